"""The kinds of prefix cache an engine can run (``--prefix-cache``), each decision about a kind here.

A kind says whether it keeps prefixes at all (the naive baseline does not: nothing ever matches, so
there is nothing to keep a snapshot for, tier below, pin or report as cached) and how to build it.
Everything else reads the kind's facts, never its name.  Builders import their modules when called,
so the CLI can list the kinds without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from kvreuse.runtime.cache.eviction import DEFAULT_POLICY

if TYPE_CHECKING:
    from kvreuse.runtime.cache.page_allocator import PageAllocator
    from kvreuse.runtime.cache.prefix_cache import PrefixCache
    from kvreuse.runtime.cache.store.states import StateTier
    from kvreuse.runtime.cache.store.tiers import LowerTiers
    from kvreuse.runtime.cache.tiered_cache import PageIO


class CacheKind(NamedTuple):
    """A ``--prefix-cache`` choice: its name, whether it keeps prefixes, what it is."""

    name: str
    keeps_prefixes: bool
    about: str


KINDS: dict[str, CacheKind] = {
    k.name: k
    for k in (
        CacheKind("radix", True, "the radix tree of KV pages (host/disk tiers below it when configured)"),
        CacheKind("off", False, "no cache: every prompt is recomputed (the naive baseline)"),
    )
}
DEFAULT_KIND = "radix"
# the kind an eviction policy orders: eviction shadows replay each policy on a cache of this kind
POLICY_KIND = "radix"


def cache_kind(name: str) -> CacheKind:
    """The kind named ``name``; ValueError (one line, with the choices) for any other name."""
    if name not in KINDS:
        raise ValueError(f"prefix_cache must be one of {', '.join(KINDS)}, got {name!r}")
    return KINDS[name]


def make_prefix_cache(
    prefix_cache: str,
    page_size: int,
    allocator: PageAllocator,
    eviction: str = DEFAULT_POLICY,
    tiers: LowerTiers | None = None,
    io: PageIO | None = None,
    write_through: bool = False,
    state_budget: int | None = None,
    state_tier: StateTier | None = None,
    state_span: int | None = None,
) -> PrefixCache:
    """The cache of kind ``prefix_cache`` over ``allocator``'s pages: for ``radix``, with ``tiers`` below it if given
    and per-node states in ``state_budget`` bytes if given (a hybrid model's snapshots), which go below the
    pool to ``state_tier`` when there are tiers (a window model's snapshots; ``state_span``: their window)."""
    if not cache_kind(prefix_cache).keeps_prefixes:
        from kvreuse.runtime.cache.prefix_cache import NoPrefixCache

        return NoPrefixCache(page_size)
    from kvreuse.runtime.cache.node_states import NodeStates, NoNodeStates

    states = NoNodeStates() if state_budget is None else NodeStates(state_budget, state_span)
    if tiers is not None:
        from kvreuse.runtime.cache.tiered_cache import TieredRadixCache

        assert io is not None, "a tiered cache copies pages through the pool's PageIO"
        assert (state_budget is None) == (state_tier is None), (
            "node states go below the pool with a state tier"
        )
        return TieredRadixCache(page_size, allocator, io, tiers, write_through, eviction, states, state_tier)
    from kvreuse.runtime.cache.radix_cache import RadixCache

    return RadixCache(page_size, allocator, eviction, states)
