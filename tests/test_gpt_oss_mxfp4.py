"""gpt-oss's MXFP4 experts kept quantized (``runtime/models/mxfp4.py``).

A tiny random gpt-oss has its experts quantized to MXFP4 here (the checkpoint's own layout: blocks
``[E, out, in/32, 16]``, a uint8 exponent per 32 weights, gate/up rows interleaved) and saved twice: as
MXFP4 (``quantization_config: mxfp4``) and dequantized by transformers' own
``convert_moe_packed_tensors``.  The engine keeps the first quantized and must match transformers on
the second: logits within 1e-4 (fp32), perplexity within 1%, greedy identical, at about an eighth of
the fp32 expert bytes.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from kvreuse.runtime.models.mxfp4 import Mxfp4Experts, byte_table, dequantize, quantize
from kvreuse.runtime.sampling.params import SamplingParams
from tests.engine_drive import random_ids, tiny_engine
from tests.helpers import TOKENIZER_FILES, load_hf, make_tiny_model
from tests.parity import all_logits

SHAPE = dict(
    hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, num_local_experts=5, num_experts_per_tok=2, sliding_window=7,
)  # fmt: skip


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mxfp4")
    dense = make_tiny_model(root / "dense", "gpt_oss", initializer_range=0.1, **SHAPE)
    tensors = load_file(str(dense / "model.safetensors"))
    quant, deq = {}, {}
    for name, t in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = quantize(t.transpose(1, 2))  # HF keeps [E, in, out]; MXFP4 rows are out
            quant[name + "_blocks"], quant[name + "_scales"] = blocks, scales
            deq[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        else:
            quant[name] = deq[name] = t
    cfg = json.loads((dense / "config.json").read_text())
    out = {}
    for kind, ts in (("mxfp4", quant), ("deq", deq)):
        d = root / kind
        d.mkdir()
        save_file({k: v.contiguous() for k, v in ts.items()}, str(d / "model.safetensors"))
        c = dict(cfg, quantization_config={"quant_method": "mxfp4"}) if kind == "mxfp4" else cfg
        (d / "config.json").write_text(json.dumps(c))
        for f in TOKENIZER_FILES:
            if (dense / f).exists():
                shutil.copy(dense / f, d / f)
        out[kind] = d
    return out


def test_quantize_round_trips_to_the_nearest_value():
    w = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(3))
    blocks, scales = quantize(w)
    back = dequantize(blocks.flatten(2), scales, byte_table(), torch.float32)
    step = torch.exp2(scales.float() - 127).repeat_interleave(32, -1)  # one e2m1 unit of each block
    assert ((back - w).abs() <= step).all()  # nearest: within half the widest gap (2 units, 4 -> 6)


def test_dequantize_matches_transformers():
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 8, 4, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(120, 135, (3, 8, 4), generator=g, dtype=torch.uint8)
    ref = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, in, out]
    ours = dequantize(blocks.flatten(2), scales, byte_table(), torch.float32)  # [E, out, in]
    assert torch.equal(ours.transpose(1, 2), ref)


def test_kept_quantized_matches_transformers_dequantized(dirs):
    eng = tiny_engine(dirs["mxfp4"], page_size=4, num_pages=128)
    experts = [m for m in eng.runner.model.modules() if isinstance(m, Mxfp4Experts)]
    assert len(experts) == SHAPE["num_hidden_layers"]
    hf = load_hf(dirs["deq"])
    g = torch.Generator().manual_seed(1)
    for n in (1, 9, 60):
        ids = torch.randint(3, 512, (n,), generator=g).tolist()
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        ours = all_logits(eng, ids)
        assert (ours - ref).abs().max().item() < 1e-4, n
    # perplexity of the 60-token sequence under each
    nll = [torch.nn.functional.cross_entropy(x[:-1], torch.tensor(ids[1:])).item() for x in (ours, ref)]
    assert abs(math.exp(nll[0]) / math.exp(nll[1]) - 1) < 0.01
    eng.cache.check_integrity()


def test_bf16_decode_kernels_keep_perplexity_within_one_percent(dirs):
    """bf16: the kept-quantized experts multiply int8 activation codes (MXFP4 x Q8); scored 2 tokens a
    step, every expert sees at most 2 rows, so the whole sequence goes through the decode kernels."""
    ids = random_ids(torch.Generator().manual_seed(5), 80)
    ppl = {}
    for kind in ("mxfp4", "deq"):
        eng = tiny_engine(dirs[kind], dtype="bfloat16", page_size=4, num_pages=128, window_paging=False)
        lps = [e[1][0] for e in eng.prompt_logprobs(ids, 0, chunk_size=2) if e[1] is not None]
        ppl[kind] = math.exp(-sum(lps) / len(lps))
    assert abs(ppl["mxfp4"] / ppl["deq"] - 1) < 0.01, ppl


def test_expert_bytes_and_greedy_against_the_dequantized_model(dirs):
    q, d = (tiny_engine(dirs[k], page_size=4, num_pages=128) for k in ("mxfp4", "deq"))

    def expert_bytes(eng) -> int:
        return sum(
            p.nbytes for n, p in eng.runner.model.named_parameters() if ".experts." in n and "bias" not in n
        )

    ratio = expert_bytes(q) / expert_bytes(d)
    assert ratio == pytest.approx((0.5 + 1 / 32) / 4)  # 4.25 bits against fp32's 32
    gen = torch.Generator().manual_seed(2)
    prompts = [random_ids(gen, n) for n in (5, 23)]
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    assert [o.output_token_ids for o in q.generate(prompts, params)] == [
        o.output_token_ids for o in d.generate(prompts, params)
    ]


def _kernel_case(seed: int, experts: int = 3):
    from kvreuse.kernels.mxfp4_cpu import load

    kernel = load()
    if kernel is None:
        pytest.skip("no C compiler: the torch decode path runs instead")
    g = torch.Generator().manual_seed(seed)
    blocks, scales = quantize(torch.randn(experts, 96, 160, generator=g))
    blocks = blocks.flatten(2).contiguous()
    return kernel, g, blocks, scales, dequantize(blocks, scales, byte_table(), torch.float32)


def _grouped_reference(x, counts, ids, w) -> torch.Tensor:
    return torch.cat([xg.float() @ w[e].T for xg, e in zip(x.split(counts), ids)])


def test_c_kernel_fp32_matches_the_decoded_matmul():
    """fp32 activations: exact weights and fp32 products, so only the summation order differs."""
    from kvreuse.kernels.mxfp4_cpu import MAX_ROWS

    kernel, g, blocks, scales, w = _kernel_case(4)
    for counts, ids in (([1], [2]), ([3, 1], [0, 2]), ([MAX_ROWS, 2, 5], [1, 0, 2])):
        x = torch.randn(sum(counts), 160, generator=g)
        ref = _grouped_reference(x, counts, ids, w)
        got = kernel(x, torch.tensor(counts), torch.tensor(ids), blocks, scales)
        assert (got - ref).abs().max().item() < 1e-5 * ref.abs().max().item()


def test_c_kernel_q8_stays_within_the_int8_rounding_bound():
    """bf16 activations go through int8 per block of 32: each element moves by at most half its
    block's step (max|x| / 127 / 2), so each output by at most that times the block's sum |w|
    (``q8_error_bound``); the tolerance is that bound plus fp32 summation slack (1e-5 relative),
    and the error must be real rounding, not an exact product by accident."""
    from kvreuse.kernels.mxfp4_cpu import q8_error_bound

    kernel, g, blocks, scales, w = _kernel_case(5)
    for counts, ids in (([1], [1]), ([4, 4, 4, 4], [0, 1, 2, 0]), ([8, 1], [2, 0])):
        x = (
            torch.randn(sum(counts), 160, generator=g) * torch.rand(sum(counts), 1, generator=g) * 4
        ).bfloat16()
        ref = _grouped_reference(x, counts, ids, w)
        got = kernel(x, torch.tensor(counts), torch.tensor(ids), blocks, scales)
        bound = torch.cat([q8_error_bound(xg, w[e]) for xg, e in zip(x.split(counts), ids)])
        err = (got - ref).abs()
        assert (err <= bound + 1e-5 * ref.abs().max()).all()
        assert 0 < err.max() < 0.02 * ref.abs().max()  # int8 rounding shows, and stays small


def test_c_kernel_refuses_a_group_it_cannot_hold():
    from kvreuse.kernels.mxfp4_cpu import MAX_ROWS

    kernel, g, blocks, scales, _ = _kernel_case(6)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(MAX_ROWS + 1, 160, dtype=dtype)
        with pytest.raises(ValueError, match="1 to 8 rows an expert"):
            kernel(x, torch.tensor([MAX_ROWS + 1]), torch.tensor([0]), blocks, scales)
