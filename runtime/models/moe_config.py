"""The mixture-of-experts facts of an HF ``config.json`` (Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE, gpt-oss)."""

from __future__ import annotations

from typing import Any, NamedTuple

# Qwen3.5-MoE and gpt-oss: every layer is sparse and the router always renormalises its top-k weights
# (gpt-oss: a softmax over the top-k logits); their configs have no switch for either (transformers
# ignores decoder_sparse_step / mlp_only_layers / norm_topk_prob)
_ALL_SPARSE_NORMALISED = ("qwen3_5_moe", "qwen3_5_moe_text", "gpt_oss")


class MoEConfig(NamedTuple):
    """Router and expert shapes; which layers are sparse follows HF's ``decoder_sparse_step`` rule."""

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    norm_topk_prob: bool
    decoder_sparse_step: int
    mlp_only_layers: tuple[int, ...]
    shared_expert_intermediate_size: int  # 0: no shared expert (Qwen3-MoE)

    @classmethod
    def from_dict(cls, c: dict[str, Any]) -> MoEConfig | None:
        """``None`` for a dense config (no experts)."""
        experts = c.get("num_experts") or c.get("num_local_experts") or 0
        if experts <= 0:
            return None
        fixed = c.get("model_type", "") in _ALL_SPARSE_NORMALISED
        top_k = c.get("num_experts_per_tok", 1)
        if not 1 <= top_k <= experts:
            raise ValueError(f"num_experts_per_tok={top_k} must be between 1 and num_experts={experts}")
        return cls(
            num_experts=experts,
            top_k=top_k,
            # gpt-oss has no dense MLP: its intermediate_size is the experts' width
            expert_intermediate_size=c.get("moe_intermediate_size") or c["intermediate_size"],
            norm_topk_prob=fixed or bool(c.get("norm_topk_prob", False)),
            decoder_sparse_step=1 if fixed else max(int(c.get("decoder_sparse_step") or 1), 1),
            mlp_only_layers=() if fixed else tuple(c.get("mlp_only_layers") or ()),
            shared_expert_intermediate_size=int(c.get("shared_expert_intermediate_size") or 0),
        )

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based) has the MoE block rather than a dense MLP."""
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0
