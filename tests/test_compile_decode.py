"""``--compile-decode``: decode steps through the torch.compile'd layer give the eager engine's results."""

from __future__ import annotations

import pytest
import torch

from kvreuse.runtime.sampling.params import SamplingParams
from tests.engine_drive import generate_checked, tiny_engine
from tests.helpers import make_tiny_model


@pytest.mark.slow  # inductor compiles the layer once (tens of seconds on 2 cores)
@pytest.mark.parametrize("quantize", ["none", "int4"])
def test_compiled_decode_matches_eager(tmp_path, quantize: str) -> None:
    path = make_tiny_model(tmp_path / "m", arch="qwen2")
    # the torch decode path: the fused CPU kernels (the ``cpu`` backend) would bypass the compiled layer
    opts = dict(
        num_pages=64, page_size=4, record_logits=True, quantize=quantize, attention_backend="reference"
    )
    eager, compiled = tiny_engine(path, **opts), tiny_engine(path, compile_decode=True, **opts)
    assert compiled.runner.decode_path == "compiled" and compiled.runner.backend.name == "reference"
    # two sequences of different lengths decoded together: a padded batch, then one left alone
    prompts = [list(range(3, 30)), list(range(40, 49))]
    params = [SamplingParams(max_tokens=6, ignore_eos=True), SamplingParams(max_tokens=3, ignore_eos=True)]
    want, got = generate_checked(eager, prompts, params), generate_checked(compiled, prompts, params)
    for a, b in zip(want, got):
        assert a.output_ids == b.output_ids
        la, lb = torch.stack(a.logits_trace), torch.stack(b.logits_trace)
        tol = 1e-4 if quantize == "none" else 1e-2  # the int4 kernel takes bf16 activations
        assert torch.allclose(la, lb, atol=tol, rtol=tol), (la - lb).abs().max()
