"""The prefix cache compiled (numba): `sim.engine.prefix_cache.PrefixCache` on arrays, for the
program kernel (`sim.kernels.program_kernel`).

The reference keeps each replica's cached blocks in a dict (block identity -> references) whose
order is the eviction order (a freed block re-enters at the end). Here a block is a node of a
doubly linked list per replica in that same order, found through one open-addressing hash table
(linear probing, backward-shift deletion) over all replicas, whose entries hold (identity, node)
side by side: a probe reads one cache line, not the node's too. A request holds the leading
`SHARED` blocks of its prompt (what the reference's `held` lists: `take` takes the first n,
`store` appends the next ones), so its block identities are computed, not stored: block i of
group g on replica j is `(g * MAX_BLOCKS + i + 1) * replicas + j`. A request's own blocks,
freed, are one node (the reference's `(OWN, idx)` run) of identity
`-(idx * replicas + j) - 2`. A request whose prompt names a prefix chain (nested prefixes, the
reference's `Req.chain`) passes its links, `links = [n, group_1, end_1, ..., group_n, end_n]`
(`link_group`): block i is then the block of the first link's group ending at or after the
block's end, as the reference's `block_ids` names it; `links[0] == 0` where it has none.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# node columns (int64): identity, references, previous and next in its replica's order; a
# request's run of own blocks (identity < 0, never referenced) holds blocks [LO, HI)
KEY, REF, PREV, NEXT, LO, HI, PC_COLS = range(7)
MAX_BLOCKS = 1 << 20
"""prompt blocks a group may have (identities stay unique below it)"""
_MIX = -7046029254386353131  # 2^64 / golden ratio as int64: Fibonacci hashing


@njit(cache=True)
def _slot(key, mask):
    return ((key * _MIX) >> 20) & mask


@njit(cache=True)
def find(tab, pc, key):
    """The node holding block `key`, or -1."""
    mask = tab.shape[0] - 1
    i = _slot(key, mask)
    while tab[i, 1] >= 0:
        if tab[i, 0] == key:
            return tab[i, 1]
        i = (i + 1) & mask
    return -1


@njit(cache=True)
def _table_put(tab, pc, node):
    mask = tab.shape[0] - 1
    i = _slot(pc[node, KEY], mask)
    while tab[i, 1] >= 0:
        i = (i + 1) & mask
    tab[i, 0], tab[i, 1] = pc[node, KEY], node


@njit(cache=True)
def _table_delete(tab, pc, key):
    mask = tab.shape[0] - 1
    i = _slot(key, mask)
    while tab[i, 0] != key:
        i = (i + 1) & mask
    j = i
    while True:  # backward shift: move later entries of the probe run into the hole
        j = (j + 1) & mask
        if tab[j, 1] < 0:
            break
        k = _slot(tab[j, 0], mask)
        if (i <= j and i < k <= j) or (i > j and (k > i or k <= j)):
            continue
        tab[i, 0], tab[i, 1] = tab[j, 0], tab[j, 1]
        i = j
    tab[i, 0], tab[i, 1] = -1, -1


@njit(cache=True)
def _link_tail(pc, lru, j, node):
    t = lru[j, 1]
    pc[node, PREV], pc[node, NEXT] = t, -1
    if t >= 0:
        pc[t, NEXT] = node
    else:
        lru[j, 0] = node
    lru[j, 1] = node


@njit(cache=True)
def _unlink(pc, lru, j, node):
    p, q = pc[node, PREV], pc[node, NEXT]
    if p >= 0:
        pc[p, NEXT] = q
    else:
        lru[j, 0] = q
    if q >= 0:
        pc[q, PREV] = p
    else:
        lru[j, 1] = p


@njit(cache=True)
def insert(tab, pc, lru, free, j, key):
    """Cache block `key` on replica j, held once, at the end of its order."""
    node = free[0]
    free[0] = pc[node, NEXT]
    free[1] += 1
    pc[node, KEY], pc[node, REF] = key, 1
    _link_tail(pc, lru, j, node)
    _table_put(tab, pc, node)


@njit(cache=True)
def _free_node(tab, pc, lru, free, j, node):
    _unlink(pc, lru, j, node)
    _table_delete(tab, pc, pc[node, KEY])
    pc[node, NEXT] = free[0]
    free[0] = node
    free[1] -= 1


@njit(cache=True)
def evict(tab, pc, lru, free, j, gain):
    """`PrefixCache.evict`: drop unreferenced blocks of replica j, first in order first (a run
    of own blocks from its end), until `gain` are dropped or none is left; the number
    dropped."""
    dropped = 0
    node = lru[j, 0]
    while node >= 0 and dropped < gain:
        nxt = pc[node, NEXT]
        if pc[node, REF] == 0:
            if pc[node, KEY] < 0:
                m = min(gain - dropped, pc[node, HI] - pc[node, LO])
                pc[node, HI] -= m
                dropped += m
                if pc[node, HI] == pc[node, LO]:
                    _free_node(tab, pc, lru, free, j, node)
            else:
                _free_node(tab, pc, lru, free, j, node)
                dropped += 1
        node = nxt
    lru[j, 2] -= dropped
    return dropped


@njit(cache=True)
def run_key(idx, replicas, j):
    """The identity of request idx's run of own blocks on replica j."""
    return -(idx * replicas + j) - 2


