"""The program kernel's state (`sim.kernels.program_kernel`): named columns, a replica's queues and
lists, its KV blocks, a step's entries and the run-length arithmetic, as
`sim.engine.replica.Replica`
keeps and edits them.

Requests in flight live in slots (`rq` integers, `rqf` floats); replicas in `rp` / `rf`; results
in rows per column (`rt`, `ri`), a column per request (its slot's `ROW`). The running list is
an array per replica edited as the reference edits its list; the waiting queue a linked list
through the slots (FCFS with preempted requests at its head, or kept in (priority, arrival)
order).
"""

from __future__ import annotations

from numba import njit, types
from numba.experimental import structref

from sim.kernels import prefix as P
from sim.kernels.serving import SV_COLS
from sim.kernels.state import (  # the shared columns too, for the kernel to import here
    MAX_SEQS, BUDGET, BS, KV_BLOCKS, FREE, BUSY, GEN, RUN_K, SEG_INDEX, RCOUNT, WHEAD, WTAIL,
    WCOUNT, ADDED, C0, CP, CD, CC, CX, NOISE, ADD_S, ADD_MORE_S, WAKE_S, HOST_S, RUN_START, RUN_A,
    RUN_B, RUN_F, SEG_START, BUSY_S, EVENTS, SEG_N, HEAP_N, RP_COLS as _RP_COLS,
    RF_COLS as _RF_COLS, cdiv)

# per request slot (int64)
PROMPT, OUTPUT, COMPUTED, GENERATED, TARGET, BLOCKS, STARTED, PRIORITY, SEQ, GROUP, PREFIX, \
    SCORE_FROM, SHARED, SEEDED, DONE, ABORTED, IDX, WNEXT, SCORING, ROW, PROG, TROW, \
    LINKS = range(23)
# from LINKS: the request's prefix chain, `prefix.link_group`'s `links` (a count, then a group and
# an end per link: as many columns as the longest chain sent needs), copied from its row of
# `State.chains` as the send is submitted; the columns before PROG are the request's state, set
# by the kernel's `submit`; PROG and TROW: the program and its template's request a request of a
# template in the kernel is (`sim.kernels.template_calls`), PROG -1 for any other and in a free
# slot; ROW: the request's column in the results (`rt`, `ri`), its idx less `RBASE`
RQ_COLS = PROG
CHAINED = -2
"""a send's group where the request names a prefix chain (its links written in its slot); the
driver sends `CHAINED - 1 - row` for the chain in row `row` of `State.chains`
(`program_calls.place_chains`)"""
# `SCORING` of a scoring request (`Req.rescore` / `reads_cache`): its cache hit covered positions
# it needs log-probabilities of (it runs again, uncached, once it ends), or it is that re-run
RESCORE, UNCACHED = 1, 2
# per request slot (float64)
LP_PROMPT, LP_SAMPLE, RQF_COLS = range(3)
# per replica: the plain kernel's columns (`sim.kernels.state`, so its run recording and
# truncation serve both), then these (int64; float64)
ENDING, NSCHED, ARRIVALS, CACHING, PRIO, RP_COLS = range(_RP_COLS, _RP_COLS + 6)
LP_STEP, SEED_STEP, SEED_SEQ, RF_COLS = range(_RF_COLS, _RF_COLS + 4)
# with `FOLD` on: the totals of the replica's runs folded so far (iterations; iterations x the
# fraction of KV blocks in use at the run's start; the most blocks in use at a run's start)
RUNS_K, RUNS_KV, RUNS_KV_PEAK, RF_COLS = RF_COLS, RF_COLS + 1, RF_COLS + 2, RF_COLS + 3
# the serving step-time model's columns and engine state (`sim.kernels.serving`, from SV0), then
# from SEEN0 a flag per token count where a replica's model is `serving` (`program_room.new_state`)
SV0 = RF_COLS
SEEN0 = RF_COLS = SV0 + SV_COLS
# results, a row per column, a column per request from request `RBASE` on (float64 / int32)
SCHEDULED_S, FIRST_TOKEN_S, FINISH_S, ARRIVAL_S, RT_ROWS = range(5)
OUT_TOKENS, CACHED, ABORTED_R, PREEMPTS, PROMPT_R, PRIORITY_R, REPLICA_R, RESCORED_R, \
    RI_ROWS = range(9)
