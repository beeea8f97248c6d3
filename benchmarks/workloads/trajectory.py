"""The trajectory data model: what an agent saw and said, turn by turn, in one or more threads.

A trajectory is a system prompt, OpenAI function schemas and a list of turns.  Each turn belongs
to a thread (0 = the main agent; 1.. = sub-agents that share the system prompt and tools), carries
the messages appended since that thread's previous request (user message or tool results) and the
assistant message the agent produced.  Replaying the scripted assistant messages, instead of the
model's own replies, keeps every pattern's token stream identical except for the pattern itself.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]


@dataclass(frozen=True)
class Turn:
    """One request/response step of one thread."""

    thread: int
    new: list[Message]
    assistant: Message


@dataclass(frozen=True)
class Trajectory:
    """A replayable agent session (see module docstring)."""

    name: str
    variant: str
    seed: int
    system: str
    tools: list[dict[str, Any]]
    turns: list[Turn] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "variant": self.variant,
            "seed": self.seed,
            "system": self.system,
            "tools": self.tools,
            "turns": [{"thread": t.thread, "new": t.new, "assistant": t.assistant} for t in self.turns],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        turns = [Turn(int(t["thread"]), list(t["new"]), dict(t["assistant"])) for t in d["turns"]]
        return cls(d["name"], d["variant"], int(d["seed"]), d["system"], list(d["tools"]), turns)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n"

    def history(self, k: int) -> list[Message]:
        """Messages (without the system message) that turn ``k``'s thread has seen when it sends request k.

        Deep copies, so patterns can edit them freely.
        """
        thread = self.turns[k].thread
        out: list[Message] = []
        for j in range(k):
            if self.turns[j].thread == thread:
                out += self.turns[j].new
                out.append(self.turns[j].assistant)
        out += self.turns[k].new
        return copy.deepcopy(out)

    def thread_turns(self, k: int) -> list[int]:
        """Indices of the turns of turn ``k``'s thread up to and including ``k``."""
        thread = self.turns[k].thread
        return [j for j in range(k + 1) if self.turns[j].thread == thread]
