"""A checkpoint without a chat template (Gemma 3 270M's GGUF has none): the server renders with the
bundled template of its architecture, or refuses in one line naming --chat-template."""

import copy

import pytest

from kvreuse.runtime.loading.tokenizer import load_tokenizer
from kvreuse.runtime.server.templates import NoChatTemplate, resolve_template
from tests.helpers import embedded_dir


@pytest.fixture(scope="module")
def bare_tokenizer():
    tok = copy.deepcopy(load_tokenizer(embedded_dir()))
    tok.chat_template = None
    return tok


def test_bundled_template_of_the_architecture(bare_tokenizer):
    info = resolve_template(bare_tokenizer, None, "gemma3_text")
    assert info.name.startswith("gemma3") and "<start_of_turn>" in info.source


def test_unknown_architecture_names_the_flag(bare_tokenizer):
    with pytest.raises(NoChatTemplate, match="--chat-template"):
        resolve_template(bare_tokenizer, None, "llama")


def test_own_template_still_wins(bare_tokenizer):
    tok = load_tokenizer(embedded_dir())
    assert resolve_template(tok, None, "gemma3_text").source == resolve_template(tok, None).source
