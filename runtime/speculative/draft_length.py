"""How many tokens a request drafts next, from how its last drafts fared.

A draft that was wholly accepted doubles the next one (up to ``most``); a partly accepted one is cut
to what was accepted plus one; a wholly rejected one also pauses drafting for 2, 4, 8 ... steps
(at most ``MAX_PAUSE``), so a request whose text does not repeat (free chat) soon decodes plainly and
pays for a verification only now and then.
"""

from __future__ import annotations

MAX_PAUSE = 32


class DraftLength:
    """One request's adaptive draft length (see the module docstring)."""

    def __init__(self, start: int = 4, most: int = 16) -> None:
        self.k = min(start, most)
        self.most = most
        self.pause = 0
        self.misses = 0

    def next(self) -> int:
        """Tokens to draft this step (0 while paused)."""
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.k

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        if accepted == drafted:
            self.k = min(self.most, 2 * self.k)
        else:
            self.k = max(2, accepted + 1)
        if accepted == 0:
            self.misses += 1
            self.pause = min(MAX_PAUSE, 1 << self.misses)
        else:
            self.misses = 0
