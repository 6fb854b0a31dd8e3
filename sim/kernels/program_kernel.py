"""Replicas of a program workload compiled (numba): `sim.engine.replica.Replica`'s decisions, event
for event, driven by the Python program driver.

Programs stay Python objects (`programs/`, written once for the simulator and the live runner);
only the replicas under them are compiled. `sim.kernels.programs` runs the loop: `advance`
processes run-of-iterations ends until one retires requests (or the arrival process is due),
the driver hands each retired request to its program (`finish` first, as `Replica._finish`),
and whatever the program sends comes back through `submit` and `abort`. Everything the
reference covers for these workloads is here in the reference's order and float expressions:
FCFS or priority waiting queues, chunked prefill, KV blocks with recompute preemption (the
newest or the lowest-priority victim), the prefix cache (`sim.kernels.prefix`), aborts, runs
of decode iterations and their truncation, the loop's host time, the log-probability and seeded
sampling terms, the linear or the serving step-time model at its mean (`sim.kernels.serving`:
the serving model's engine state in `rf`). The running list and a step's entries
are arrays indexed as the reference's lists are, so its list edits (a victim removed before
the entry being scheduled) play out the same.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.kernels import serving as V
from sim.kernels.state import cdiv, pop_event, push_event, record_run, truncate_run
from sim.kernels.program_state import (
    PROMPT, OUTPUT, COMPUTED, GENERATED, TARGET, BLOCKS, STARTED, PRIORITY, SEQ, GROUP, PREFIX,
    SCORE_FROM, SHARED, SEEDED, DONE, ABORTED, IDX, LP_PROMPT, LP_SAMPLE, MAX_SEQS, BUDGET, BS,
    FREE, BUSY, GEN, RUN_K, RCOUNT, WHEAD, WCOUNT, ADDED, ENDING, NSCHED, ARRIVALS, CACHING, PRIO,
    C0, CP, CD, CC, CX, NOISE, ADD_S, ADD_MORE_S, WAKE_S, HOST_S, SEG_START, BUSY_S, LP_STEP,
    SEED_STEP, SEED_SEQ, SV0, SEEN0, SCHEDULED_S, FIRST_TOKEN_S, FINISH_S, ARRIVAL_S, OUT_TOKENS,
    CACHED, ABORTED_R, PROMPT_R, PRIORITY_R, REPLICA_R, SEG_N, HEAP_N, DONE_N, RUNS_K, RUNS_KV,
    RUNS_KV_PEAK, DONE_J, FOLD, RERUNS, RBASE, ROW, SCORING, RESCORE, UNCACHED, RESCORED_R,
    RQ_COLS, LINKS, CHAINED, END, ARRIVAL, RETIRED, ROOM, alloc, release, before, enqueue,
    dequeue, remove_running, entry, preempt, store, take_hit, head_admissible, run_length,
    unschedule)


@njit(cache=True)
def _admit(rq, rqf, rp, running, sched, rt, ri, pc, tab, lru, free, j, now, budget, tot):
    """`Replica._admit`: waiting requests join the step in queue order (a cached prefix
    borrowed first) while there is a sequence slot, token budget and KV room."""
    bs = rp[j, BS]
    while rp[j, WCOUNT] > 0 and rp[j, RCOUNT] < rp[j, MAX_SEQS] and budget > 0:
        r = rp[j, WHEAD]
        if rp[j, CACHING] and rq[r, COMPUTED] == 0:
            if not take_hit(rq, rp, pc, tab, lru, free, j, r, budget):
                break
            n = min(rq[r, TARGET] - rq[r, COMPUTED], budget)
        else:
            n = min(rq[r, TARGET] - rq[r, COMPUTED], budget)
            whole = cdiv(rq[r, TARGET], bs) - rq[r, SHARED] - rq[r, BLOCKS]  # `_fits_whole`
            if whole > rp[j, FREE] + lru[j, 2] or \
                    not alloc(rq, rp, pc, tab, lru, free, j, r, rq[r, COMPUTED] + n):
                break
        dequeue(rq, rp, j, r)
        running[j, rp[j, RCOUNT]] = r
        rp[j, RCOUNT] += 1
        if rq[r, STARTED] == 0:
            rq[r, STARTED] = 1
            rt[SCHEDULED_S, rq[r, ROW]] = now
            ri[CACHED, rq[r, ROW]] = rq[r, COMPUTED]
        entry(rq, rqf, rp, sched, j, r, n, tot)
        if rp[j, CACHING]:
            store(rq, rp, pc, tab, lru, free, j, r, rq[r, COMPUTED] + n)
        budget -= n


@njit(cache=True)
def _compose(rq, rqf, rp, running, sched, rt, ri, pc, tab, lru, free, j, now, tot):
    """`Replica._plan`'s composition: the running requests in order (preempting for KV room),
    then waiting ones unless a request was preempted; the preemptions."""
    bs, budget = rp[j, BS], rp[j, BUDGET]
    rp[j, NSCHED] = 0
    preempted = 0
    i = 0
    while i < rp[j, RCOUNT] and budget > 0:
        r = running[j, i]
        computed, target = rq[r, COMPUTED], rq[r, TARGET]
        if computed >= target and cdiv(computed + 1, bs) <= rq[r, SHARED] + rq[r, BLOCKS]:
            m = rp[j, NSCHED]
            sched[j, m, 0], sched[j, m, 1] = r, 1
            rp[j, NSCHED] = m + 1
            budget -= 1
            i += 1
            tot[0] += computed + 1
            tot[3] += rqf[r, LP_SAMPLE]
            tot[4] += rq[r, SEEDED]
            continue
        prefill = computed < target
        n = min(target - computed, budget) if prefill else 1
        scheduled = True
        while not alloc(rq, rp, pc, tab, lru, free, j, r, computed + n):
            v = running[j, rp[j, RCOUNT] - 1]
            if rp[j, PRIO]:
                at = rp[j, RCOUNT] - 1
                for q in range(rp[j, RCOUNT]):
                    if before(rq, v, running[j, q]):
                        v, at = running[j, q], q
                if at < i:  # scheduled already: `Replica._unschedule`
                    i -= 1
                    budget += unschedule(rq, rp, sched, j, v)
            preempt(rq, rp, ri, running, pc, tab, lru, free, j, v)
            preempted += 1
            if v == r:
                scheduled = False
                break
        if not scheduled:
            break  # r itself was preempted: the step schedules no later request (vLLM's)
        entry(rq, rqf, rp, sched, j, r, n, tot)
        if rp[j, CACHING] and prefill:
            store(rq, rp, pc, tab, lru, free, j, r, computed + n)
        budget -= n
        i += 1
    if preempted == 0:  # a step that preempted admits no waiting request
        _admit(rq, rqf, rp, running, sched, rt, ri, pc, tab, lru, free, j, now, budget, tot)
    return preempted


@njit(cache=True)
def plan(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
         free, j):
    """`Replica._plan` and `_launch` for replica j at the clock's time."""
    env_now = clock[0]
    now = env_now + rf[j, HOST_S]
    rf[j, HOST_S] = 0.0
    rp[j, ADDED] = 0
    while True:
        tot = np.zeros(8)  # context, prefill tokens and sequences, lp ms, seeded, spans, pairs,
        # span pairs
        preempted = _compose(rq, rqf, rp, running, sched, rt, ri, pc, tab, lru, free, j, now,
                             tot)
        if rp[j, NSCHED] > 0 or preempted == 0:
            break
        now = env_now  # its one candidate preempted itself: composed anew, as the reference
    if rp[j, NSCHED] == 0:
        rp[j, BUSY] = 0
        rp[j, RUN_K] = 0
        return
    if preempted:  # `step_totals`: the entries again, as the state is now
        entries = rp[j, NSCHED]
        rp[j, NSCHED] = 0
        tot[:] = 0.0
        for m in range(entries):
            entry(rq, rqf, rp, sched, j, sched[j, m, 0], sched[j, m, 1], tot)
    _launch(rq, rp, rf, running, seg, h, ctr, pc, tab, lru, j, now, env_now, tot, preempted)


