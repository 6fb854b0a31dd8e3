"""The plain-request simulation compiled (numba): the reference replica's logic, event for event.

`sim.engine.replica.Replica` under SimPy is the reference: this kernel runs the same decisions in
the same event order (a heap on (time, creation order), as SimPy's queue of timeouts), with the same
float expressions in the same order, so its tables equal the SimPy run's bit for bit
(`tests/test_compiled.py`). It covers what a plain request workload needs (FCFS, chunked prefill,
KV blocks with recompute preemption, runs of decode iterations and their truncation by arrivals,
the linear or the serving step-time model at its mean or sampled, the loop's host time, the
built-in routers); `sim.kernels.plain` decides when it applies. Compiled, the per-request work of the
reference (every running request touched at every event) costs nanoseconds, so the kernel keeps
the reference's simple lists.

Its state, the event heap and the request lists are in `sim.kernels.state`; the serving model's
engine state and speed spells in `sim.kernels.serving` (`eng`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from sim.kernels.state import (
    PROMPT, OUTPUT, COMPUTED, GENERATED, TARGET, BLOCKS, STARTED, SCHED_N, RNEXT, MAX_SEQS,
    BUDGET, BS, FREE, BUSY, GEN, RUN_K, RHEAD, RTAIL, RCOUNT, WHEAD, WCOUNT, OUTSTANDING,
    IN_FLIGHT, SAMPLED, N_QUANTILES, ADDED, C0, CP, CD, CC, CX, NOISE, NOISE_STD, RUN_FACTOR,
    ADD_S, WAKE_S, HOST_S, ADD_MORE_S, SEG_START, BUSY_S, SCHEDULED_S, FIRST_TOKEN_S, FINISH_S,
    RT_COLS, EVENTS, SEG_N, HEAP_N, SEG_COLS, push_event, pop_event, cdiv, alloc,
    unlink_running, append_running, append_waiting, pop_waiting, preempt, grow_rows,
    record_run, truncate_run, iterations_within)
from sim.kernels import serving as V


@njit(cache=True)
def _step_ms(rf, j, p, d, c):
    return rf[j, C0] + rf[j, CP] * p + rf[j, CD] * d + rf[j, CC] * c + rf[j, CX] * p * c / 1e3


@njit(cache=True)
def _noise(rp, rf, rngs, quantiles, j, k, prefill):
    """`Replica._noise`: the step's residual factor (mean, or drawn from the replica's
    generator: numba's Generator draws NumPy's stream); a prefill step's from its own
    quantiles (the rows after every replica's, `plain._noise`)."""
    if rp[j, SAMPLED] == 0:
        return rf[j, NOISE]
    g = rngs[j]
    if k == 1:
        row = j + rp.shape[0] if prefill else j
        return rf[j, RUN_FACTOR] * math.exp(quantiles[row, g.integers(0, rp[j, N_QUANTILES])])
    return rf[j, RUN_FACTOR] * max(0.05, rf[j, NOISE] + rf[j, NOISE_STD] / math.sqrt(k)
                                   * g.standard_normal())


@njit(cache=True)
def _run_length(rq, rp, j):
    """`sim.engine.run_length.decode_run_length` without speculation."""
    bs, free = rp[j, BS], rp[j, FREE]
    k = 1 << 62
    r = rp[j, RHEAD]
    while r >= 0:
        k = min(k, rq[r, OUTPUT] - rq[r, GENERATED])
        r = rq[r, RNEXT]
    if k <= 1:
        return 1
    if rp[j, RCOUNT] * (k // bs + 2) <= free or _extra(rq, rp, j, k) <= free:
        return k
    lo, hi = 1, k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _extra(rq, rp, j, mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


@njit(cache=True)
def _extra(rq, rp, j, it):
    need, bs = 0, rp[j, BS]
    r = rp[j, RHEAD]
    while r >= 0:
        x = cdiv(rq[r, COMPUTED] + it, bs) - rq[r, BLOCKS]
        if x > 0:
            need += x
        r = rq[r, RNEXT]
    return need


@njit(cache=True, inline="always")
def _admit(rq, rp, rt, j, now, budget, tot):
    """`Replica._admit`: waiting requests join the step in queue order while there is a
    sequence slot, token budget and KV room; the number admitted. `tot`: the step's totals
    (context, prefill tokens, prefill sequences, spanned context, attention pairs, new tokens x
    spanned context), added to."""
    admitted = 0
    while rp[j, WCOUNT] > 0 and rp[j, RCOUNT] < rp[j, MAX_SEQS] and budget > 0:
        r = rp[j, WHEAD]
        n = min(rq[r, TARGET] - rq[r, COMPUTED], budget)
        # `Replica._fits_whole`: the whole prompt's blocks free, though the chunk alone is taken
        if cdiv(rq[r, TARGET], rp[j, BS]) - rq[r, BLOCKS] > rp[j, FREE] or \
                not alloc(rq, rp, j, r, rq[r, COMPUTED] + n):
            break
        pop_waiting(rq, rp, j)
        append_running(rq, rp, j, r)
        if rq[r, STARTED] == 0:
            rq[r, STARTED] = 1
            rt[r, SCHEDULED_S] = now
        rq[r, SCHED_N] = n
        admitted += 1
        budget -= n
        _add(tot, rq[r, COMPUTED], rq[r, TARGET], n)
    return admitted


@njit(cache=True, inline="always")
def _add(tot, computed, target, n):
    """Add an entry of n tokens to the step's totals (`entry_totals`, `prefill_spans`)."""
    if computed < target:
        tot[0] += computed + n
        tot[1] += n
        tot[2] += 1
        tot[3] += computed
        tot[4] += n * (computed + n)
        tot[5] += n * computed
    else:
        tot[0] += computed + 1


@njit(cache=True)
def _plan(rq, rp, rf, rt, seg, h, ctr, rngs, quantiles, eng, j, env_now):
    """`Replica._plan` (no device, no prefix cache, FCFS), then `_launch`."""
    now = env_now + rf[j, HOST_S]
    rf[j, HOST_S] = 0.0
    rp[j, ADDED] = 0
    bs = rp[j, BS]
    budget = rp[j, BUDGET]
    preempted = n_sched = 0
    tot = eng[4]  # context, prefill tokens and sequences, spans, pairs, span pairs: reused
    tot[:] = 0
    r = rp[j, RHEAD]
    while r >= 0 and budget > 0:
        nxt = rq[r, RNEXT]
        computed, target = rq[r, COMPUTED], rq[r, TARGET]
        if computed >= target and cdiv(computed + 1, bs) <= rq[r, BLOCKS]:
            rq[r, SCHED_N] = 1
            n_sched += 1
            budget -= 1
            tot[0] += computed + 1
            r = nxt
            continue
        prefill = computed < target
        n = min(target - computed, budget) if prefill else 1
        scheduled = True
        while not alloc(rq, rp, j, r, computed + n):
            v = rp[j, RTAIL]
            preempt(rq, rp, j, v)
            preempted += 1
            if v == r:
                scheduled = False
                break
        if not scheduled:
            r = -1  # r was the last running request
            continue
        nxt = rq[r, RNEXT]  # preemptions may have cut the list after r
        rq[r, SCHED_N] = n
        n_sched += 1
        budget -= n
        _add(tot, computed, target, n)
        r = nxt
    if preempted == 0:  # a step that preempted admits no waiting request
        n_sched += _admit(rq, rp, rt, j, now, budget, tot)
    if n_sched == 0:
        rp[j, BUSY] = 0
        rp[j, RUN_K] = 0
        return
    _launch(rq, rp, rf, seg, h, ctr, rngs, quantiles, eng, j, now, env_now, tot,
            n_sched - tot[2], preempted)


@njit(cache=True, inline="always")
def _launch(rq, rp, rf, seg, h, ctr, rngs, quantiles, eng, j, now, env_now, tot, decode_seqs,
            preempted):
    """`Replica._launch`: price the step (a run of decode iterations where it may
    fast-forward, ending at its speed level's window edge), record it, schedule its end."""
    context, prefill_tokens, prefill_seqs = tot[0], tot[1], tot[2]
    step = _step_ms(rf, j, prefill_tokens, decode_seqs, context)
    plain = True
    sv = eng[0]
    if sv[j, V.SERVING] > 0.0:
        step, plain = V.step_ms(sv, 0, eng[1], 0, j, now, prefill_tokens, decode_seqs,
                                context, prefill_seqs, tot[3], tot[4], tot[5], step)
    spells = sv[j, V.N_SPELLS] > 0.0
    if spells:
        rf[j, RUN_FACTOR] = sv[j, V.DRIFT] * V.spell_level(eng, j, now)
    factor = _noise(rp, rf, rngs, quantiles, j, 1, prefill_tokens > 0)
    k = 1
    a_ms, b_ms = step, 0.0
    head_ms, head_at = 0.0, 0
    if plain and prefill_tokens == 0 and preempted == 0 and decode_seqs == rp[j, RCOUNT]:
        head_ms, head_at = V.echo_head(sv, 0, j)  # what a decode run's first iterations carry
        head = rp[j, WHEAD]
        admissible = rp[j, WCOUNT] > 0 and rp[j, RCOUNT] < rp[j, MAX_SEQS] and \
            cdiv(rq[head, TARGET], rp[j, BS]) <= rp[j, FREE]
        # sampled: an echo step draws its own noise
        if not admissible and (head_at == 0 or rp[j, SAMPLED] == 0):
            k = _run_length(rq, rp, j)
    echo_ms, echo_at = 0.0, 0
    if k > 1:
        context0 = context - decode_seqs
        closed_a = rf[j, C0] + rf[j, CD] * decode_seqs + rf[j, CC] * (context0 + decode_seqs)
        closed_b = rf[j, CC] * decode_seqs
        if spells:  # the run ends at its speed level's window edge
            k = min(k, max(1, iterations_within(
                closed_a, closed_b, (V.spell_end_s(sv, j) - now) * 1e3
                / (rf[j, RUN_FACTOR] * rf[j, NOISE]), head_ms, head_at)))
        if k > 1:
            a_ms, b_ms, echo_ms, echo_at = closed_a, closed_b, head_ms, head_at
            factor = _noise(rp, rf, rngs, quantiles, j, k, False)
    # (the reference adds a log-probability term here: plain requests have none)
    record_run(rp, rf, seg, h, ctr, j, now, env_now, k, a_ms, b_ms, factor, prefill_tokens,
               prefill_seqs, decode_seqs, context, preempted, 0, echo_ms, echo_at)


@njit(cache=True)
def _on_end(rq, rp, rf, rt, seg, h, ctr, rngs, quantiles, eng, j, k, t_end, env_now):
    """`Replica._on_end`: apply the k iterations, retire who is done, plan the next step."""
    rf[j, BUSY_S] += t_end - rf[j, SEG_START]
    eng[0][j, V.LAST_END] = t_end
    V.ran(eng[0], 0, j, k)
    bs = rp[j, BS]
    r = rp[j, RHEAD]
    while r >= 0:
        nxt = rq[r, RNEXT]
        n = rq[r, SCHED_N]
        if n > 0:
            rq[r, SCHED_N] = 0
            if k > 1 or rq[r, COMPUTED] >= rq[r, TARGET]:
                rq[r, COMPUTED] += k
                rq[r, GENERATED] += k
                if cdiv(rq[r, COMPUTED], bs) > rq[r, BLOCKS]:
                    alloc(rq, rp, j, r, rq[r, COMPUTED])
            else:
                rq[r, COMPUTED] += n
                if rq[r, COMPUTED] >= rq[r, TARGET]:
                    rq[r, GENERATED] += 1
                    if rq[r, GENERATED] == 1:
                        rt[r, FIRST_TOKEN_S] = t_end
            if rq[r, GENERATED] >= rq[r, OUTPUT]:  # done: retire and finish
                unlink_running(rq, rp, j, r)
                rp[j, FREE] += rq[r, BLOCKS]
                rq[r, BLOCKS] = 0
                rt[r, FINISH_S] = env_now
                rp[j, OUTSTANDING] -= rq[r, PROMPT] + rq[r, OUTPUT]
                rp[j, IN_FLIGHT] -= 1
        r = nxt
    rp[j, RUN_K] = 0
    _plan(rq, rp, rf, rt, seg, h, ctr, rngs, quantiles, eng, j, env_now)


@njit(cache=True)
def _submit(rq, rp, rf, rt, seg, h, ctr, rngs, quantiles, eng, i, env_now, least_outstanding,
            rr):
    """Route request i (`policies.routing`) and submit it (`Replica.submit`)."""
    nrep = rp.shape[0]
    if least_outstanding:
        j = 0
        for q in range(1, nrep):
            if rp[q, OUTSTANDING] < rp[j, OUTSTANDING]:
                j = q
    else:
        j = rr % nrep
    rp[j, OUTSTANDING] += rq[i, PROMPT] + rq[i, OUTPUT]
    rp[j, IN_FLIGHT] += 1
    # the first request added since the last step costs the loop most (`sim.step_time.host_time`)
    rf[j, HOST_S] += rf[j, ADD_MORE_S] if rp[j, ADDED] else rf[j, ADD_S]
    rp[j, ADDED] = 1
    append_waiting(rq, rp, j, i)
    if rp[j, BUSY] == 0 and rf[j, WAKE_S] == 0.0:
        _plan(rq, rp, rf, rt, seg, h, ctr, rngs, quantiles, eng, j, env_now)
    elif rp[j, BUSY] == 0:  # the idle loop wakes, then composes with what arrived meanwhile
        rp[j, BUSY] = 1
        push_event(h, ctr, env_now + rf[j, WAKE_S], j, rp[j, GEN], -1, 0.0)
    elif rp[j, RUN_K] > 0 and rp[j, RCOUNT] < rp[j, MAX_SEQS]:
        truncate_run(rp, rf, seg, h, ctr, j, env_now)
    return j


@njit(cache=True)
def simulate_kernel(arrival_s, rq, rp, rf, rngs, quantiles, eng, least_outstanding):
    """Run the whole simulation; (results per request, replica of each request, segment rows,
    events scheduled). `rq`, `rp`, `rf` and `eng` (`sim.kernels.serving`) come initialised
    (`sim.kernels.plain`)."""
    n, nrep = arrival_s.shape[0], rp.shape[0]
    rt = np.full((n, RT_COLS), np.nan)
    replica_of = np.zeros(n, dtype=np.int64)
    h = np.empty((n + nrep + 2, 6))  # pending events: live ends, superseded ends, one arrival
    seg = np.empty((n + 16, SEG_COLS))  # grown by doubling: ~2.5 rows a request
    ctr = np.zeros(4, dtype=np.int64)
    now = 0.0
    i = 0
    while True:
        # the arrival process: submit every request due, then wait for the next one
        while i < n:
            gap = arrival_s[i] - now
            if gap > 0:
                push_event(h, ctr, now + gap, -1, 0, 0, 0.0)
                break
            if ctr[SEG_N] + 2 > seg.shape[0]:
                seg = grow_rows(seg)
            replica_of[i] = _submit(rq, rp, rf, rt, seg, h, ctr, rngs, quantiles, eng, i, now,
                                    least_outstanding, i)
            i += 1
        # the next event; an arrival's resumption submits its request before waiting again
        while ctr[HEAP_N] > 0:
            ev = pop_event(h, ctr)
            now = ev[0]
            j = int(ev[2])
            if j < 0:
                if ctr[SEG_N] + 2 > seg.shape[0]:
                    seg = grow_rows(seg)
                replica_of[i] = _submit(rq, rp, rf, rt, seg, h, ctr, rngs, quantiles, eng, i, now,
                                        least_outstanding, i)
                i += 1
                break
            if int(ev[3]) != rp[j, GEN]:
                continue  # superseded by a truncation
            if ctr[SEG_N] + 2 > seg.shape[0]:
                seg = grow_rows(seg)
            if int(ev[4]) < 0:  # awake (`_submit`)
                _plan(rq, rp, rf, rt, seg, h, ctr, rngs, quantiles, eng, j, now)
                continue
            _on_end(rq, rp, rf, rt, seg, h, ctr, rngs, quantiles, eng, j, int(ev[4]), ev[5],
                    now)
        else:
            break
    return rt, replica_of, seg[:ctr[SEG_N]].copy(), ctr[EVENTS]