# counters (int64) and the clock
# after the plain kernel's EID, EVENTS, SEG_N, HEAP_N; FOLD: 1 when no steps table is written,
# so that a replica keeps one step row (its current run's), folded into RUNS_K / RUNS_KV when
# the next run replaces it: rows for every run would take gigabytes at a million programs;
# the run of iterations it replaces; RERUNS: scoring requests sent again (`RESCORE`)
DONE_N, DONE_J, FOLD, RERUNS, CTR_COLS = range(4, 9)
# the templates in the kernel (`sim.kernels.template_calls`): the next request idx; the slots in
# `kfree`, the sends in `klog` and the programs done in `kdone` since the driver last read them;
# the inter-program scheduler's priority (`PRIO_MODE`); the most cached blocks one call can add
# (`CompiledCluster.node_room`)
NEXT_IDX, KFREE_N, KLOG_N, KDONE_N, PRIO_MODE, NODE_ROOM, CTR_COLS = range(CTR_COLS,
                                                                           CTR_COLS + 7)
# the Dynasor scheduler's state (`template_calls`): programs finished (`fl`), its default
# remaining tokens
FL_N, DYN_DEFAULT, CTR_COLS = range(CTR_COLS, CTR_COLS + 3)
# the request whose results are the first column of `rt` / `ri`: 0 unless the run folds
# finished requests' results as it goes (`program_room.KernelRoom._fold_results`)
RBASE, CTR_COLS = CTR_COLS, CTR_COLS + 1
# the programs' arrivals in the kernel (`sim.kernels.arrival_calls`): on (1) or not; the next
# program to arrive; the pools a program row pins (`template_calls.P_PIN0`)
KARR, NEXT_PROG, NPOOLS, CTR_COLS = range(CTR_COLS, CTR_COLS + 4)
CALLS = 64
"""kernel calls between two checks of the arrays' room (`program_room.KernelRoom._room`)"""
KERNEL_ROOM = 64
"""step rows, events and calls' worth of cached blocks kept past `CALLS` for the kernel's own
sends (`sim.kernels.template_calls`), where templates are in the kernel"""
# what `advance` stopped for
END, ARRIVAL, RETIRED, ROOM = range(4)


class State:
    """The kernel's arrays, in the order every kernel function takes them (`pend_i`, `pend_f`:
    one buffer of pending sends, seen as int64 and as float64), then `chains`, which only the
    entry points read: a row per prefix chain the driver sent, its links as `LINKS` holds them
    (each chain's row written once, not a slot's columns per request), then the templates in
    the kernel (`sim.kernels.template_calls`), then the routing loads (`lo`: outstanding
    tokens, `lf`: programs in flight per replica, the cluster's own arrays) and the programs'
    arrivals in the kernel (`sim.kernels.arrival_calls`: `pa`, `pk`, `tpool`)."""

    __slots__ = ("rq", "rqf", "rp", "rf", "running", "sched", "rt", "ri", "h", "seg", "ctr",
                 "clock", "done", "pc", "tab", "lru", "free", "pend_i", "pend_f", "chains",
                 "tk", "tkf", "tfo", "tlinks", "pg", "kfree", "klog", "kdone", "kclass", "pgf",
                 "flc", "flt", "kpar", "lo", "lf", "pa", "pk", "tpool")

    def packed(self) -> "Packed":
        """The arrays as one kernel argument (the entry points' `st`)."""
        return _pack(*(getattr(self, k) for k in self.__slots__))


# A numba call unboxes each array argument (~70 ns apiece): 19 of them cost more than a
# submit's work, so the driver's calls take the arrays packed in one struct.
@structref.register
class PackedType(types.StructRef):
    """numba's type of `Packed`."""

    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class Packed(structref.StructRefProxy):
    """`State`'s arrays in one numba struct (`State.packed`)."""