@njit(cache=True)
def _launch(rq, rp, rf, running, seg, h, ctr, pc, tab, lru, j, now, env_now, tot, preempted):
    """`Replica._launch`: price the step (a run of decode iterations where it may), record it,
    schedule its end."""
    context, prefill_tokens, prefill_seqs = int(tot[0]), int(tot[1]), int(tot[2])
    lp_ms, seeded = tot[3], int(tot[4])
    decode_seqs = rp[j, NSCHED] - prefill_seqs
    a_ms = rf[j, C0] + rf[j, CP] * prefill_tokens + rf[j, CD] * decode_seqs + \
        rf[j, CC] * context + rf[j, CX] * prefill_tokens * context / 1e3
    b_ms = 0.0
    plain = True
    if rf[j, SV0 + V.SERVING] > 0.0:
        a_ms, plain = V.step_ms(rf, SV0, rf, SEEN0, j, now, prefill_tokens, decode_seqs, context,
                                prefill_seqs, int(tot[5]), int(tot[6]), int(tot[7]), a_ms)
    factor = rf[j, NOISE]
    k, echo_ms, echo_at = 1, 0.0, 0
    if plain and prefill_tokens == 0 and preempted == 0 and decode_seqs == rp[j, RCOUNT]:
        if not head_admissible(rq, rp, lru, j):
            k = run_length(rq, rp, running, j)
        if k > 1:
            a_ms = rf[j, C0] + rf[j, CD] * decode_seqs + \
                rf[j, CC] * (context - decode_seqs + decode_seqs)
            b_ms = rf[j, CC] * decode_seqs
            echo_ms, echo_at = V.echo_head(rf, SV0, j)  # the run's first iterations carry it
    extra = 0.0
    if lp_ms > 0.0:
        extra += lp_ms + rf[j, LP_STEP]
    if seeded:
        extra += rf[j, SEED_STEP] + rf[j, SEED_SEQ] * seeded
    a_ms += extra / factor
    if ctr[FOLD]:  # row j holds replica j's run: fold the one that ends into the totals
        rows = ctr[SEG_N]
        if seg[j, 2] > 0:
            rf[j, RUNS_K] += seg[j, 2]
            rf[j, RUNS_KV] += seg[j, 12] / seg[j, 13] * seg[j, 2]  # `sim.engine.tables.kv_usage`'s
            rf[j, RUNS_KV_PEAK] = max(rf[j, RUNS_KV_PEAK], seg[j, 12])
        ctr[SEG_N] = j
    record_run(rp, rf, seg, h, ctr, j, now, env_now, k, a_ms, b_ms, factor, prefill_tokens,
               prefill_seqs, decode_seqs, context, preempted, lru[j, 2], echo_ms, echo_at)
    if ctr[FOLD]:
        ctr[SEG_N] = rows


