"""Issue 56: a template that requires alternating user/assistant roles (Gemma 3's: "Conversation roles
must alternate") renders what agents send instead of refusing it, as llama.cpp's template polyfills do:
Codex CLI opens with two developer and two user messages, Claude Code's tool results follow its calls.

The server runs the embedded model with the bundled gemma3 template (the template is what is tested;
which tokenizer splits the text does not matter): each request's prompt size is checked against the
token count of the text written out here by hand, the way Gemma's template renders merged turns.
Before the fix every request below was a 400 "the chat template cannot render these messages"."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from kvreuse.chat_templates.alternation import alternate, alternates, requires_alternation
from kvreuse.chat_templates.render import load_template, render_text
from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server():
    aengine = AsyncEngine(Engine(None, kv_cache_memory="64M", max_model_len=1024, max_running=2))
    app = create_app(aengine, ServerConfig("gemma-like", chat_template="gemma3"))
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        yield c, aengine.engine.tokenizer
    aengine.shutdown()


def _turns(bos: str, *turns: tuple[str, str]) -> str:
    body = "".join(f"<start_of_turn>{role}\n{text}<end_of_turn>\n" for role, text in turns)
    return f"{bos}{body}<start_of_turn>model\n"


def _count(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


def test_the_bundled_gemma_template_is_known_to_require_alternation(server):
    _, tok = server
    assert requires_alternation(load_template("gemma3", tok))
    assert not requires_alternation(load_template("qwen3", tok))


def test_codex_shaped_turns_render_merged_as_gemma_would_take_them(server):
    _, tok = server
    src = load_template("gemma3", tok)
    msgs = [{"role": "system", "content": "Sys A."}, {"role": "developer", "content": [{"type": "text", "text": "Sys B."}]},
            {"role": "user", "content": "U1"}, {"role": "user", "content": "U2"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                                  "function": {"name": "ls", "arguments": '{"p": 1}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.py"}, {"role": "user", "content": "U3"}]  # fmt: skip
    with pytest.raises(Exception, match="roles must alternate"):
        render_text(tok, msgs, None, template=src)
    fitted = alternate(msgs, src)
    assert alternates(fitted) and fitted is not msgs
    want = _turns(tok.bos_token, ("user", "Sys A.\n\nSys B.\n\nU1\n\nU2"),
                  ("model", '{"tool_calls": [{"name": "ls", "arguments": {"p": 1}}]}'), ("user", "a.py\n\nU3"))  # fmt: skip
    assert render_text(tok, fitted, None, template=src) == want
    parts = [{"role": "system", "content": [{"type": "text", "text": "P1."}, {"type": "text", "text": "P2."}]},
             {"role": "user", "content": "U"}]  # fmt: skip
    assert render_text(tok, alternate(parts, src), None, template=src) == _turns(
        tok.bos_token, ("user", "P1.\n\nP2.\n\nU")
    )
    ok = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert alternate(ok, src) is ok  # already alternating: untouched


def test_chat_completions_with_two_system_and_two_user_messages(server):
    c, tok = server
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "system", "content": "Use tools."},
                         {"role": "user", "content": "Hello."}, {"role": "user", "content": "Fix the test."}],
            "max_tokens": 2, "temperature": 0}  # fmt: skip
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    want = _turns(tok.bos_token, ("user", "Be brief.\n\nUse tools.\n\nHello.\n\nFix the test."))
    assert r.json()["usage"]["prompt_tokens"] == _count(tok, want)


def test_responses_with_codex_shaped_input_and_a_tool_round(server):
    c, tok = server
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "exec_command",
        "arguments": json.dumps({"cmd": "ls"}),
    }
    items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Permissions."}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env/>"}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the test."}]},
             call, {"type": "function_call_output", "call_id": "call_1", "output": "calc.py"}]  # fmt: skip
    tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}}]
    body = {"instructions": "You are Codex.", "input": items, "tools": tools, "max_output_tokens": 2,
            "temperature": 0, "store": True}  # fmt: skip
    r = c.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    want = _turns(tok.bos_token, ("user", "You are Codex.\n\nPermissions.\n\n<env/>\n\nFix the test."),
                  ("model", '{"tool_calls": [{"name": "exec_command", "arguments": {"cmd": "ls"}}]}'),
                  ("user", "calc.py"))  # fmt: skip
    assert r.json()["usage"]["input_tokens"] == _count(tok, want)
    # continuing the stored response: the stored conversation is the one asked (re-fitted, not lost)
    nxt = c.post("/v1/responses", json={"instructions": "You are Codex.", "previous_response_id": r.json()["id"],
                                        "input": "And now?", "max_output_tokens": 2, "temperature": 0})  # fmt: skip
    assert nxt.status_code == 200, nxt.text
    reply = r.json()["output"][-1]["content"][0]["text"].strip()  # the template trims each turn
    want2 = want + f"{reply}<end_of_turn>\n<start_of_turn>user\nAnd now?<end_of_turn>\n<start_of_turn>model\n"
    assert nxt.json()["usage"]["input_tokens"] == _count(tok, want2)


def test_anthropic_tool_result_after_a_call(server):
    c, tok = server
    msgs = [{"role": "user", "content": "List files."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "calc.py"},
                                         {"type": "text", "text": "Go on."}]}]  # fmt: skip
    body = {"model": "claude-sonnet-4-5", "max_tokens": 2, "system": [{"type": "text", "text": "You are Claude Code."}],
            "messages": msgs, "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]}  # fmt: skip
    r = c.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    want = _turns(tok.bos_token, ("user", "You are Claude Code.\n\nList files."),
                  ("model", '{"tool_calls": [{"name": "Bash", "arguments": {"command": "ls"}}]}'),
                  ("user", "calc.py\n\nGo on."))  # fmt: skip
    u = r.json()["usage"]
    assert u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"] == _count(
        tok, want
    )
