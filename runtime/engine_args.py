"""Command-line flags that configure an engine, shared by every subcommand that runs one."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from runtime.config import EngineConfig

DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(EngineConfig)}


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g, d = p.add_argument_group("engine"), DEFAULTS
    g.add_argument(
        "--model",
        default=d["model"],
        help="HF model dir, hub id, .gguf file; default: embedded SmolLM2-135M-Instruct",
    )
    g.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=d["dtype"],
        help="default: bf16 on GPU, else fp32",
    )
    g.add_argument("--device", default=d["device"], help="cpu or cuda[:N]; default: cuda if available")
    g.add_argument(
        "--kv-cache-memory",
        default=d["kv_cache_memory"],
        help="KV pool size, e.g. 512M or 2G (default 1G on CPU, 85%% of free GPU memory)",
    )
    g.add_argument(
        "--page-size", type=int, default=d["page_size"], help=f"tokens per KV page (default {d['page_size']})"
    )
    g.add_argument(
        "--chunk-size",
        type=int,
        default=d["chunk_size"],
        help=f"prefill tokens per step (default {d['chunk_size']})",
    )
    g.add_argument(
        "--max-running",
        type=int,
        default=d["max_running"],
        help=f"most requests decoded together (default {d['max_running']})",
    )
    g.add_argument(
        "--prefix-cache",
        choices=["radix", "off"],
        default=d["prefix_cache"],
        help="off = recompute every prompt",
    )
    g.add_argument(
        "--schedule-policy",
        choices=["fcfs", "lpm"],
        default=d["schedule_policy"],
        help="lpm = longest cached prefix first",
    )
    g.add_argument(
        "--attention-backend", choices=["auto", "reference", "triton"], default=d["attention_backend"]
    )
    g.add_argument(
        "--max-model-len", type=int, default=d["max_model_len"], help="cap on prompt + output tokens"
    )


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        dtype=args.dtype,
        device=args.device,
        kv_cache_memory=args.kv_cache_memory,
        page_size=args.page_size,
        chunk_size=args.chunk_size,
        max_running=args.max_running,
        prefix_cache=args.prefix_cache,
        schedule_policy=args.schedule_policy,
        attention_backend=args.attention_backend,
        max_model_len=args.max_model_len,
    )