@njit(cache=True)
def submit(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
           free, j, r, idx, prompt, output, priority, group, prefix, score_from, seeded,
           lp_prompt_ms, lp_sample_ms):
    """`Replica.submit` to replica j of request `idx` (`sim.engine.request_state.Req`'s fields),
    kept in slot r while in flight."""
    rq[r, :RQ_COLS] = 0
    if group == CHAINED:  # its links in place (`programs.CompiledCluster.send`), its group any
        group = 0
    else:
        rq[r, LINKS] = 0
    rq[r, PROMPT], rq[r, OUTPUT], rq[r, TARGET], rq[r, PRIORITY] = prompt, output, prompt, \
        priority
    rq[r, GROUP], rq[r, PREFIX], rq[r, SCORE_FROM], rq[r, SEEDED], rq[r, IDX] = \
        group, prefix, score_from, seeded, idx
    rqf[r, LP_PROMPT], rqf[r, LP_SAMPLE] = lp_prompt_ms, lp_sample_ms
    # the requests table's columns of a send (priority as the table's int32 keeps it)
    c = rq[r, ROW] = idx - ctr[RBASE]
    rt[ARRIVAL_S, c] = clock[0]
    rt[SCHEDULED_S, c] = rt[FIRST_TOKEN_S, c] = rt[FINISH_S, c] = np.nan
    ri[PROMPT_R, c], ri[REPLICA_R, c] = prompt, j
    ri[PRIORITY_R, c] = min(max(priority, -2**31), 2**31 - 1)
    arrive(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru, free,
           j, r)


