"""The compiled kernel's state (`sim.kernels.plain_kernel`): named columns, the event heap, a
replica's running list and waiting queue, KV blocks, and the run-length arithmetic.

State lives in a few arrays whose columns are named by module constants (compile-time in numba):
per request `rq`, per replica `rp` (integers) and `rf` (floats), results per request `rt`. The
running list and the waiting queue are linked through request rows (running: admission order,
as `Replica.running`; waiting: a deque). The heap holds rows (time, creation, replica,
generation, iterations, end time) ordered as SimPy orders its timeouts.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from sim.step_time.latency import ECHO_WEIGHTS

# per request (int64)
PROMPT, OUTPUT, COMPUTED, GENERATED, TARGET, BLOCKS, STARTED, SCHED_N, RNEXT, RPREV, WNEXT, \
    PREEMPTS, RQ_COLS = range(13)
# per replica (int64)
MAX_SEQS, BUDGET, BS, KV_BLOCKS, FREE, BUSY, GEN, RUN_K, SEG_INDEX, RHEAD, RTAIL, RCOUNT, \
    WHEAD, WTAIL, WCOUNT, OUTSTANDING, IN_FLIGHT, SAMPLED, N_QUANTILES, ADDED, \
    RP_COLS = range(21)
# per replica (float64): the linear model's coefficients, then state
C0, CP, CD, CC, CX, NOISE, NOISE_STD, RUN_FACTOR, ADD_S, WAKE_S, HOST_S, RUN_START, RUN_A, \
    RUN_B, RUN_F, SEG_START, BUSY_S, ADD_MORE_S, RUN_ECHO, RUN_AT, RF_COLS = range(21)
# per request results (float64)
SCHEDULED_S, FIRST_TOKEN_S, FINISH_S, RT_COLS = range(4)
# counters
EID, EVENTS, SEG_N, HEAP_N = range(4)
SEG_COLS = 17  # sim.engine.request_state.SEG_COLUMNS
W1, W2, W3 = ECHO_WEIGHTS


@njit(cache=True)
def push_event(h, ctr, t, rep, gen, k, t_end):
    """Schedule an event (replica `rep`'s run end; -1: the next arrival) by (time, creation)."""
    i = ctr[HEAP_N]
    ctr[HEAP_N] = i + 1
    eid = ctr[EID]
    ctr[EID] = eid + 1
    while i > 0:
        p = (i - 1) >> 1
        if h[p, 0] < t or (h[p, 0] == t and h[p, 1] < eid):
            break
        h[i] = h[p]
        i = p
    h[i, 0], h[i, 1], h[i, 2], h[i, 3], h[i, 4], h[i, 5] = t, eid, rep, gen, k, t_end


@njit(cache=True)
def pop_event(h, ctr):
    """The earliest event, as a row (time, creation, replica, generation, iterations, end time)."""
    n = ctr[HEAP_N] - 1
    ctr[HEAP_N] = n
    top = h[0].copy()
    last = h[n].copy()
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (h[c + 1, 0] < h[c, 0] or
                          (h[c + 1, 0] == h[c, 0] and h[c + 1, 1] < h[c, 1])):
            c += 1
        if last[0] < h[c, 0] or (last[0] == h[c, 0] and last[1] < h[c, 1]):
            break
        h[i] = h[c]
        i = c
    if n > 0:
        h[i] = last
    return top


@njit(cache=True)
def run_ms(a_ms, b_ms, k, echo_ms, echo_at):
    """Total duration of the first k iterations of a decode run, the after-prefill echo its
    first iterations carry included (`sim.step_time.latency.run_ms`, the same float steps)."""
    ms = k * a_ms + b_ms * k * (k - 1) / 2.0
    if echo_at:
        for i in range(echo_at - 1, min(echo_at - 1 + k, 3)):
            ms += (W1 if i == 0 else (W2 if i == 1 else W3)) * echo_ms
    return ms


@njit(cache=True)
def iterations_within(a_ms, b_ms, dt_ms, echo_ms, echo_at):
    """`sim.step_time.latency.iterations_within`, the same float steps."""
    if dt_ms <= 0:
        return 1
    if b_ms <= 1e-12:
        k = math.ceil(dt_ms / a_ms)
    else:
        h = a_ms - b_ms / 2.0
        k = math.ceil((-h + math.sqrt(h * h + 2.0 * b_ms * dt_ms)) / b_ms)
    k = max(k, 1)
    while k > 1 and run_ms(a_ms, b_ms, k - 1, echo_ms, echo_at) >= dt_ms:
        k -= 1
    while run_ms(a_ms, b_ms, k, echo_ms, echo_at) < dt_ms:
        k += 1
    return k


@njit(cache=True)
def cdiv(a, b):
    """Ceiling division (blocks for tokens)."""
    return -(-a // b)


@njit(cache=True)
def alloc(rq, rp, j, r, tokens_after):
    """`Replica._alloc` without a prefix cache: blocks for `tokens_after`; False: no room."""
    need = cdiv(tokens_after, rp[j, BS]) - rq[r, BLOCKS]
    if need <= 0:
        return True
    if need > rp[j, FREE]:
        return False
    rp[j, FREE] -= need
    rq[r, BLOCKS] += need
    return True


@njit(cache=True)
def unlink_running(rq, rp, j, r):
    """Remove request r from replica j's running list."""
    p, q = rq[r, RPREV], rq[r, RNEXT]
    if p >= 0:
        rq[p, RNEXT] = q
    else:
        rp[j, RHEAD] = q
    if q >= 0:
        rq[q, RPREV] = p
    else:
        rp[j, RTAIL] = p
    rp[j, RCOUNT] -= 1


@njit(cache=True)
def append_running(rq, rp, j, r):
    """Append request r to replica j's running list."""
    t = rp[j, RTAIL]
    rq[r, RPREV], rq[r, RNEXT] = t, -1
    if t >= 0:
        rq[t, RNEXT] = r
    else:
        rp[j, RHEAD] = r
    rp[j, RTAIL] = r
    rp[j, RCOUNT] += 1


@njit(cache=True)
def append_waiting(rq, rp, j, r):
    """Append request r to replica j's waiting queue."""
    rq[r, WNEXT] = -1
    if rp[j, WTAIL] >= 0:
        rq[rp[j, WTAIL], WNEXT] = r
    else:
        rp[j, WHEAD] = r
    rp[j, WTAIL] = r
    rp[j, WCOUNT] += 1


@njit(cache=True)
def pop_waiting(rq, rp, j):
    """Pop the head of replica j's waiting queue."""
    r = rp[j, WHEAD]
    rp[j, WHEAD] = rq[r, WNEXT]
    if rp[j, WHEAD] < 0:
        rp[j, WTAIL] = -1
    rp[j, WCOUNT] -= 1
    return r


@njit(cache=True)
def preempt(rq, rp, j, v):
    """`Replica._preempt`: free v's blocks; it recomputes from the start, first in the queue."""
    unlink_running(rq, rp, j, v)
    rp[j, FREE] += rq[v, BLOCKS]
    rq[v, BLOCKS] = 0
    rq[v, COMPUTED] = 0
    rq[v, TARGET] = rq[v, PROMPT] + rq[v, GENERATED]
    rq[v, PREEMPTS] += 1
    rq[v, WNEXT] = rp[j, WHEAD]  # appendleft
    rp[j, WHEAD] = v
    if rp[j, WTAIL] < 0:
        rp[j, WTAIL] = v
    rp[j, WCOUNT] += 1


@njit(cache=True)
def grow_rows(seg):
    """The rows array with twice the capacity."""
    out = np.empty((2 * seg.shape[0], SEG_COLS))
    out[:seg.shape[0]] = seg
    return out


@njit(cache=True)
def record_run(rp, rf, seg, h, ctr, j, now, env_now, k, a_ms, b_ms, factor, prefill_tokens,
               prefill_seqs, decode_seqs, context, preempted, cached_free, echo_ms, echo_at):
    """The end of `Replica._launch`: record the step's run of k iterations (its first ones
    carrying the echo `echo_ms` from its place `echo_at`), keep it truncatable (k > 1), schedule
    its end. `cached_free`: cached blocks no request holds (free, as vLLM counts them)."""
    rp[j, BUSY] = 1
    rf[j, SEG_START] = now
    m = ctr[SEG_N]
    ctr[SEG_N] = m + 1
    rp[j, SEG_INDEX] = m
    row = seg[m]
    row[0], row[1], row[2], row[3], row[4], row[5] = j, now, k, a_ms, b_ms, factor
    row[6], row[7], row[8], row[9] = prefill_tokens, prefill_seqs, decode_seqs, context
    row[10], row[11] = rp[j, RCOUNT], rp[j, WCOUNT]
    row[12] = rp[j, KV_BLOCKS] - rp[j, FREE] - cached_free
    row[13], row[14], row[15], row[16] = rp[j, KV_BLOCKS], preempted, echo_ms, echo_at
    rp[j, RUN_K] = k if k > 1 else 0
    rf[j, RUN_START], rf[j, RUN_A], rf[j, RUN_B], rf[j, RUN_F] = now, a_ms, b_ms, factor
    rf[j, RUN_ECHO], rf[j, RUN_AT] = echo_ms, echo_at
    rp[j, GEN] += 1
    t_end = now + run_ms(a_ms, b_ms, k, echo_ms, echo_at) * factor / 1e3
    push_event(h, ctr, env_now + (t_end - env_now), j, rp[j, GEN], k, t_end)
    ctr[EVENTS] += 1


@njit(cache=True)
def truncate_run(rp, rf, seg, h, ctr, j, env_now):
    """`Replica._truncate`: end replica j's run of iterations at the boundary after now."""
    start, a_ms, b_ms, factor = rf[j, RUN_START], rf[j, RUN_A], rf[j, RUN_B], rf[j, RUN_F]
    echo_ms, echo_at = rf[j, RUN_ECHO], int(rf[j, RUN_AT])
    k_new = iterations_within(a_ms, b_ms, (env_now - start) * 1e3 / factor, echo_ms, echo_at)
    if k_new < rp[j, RUN_K]:
        rp[j, GEN] += 1
        rp[j, RUN_K] = k_new
        seg[rp[j, SEG_INDEX], 2] = k_new
        t_end = start + run_ms(a_ms, b_ms, k_new, echo_ms, echo_at) * factor / 1e3
        push_event(h, ctr, env_now + (t_end - env_now), j, rp[j, GEN], k_new, t_end)
        ctr[EVENTS] += 1
