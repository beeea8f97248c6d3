"""Token usage of a response, and OpenAI's rule for where it goes in a stream.

Without ``stream_options.include_usage`` no chunk carries ``usage``; with it every chunk has
``usage: null`` and one last chunk, with empty ``choices``, carries the totals.  Clients that add up
the usage of every chunk (LangChain does) then count each token once.
"""

from __future__ import annotations

from typing import Any

from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.server.openai.protocol import StreamOptions


def usage(prompt_lens: list[int], outs: list[RequestOutput], n: int = 1) -> dict[str, Any]:
    """Totals over every prompt (``prompt_lens``, each counted once) and all its ``n`` choices.

    ``outs`` is in choice order, prompt by prompt; a prompt's cached tokens are its first choice's
    (the n choices share the prompt, so counting each would overstate the cache).
    """
    prompt = sum(prompt_lens)
    completion = sum(len(o.output_token_ids) for o in outs)
    cached = sum(int(o.cached_tokens or 0) for o in outs[::n])
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


class StreamUsage:
    """Applies the streaming usage rule to every chunk a response sends."""

    def __init__(self, options: StreamOptions | None) -> None:
        self.include = bool(options and options.include_usage)

    def chunk(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A content chunk: ``usage: null`` when usage was asked for, no key otherwise."""
        if self.include:
            obj["usage"] = None
        return obj

    def final(
        self, head: dict[str, Any], totals: dict[str, Any], extra: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The usage-only last chunk (with ``extra``, e.g. the kvreuse extension), or None when not asked for."""
        if not self.include:
            return None
        return {**head, "choices": [], "usage": totals, **extra}
