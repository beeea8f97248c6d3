"""Incremental detokenisation with stop strings that never leak into a stream."""

from __future__ import annotations


class IncrementalDetokenizer:
    """Decodes a growing token list into text deltas (vLLM's prefix/read offset method).

    A delta is held back while it ends in an incomplete UTF-8 sequence, or while its tail
    could still be the start of a stop string.
    """

    def __init__(self, tokenizer, stop: list[str]) -> None:
        self.tok = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # all decoded text so far (stop string cut off once found)
        self.emitted = 0  # chars of self.text already returned
        self.stopped = False

    def add(self, token_id: int) -> str:
        """Append one token; return the text that is now safe to emit."""
        self.ids.append(token_id)
        prefix = self.tok.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        full = self.tok.decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        for s in self.stop:
            at = self.text.find(s, max(0, self.emitted - len(s)))
            if at != -1:
                self.text = self.text[:at]
                self.stopped = True
        hold = 0 if self.stopped else self._partial_stop_len()
        end = max(self.emitted, len(self.text) - hold)
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta

    def flush(self) -> str:
        """At the end of a request: everything not yet emitted (a partial stop string is plain text then)."""
        delta = self.text[self.emitted :]
        self.emitted = len(self.text)
        return delta

    def _partial_stop_len(self) -> int:
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:n]):
                    best = max(best, n)
                    break
        return best
