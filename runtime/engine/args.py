"""Command-line flags that configure an engine, shared by every subcommand that runs one.

Every default is ``EngineConfig``'s (``runtime/engine/config.py`` owns them and says why); a flag
only names it and says what it does.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from kvreuse.runtime.cache.eviction import POLICIES
from kvreuse.runtime.cache.registry import KINDS as CACHE_KINDS
from kvreuse.runtime.engine.config import EngineConfig
from kvreuse.runtime.speculative.drafter import MODES as SPECULATIVE_MODES

D = {f.name: f.default for f in fields(EngineConfig)}


def _policy_list(text: str) -> tuple[str, ...]:
    """``lru,answer`` -> the policies, each one of ``POLICIES`` (argparse prints the error in one line)."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in POLICIES]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(bad)} (choose from {', '.join(POLICIES)})"
        )
    return names


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument(
        "--model",
        default=None,
        help="HF model dir, hub id, .gguf file; default: embedded SmolLM2-135M-Instruct",
    )
    g.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="default: bf16 on GPU, else fp32",
    )
    g.add_argument("--device", default=None, help="cpu or cuda[:N]; default: cuda if available")
    g.add_argument(
        "--kv-cache-memory",
        default=None,
        help="KV pool size, e.g. 512M or 2G (default 1G on CPU, 85%% of free GPU memory)",
    )
    g.add_argument(
        "--page-size", type=int, default=D["page_size"], help=f"tokens per KV page (default {D['page_size']})"
    )
    g.add_argument(
        "--chunk-size",
        type=int,
        default=D["chunk_size"],
        help=f"prefill tokens per step (default {D['chunk_size']})",
    )
    g.add_argument(
        "--tenant-chunk-size",
        type=int,
        default=D["tenant_chunk_size"],
        help="prefill tokens per step while more than one tenant has work: how long one tenant's prompt "
        f"may stall another's request (default {D['tenant_chunk_size']})",
    )
    g.add_argument(
        "--tenant-step-ms",
        type=float,
        default=D["tenant_step_s"] * 1e3,
        help="... and at most what fits a step of this many ms, by the step times seen on this machine "
        f"(default {D['tenant_step_s'] * 1e3:g})",
    )
    g.add_argument(
        "--max-running",
        type=int,
        default=D["max_running"],
        help=f"most requests decoded together (default {D['max_running']})",
    )
    g.add_argument(
        "--prefix-cache",
        choices=list(CACHE_KINDS),
        default=D["prefix_cache"],
        help="off = recompute every prompt",
    )
    g.add_argument(
        "--eviction-policy",
        choices=sorted(POLICIES),
        default=D["eviction_policy"],
        help=f"which cached prefixes give way first (default {D['eviction_policy']}; see benchmarks/traces/eviction_traces.py)",
    )
    g.add_argument(
        "--eviction-shadows",
        type=_policy_list,
        default=D["eviction_shadows"],
        metavar="POLICY,...",
        help="also replay each finished request through these policies' page-only copies of the pool and report "
        "what they would have hit (/metrics, /v1/cache): a policy chosen on this server's own traffic",
    )
    g.add_argument(
        "--session-ttl",
        type=float,
        default=D["session_ttl"],
        help=f"seconds a session's last prompt + output stays pinned after its last use (default {D['session_ttl']:g})",
    )
    g.add_argument(
        "--pinned-fraction",
        type=float,
        default=D["pinned_fraction"],
        help=f"most of the KV pool that pins may hold; over it the oldest pins lapse (default {D['pinned_fraction']})",
    )
    g.add_argument(
        "--schedule-policy",
        choices=["fcfs", "lpm"],
        default=D["schedule_policy"],
        help="lpm = longest cached prefix first",
    )
    g.add_argument(
        "--attention-backend", choices=["auto", "reference", "cpu", "triton"], default=D["attention_backend"]
    )
    g.add_argument(
        "--quantize",
        choices=["none", "int8", "int4", "gguf"],
        default=D["quantize"],
        help="weight-only quantized linears on CPU; gguf = a GGUF model's own blocks (default none)",
    )
    g.add_argument(
        "--compile-decode",
        action="store_true",
        help="torch.compile decode steps' layers (faster CPU decode; compiles at the first step)",
    )
    g.add_argument(
        "--grammar-compile-timeout",
        type=float,
        default=D["grammar_compile_timeout"],
        help="seconds a grammar (JSON schema, tools) may compile before the request is refused "
        f"(default {D['grammar_compile_timeout']:g})",
    )
    g.add_argument(
        "--max-model-len", type=int, default=D["max_model_len"], help="cap on prompt + output tokens"
    )
    g.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=D["tensor_parallel_size"],
        help="shard the model over N ranks (torch.distributed)",
    )
    g.add_argument(
        "--speculative",
        choices=["auto", *SPECULATIVE_MODES],
        default="auto",
        help="draft tokens from the request's own text (ngram) or also its tenant's recent requests "
        "(suffix), verified in one forward; auto (default): suffix where the model supports it, else off "
        "(benchmarks/results/speculative.json)",
    )
    t = p.add_argument_group("KV tiers below the pool")
    t.add_argument(
        "--kv-store", default=None, help="disk tier directory: evicted KV pages survive eviction and restarts"
    )
    t.add_argument(
        "--kv-store-size", default=D["kv_store_size"], help=f"disk tier budget (default {D['kv_store_size']})"
    )
    t.add_argument("--kv-host-memory", default=None, help="host-memory tier budget, e.g. 8G (default: none)")
    t.add_argument(
        "--kv-write-through", action="store_true", help="write cached pages down at once, not on eviction"
    )
    t.add_argument(
        "--kv-shared-store",
        default=None,
        metavar="URL",
        help="shared tier: a Valkey/Redis server (valkey://127.0.0.1:6379; with a password "
        "valkey://:PASSWORD@HOST:PORT) that replicas write their pages through to and read each other's "
        "from; its budget is the server's maxmemory (default: none)",
    )
    t.add_argument(
        "--kv-shared-secret-file",
        default=None,
        metavar="FILE",
        help="a file holding the replicas' shared secret (>= 16 bytes): every shared-tier entry carries an "
        "HMAC-SHA256 under it, and an entry without a valid one is refused and deleted (default: a "
        "checksum only, so anyone who can write to the store can forge pages)",
    )
    g.add_argument(
        "--snapshot-memory",
        default=None,
        help="hybrid (Qwen3.5) and sliding-window (Gemma 3) models: budget for state / window snapshots, e.g. 2G "
        "(default 1G)",
    )
    g.add_argument(
        "--snapshot-every",
        type=int,
        default=D["snapshot_every"],
        help="hybrid and window models: also snapshot every K pages inside a prefill chunk (default 0: chunk ends)",
    )
    g.add_argument(
        "--window-paging",
        action=argparse.BooleanOptionalAction,
        default=D["window_paging"],
        help="sliding-window models with full-attention layers too (Gemma 3): window layers' KV in "
        "per-request rings, window snapshots beside the radix tree (--no-window-paging: pages for every token)",
    )


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        dtype=args.dtype,
        device=args.device,
        kv_cache_memory=args.kv_cache_memory,
        page_size=args.page_size,
        chunk_size=args.chunk_size,
        tenant_chunk_size=args.tenant_chunk_size,
        tenant_step_s=args.tenant_step_ms / 1e3,
        max_running=args.max_running,
        prefix_cache=args.prefix_cache,
        eviction_policy=args.eviction_policy,
        eviction_shadows=args.eviction_shadows,
        session_ttl=args.session_ttl,
        pinned_fraction=args.pinned_fraction,
        schedule_policy=args.schedule_policy,
        attention_backend=args.attention_backend,
        quantize=args.quantize,
        compile_decode=args.compile_decode,
        grammar_compile_timeout=args.grammar_compile_timeout,
        max_model_len=args.max_model_len,
        tensor_parallel_size=args.tensor_parallel_size,
        kv_store=args.kv_store,
        kv_store_size=args.kv_store_size,
        kv_host_memory=args.kv_host_memory,
        kv_write_through=args.kv_write_through,
        kv_shared_store=args.kv_shared_store,
        kv_shared_secret_file=args.kv_shared_secret_file,
        snapshot_memory=args.snapshot_memory,
        snapshot_every=args.snapshot_every,
        speculative=args.speculative,
        window_paging=args.window_paging,
    )
