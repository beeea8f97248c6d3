"""Our decoder-only transformer over the paged KV pool (Llama, Mistral, Ministral, Qwen2, Qwen3).

The differences between these families are four switches read from the config:
QKV bias (Qwen2), per-head q/k RMSNorm (Qwen3), tied embeddings, per-layer sliding windows (Mistral).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn

from kvreuse.kernels.backends import AttentionBackend
from kvreuse.runtime.models.batch import ForwardBatch
from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.models.fused_decode import fusable, fused_decode_layer, layer_plan
from kvreuse.runtime.models.layers import RMSNorm, RotaryEmbedding, apply_rope
from kvreuse.runtime.models.linear import Linear
from kvreuse.runtime.models.moe import Experts, feed_forward
from kvreuse.runtime.models.summary import ParamCounts, count_parameters


class StepContext(NamedTuple):
    """What every layer of one forward shares: the batch, rope tables, kernels and their decode plans
    (one per sliding window the model has, key None for full attention; None: no plans)."""

    fb: ForwardBatch
    cos: torch.Tensor
    sin: torch.Tensor
    backend: AttentionBackend
    plan: dict[int | None, Any] | None


def decode_plans(
    fb: ForwardBatch, backend: AttentionBackend, page_size: int, windows: tuple[int | None, ...]
) -> dict[int | None, Any] | None:
    """A decode step's per-layer gather plans, made once per window size (reference backend only)."""
    if not fb.is_decode or backend.decode_plan is None:
        return None
    return {
        w: backend.decode_plan(fb.page_table, fb.seq_lens_k, page_size, w) for w in set(windows or (None,))
    }


def step_contexts(
    fb: ForwardBatch,
    ring: ForwardBatch | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    backend: AttentionBackend,
    page_size: int,
    windows: tuple[int | None, ...],
) -> tuple[StepContext, StepContext]:
    """The full-attention layers' context and the window layers' (their ring's page table and slots,
    and decode plans over it; the same as the first when the window layers keep pool pages)."""
    if ring is None:
        ctx = StepContext(fb, cos, sin, backend, decode_plans(fb, backend, page_size, windows))
        return ctx, ctx
    full = tuple(w for w in windows if w is None)
    wins = tuple(w for w in windows if w is not None)
    ctx = StepContext(fb, cos, sin, backend, decode_plans(fb, backend, page_size, full))
    return ctx, StepContext(ring, cos, sin, backend, decode_plans(ring, backend, page_size, wins))


