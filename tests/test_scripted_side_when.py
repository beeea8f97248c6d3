"""Issue 56: Claude Code compacts in a fork that sends the main loop's tools with a summary instruction
appended; the script's ``side_when`` makes such a request a side request (the ``side`` text, no step
taken), so the main loop's next request still gets the next step.  Before ``side_when`` the
compaction request took a step (a Read call), which Claude Code's fork refused, and the compaction
failed."""

from __future__ import annotations

from kvreuse.runtime.server.scripted import ScriptedReplies

TOOLS = [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}]
STEPS = [{"tool": "Read", "input": {"file_path": "a"}}, {"text": "Done reading."}]
MARK = "Do NOT call any tools"


def test_a_request_with_tools_and_the_mark_gets_the_side_text_without_taking_a_step():
    r = ScriptedReplies.from_dict({"steps": STEPS, "side": "<summary>s</summary>", "side_when": [MARK]})
    main = [{"role": "user", "content": "Read a."}]
    compact = [*main, {"role": "user", "content": [{"type": "text", "text": f"CRITICAL: {MARK}."}]}]
    assert r.is_side(compact) and not r.is_side(main)
    assert r.next_step(bool(TOOLS) and not r.is_side(compact)) == ({"text": "<summary>s</summary>"}, -1)
    assert r.next_step(bool(TOOLS) and not r.is_side(main)) == (STEPS[0], 0)  # the step was not spent
    assert r.taken == 1 and r.side_replies == 1


def test_without_side_when_a_request_with_tools_takes_a_step():
    r = ScriptedReplies.from_dict({"steps": STEPS})
    assert not r.is_side([{"role": "user", "content": MARK}])
    assert r.next_step(True) == (STEPS[0], 0)
