"""Our ``SparseMoE`` block alone against transformers' blocks for the MoE hybrids and Qwen3-MoE.

Qwen3-Next and Qwen3.5-MoE add a shared expert behind a sigmoid gate; their decoder layers (gated
delta-net attention) are the hybrid issue's, so here the feed-forward block is checked on its own,
with the MoE facts read from the real HF config classes by ``MoEConfig.from_dict``.
"""

from __future__ import annotations

import pytest
import torch

from kvreuse.runtime.models.linear import Linear, onednn_packs
from kvreuse.runtime.models.moe import Experts, SparseMoE
from kvreuse.runtime.models.moe_config import MoEConfig

HIDDEN = 64
COMMON = dict(
    hidden_size=HIDDEN, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=3,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
)  # fmt: skip


def _hf_block(kind: str, **kw):
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as q35
    from transformers.models.qwen3_moe import modeling_qwen3_moe as q3
    from transformers.models.qwen3_next import modeling_qwen3_next as qn

    if kind == "qwen3_next":
        cfg = qn.Qwen3NextConfig(**COMMON, shared_expert_intermediate_size=40, **kw)
        return cfg, qn.Qwen3NextSparseMoeBlock(cfg)
    if kind == "qwen3_5_moe":
        cfg = q35.Qwen3_5MoeTextConfig(**COMMON, shared_expert_intermediate_size=40, **kw)
        return cfg, q35.Qwen3_5MoeSparseMoeBlock(cfg)
    cfg = q3.Qwen3MoeConfig(**COMMON, intermediate_size=128, **kw)
    return cfg, q3.Qwen3MoeSparseMoeBlock(cfg)


def _ours_from(hf_block, moe: MoEConfig) -> SparseMoE:
    """Our block holding the HF block's weights (gate/up fused the way the loader fuses them)."""
    ours = SparseMoE(HIDDEN, moe)
    with torch.no_grad():
        ours.gate.weight.copy_(hf_block.gate.weight)
        ours.experts.gate_up_proj.copy_(hf_block.experts.gate_up_proj)
        ours.experts.down_proj.copy_(hf_block.experts.down_proj)
        if moe.shared_expert_intermediate_size:
            se = hf_block.shared_expert
            ours.shared_expert.gate_up_proj.weight.copy_(torch.cat([se.gate_proj.weight, se.up_proj.weight]))
            ours.shared_expert.down_proj.weight.copy_(se.down_proj.weight)
            ours.shared_expert_gate.weight.copy_(hf_block.shared_expert_gate.weight)
    return ours


CASES = [
    ("qwen3_next", dict(norm_topk_prob=True)),
    ("qwen3_next", dict(norm_topk_prob=False)),
    ("qwen3_5_moe", {}),  # always renormalised
    ("qwen3_moe", dict(norm_topk_prob=False)),
]


@pytest.mark.parametrize("kind,kw", CASES)
@pytest.mark.parametrize("packed", [False, True])
def test_block_matches_transformers(kind, kw, packed):
    """``packed``: the router and shared-expert gate repacked for oneDNN and the experts re-laid out
    transposed, as ``CausalLM.prepare`` does on CPU."""
    torch.manual_seed(0)
    cfg, hf = _hf_block(kind, **kw)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    moe = MoEConfig.from_dict(cfg.to_dict())
    assert moe.shared_expert_intermediate_size == (0 if kind == "qwen3_moe" else 40)
    assert moe.norm_topk_prob == kw.get("norm_topk_prob", kind == "qwen3_5_moe")
    ours = _ours_from(hf, moe)
    if packed:
        _packed(ours)
    for tokens in (1, 4, 57):
        x = torch.randn(1, tokens, HIDDEN)
        with torch.no_grad():
            ref = hf(x)[0]
            got = ours.forward(x[0])
        assert (got - ref).abs().max().item() < 1e-5, f"{kind} {kw} tokens={tokens}"


def test_dense_configs_have_no_moe():
    assert MoEConfig.from_dict({"model_type": "qwen3", "hidden_size": 64}) is None


def test_bad_top_k_is_a_clear_error():
    with pytest.raises(ValueError, match="num_experts_per_tok=9"):
        MoEConfig.from_dict({"num_experts": 8, "num_experts_per_tok": 9, "moe_intermediate_size": 8})


def test_torch_without_grouped_mm_takes_the_per_expert_loop(monkeypatch):
    """torch < 2.9 has no ``F.grouped_mm``: the Python loop over active experts gives the same result."""
    import torch.nn.functional as F

    torch.manual_seed(1)
    cfg, hf = _hf_block("qwen3_next", norm_topk_prob=True)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    ours = _ours_from(hf, MoEConfig.from_dict(cfg.to_dict()))
    x = torch.randn(1, 57, HIDDEN)
    with torch.no_grad():
        ref = hf(x)[0]
        monkeypatch.delattr(F, "grouped_mm", raising=False)
        got = ours.forward(x[0])
    assert not hasattr(F, "grouped_mm")
    assert (got - ref).abs().max().item() < 1e-5