@njit(cache=True)
def arrive(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
           free, j, r):
    """The request in slot r joins replica j's queue (`Replica.submit` past the request's
    making): its arrival number, the loop's host time, and the loop woken if idle."""
    rq[r, SEQ] = rp[j, ARRIVALS]
    rp[j, ARRIVALS] += 1
    # the first request added since the last step costs the loop most (`sim.step_time.host_time`)
    rf[j, HOST_S] += rf[j, ADD_MORE_S] if rp[j, ADDED] else rf[j, ADD_S]
    rp[j, ADDED] = 1
    enqueue(rq, rp, j, r, False)
    if rp[j, BUSY] == 0 and rf[j, WAKE_S] == 0.0:
        plan(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
             free, j)
    elif rp[j, BUSY] == 0:  # the idle loop wakes, then composes with what arrived meanwhile
        rp[j, BUSY] = 1
        push_event(h, ctr, clock[0] + rf[j, WAKE_S], j, rp[j, GEN], -1, 0.0)
    elif rp[j, RUN_K] > 0 and rp[j, RCOUNT] < rp[j, MAX_SEQS]:
        truncate_run(rp, rf, seg, h, ctr, j, clock[0])


@njit(cache=True)
def abort(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
          free, j, r):
    """`Replica.abort`: the tokens it generated when it finished now (its callback is due),
    -1 when it ends with the iteration in flight or had ended."""
    if rq[r, DONE] or rq[r, ABORTED]:
        return -1
    rq[r, ABORTED] = 1
    ri[ABORTED_R, rq[r, ROW]] = 1
    if dequeue(rq, rp, j, r):
        return finish(rq, rp, rt, ri, clock, pc, tab, lru, free, j, r) >> 1
    in_flight = False
    if rp[j, ENDING] == 0 and rp[j, BUSY]:
        for m in range(rp[j, NSCHED]):
            in_flight = in_flight or sched[j, m, 0] == r
    if not in_flight:
        remove_running(rp, running, j, r)
        return finish(rq, rp, rt, ri, clock, pc, tab, lru, free, j, r) >> 1
    if rp[j, RUN_K] > 0:
        truncate_run(rp, rf, seg, h, ctr, j, clock[0])
    return -1


@njit(cache=True)
def finish(rq, rp, rt, ri, clock, pc, tab, lru, free, j, r):
    """`Replica._finish` but its callback: release the request's blocks (its full ones stay
    cached), record its end; the tokens it generated times 2, plus 1 if it was aborted."""
    rq[r, DONE] = 1
    release(rq, rp, pc, tab, lru, free, j, r)
    rt[FINISH_S, rq[r, ROW]] = clock[0]
    ri[OUT_TOKENS, rq[r, ROW]] = rq[r, GENERATED]
    return 2 * rq[r, GENERATED] + rq[r, ABORTED]


@njit(cache=True)
def retire(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
           free, j, r):
    """`finish` of a request its step ended, then `Cluster._finished`: a scoring request that
    read cached positions it needs log-probabilities of runs again from the start, reading no
    cache, and only that run's end is its callback (-1 until then)."""
    out = finish(rq, rp, rt, ri, clock, pc, tab, lru, free, j, r)
    if rq[r, SCORING] != RESCORE or rq[r, ABORTED]:
        return out
    rq[r, DONE] = rq[r, COMPUTED] = rq[r, GENERATED] = 0  # `Req.rerun_uncached`
    rq[r, TARGET], rq[r, SCORING] = rq[r, PROMPT], UNCACHED
    ri[RESCORED_R, rq[r, ROW]] = 1
    ctr[RERUNS] += 1
    arrive(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru, free,
           j, r)
    return -1


