"""Our model code against transformers: logits within 1e-4 (fp32), greedy generation token-identical."""

from __future__ import annotations

import pytest
import torch

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.sampling.params import SamplingParams
from tests.helpers import load_hf
from tests.parity import all_logits, assert_greedy_matches_generate, assert_logits_match

ARCHS = [(a, t) for a in ("llama", "qwen2", "qwen3") for t in (False, True)] + [
    ("llama3-rope", False),
    ("mistral", False),
]
LENGTHS = [1, 2, 7, 31, 64, 129, 300]


_our_all_logits = all_logits  # the name other families' parity tests import


@pytest.mark.parametrize("arch,tie", ARCHS)
def test_logits_match_transformers(tiny_models, arch, tie):
    d = tiny_models[(arch, tie)]
    eng = Engine(model_dir=str(d), dtype="float32", device="cpu", num_pages=64, page_size=16)
    assert_logits_match(eng, load_hf(d), LENGTHS, label=f"{arch} tie={tie}")


@pytest.mark.parametrize("arch,tie", ARCHS)
def test_greedy_generation_matches_generate(tiny_models, arch, tie):
    d = tiny_models[(arch, tie)]
    eng = Engine(model_dir=str(d), dtype="float32", device="cpu", num_pages=128, page_size=4, chunk_size=64)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (5, 77, 150)]
    assert_greedy_matches_generate(eng, load_hf(d), prompts)


EMBEDDED_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
]


def test_embedded_smollm2_greedy_matches_transformers():
    from tests.helpers import embedded_dir

    d = embedded_dir()
    hf = load_hf(d)
    eng = Engine(model_dir=str(d), dtype="float32", device="cpu", kv_cache_memory="128M")
    tok = eng.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
               for p in EMBEDDED_PROMPTS]  # fmt: skip
    ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    outs = eng.generate(ids, SamplingParams(max_tokens=32, ignore_eos=True))
    hf.generation_config.eos_token_id = None
    for p, out in zip(ids, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False, pad_token_id=0)[
                0, len(p) :
            ]
        assert out.output_token_ids == ref.tolist()