@njit(cache=True)
def drop_run(tab, pc, lru, free, j, idx, replicas):
    """`PrefixCache.drop_run`: request idx's own cached blocks leave the cache; how many."""
    node = find(tab, pc, run_key(idx, replicas, j))
    if node < 0:
        return 0
    size = pc[node, HI] - pc[node, LO]
    _free_node(tab, pc, lru, free, j, node)
    lru[j, 2] -= size
    return size


@njit(cache=True)
def put_run(tab, pc, lru, free, j, idx, lo, hi, replicas):
    """Request idx's own blocks [lo, hi) join the cache, unreferenced, at the end of its order."""
    insert(tab, pc, lru, free, j, run_key(idx, replicas, j))
    node = lru[j, 1]
    pc[node, REF], pc[node, LO], pc[node, HI] = 0, lo, hi
    lru[j, 2] += hi - lo


@njit(cache=True)
def block_key(group, i, replicas, j):
    """The identity of prompt block i (0-based) of a prefix group on replica j."""
    return (group * MAX_BLOCKS + i + 1) * replicas + j


@njit(cache=True)
def link_group(links, group, i, bs):
    """The group whose block i (0-based, `bs` tokens a block) a request's prompt holds: its
    prefix group, or, where it names a chain, the first link ending at or after the block."""
    n = links[0]
    if n == 0:
        return group
    end, k = (i + 1) * bs, 0
    while k < n - 1 and links[2 + 2 * k] < end:
        k += 1
    return links[1 + 2 * k]


@njit(cache=True)
def unref(tab, pc, lru, j, group, links, bs, shared, replicas):
    """`PrefixCache.unref`: a request stops holding its first `shared` blocks; each re-enters
    the order at its end (the last block first); unreferenced ones become evictable."""
    for i in range(shared - 1, -1, -1):
        node = find(tab, pc, block_key(link_group(links, group, i, bs), i, replicas, j))
        pc[node, REF] -= 1
        _unlink(pc, lru, j, node)
        _link_tail(pc, lru, j, node)
        if pc[node, REF] == 0:
            lru[j, 2] += 1


@njit(cache=True)
def lookup(tab, pc, j, group, links, bs, shared, limit, idx, replicas):
    """`PrefixCache.lookup`: of a request's `shared` group blocks (its first `limit` blocks at
    most), how many lead cached; how many of its own blocks follow them; how many of those
    blocks no request holds."""
    n = unheld = 0
    while n < min(shared, limit):
        node = find(tab, pc, block_key(link_group(links, group, n, bs), n, replicas, j))
        if node < 0:
            return n, 0, unheld
        unheld += pc[node, REF] == 0
        n += 1
    own = 0
    if n == shared:
        node = find(tab, pc, run_key(idx, replicas, j))
        if node >= 0 and pc[node, LO] == shared:
            own = max(0, min(pc[node, HI], limit) - shared)
    return n, own, unheld + own


@njit(cache=True)
def take(tab, pc, lru, free, j, group, links, bs, n, own, idx, replicas):
    """`PrefixCache.take`: hold the first n group blocks and the request's first `own` own
    blocks; the own blocks it did not take leave the cache: the number freed."""
    for i in range(n):
        node = find(tab, pc, block_key(link_group(links, group, i, bs), i, replicas, j))
        if pc[node, REF] == 0:
            lru[j, 2] -= 1
        pc[node, REF] += 1
    if own:
        return drop_run(tab, pc, lru, free, j, idx, replicas) - own
    return 0


@njit(cache=True)
def store(tab, pc, lru, free, j, group, links, bs, shared, full, replicas):
    """`PrefixCache.store`: blocks shared..full-1 join the cache, held by the request, up to the
    first that is cached already; the number that joined."""
    added = 0
    for i in range(shared, full):
        key = block_key(link_group(links, group, i, bs), i, replicas, j)
        if find(tab, pc, key) >= 0:
            break
        insert(tab, pc, lru, free, j, key)
        added += 1
    return added


def new_cache(nodes: int, replicas: int):
    """Empty state for `nodes` blocks: (nodes, hash table, per replica (first, last,
    evictable), free list (head, in use))."""
    pc = np.full((nodes, PC_COLS), -1, dtype=np.int64)
    pc[:, NEXT] = np.arange(1, nodes + 1)
    pc[-1, NEXT] = -1
    tab = np.full((_table_size(nodes), 2), -1, dtype=np.int64)
    lru = np.zeros((replicas, 3), dtype=np.int64)
    lru[:, :2] = -1
    return pc, tab, lru, np.array([0, 0], dtype=np.int64)


def grow_cache(pc: np.ndarray, free: np.ndarray):
    """The nodes and a rebuilt table with twice the capacity (links and order kept)."""
    n = pc.shape[0]
    out = np.full((2 * n, PC_COLS), -1, dtype=np.int64)
    out[:n] = pc
    out[n:, NEXT] = np.arange(n + 1, 2 * n + 1)
    out[-1, NEXT] = free[0]  # the old free list continues after the new nodes
    free[0] = n
    tab = np.full((_table_size(2 * n), 2), -1, dtype=np.int64)
    _rehash(tab, out, n, free[0])
    return out, tab


@njit(cache=True)
def _rehash(tab, pc, old, first_new):
    used = np.ones(old, dtype=np.bool_)  # a node is in use unless on the old free list
    node = pc[pc.shape[0] - 1, NEXT]
    while node >= 0 and node < old:
        used[node] = False
        node = pc[node, NEXT]
    for node in range(old):
        if used[node]:
            _table_put(tab, pc, node)


def _table_size(nodes: int) -> int:
    return 1 << max(4, int(2 * nodes - 1).bit_length())
