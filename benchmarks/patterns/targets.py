"""Where the benchmark sends requests: the in-process engine, or any OpenAI-compatible server."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from kvreuse.benchmarks.patterns.request import Request
from kvreuse.runtime.engine.states import snapshot_policy

TEMPLATE = "qwen3"  # ChatML with tools and thinking; SmolLM2 shares its special tokens


class Measured(NamedTuple):
    """What one request cost. ``cached_tokens`` is None when the target does not report it."""

    prompt_tokens: int
    cached_tokens: int | None
    prefilled_tokens: int | None
    output_token_ids: list[int]
    ttft_s: float
    prefill_s: float | None
    decode_s: float | None
    cached_host_tokens: int | None = None  # of cached_tokens: loaded back from the host / disk tier
    cached_disk_tokens: int | None = None  # (None: the target does not say)
    snapshot_cut: int = 0  # hybrids: KV-matched tokens recomputed for want of a state snapshot


class InProcessTarget:
    """Renders each request with the chat template and sends token ids to a ``kvreuse.runtime.engine.engine.Engine``."""

    name = "in-process"

    def __init__(self, engine: Any, max_tokens: int = 4, reply_kv: str = "decode") -> None:
        from kvreuse.runtime.sampling.params import SamplingParams

        self.engine = engine
        # "decode": a forced reply is generated token by token (one engine step each); "extend": the request
        # generates only the reply's first token, then prompt + reply is sent again so one extend step writes
        # the reply's KV to the cache (the same pages as decoding: tests/test_reply_extend.py), for sessions
        # whose thousands of reply tokens would take hours of decode steps on a CPU
        self.reply_kv = reply_kv
        self.tokenizer = engine.tokenizer
        self.params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.reset_note = ""
        # hybrids: where the engine takes state snapshots, so the runner can predict the reuse
        self.snapshot_policy = snapshot_policy(engine.runner, engine.config)

    def reset(self) -> None:
        self.engine.reset_prefix_cache()

    def send(
        self, request: Request, token_ids: list[int], cache: bool, forced: list[int] | None = None
    ) -> Measured:
        """Run one request; ``forced``: the reply to emit as generated tokens (cached replies)."""
        if not cache:
            self.engine.reset_prefix_cache()  # cache off: nothing survives from earlier requests
        params = self.params
        extend = bool(forced) and self.reply_kv == "extend" and len(forced) > 1
        if forced:
            from kvreuse.runtime.sampling.params import SamplingParams

            n = 1 if extend else len(forced)
            params = SamplingParams(max_tokens=n, forced_tokens=forced[:n], ignore_eos=True)
        out = self.engine.generate([token_ids], params)[0]
        if extend:  # the reply's KV, written by one extend step; this call's own counts are not the request's
            from kvreuse.runtime.sampling.params import SamplingParams

            tail = SamplingParams(max_tokens=1, forced_tokens=forced[-1:], ignore_eos=True)
            self.engine.generate([list(token_ids) + list(forced[:-1])], tail)
        return Measured(
            len(out.prompt_token_ids),
            out.cached_tokens,
            out.prefilled_tokens,
            list(forced) if extend else list(out.output_token_ids),
            out.ttft_s,
            out.prefill_s,
            out.decode_s,
            out.cached_host_tokens,
            out.cached_disk_tokens,
            getattr(out, "snapshot_cut", 0),
        )


class AccountingTarget:
    """The engine's paged radix-cache reuse rule without a model, for sessions too long to replay on a CPU.

    A request reuses the whole pages of the longest prefix it shares with any earlier computed stream
    (prompt + reply but its last token), and always computes at least one token; sequential requests
    and no eviction, as in the benchmark.  The report checks it against the engine on every request of
    the engine runs (they agree token for token).
    """

    name = "accounting"

    def __init__(self, tokenizer: Any, page_size: int = 16) -> None:
        self.tokenizer, self.page = tokenizer, page_size
        self.streams: list[Any] = []
        self.reset_note = ""

    def reset(self) -> None:
        self.streams = []

    def send(
        self, request: Request, token_ids: list[int], cache: bool, forced: list[int] | None = None
    ) -> Measured:
        from kvreuse.benchmarks.patterns.ideal import as_arrays, best_prefix

        if not cache:
            self.streams = []
        shared = best_prefix(token_ids, self.streams) // self.page * self.page
        prefilled = max(1, len(token_ids) - shared)
        out = list(forced) if forced else [0]
        self.streams += as_arrays([list(token_ids) + out[:-1]])
        return Measured(len(token_ids), len(token_ids) - prefilled, prefilled, out, 0.0, None, None)


class ServerTarget:
    """Streams chat completions from an OpenAI-compatible server and times the first token.

    Token accounting (ideal, divergence) renders locally with the ``qwen3`` template, so a kvreuse
    server must run with ``--chat-template qwen3`` for its totals to match the in-process target;
    each row keeps both counts (``prompt_tokens`` from the server, ``rendered_tokens`` local).
    """

    name = "server"

    def __init__(
        self, url: str, model: str | None = None, max_tokens: int = 4, api_key: str = "none"
    ) -> None:
        import httpx
        import openai

        self.base = url.rstrip("/")
        if not self.base.endswith("/v1"):
            self.base += "/v1"
        self.client = openai.OpenAI(base_url=self.base, api_key=api_key)
        self.http = httpx.Client(timeout=30)
        self.model = model or self.client.models.list().data[0].id
        self.max_tokens = max_tokens
        self.reset_note = ""

    def reset(self) -> None:
        try:
            r = self.http.post(f"{self.base}/cache/reset", json={})  # JSON: kvreuse refuses simple POSTs
            ok = r.status_code < 400
        except Exception:  # a peer without the endpoint, or one that drops the connection
            ok = False
        if not ok:
            self.reset_note = "server has no POST /v1/cache/reset: runs may start with a warm cache"

    def send(
        self, request: Request, token_ids: list[int], cache: bool, forced: list[int] | None = None
    ) -> Measured:
        """Stream one chat completion; an OpenAI API cannot force a reply, so ``forced`` is ignored."""
        if not cache:
            self.reset()
        t0 = time.perf_counter()
        ttft = None
        usage, tiers = None, {}
        stream = self.client.chat.completions.create(
            model=self.model,
            messages=request.messages,
            tools=request.tools,
            max_tokens=self.max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"chat_template_kwargs": request.template_kwargs, "ignore_eos": True},
        )
        for chunk in stream:
            if ttft is None and chunk.choices and _has_output(chunk.choices[0].delta):
                ttft = time.perf_counter() - t0
            if chunk.usage is not None:
                usage = chunk.usage
                ext = (chunk.model_extra or {}).get("kvreuse") or {}  # a kvreuse server's cache diagnosis
                tiers = (ext.get("cache") or {}).get("cached_by_tier") or {}
        total = time.perf_counter() - t0
        ttft = total if ttft is None else ttft
        prompt = usage.prompt_tokens if usage else len(token_ids)
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        cached = getattr(details, "cached_tokens", None) if details else None
        return Measured(
            prompt, cached, None if cached is None else prompt - cached, [], ttft, None, total - ttft,
            tiers.get("host"), tiers.get("disk"),
        )  # fmt: skip


def _has_output(delta: Any) -> bool:
    return bool(delta.content or delta.tool_calls or getattr(delta, "reasoning_content", None))
