"""`policies.scheduling.FinishedLengths` on arrays, for the program kernel: the token counts of
the programs finished so far (a count per token count, `flc`, and a Fenwick tree over them,
`flt`, 1-based, as long as `flc` plus one, a power of two), so that the kernel computes the
Dynasor scheduler's priority (`sim.kernels.template_calls`) as the Python object does, and the
driver reads and adds to the same arrays (`sim.workloads.kernel_templates.KernelFinished`)."""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def add(flc, flt, tokens):
    """One more finished program of `tokens` tokens (below `len(flc)`)."""
    flc[tokens] += 1
    i = tokens + 1
    while i < flt.shape[0]:
        flt[i] += 1
        i += i & -i


@njit(cache=True)
def median_remaining(flt, n, tokens_done):
    """`FinishedLengths.median_remaining` of `n` finished programs: the upper median of
    (t - tokens_done) over finished counts t > tokens_done; -1 when none is longer."""
    size = flt.shape[0] - 1
    i, below = min(tokens_done + 1, size), 0
    while i:
        below += flt[i]
        i &= i - 1
    longer = n - below
    if longer == 0:
        return -1
    k, pos = below + longer // 2, 0
    while size:
        if flt[pos + size] <= k:
            pos += size
            k -= flt[pos]
        size //= 2
    return pos - tokens_done