class PagedAttention(nn.Module):
    """Self-attention whose keys and values live in one layer of the paged KV pool."""

    def __init__(self, cfg: ModelConfig, window: int | None = None) -> None:
        super().__init__()
        self.window = window  # a sliding-window layer sees only the last ``window`` keys
        self.nh, self.nkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = self.nh * self.hd, self.nkv * self.hd
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = self.hd**-0.5

    def forward(
        self, x: torch.Tensor, ctx: StepContext, kv: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        qkv = self.qkv_proj.run(x)
        v = qkv[:, self.q_size + self.kv_size :].view(-1, self.nkv, self.hd)
        if self.q_norm is None:
            # q and k heads are adjacent in the fused output: rotate them in one go
            qk = apply_rope(
                qkv[:, : self.q_size + self.kv_size].view(-1, self.nh + self.nkv, self.hd), ctx.cos, ctx.sin
            )
            q, k = qk[:, : self.nh], qk[:, self.nh :]
        else:
            q, k, _ = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = apply_rope(self.q_norm.forward(q.view(-1, self.nh, self.hd)), ctx.cos, ctx.sin)
            k = apply_rope(self.k_norm.forward(k.view(-1, self.nkv, self.hd)), ctx.cos, ctx.sin)
        return self.o_proj.run(self.attend(q, k, v, ctx, kv).reshape(-1, self.q_size))

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ctx: StepContext,
        kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """Store k/v and attend (``paged_attention``); a family with its own kernel overrides this."""
        return paged_attention(q, k, v, ctx, kv, self.scale, self.window)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: StepContext,
    kv: tuple[torch.Tensor, torch.Tensor],
    scale: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Store this step's k/v in the layer's pages, then attend: q [T, Hq, D] -> [T, Hq, D]; ``window``:
    only each query's last ``window`` keys (a sliding-window layer); ``sinks``: a learned sink logit
    per query head (gpt-oss; ``kernels/reference.py``)."""
    ctx.backend.store_kv(kv[0], kv[1], ctx.fb.slot_mapping, k, v)
    return cached_attention(q, ctx, kv, scale, window, sinks)


def cached_attention(
    q: torch.Tensor,
    ctx: StepContext,
    kv: tuple[torch.Tensor, torch.Tensor],
    scale: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attend over the keys and values already in the layer's pages, this step's included (a layer that
    reads an earlier layer's KV, Gemma 4's KV-shared tail, stores none of its own)."""
    k_cache, v_cache = kv
    fb, backend = ctx.fb, ctx.backend
    if fb.is_decode:
        plan = None if ctx.plan is None else ctx.plan[window]
        return backend.decode_attention(
            q, k_cache, v_cache, fb.page_table, fb.seq_lens_k, scale, plan=plan, window=window, sinks=sinks
        )
    return backend.extend_attention(
        q, k_cache, v_cache, fb.page_table, fb.cu_seqlens_q, fb.seq_lens_k, scale, window=window, sinks=sinks
    )


class DecoderLayer(nn.Module):
    """Pre-norm attention + gated MLP (or sparse MoE block) with residuals."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = PagedAttention(cfg, cfg.window(layer))
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = feed_forward(cfg.hidden_size, cfg.intermediate_size, cfg.moe, layer)

    def forward(
        self, h: torch.Tensor, ctx: StepContext, kv: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        h = h + self.self_attn.forward(self.input_layernorm.forward(h), ctx, kv)
        return h + self.mlp.forward(self.post_attention_layernorm.forward(h))


def embedding(num: int, dim: int) -> nn.Embedding:
    """An ``nn.Embedding`` without its random init: models are built on the meta device and loaded
    after (``build_model``), and ``normal_`` on meta imports ``torch._dynamo`` (~1.7 s a process)."""
    return nn.Embedding(num, dim, _weight=torch.empty(num, dim))


class CausalLM(nn.Module):
    """Embeddings, decoder layers, final norm and LM head; logits only for the sampled rows."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # how a decode step runs its layers (a layer function and what it takes per layer), chosen
        # once by ``choose_decode``; None: the plain ``DecoderLayer.forward``
        self.decode_run: tuple[Callable, list] | None = None
        self.rope = RotaryEmbedding(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling
        )

    def prepare(self) -> None:
        """After the weights are loaded: on CPU repack every linear weight for oneDNN.

        Decode on CPU streams every weight once per step; the packed layout streams it up to ~2.5x
        faster for 1-8 rows (figures in ``runtime/models/linear.py``).  A tied LM head gets its own
        packed copy, the embedding table keeps the dense one.  Routed experts are re-laid out for their
        grouped GEMMs (``Experts.pack_for_cpu``).  GPUs need none of this.
        """
        for m in self.modules():
            if isinstance(m, (Linear, Experts)):
                m.pack_for_cpu()

    def choose_decode(self, backend: AttentionBackend, k_cache: torch.Tensor, compile: bool) -> str:
        """Decide, once (the modules are final: quantized, packed), how decode steps run their layers:
        ``fused`` (the ``cpu`` backend's C kernels, where they take this model's dtypes and shapes),
        ``compiled`` (``--compile-decode``, see ``compile_decode``) or ``eager``."""
        h = self.embed_tokens.weight[:1]
        cos, _ = self.rope.lookup(torch.zeros(1, dtype=torch.long, device=h.device))
        if fusable(backend.fused, h, self.layers[0], k_cache, cos):
            self.decode_run = (fused_decode_layer, [layer_plan(layer) for layer in self.layers])
            return "fused"
        if compile:
            self.compile_decode()
            return "compiled"
        return "eager"

    def compile_decode(self) -> None:
        """Run decode steps' layers through one ``torch.compile``d ``DecoderLayer.forward`` (CPU: inductor's C++).

        A CPU decode step of a small model is bound by dispatch, not by its matmuls: ~40 small ops a layer
        around four matmuls (SmolLM2-135M int4, 2 threads: linears + head ~6 ms of a ~15 ms step).  The
        compiled layer fuses the norms, rope, residuals and SwiGLU into a few C++ loops; the matmuls and
        attention stay the same library kernels.  One graph serves every layer (parameters are inputs)
        and every length (``dynamic=True``); prefill stays eager, where the GEMMs dominate.  Costs tens of
        seconds of compilation at the first decode step, hence opt-in (``--compile-decode``).  The ``cpu``
        attention backend's fused C kernels (``runtime/models/fused_decode.py``) do the same fusion
        without compiling and take precedence; this serves the ``reference`` backend.
        """
        self.decode_run = (torch.compile(DecoderLayer.forward, dynamic=True), list(self.layers))

    def parameter_counts(self) -> ParamCounts:
        """Total parameters and those one token reads (all but the experts its router skipped)."""
        return count_parameters(self)

    @torch.inference_mode()
    def forward(
        self,
        fb: ForwardBatch,
        kv_layers: list[tuple[torch.Tensor, torch.Tensor]],
        backend: AttentionBackend,
        ring: ForwardBatch | None = None,
    ) -> torch.Tensor:
        """Returns float32 logits ``[len(fb.logits_rows), vocab]``; ``ring``: the batch as the window
        layers address their rings (``runtime/runner/window_pool.py``), None when they use ``fb``'s pages."""
        cos, sin = self.rope.lookup(fb.positions)
        ctx, wctx = step_contexts(fb, ring, cos, sin, backend, kv_layers[0][0].shape[1], self.cfg.windows)
        h = self.embed_tokens(fb.input_ids)
        run_layer, layers = DecoderLayer.forward, self.layers
        if self.decode_run is not None and (fb.is_decode or self.decode_run[0] is fused_decode_layer):
            run_layer, layers = self.decode_run  # the fused kernels serve extends too
        for layer, kv, w in zip(layers, kv_layers, self.cfg.windows or [None] * len(kv_layers)):
            h = run_layer(layer, h, ctx if w is None else wctx, kv)
        h = self.norm.forward(h[fb.logits_rows])
        logits = self.lm_head.run(h)
        return logits.float()
