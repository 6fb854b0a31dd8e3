"""A replica's prefix cache: KV blocks of shared prompt prefixes, by prefix group, LRU-evicted.

An entry is [blocks, refcount]: the running requests that borrow it hold a reference; an entry
no request references stays cached (its blocks count as `evictable`) until a KV allocation needs
the room, least recently used first. `evictable` is kept as references change, so asking how
much room eviction could make costs nothing however many prefixes are cached.
"""

from __future__ import annotations

from sim.request_state import Req


class PrefixCache:
    """Group -> [blocks, refcount] in LRU order, with the unreferenced blocks counted."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.entries: dict[int, list[int]] = {}
        self.evictable = 0

    def evict(self, gain: int) -> int:
        """Drop unreferenced entries, least recently used first, until `gain` blocks are free
        (or none is left); the blocks freed."""
        victims = []
        for g, (b, ref) in self.entries.items():
            if gain <= 0:
                break
            if ref == 0:
                victims.append(g)
                gain -= b
        freed = 0
        for g in victims:
            freed += self.entries.pop(g)[0]
        self.evictable -= freed
        return freed

    def unref(self, group: int) -> None:
        """A request stops borrowing the group's prefix."""
        entry = self.entries[group]
        entry[1] -= 1
        if entry[1] == 0:
            self.evictable += entry[0]

    def hit(self, r: Req) -> None:
        """A request about to prefill borrows its group's cached prefix, if there is one."""
        entry = self.entries.get(r.group)
        if entry is None:
            return
        self.entries[r.group] = self.entries.pop(r.group)  # refresh LRU position
        if entry[1] == 0:
            self.evictable -= entry[0]
        entry[1] += 1
        r.shared = entry[0]
        r.computed = min(entry[0] * self.block_size, r.target - 1)

    def store(self, r: Req) -> None:
        """After a prefill chunk: its full blocks of the group's prefix join the cache."""
        full = min(r.prefix_tokens, r.computed) // self.block_size
        entry = self.entries.get(r.group)
        if r.shared:
            # A request that borrowed the group's prefix and computed a longer one (the next
            # chunk of a growing reasoning prefix) extends the entry with its own blocks.
            if entry is not None and r.shared == entry[0] and full > entry[0]:
                r.blocks -= full - entry[0]
                r.shared = entry[0] = full
            return
        if entry is not None:
            return
        if full > 0:
            r.blocks -= full
            r.shared = full
            self.entries[r.group] = [full, 1]