structref.define_proxy(Packed, PackedType, list(State.__slots__))
_I1, _I2, _F1, _F2 = types.int64[::1], types.int64[:, ::1], types.float64[::1], \
    types.float64[:, ::1]
_PACKED = PackedType(list(zip(State.__slots__, (
    _I2, _F2, _I2, _F2, _I2, types.int64[:, :, ::1], _F2, types.int32[:, ::1], _F2, _F2, _I1,
    _F1, _I1, _I2, _I2, _I2, _I1, _I1, _F1, _I2, _I2, _F2, _I1, _I2, _I2, _I1, _I2, _I2,
    _I1, _F1, _I1, _I1, _F1, _I1, _I1, _F1, _I2, _I2))))


@njit(cache=True)
def _pack(rq, rqf, rp, rf, running, sched, rt, ri, h, seg, ctr, clock, done, pc, tab, lru,
          free, pend_i, pend_f, chains, tk, tkf, tfo, tlinks, pg, kfree, klog, kdone, kclass, pgf,
          flc, flt, kpar, lo, lf, pa, pk, tpool):
    st = structref.new(_PACKED)
    st.rq, st.rqf, st.rp, st.rf, st.running, st.sched = rq, rqf, rp, rf, running, sched
    st.rt, st.ri, st.h, st.seg, st.ctr, st.clock = rt, ri, h, seg, ctr, clock
    st.done, st.pc, st.tab, st.lru, st.free = done, pc, tab, lru, free
    st.pend_i, st.pend_f, st.chains = pend_i, pend_f, chains
    st.tk, st.tkf, st.tfo, st.tlinks, st.pg = tk, tkf, tfo, tlinks, pg
    st.kfree, st.klog, st.kdone, st.kclass = kfree, klog, kdone, kclass
    st.pgf, st.flc, st.flt, st.kpar = pgf, flc, flt, kpar
    st.lo, st.lf, st.pa, st.pk, st.tpool = lo, lf, pa, pk, tpool
    return st


@njit(cache=True)
def alloc(rq, rp, pc, tab, lru, free, j, r, tokens_after):
    """`Replica._alloc`: blocks for `tokens_after`, evicting cached blocks for room."""
    need = cdiv(tokens_after, rp[j, BS]) - rq[r, SHARED] - rq[r, BLOCKS]
    if need <= 0:
        return True
    if need > rp[j, FREE]:
        rp[j, FREE] += P.evict(tab, pc, lru, free, j, need - rp[j, FREE])
        if need > rp[j, FREE]:
            return False
    rp[j, FREE] -= need
    rq[r, BLOCKS] += need
    return True


