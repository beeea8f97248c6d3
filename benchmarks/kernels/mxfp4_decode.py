"""gpt-oss MXFP4 experts kept quantized vs dequantized to bf16: decode speed, expert memory, perplexity.

Run from the repository root: ``python -m kvreuse.benchmarks.kernels.mxfp4_decode [--quick] [--out PATH] [--threads N]``.

One random gpt-oss of a tiny-but-wide MoE shape (bf16 engines, 4 layers, hidden 1024, 16 experts of
width 1024, top-4: 6 MiB bf16 expert matrices, whose weight reads dominate a decode step), its experts
quantized to MXFP4 (``kvreuse.runtime.models.mxfp4.quantize``) and saved twice: as MXFP4 blocks + scales, and
dequantized (transformers' ``convert_moe_packed_tensors``), so both engines hold the same values.
``mxfp4`` keeps the blocks and multiplies straight from them at decode (``kernels/cpu/mxfp4.c``: bf16
activations as int8 per block of 32, MXFP4 x Q8_0); ``bf16`` runs the dequantized experts on the usual
MoE path (``embedding_bag`` for up to 4 rows, grouped GEMMs above).

Decode tokens/s for 1 and 4 streams (``(n - 1) / decode_s`` per stream times the streams; the variants
alternate within each round, tok/s are medians, the ratio is the median of each round's paired ratio);
expert bytes of each engine; perplexity of a synthetic 256-token sequence under each, scored 2 tokens a
step so that it runs the decode kernels (goal: within 1%).
Goal for decode: mxfp4 >= 1.5x bf16 at one stream.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from kvreuse.benchmarks.common import (
    base_parser,
    bench_main,
    format_table,
    interleave,
    median,
    model_dir,
    reps,
    synthetic_prompt,
)

TARGET = 1.5
VOCAB = 8192
SHAPE = dict(
    num_hidden_layers=4, hidden_size=1024, intermediate_size=1024, num_attention_heads=16, num_key_value_heads=8,
    head_dim=64, num_local_experts=16, num_experts_per_tok=4, sliding_window=128, vocab_size=VOCAB,
    max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("mxfp4_decode", __doc__.splitlines()[0])
    p.add_argument("--decode-tokens", type=int, default=32, help="tokens generated per stream")
    p.add_argument("--streams", default="1,4", help="comma-separated stream counts")
    args = p.parse_args(argv)
    if args.quick:
        args.decode_tokens, args.streams = 6, "1"
    return args


def save_pair(root: Path) -> dict[str, Path]:
    """The random model's MXFP4 and dequantized checkpoints (same expert values)."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from kvreuse.runtime.models.mxfp4 import quantize

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("gpt_oss", **SHAPE)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    quant, deq = {}, {}
    for name, t in model.state_dict().items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            pairs = [quantize(t[e].float().T) for e in range(t.shape[0])]  # HF keeps [E, in, out]
            blocks, scales = torch.stack([b for b, _ in pairs]), torch.stack([s for _, s in pairs])
            quant[name + "_blocks"], quant[name + "_scales"] = blocks, scales
            deq[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)
        else:
            quant[name] = deq[name] = t
    out = {}
    for kind, ts in (("mxfp4", quant), ("bf16", deq)):
        d = root / kind
        d.mkdir()
        save_file({k: v.contiguous() for k, v in ts.items()}, str(d / "model.safetensors"))
        c = cfg.to_dict() | ({"quantization_config": {"quant_method": "mxfp4"}} if kind == "mxfp4" else {})
        (d / "config.json").write_text(json.dumps(c))
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if (model_dir() / f).exists():
                shutil.copy(model_dir() / f, d / f)
        out[kind] = d
    return out


def perplexity(eng, ids: list[int]) -> float:
    """exp(mean NLL) of ``ids`` from the engine's prompt logprobs, scored 2 tokens a step so that every
    expert sees at most 2 rows: through the kernels decode uses (an engine without window rings:
    scoring takes no ring slot)."""
    lps = [e[1][0] for e in eng.prompt_logprobs(ids, 0, chunk_size=2) if e[1] is not None]
    return math.exp(-sum(lps) / len(lps))


def run(args: argparse.Namespace) -> dict:
    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.sampling.params import SamplingParams

    streams = [int(s) for s in args.streams.split(",") if s]
    tmp = tempfile.TemporaryDirectory()
    dirs = save_pair(Path(tmp.name))
    opts = dict(dtype="bfloat16", prefix_cache="off", num_pages=1024)
    engines = {k: Engine(model_dir=str(d), **opts) for k, d in dirs.items()}
    bytes_ = {
        k: sum(p.nbytes for n, p in e.runner.model.named_parameters() if ".experts." in n and "bias" not in n)
        for k, e in engines.items()
    }
    seq = synthetic_prompt(256, 7, 3, VOCAB)
    ppl = {}
    for k, d in dirs.items():
        scorer = Engine(model_dir=str(d), **opts, window_paging=False)
        ppl[k] = perplexity(scorer, seq)
        del scorer
    res: dict = {"dtype": "bfloat16", "shape": SHAPE, "expert_bytes": bytes_, "perplexity_256": ppl}
    res["perplexity_ratio"] = ppl["mxfp4"] / ppl["bf16"]
    res["decode"], rows, seed = [], [], [0]

    def decode(k: str, s: int) -> float:
        seed[0] += 1
        prompts = [synthetic_prompt(32, seed[0] * 100 + i, 3, VOCAB) for i in range(s)]
        outs = engines[k].generate(prompts, SamplingParams(max_tokens=args.decode_tokens, ignore_eos=True))
        return max(o.decode_s for o in outs)

    for s in streams:
        variants = {k: (lambda r, k=k, s=s: decode(k, s)) for k in engines}
        t = interleave(variants, reps(args, 5), warmup=True)
        tok_s = {k: s * (args.decode_tokens - 1) / median(v) for k, v in t.items()}
        paired = median([b / a for a, b in zip(t["mxfp4"], t["bf16"])])
        res["decode"].append({"streams": s, "tok_s": tok_s, "mxfp4_vs_bf16_paired": paired, "times_s": t})
        rows.append((f"{s} stream(s)", tok_s["mxfp4"], tok_s["bf16"], paired, paired >= TARGET))
    rows.append(
        ("expert MiB", bytes_["mxfp4"] / 2**20, bytes_["bf16"] / 2**20, bytes_["mxfp4"] / bytes_["bf16"], "")
    )
    rows.append(("perplexity (256 tok)", ppl["mxfp4"], ppl["bf16"], res["perplexity_ratio"],
                 abs(res["perplexity_ratio"] - 1) < 0.01))  # fmt: skip
    table = format_table(["", "mxfp4", "bf16", "mxfp4/bf16", "goal"], rows)
    print(table)
    res["table"], res["target_decode_1_stream"] = table, TARGET
    tmp.cleanup()
    return res


def main(argv: list[str] | None = None) -> int:
    return bench_main("mxfp4_decode", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