def _packed(ours: SparseMoE) -> SparseMoE:
    """Router repacked for oneDNN and experts re-laid out, as ``CausalLM.prepare`` does on CPU."""
    for m in ours.modules():
        if isinstance(m, Experts):
            assert m.pack_for_cpu()
        elif isinstance(m, Linear):  # packed wherever oneDNN can (bf16 needs a CPU with AVX512-BF16)
            can = onednn_packs(m.weight)
            assert m.pack_for_cpu() == can
    return ours


@pytest.mark.parametrize("tokens", [1, 4, 8])
@pytest.mark.parametrize("path", ["gathered", "grouped_mm", "loop"])
def test_only_the_routed_experts_are_read(monkeypatch, tokens, path):
    """Experts no token picked hold NaN: a read of their weights would poison the output.

    Eight tokens are two distinct ones repeated (streams at the same point), so they share experts.
    ``gathered``: packed experts, so up to ``GATHER_MAX_TOKENS`` rows take ``gathered_swiglu``.
    """
    import torch.nn.functional as F

    torch.manual_seed(2)
    _, hf = _hf_block("qwen3_moe", norm_topk_prob=True)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    ours = _ours_from(hf, MoEConfig(8, 3, 24, True, 1, (), 0))
    if path == "gathered":
        _packed(ours)
    assert ours.experts.gathers_rows() == (path == "gathered")
    x = torch.randn(min(tokens, 2), HIDDEN).repeat(max(tokens // 2, 1), 1)
    with torch.no_grad():
        ref = ours.forward(x)
        picked = torch.topk(ours.gate.run(x), 3, dim=-1).indices.unique()
        idle = [e for e in range(8) if e not in picked.tolist()]
        assert idle, "every expert picked: the test would prove nothing"
        ours.experts.gate_up_proj[idle] = float("nan")
        ours.experts.down_proj[idle] = float("nan")
        if path == "loop":
            monkeypatch.delattr(F, "grouped_mm", raising=False)
        got = ours.forward(x)
    assert not got.isnan().any() and torch.allclose(got, ref, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gathered_rows_equal_grouped_gemms_and_do_not_depend_on_the_batch(monkeypatch, dtype):
    """Up to ``GATHER_MAX_TOKENS`` rows (few-stream decode) vs the grouped GEMMs on the same packed
    weights, at the boundary too; and a row's output is the same alone as inside a batch."""
    from kvreuse.runtime.models import moe

    torch.manual_seed(3)
    cfg, hf = _hf_block("qwen3_next", norm_topk_prob=True)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    ours = _packed(_ours_from(hf, MoEConfig.from_dict(cfg.to_dict())).to(dtype))
    x = torch.randn(moe.GATHER_MAX_TOKENS + 1, HIDDEN, dtype=dtype)
    with torch.no_grad():
        for n in range(1, moe.GATHER_MAX_TOKENS + 2):
            got = ours.forward(x[:n])
            monkeypatch.setattr(moe, "GATHER_MAX_TOKENS", 0)
            ref = ours.forward(x[:n])
            monkeypatch.undo()
            # bf16: the two paths round differently, so a couple of ulps of the largest output
            tol = 1e-5 if dtype == torch.float32 else ref.abs().max().item() / 64
            assert got.dtype == dtype and (got - ref).abs().max().item() < tol, n
        alone = [ours.forward(x[i : i + 1]) for i in range(moe.GATHER_MAX_TOKENS)]
        assert torch.equal(torch.cat(alone), ours.forward(x[: moe.GATHER_MAX_TOKENS]))


def test_odd_widths_in_bf16_take_the_loop_not_grouped_mm():
    """``F.grouped_mm`` raises on row strides that are not multiples of 16 bytes (hidden 44 in bf16: 88
    bytes, the gemma4-moe test shape); such experts run the per-expert loop, equal to fp32's grouped
    GEMMs within bf16 rounding."""
    torch.manual_seed(4)
    experts = Experts(5, 44, 20)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    x = torch.randn(9, 44)
    top_w, top_i = torch.randn(9, 5).softmax(-1).topk(2, dim=-1)
    with torch.no_grad():
        ref = experts.forward(x, top_i, top_w)
        got = experts.to(torch.bfloat16).forward(x.bfloat16(), top_i, top_w.bfloat16())
    assert got.dtype == torch.bfloat16
    assert (got.float() - ref).abs().max().item() < ref.abs().max().item() / 32
