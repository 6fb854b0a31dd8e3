"""A what-if token stream read a round at a time, compiled: per token one comparison of its first
confident exit against the loaded depth, so a round costs a pass over its tokens and no arrays
of them (`sim.families.helios.whatif`).

A what-if token's max probability at a layer takes one of two values, one at and past its first
confident exit, one before it (`WhatIfDepth`), so a read below compares first exits with the
layer and gives what the array reads of the tokens' rows give, value for value; sums are added
in token order, as `sim.families.helios.blocks.prompt_sums` adds them. The exit draw is here
too: it makes the first exits.
"""

from __future__ import annotations

import numpy as np
from numba import njit


BLOCK = 4096
"""uniforms taken at once: their counts stay in cache across the cumulative shares' passes"""


@njit(cache=True)
def drawn_exits(uniforms, cdf, layers):
    """Per uniform, the layer whose cumulative share first exceeds it (`searchsorted` on the
    right, as `Generator.choice` picks): `layers[k]`, k the count of `cdf[:-1]` at or below it
    (`cdf` does not decrease; fewer than 256 layers). Counted a share at a time over a block of
    uniforms, in bytes: the comparisons vectorise."""
    n = uniforms.size
    count = np.zeros(n, np.uint8)
    out = np.empty(n, layers.dtype)
    for a in range(0, n, BLOCK):
        b = min(n, a + BLOCK)
        us, ks = uniforms[a:b], count[a:b]
        for j in range(cdf.size - 1):
            c = cdf[j]
            for i in range(b - a):
                ks[i] += us[i] >= c
        for i in range(b - a):
            out[a + i] = layers[ks[i]]
    return out


@njit(cache=True)
def past_depth(first_exit, starts, prompts, depth):
    """Per token of `prompts` in turn (stream indices; `starts` index each one's first token),
    whether its first confident exit lies past `depth`. Written as bytes and viewed as bools:
    the comparisons then vectorise (a bool store does not)."""
    total = 0
    for p in prompts:
        total += starts[p + 1] - starts[p]
    out = np.empty(total, np.uint8)
    d = first_exit.dtype.type(depth)
    j = 0
    for p in prompts:
        a, n = starts[p], starts[p + 1] - starts[p]
        src, dst = first_exit[a:a + n], out[j:j + n]
        for t in range(n):
            dst[t] = src[t] > d
        j += n
    return out.view(np.bool_)


@njit(cache=True)
def sums_at_depth(first_exit, starts, prompts, depth, at_past, before):
    """Per prompt of `prompts`, its tokens' values at `depth` (`at_past` at and past a token's
    first confident exit, `before` before it) added in token order from 0.0. Four prompts'
    sums advance side by side: each is its own chain of additions, so theirs overlap where one
    would wait on its last addition."""
    n = prompts.size
    out = np.empty(n)
    pick = np.array([before, at_past])
    j = 0
    while j + 4 <= n:
        a0, a1, a2, a3 = (starts[prompts[j]], starts[prompts[j + 1]], starts[prompts[j + 2]],
                          starts[prompts[j + 3]])
        e0, e1, e2, e3 = (starts[prompts[j] + 1], starts[prompts[j + 1] + 1],
                          starts[prompts[j + 2] + 1], starts[prompts[j + 3] + 1])
        m = min(min(e0 - a0, e1 - a1), min(e2 - a2, e3 - a3))
        s0 = s1 = s2 = s3 = 0.0
        for t in range(m):
            s0 += pick[np.int64(first_exit[a0 + t] <= depth)]
            s1 += pick[np.int64(first_exit[a1 + t] <= depth)]
            s2 += pick[np.int64(first_exit[a2 + t] <= depth)]
            s3 += pick[np.int64(first_exit[a3 + t] <= depth)]
        out[j] = _added(s0, first_exit, a0 + m, e0, depth, pick)
        out[j + 1] = _added(s1, first_exit, a1 + m, e1, depth, pick)
        out[j + 2] = _added(s2, first_exit, a2 + m, e2, depth, pick)
        out[j + 3] = _added(s3, first_exit, a3 + m, e3, depth, pick)
        j += 4
    for k in range(j, n):
        out[k] = _added(0.0, first_exit, starts[prompts[k]], starts[prompts[k] + 1], depth, pick)
    return out


@njit(cache=True)
def _added(s, first_exit, a, e, depth, pick):
    """`s` and then the values of tokens a..e-1 in turn."""
    for t in range(a, e):
        s += pick[np.int64(first_exit[t] <= depth)]
    return s


@njit(cache=True)
def first_exit_counts(first_exit, starts, prompts, layers):
    """Per layer 0..`layers`, the tokens of `prompts` whose first confident exit it is."""
    out = np.zeros(layers + 1, np.int64)
    for p in prompts:
        for t in range(starts[p], starts[p + 1]):
            out[first_exit[t]] += 1
    return out


@njit(cache=True)
def column_sums_at(first_exit, starts, prompts, values, start):
    """Per exit c (0-based), `start[c]` and then each token's value at it added in token order:
    `values[1, c]` where the token's first confident exit is at or before layer c + 1, else
    `values[0, c]` (each exit its own sum, so the exits' additions run side by side)."""
    out = start.copy()
    depth = values.shape[1]
    for p in prompts:
        for t in range(starts[p], starts[p + 1]):
            f = first_exit[t]
            for c in range(depth):
                out[c] += values[np.int64(f <= c + 1), c]
    return out
