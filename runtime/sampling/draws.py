"""A request's randomness by output position, so a seeded request samples the same text however its
tokens are batched, drafted or verified.

The draw of the token at output position ``p`` uses a generator seeded from ``(seed, p)`` alone, never
one stream consumed draw by draw: speculative decoding verifies a varying number of drafted rows per
step (drafts come from the tenant's history, which other requests change), so a shared stream would
give each call different numbers and a seed would not reproduce.  ``runtime/speculative/verify.py``
draws each verified row's target exactly as an undrafted step at that position would.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import torch


def fresh_seed() -> int:
    """A seed from the OS's entropy: an unseeded request's draws, unrelated to any other request's."""
    return secrets.randbits(63)


@dataclass(frozen=True)
class Draws:
    """The draws of one request from output position ``start`` on (``at`` moves it)."""

    seed: int
    start: int = 0

    def at(self, start: int) -> Draws:
        return Draws(self.seed, start)

    def generator(self, row: int = 0) -> torch.Generator:
        """The generator of the token at output position ``start + row``."""
        key = hashlib.blake2b(f"{self.seed}:{self.start + row}".encode(), digest_size=8).digest()
        return torch.Generator().manual_seed(int.from_bytes(key, "little") >> 1)
