"""What other eviction policies would have hit on this server's own traffic (miniature simulations).

No policy is best on every workload: on the Mooncake trace ``answer`` beats LRU on one half and
loses to it on the other (``docs/traces.md``).  So a server can run *shadows*
(``--eviction-shadows lru,answer``): each a radix tree with the pool's page count under another
policy, holding page ids only (no KV is kept or computed), that replays every finished request:
match its prompt as admission does, then insert the whole pages it computed, evicting in that
policy's order.  A shadow's cached tokens, over the same prompt tokens as the pool's own, say what
that policy would have served here, so an operator chooses ``--eviction`` from their own traffic.

What a shadow leaves out, so that its figures are read as an estimate:

* Requests replay one at a time in the order they finish.  With one request at a time a shadow
  of the serving policy is the pool itself (``tests/test_eviction_shadows.py`` checks it token for
  token); with concurrent requests the pool also holds the running requests' pages, which a
  shadow does not.
* Only the pool: no host, disk or shared tier, no pins (a pinned session counts as evictable).
* Full attention only: an engine with per-node states (hybrid and sliding-window models, whose
  matches end where a snapshot is) refuses shadows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from runtime.cache.page_allocator import PageAllocator
from runtime.cache.radix_cache import RadixCache, TreeNode
from runtime.request import CacheScope


class ShadowStats(NamedTuple):
    """Over the requests the shadows replayed: their prompt tokens, what the pool served of them, and
    what each shadow policy would have."""

    prompt_tokens: int
    served_tokens: int
    cached_tokens: dict[str, int]


class Shadow:
    """One policy's metadata-only copy of the pool (see the module docstring)."""

    def __init__(self, policy: str, num_pages: int, page_size: int, chunk_size: int) -> None:
        self.policy = policy
        self.allocator = PageAllocator(num_pages)
        self.tree = RadixCache(page_size, self.allocator, policy)
        self.chunk_size = chunk_size
        self.cached_tokens = 0

    def replay(self, tokens: Sequence[int], num_prompt: int, num_computed: int, scope: CacheScope) -> None:
        """One request's life in the pool, step for step as the scheduler and the cache manager run it
        alone: match, prefill chunk by chunk (pages reserved, then inserted), decode a token at a time,
        insert at the end.  The same calls in the same order, so a stateful policy sees the same clock."""
        tree, alloc = self.tree, self.allocator
        m = tree.match(tokens[: num_prompt - 1], scope)  # as admission: one token left for the logits
        self.cached_tokens += m.cached_len
        tree.lock(m.handle)
        life = _Life(tree, alloc, tokens, scope, m.handle, list(m.pages))
        done = m.cached_len
        while done < num_prompt:
            n = min(self.chunk_size, num_prompt - done)
            if not life.reserve(done + n):
                break  # the pool cannot hold this request: keep what it computed
            done += n
            if n > 1 or done < num_prompt:  # the scheduler's rule: a sampled one-token chunk inserts nothing
                life.insert(done)
        while done < num_computed and life.reserve(done + 1):
            done += 1
        life.insert(min(done, num_computed))
        tree.finished(life.handle, num_prompt, len(tokens) - num_prompt)
        alloc.free(life.pages[life.in_tree :])
        tree.unlock(life.handle)

    def reset(self) -> None:
        self.tree.reset()


class Shadows:
    """The shadows of one pool, fed each finished request (``CacheManager.finish``)."""

    def __init__(self, policies: Sequence[str], num_pages: int, page_size: int, chunk_size: int) -> None:
        self.shadows = [Shadow(p, num_pages, page_size, chunk_size) for p in policies]
        self.prompt_tokens = self.served_tokens = 0

    def replay(
        self, tokens: Sequence[int], num_prompt: int, num_computed: int, served: int, scope: CacheScope
    ) -> None:
        """A request that the pool served ``served`` cached tokens of finished."""
        self.prompt_tokens += num_prompt
        self.served_tokens += served
        for s in self.shadows:
            s.replay(tokens, num_prompt, num_computed, scope)

    def reset(self) -> None:
        """The pool was emptied (a cache reset): so are the shadows, to stay comparable with it."""
        for s in self.shadows:
            s.reset()

    def check(self) -> None:
        """Every shadow page is in its tree or free (a replay keeps none of its own), and each tree is whole."""
        for s in self.shadows:
            s.tree.check()
            assert s.tree.total_pages + s.allocator.num_free == s.allocator.num_pages, s.policy
            assert s.tree.locked_pages == 0, s.policy

    def stats(self) -> ShadowStats | None:
        return ShadowStats(
            self.prompt_tokens, self.served_tokens, {s.policy: s.cached_tokens for s in self.shadows}
        )


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


def make_shadows(
    policies: Sequence[str], num_pages: int, page_size: int, chunk_size: int
) -> Shadows | NoShadows:
    """Shadows of ``policies`` over a pool of ``num_pages`` pages, or the null object when there are none."""
    return Shadows(policies, num_pages, page_size, chunk_size) if policies else NoShadows()


class _Life:
    """A replayed request's own pages and its handle, as ``CacheManager.reserve`` / ``cache_computed``
    keep them for a real one."""

    def __init__(
        self, tree: RadixCache, alloc: PageAllocator, tokens: Sequence[int], scope: CacheScope,
        handle: TreeNode, pages: list[int],
    ) -> None:  # fmt: skip
        self.tree, self.alloc, self.tokens, self.scope = tree, alloc, tokens, scope
        self.handle, self.pages, self.in_tree = handle, pages, len(pages)

    def reserve(self, total: int) -> bool:
        """Pages for ``total`` computed tokens, evicting as the manager does; False when they do not fit."""
        need = -(-total // self.tree.page_size) - len(self.pages)
        if need > self.alloc.num_free:
            self.tree.evict(need - self.alloc.num_free)
        if need > self.alloc.num_free:
            return False
        if need > 0:
            self.pages.extend(self.alloc.alloc(need))
        return True

    def insert(self, computed: int) -> None:
        """Offer the whole computed pages to the tree and adopt its pages (``cache_computed``)."""
        n_pages = computed // self.tree.page_size
        if n_pages <= self.in_tree:
            return
        res = self.tree.insert(self.tokens[: n_pages * self.tree.page_size], self.pages[:n_pages], self.scope)
        dup_end = res.prefix_len // self.tree.page_size
        if dup_end > self.in_tree:
            self.alloc.free(self.pages[self.in_tree : dup_end])
        self.tree.lock(res.handle)
        self.tree.unlock(self.handle)
        self.handle = res.handle
        self.pages[: len(res.pages)] = res.pages
        self.in_tree = len(res.pages)
