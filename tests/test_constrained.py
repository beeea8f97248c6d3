"""Constrained decoding on the embedded model, offline engine: outputs valid by construction
(checked with ``jsonschema``, an independent validator), one compile per grammar, logit_bias applied,
and requests without either untouched."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from kvreuse.runtime.engine.engine import Engine, EngineError
from kvreuse.runtime.sampling.constrained import json_object, json_schema, tool_call
from kvreuse.runtime.sampling.masking import apply_constraints
from kvreuse.runtime.sampling.params import SamplingParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age"],
}
TOOLS = [
    ("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    ("add", {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}),
    ("ping", None),
]  # fmt: skip


@pytest.fixture(scope="module")
def eng():
    return Engine(kv_cache_memory=64 << 20)


def _chat(eng: Engine, text: str) -> str:
    msgs = [{"role": "user", "content": text}]
    return eng.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_json_schema_outputs_validate_sampled_and_greedy(eng):
    g = json_schema(PERSON)
    compiled = eng.admission.grammars.compiles  # other tests' grammars
    prompts = [_chat(eng, f"Describe person number {i} as JSON.") for i in range(6)]
    params = [SamplingParams(max_tokens=96, temperature=t, seed=i) for i, t in enumerate([0.0, 1.0] * 3)]
    outs = eng.generate(prompts, [p.__class__(**{**p.__dict__, "grammar": g}) for p in params])
    for o in outs:
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), PERSON)
    assert eng.admission.grammars.compiles == compiled + 1  # six requests, one schema: compiled once


def test_tool_call_grammar_names_a_real_tool_and_validates(eng):
    g = tool_call(TOOLS, "hermes", None)
    head = '<tool_call>\n{"name": "'
    prompts = [_chat(eng, q) + head for q in ("Weather in Oslo?", "What is 2+3?", "Ping the server.", "Hi")]
    outs = eng.generate(prompts, SamplingParams(max_tokens=64, temperature=1.0, seed=3, grammar=g))
    schemas = {n: s or {"type": "object"} for n, s in TOOLS}
    for o in outs:
        call = json.loads(('{"name": "' + o.text).removesuffix("\n</tool_call>"))
        assert call["name"] in schemas, o.text
        jsonschema.validate(call["arguments"], schemas[call["name"]])


def test_json_object_mask_allows_only_an_object_start(eng):
    m = eng.admission.grammars.matcher(json_object())
    logits = torch.zeros(2, eng.runner.cfg.vocab_size)
    params = [SamplingParams(), SamplingParams()]
    out = apply_constraints(logits, params, [m, None])
    allowed = (out[0] > float("-inf")).nonzero().flatten().tolist()
    texts = [eng.tokenizer.decode([t]) for t in allowed]
    assert allowed and all(t.startswith("{") for t in texts)
    assert eng.tokenizer.encode("{", add_special_tokens=False)[0] in allowed
    assert torch.equal(out[1], logits[1])  # the unconstrained row is untouched


def test_no_constraint_costs_nothing():
    logits = torch.randn(3, 50)
    assert apply_constraints(logits, [SamplingParams()] * 3, [None] * 3) is logits


def test_logit_bias_changes_greedy_as_the_bias_says(eng):
    p = _chat(eng, "Say something.")
    base = eng.generate(p, SamplingParams(max_tokens=4))[0].output_token_ids
    forced = eng.generate(p, SamplingParams(max_tokens=4, logit_bias={1234: 100.0}))[0].output_token_ids
    assert forced == [1234] * 4
    banned = eng.generate(p, SamplingParams(max_tokens=1, logit_bias={base[0]: -100.0}))[0].output_token_ids
    assert banned[0] != base[0]


def test_bad_grammar_and_bias_are_engine_errors(eng):
    with pytest.raises(EngineError, match="logit_bias"):
        eng.make_request("hi", SamplingParams(logit_bias={10**7: 1.0}))
    with pytest.raises(EngineError, match="json_schema"):
        eng.make_request(
            "hi",
            SamplingParams(
                grammar=json_schema(
                    {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}
                )
            ),
        )