@njit(cache=True)
def take_hit(rq, rp, pc, tab, lru, free, j, r, budget):
    """`KvPool._take_hit`: a waiting request's cache hit and first chunk where its whole prompt
    fits; False, nothing changed, where not. A scoring request whose hit covers positions it
    needs log-probabilities of is marked `RESCORE` (`PrefixCache.take`); its re-run reads no
    cache."""
    bs = rp[j, BS]
    n = own = unheld = 0
    if rq[r, SCORING] != UNCACHED:
        shared = rq[r, PREFIX] // bs if rq[r, GROUP] >= 0 else 0
        n, own, unheld = P.lookup(tab, pc, j, rq[r, GROUP], rq[r, LINKS:], bs, shared,
                                  (rq[r, TARGET] - 1) // bs, rq[r, IDX], rp.shape[0])
    held = n + own
    need = cdiv(rq[r, TARGET], bs) - held - rq[r, BLOCKS]
    computed = held * bs
    first = cdiv(computed + min(rq[r, TARGET] - computed, budget), bs) - held - rq[r, BLOCKS]
    if max(need, first) + unheld > rp[j, FREE] + lru[j, 2]:
        return False
    rp[j, FREE] += P.take(tab, pc, lru, free, j, rq[r, GROUP], rq[r, LINKS:], bs, n, own,
                          rq[r, IDX], rp.shape[0])
    rq[r, SHARED], rq[r, BLOCKS], rq[r, COMPUTED] = n, rq[r, BLOCKS] + own, computed
    if rq[r, SCORING] != UNCACHED:
        rq[r, SCORING] = RESCORE if rq[r, SCORE_FROM] and computed >= rq[r, SCORE_FROM] else 0
    return alloc(rq, rp, pc, tab, lru, free, j, r, computed + min(rq[r, TARGET] - computed,
                                                                   budget))


@njit(cache=True)
def release(rq, rp, pc, tab, lru, free, j, r):
    """`Replica._release`: the request's full blocks stay cached by content (`PrefixCache.
    release`: its own ones as one run, then its group's, given back); the rest are freed."""
    if rp[j, CACHING]:
        store(rq, rp, pc, tab, lru, free, j, r, rq[r, COMPUTED])
        shared = rq[r, PREFIX] // rp[j, BS] if rq[r, GROUP] >= 0 else 0
        full = rq[r, COMPUTED] // rp[j, BS]
        if full > shared:
            freed = P.drop_run(tab, pc, lru, free, j, rq[r, IDX], rp.shape[0])
            rq[r, BLOCKS] += freed - (full - shared)
            P.put_run(tab, pc, lru, free, j, rq[r, IDX], shared, full, rp.shape[0])
        if rq[r, SHARED]:
            P.unref(tab, pc, lru, j, rq[r, GROUP], rq[r, LINKS:], rp[j, BS], rq[r, SHARED],
                    rp.shape[0])
            rq[r, SHARED] = 0
    rp[j, FREE] += rq[r, BLOCKS]
    rq[r, BLOCKS] = 0


@njit(cache=True)
def before(rq, a, b):
    """Whether request a comes before b in a priority queue (priority, then arrival)."""
    return rq[a, PRIORITY] < rq[b, PRIORITY] or (rq[a, PRIORITY] == rq[b, PRIORITY] and
                                                 rq[a, SEQ] < rq[b, SEQ])


@njit(cache=True)
def enqueue(rq, rp, j, r, front):
    """Into the waiting queue: FCFS at the back (`front`: a preempted request, at the head);
    priority mode by (priority, arrival)."""
    if rp[j, PRIO]:
        prev, q = -1, rp[j, WHEAD]
        while q >= 0 and before(rq, q, r):
            prev, q = q, rq[q, WNEXT]
    elif front:
        prev, q = -1, rp[j, WHEAD]
    else:
        prev, q = rp[j, WTAIL], -1
    rq[r, WNEXT] = q
    if prev >= 0:
        rq[prev, WNEXT] = r
    else:
        rp[j, WHEAD] = r
    if q < 0:
        rp[j, WTAIL] = r
    rp[j, WCOUNT] += 1


@njit(cache=True)
def dequeue(rq, rp, j, r):
    """Remove request r from the waiting queue; False if it is not there."""
    prev, q = -1, rp[j, WHEAD]
    while q >= 0 and q != r:
        prev, q = q, rq[q, WNEXT]
    if q < 0:
        return False
    if prev >= 0:
        rq[prev, WNEXT] = rq[r, WNEXT]
    else:
        rp[j, WHEAD] = rq[r, WNEXT]
    if rp[j, WTAIL] == r:
        rp[j, WTAIL] = prev
    rp[j, WCOUNT] -= 1
    return True


@njit(cache=True)
def remove_running(rp, running, j, r):
    """`running.remove(r)`; False if r is not running."""
    n = rp[j, RCOUNT]
    for i in range(n):
        if running[j, i] == r:
            for q in range(i, n - 1):
                running[j, q] = running[j, q + 1]
            rp[j, RCOUNT] = n - 1
            return True
    return False


@njit(cache=True)
def entry(rq, rqf, rp, sched, j, r, n, tot):
    """Add step entry (r, n) (`sim.engine.request_state.entry_totals`) to the step's totals
    tot = [context, prefill tokens, prefill sequences, log-probability ms, seeded, context
    the prefill chunks attend to before them, their attention pairs, their new tokens x that
    context] (`prefill_spans`)."""
    m = rp[j, NSCHED]
    sched[j, m, 0], sched[j, m, 1] = r, n
    rp[j, NSCHED] = m + 1
    if rq[r, COMPUTED] < rq[r, TARGET]:
        tot[3] += n * rqf[r, LP_PROMPT]
        tot[5] += rq[r, COMPUTED]
        tot[6] += n * (rq[r, COMPUTED] + n)
        tot[7] += n * rq[r, COMPUTED]
        tot[0] += rq[r, COMPUTED] + n
        tot[1] += n
        tot[2] += 1
        if rq[r, COMPUTED] + n >= rq[r, TARGET]:
            tot[3] += rqf[r, LP_SAMPLE]
            tot[4] += rq[r, SEEDED]
    else:
        tot[0] += rq[r, COMPUTED] + 1
        tot[3] += rqf[r, LP_SAMPLE]
        tot[4] += rq[r, SEEDED]


@njit(cache=True)
def preempt(rq, rp, ri, running, pc, tab, lru, free, j, v):
    """`Replica._preempt`: v recomputes from the start, back in the queue."""
    remove_running(rp, running, j, v)
    release(rq, rp, pc, tab, lru, free, j, v)
    rq[v, COMPUTED] = 0
    rq[v, TARGET] = rq[v, PROMPT] + rq[v, GENERATED]
    ri[PREEMPTS, rq[v, ROW]] += 1
    enqueue(rq, rp, j, v, True)


@njit(cache=True)
def unschedule(rq, rp, sched, j, v):
    """`Replica._unschedule`: v out of the step's entries; the tokens it was charged."""
    m = 0
    while sched[j, m, 0] != v:
        m += 1
    n = sched[j, m, 1]
    for q in range(m, rp[j, NSCHED] - 1):
        sched[j, q, 0], sched[j, q, 1] = sched[j, q + 1, 0], sched[j, q + 1, 1]
    rp[j, NSCHED] -= 1
    return 1 if rq[v, COMPUTED] >= rq[v, TARGET] else n


@njit(cache=True)
def store(rq, rp, pc, tab, lru, free, j, r, computed_tokens):
    """`PrefixCache.store` of the request's newly full group blocks."""
    full = min(rq[r, PREFIX], computed_tokens) // rp[j, BS]
    if rq[r, GROUP] >= 0 and full > rq[r, SHARED]:
        added = P.store(tab, pc, lru, free, j, rq[r, GROUP], rq[r, LINKS:], rp[j, BS],
                        rq[r, SHARED], full, rp.shape[0])
        rq[r, BLOCKS] -= added
        rq[r, SHARED] += added


@njit(cache=True)
def head_admissible(rq, rp, lru, j):
    """`Replica._head_admissible`: whether the queue's head could be admitted next step."""
    if rp[j, WCOUNT] == 0 or rp[j, RCOUNT] >= rp[j, MAX_SEQS]:
        return False
    need = cdiv(rq[rp[j, WHEAD], TARGET], rp[j, BS])
    return need <= rp[j, FREE] + lru[j, 2]


@njit(cache=True)
def run_length(rq, rp, running, j):
    """`sim.engine.run_length.decode_run_length` (no speculation)."""
    bs, free, n = rp[j, BS], rp[j, FREE], rp[j, RCOUNT]
    k = 1 << 62
    for i in range(n):
        r = running[j, i]
        k = min(k, rq[r, OUTPUT] - rq[r, GENERATED])
    if k <= 1:
        return 1
    if n * (k // bs + 2) <= free or extra(rq, rp, running, j, k) <= free:
        return k
    lo, hi = 1, k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if extra(rq, rp, running, j, mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


@njit(cache=True)
def extra(rq, rp, running, j, it):
    """New blocks the running requests need for `it` more tokens each."""
    need, bs = 0, rp[j, BS]
    for i in range(rp[j, RCOUNT]):
        r = running[j, i]
        x = cdiv(rq[r, COMPUTED] + it, bs) - rq[r, BLOCKS] - rq[r, SHARED]
        if x > 0:
            need += x
    return need
