"""The prefix cache: which KV pages hold which token prefixes, who owns each page, and what is kept.

``manager.CacheManager`` (page ownership between requests and the cache) speaks only the
``prefix_cache.PrefixCache`` interface; ``registry`` builds the cache a ``--prefix-cache`` kind names
(the radix tree of ``radix_tree`` / ``radix_cache``, with host/disk tiers in ``tiered_cache`` over
``store/``, or the naive ``NoPrefixCache``).  ``eviction`` orders what may go, ``pins`` keeps sessions'
prefixes, ``node_states`` / ``state_slots`` keep a hybrid model's recurrent-state snapshots beside the
pages, ``page_allocator`` is the free list.  Whose a prefix is comes with each request
(``runtime/request.py``'s ``CacheScope``).
"""
