"""What other eviction policies would have hit on this server's own traffic (miniature simulations).

No policy is best on every workload: on the Mooncake trace ``answer`` beats LRU on one half and
loses to it on the other (``docs/traces.md``).  So a server can run *shadows*
(``--eviction-shadows lru,answer``): per policy, a ``CacheManager`` of its own with the pool's page
count, holding page ids only (no KV is kept or computed), that replays every finished request alone,
call for call as the scheduler ran it (``CacheManager.replay``: admit, prefill chunk by chunk, decode,
release).  A shadow's cached tokens, over the same prompt tokens as the pool's own, say what that
policy would have served here, so an operator chooses ``--eviction-policy`` from their own traffic.

What a shadow leaves out, so that its figures are read as an estimate:

* Requests replay one at a time in the order they finish.  With one request at a time a shadow
  of the serving policy is the pool itself (``tests/test_eviction_shadows.py`` checks it token for
  token); with concurrent requests the pool also holds the running requests' pages, which a
  shadow does not.
* Only the pool: no host, disk or shared tier (sessions are pinned as in the pool).
* Full attention only: an engine with per-node states (hybrid and sliding-window models, whose
  matches end where a snapshot is) refuses shadows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from kvreuse.runtime.request import CacheScope


class ShadowPool(Protocol):
    """What a shadow needs of a cache manager (``CacheManager`` is one; built by ``manager.make_shadows``)."""

    def replay(
        self, tokens: Sequence[int], num_prompt: int, num_computed: int, scope: CacheScope, chunk_size: int
    ) -> int: ...

    def reset(self) -> None: ...

    def check_integrity(self) -> object: ...


class ShadowStats(NamedTuple):
    """Over the requests the shadows replayed: their prompt tokens, what the pool served of them, and
    what each shadow policy would have."""

    prompt_tokens: int
    served_tokens: int
    cached_tokens: dict[str, int]


class Shadows:
    """The shadows of one pool, by policy, fed each finished request (``CacheManager.finish``)."""

    def __init__(self, pools: dict[str, ShadowPool], chunk_size: int) -> None:
        self.pools = pools
        self.chunk_size = chunk_size
        self.cached = dict.fromkeys(pools, 0)
        self.prompt_tokens = self.served_tokens = 0

    def replay(
        self, tokens: Sequence[int], num_prompt: int, num_computed: int, served: int, scope: CacheScope
    ) -> None:
        """A request that the pool served ``served`` cached tokens of finished."""
        self.prompt_tokens += num_prompt
        self.served_tokens += served
        for policy, pool in self.pools.items():
            self.cached[policy] += pool.replay(tokens, num_prompt, num_computed, scope, self.chunk_size)

    def reset(self) -> None:
        """The pool was emptied (a cache reset): so are the shadows, to stay comparable with it."""
        for pool in self.pools.values():
            pool.reset()

    def check(self) -> None:
        for pool in self.pools.values():
            pool.check_integrity()

    def stats(self) -> ShadowStats | None:
        return ShadowStats(self.prompt_tokens, self.served_tokens, dict(self.cached))


class NoShadows:
    """No shadows (the default): nothing replayed, no figures."""

    def replay(
        self, tokens: Sequence[int], num_prompt: int, num_computed: int, served: int, scope: CacheScope
    ) -> None:
        pass

    def reset(self) -> None:
        pass

    def stats(self) -> ShadowStats | None:
        return None
