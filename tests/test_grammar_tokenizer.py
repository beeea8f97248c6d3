"""A tokenizer llguidance refuses (more tokens than the model's vocabulary) must not stop a server:
``warm()`` (what ``kvreuse serve`` calls before it listens) logs it, and each grammar request gets the
reason as a GrammarError (a 400), not a crash."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from kvreuse.runtime.sampling.constrained.compiler import GrammarCompiler, GrammarError
from kvreuse.runtime.sampling.constrained.spec import json_object
from tests.helpers import embedded_dir


def test_a_refused_tokenizer_is_a_grammar_error_not_a_crash(caplog):
    tok = AutoTokenizer.from_pretrained(embedded_dir())  # 49,152 tokens
    grammars = GrammarCompiler(tok, 512, frozenset({tok.eos_token_id}))
    grammars.warm()  # the old build raised here, and `kvreuse serve` exited with 2
    assert "constrained decoding is unavailable" in caplog.text
    for _ in range(2):  # said again on every request, without another build
        with pytest.raises(GrammarError, match="unavailable for this model's tokenizer"):
            grammars.compiled(json_object())


def test_a_tokenizer_that_fits_compiles():
    tok = AutoTokenizer.from_pretrained(embedded_dir())
    grammars = GrammarCompiler(tok, len(tok), frozenset({tok.eos_token_id}))
    grammars.warm()
    assert grammars.compiled(json_object()) is not None


def test_one_tenants_schemas_never_push_another_tenants_grammar_out(monkeypatch):
    """Issue 51 (tenant budgets on every per-tenant store): the compiled-grammar cache was one LRU, so
    B compiling many schemas evicted A's and A paid the compile again."""
    from kvreuse.runtime.sampling.constrained import compiler
    from kvreuse.runtime.sampling.constrained.spec import json_schema

    monkeypatch.setattr(compiler, "CACHE_SIZE", 4)
    tok = AutoTokenizer.from_pretrained(embedded_dir())
    grammars = GrammarCompiler(tok, len(tok), frozenset({tok.eos_token_id}))
    mine = grammars.compiled(json_object(), "A")
    for i in range(10):
        grammars.compiled(json_schema({"type": "object", "properties": {f"p{i}": {"type": "integer"}}}), "B")
    n = grammars.compiles
    assert grammars.compiled(json_object(), "A") is mine and grammars.compiles == n  # a hit, not a compile
    assert len(grammars._cache) == 4
