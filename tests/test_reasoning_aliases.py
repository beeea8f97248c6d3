"""Issue 50: an assistant message's reasoning under ``thinking`` or ``reasoning`` (what gpt-oss's
template and other clients use) reaches the template, as ``reasoning_content`` does; it was dropped."""

import pytest

from kvreuse.runtime.server.openai.messages import template_messages
from kvreuse.runtime.server.openai.protocol import ChatCompletionRequest


@pytest.mark.parametrize("key", ["reasoning_content", "thinking", "reasoning"])
def test_reasoning_under_each_name_reaches_the_template(key):
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "12 * 7?"},
            {"role": "assistant", "content": "84.", key: "12 * 7 = 84."},
            {"role": "user", "content": "Halve it."},
        ],
    }
    msgs = template_messages(ChatCompletionRequest.model_validate(body))
    assert msgs[1]["reasoning_content"] == "12 * 7 = 84."