@njit(cache=True)
def _on_end(rq, rp, rf, running, sched, rt, pc, tab, lru, free, done, ctr, j, k, t_end):
    """`Replica._on_end` up to the callbacks: apply the k iterations; the requests now done
    leave the running list (into `done`, in step order)."""
    rf[j, BUSY_S] += t_end - rf[j, SEG_START]
    rf[j, SV0 + V.LAST_END] = t_end
    V.ran(rf, SV0, j, k)
    rp[j, ENDING] = 1
    bs, nd = rp[j, BS], 0
    for m in range(rp[j, NSCHED]):
        r, n = sched[j, m, 0], sched[j, m, 1]
        if k > 1 or rq[r, COMPUTED] >= rq[r, TARGET]:
            rq[r, COMPUTED] += k
            rq[r, GENERATED] += k
            if cdiv(rq[r, COMPUTED], bs) > rq[r, SHARED] + rq[r, BLOCKS]:
                alloc(rq, rp, pc, tab, lru, free, j, r, rq[r, COMPUTED])
        else:
            rq[r, COMPUTED] += n
            if rq[r, COMPUTED] >= rq[r, TARGET]:
                rq[r, GENERATED] += 1
                if rq[r, GENERATED] == 1:
                    rt[FIRST_TOKEN_S, rq[r, ROW]] = t_end
        if rq[r, GENERATED] >= rq[r, OUTPUT] or rq[r, ABORTED]:
            done[nd] = r
            nd += 1
    for m in range(nd):
        rq[done[m], DONE] = 1
        remove_running(rp, running, j, done[m])
    ctr[DONE_N], ctr[DONE_J] = nd, j


@njit(cache=True)
def end_step(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
             free, j):
    """The rest of `Replica._on_end` once the callbacks ran: plan the next step."""
    rp[j, RUN_K] = 0
    rp[j, ENDING] = 0
    plan(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
         free, j)


SENT = 12
"""a pending send's fields in `pend`: replica, slot, then `sim.engine.request_state.Sent`'s (the two
log-probability costs as float64, the rest int64)"""


@njit(cache=True)
def drain(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
          free, pend_i, pend_f, npend):
    """`submit` the `npend` sends the driver packed into `pend` (one buffer seen as int64 and
    as float64) since the last kernel call, in the order it sent them."""
    for k in range(npend):
        o = k * SENT
        submit(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
               free, pend_i[o], pend_i[o + 1], pend_i[o + 2], pend_i[o + 3], pend_i[o + 4],
               pend_i[o + 5], pend_i[o + 6], pend_i[o + 7], pend_i[o + 8], pend_i[o + 9],
               pend_f[o + 10], pend_f[o + 11])


@njit(cache=True)
def advance(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
            free, pend_i, pend_f, npend, node_room, pending):
    """Submit the pending sends, finish replica `pending`'s step end (>= 0: its callbacks ran),
    then process events until one retires requests, the arrival process is due, room runs
    short or none is left: (END, ARRIVAL, ROOM or RETIRED; the replica; n retired, in
    `done[:n]`; the clock; the first one's slot and its `retire`, done here, as nothing comes
    between a step's end and its first callback)."""
    drain(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
          free, pend_i, pend_f, npend)
    if pending >= 0:
        end_step(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab,
                 lru, free, pending)
    while ctr[HEAP_N] > 0:
        if ctr[SEG_N] + 2 > seg.shape[0] or ctr[HEAP_N] + 4 > h.shape[0] or \
                free[1] + node_room > pc.shape[0]:
            return ROOM, 0, 0, clock[0], 0, 0
        ev = pop_event(h, ctr)
        clock[0] = ev[0]
        j = int(ev[2])
        if j < 0:
            return ARRIVAL, 0, 0, clock[0], 0, 0
        if int(ev[3]) != rp[j, GEN]:
            continue  # superseded by a truncation
        if int(ev[4]) < 0:  # awake (`submit`)
            plan(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab,
                 lru, free, j)
            continue
        _on_end(rq, rp, rf, running, sched, rt, pc, tab, lru, free, done, ctr, j, int(ev[4]),
                ev[5])
        if ctr[DONE_N] > 0:
            return RETIRED, j, ctr[DONE_N], clock[0], done[0], retire(
                rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab,
                lru, free, j, done[0])
        end_step(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab,
                 lru, free, j)
    return END, 0, 0, clock[0], 0, 0


@njit(cache=True)
def schedule_arrival(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc,
                     tab, lru, free, pend_i, pend_f, npend, gap):
    """Submit the pending sends (the arriving program's first requests), then let the arrival
    process wait `gap` seconds (a SimPy timeout it yields)."""
    drain(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
          free, pend_i, pend_f, npend)
    push_event(h, ctr, clock[0] + gap, -1, 0, 0, 0.0)
