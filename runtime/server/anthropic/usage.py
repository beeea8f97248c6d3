"""Anthropic usage from what the engine saw, exactly.

* ``cache_read_input_tokens``: prompt tokens served from the prefix cache (the engine's
  ``cached_tokens``).
* ``cache_creation_input_tokens``: prompt tokens this request computed and wrote into the cache:
  the prompt's whole pages beyond the cached part (the cache stores whole pages; a partial last
  page is computed but not kept).  0 when the prefix cache is off.
* ``input_tokens``: the rest of the prompt (computed, not kept).

The three add up to the prompt the engine saw (rendered template + any forced tool-call prefix).
"""

from __future__ import annotations

from typing import Any

from kvreuse.runtime.engine.outputs import RequestOutput


def usage(prompt_tokens: int, out: RequestOutput, page_size: int, caching: bool) -> dict[str, Any]:
    read = max(0, min(out.cached_tokens, prompt_tokens))
    created = max(0, prompt_tokens // page_size * page_size - read) if caching else 0
    return {
        "input_tokens": prompt_tokens - read - created,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": created,
        "output_tokens": len(out.output_token_ids),
    }
