"""Request-by-request templates in the program kernel: a templated request's follow-ups sent
where it retires, with no round trip to the Python driver.

An asynchronous A1 program's requests each send what follows from their own outcome
(`sim.workloads.request_templates`; a search program's next round follows the last request of
its round): once a question's record is written into the kernel's arrays
(`sim.workloads.kernel_templates`), the kernel does what `TemplateDriver.on_request_done` does
for such a request (the program's tokens take the request's, its follow-ups go out to the
replicas the program is pinned to, numbered on from its last, at the priority its scheduler
gives (`_priority`: Dynasor's on the history in `finished_lengths`); or, with nothing in
flight and nothing to send, the program is done) and logs what the driver's tables need: each
send's owner columns (`klog`) and each program done (`kdone`). A path that stops on its probes
is taken by `stop_calls`. A ToT program's target requests go through its target queue (`pg`'s
last columns: SEED's one at a time, `send`, `_pop`), as `request_templates.returned` sends
them. A follow-up bound for a pool the program is not pinned to yet (routing is Python's), or
past the room the driver left, hands the request back (`TEMPLATED`); the driver then does the
same in Python.
"""

from __future__ import annotations

from numba import njit

from sim.kernels import finished_lengths as F
from sim.kernels.program_kernel import submit
from sim.kernels.program_state import (
    CALLS, CHAINED, DYN_DEFAULT, FL_N, FOLD, HEAP_N, IDX, KDONE_N, KFREE_N, KLOG_N, LINKS,
    NEXT_IDX, NODE_ROOM, NPOOLS, PRIO_MODE, PROG, RBASE, SEG_N, TROW)

# a template request's row of `tk` (int64)
# (T_BARRIER: its follow-ups wait until none of the program's requests is in flight)
# (T_END: the tokens its program ends with, which the Dynasor scheduler's history takes; at
# most, for a path that stops; T_STOP: `stop_calls`' flags of a path that stops on a probe)
# (T_QUEUE: where it waits in its program's target queue, the queue's limit, else 0; T_INDEX:
# its number in its template, for the driver's `trows`)
T_FOLLOW0, T_FOLLOWN, T_GAINED, T_POOL, T_PATH, T_ROLE, T_PROMPT, T_OUTPUT, T_PREFIX, \
    T_SCORE_FROM, T_SEEDED, T_BARRIER, T_END, T_STOP, T_QUEUE, T_INDEX, T_COLS = range(17)
# `tkf`: per request-cost class c, the request's log-probability costs there at 2c and 2c + 1
# a program's row of `pg` (int64): its tokens, its requests in flight, its requests made, for a
# path that stops (`stop_calls`) its gate probes yet to return, its probes' tokens and how it
# ended, its target queue's requests in flight and waiting, then per pool the replica it is
# pinned to there (-1: none yet), then per pool the tokens its routing booked there (`NPOOLS`
# pools), then the requests waiting in its target queue in order (template row, number);
# `pgf`: its arrival time
P_TOKENS, P_OPEN, P_NEXT, P_GATES, P_PROBE, P_DONE, P_QIN, P_QN, P_PIN0 = range(9)
FCFS, LPM, APP_FIFO, DYNASOR = range(4)
"""`PRIO_MODE`: the priority of `policies.scheduling`'s `Fcfs`, `LongestPrefixMatch`, `AppFifo`,
`DynasorGang` (its finished-programs estimate; `kpar[0]` its escalation age, `ctr[DYN_DEFAULT]`
its default remaining tokens)"""
RANKS = 100_000
"""`policies.scheduling._RANKS`: program ranks inside one Dynasor priority class"""
FOLDED, TEMPLATED = -2, -3
"""what `follow` returns for a templated request: done here, the driver to read `klog` and
`kdone`; handed back to the driver (its slot still held)"""


@njit(cache=True)
def follow(st, s, out):
    """The retired request in slot s (`retire`'s `out`): a templated one's follow-ups sent here
    (FOLDED) or handed back (TEMPLATED); any other's `out` as it was."""
    rq, tk, pg, ctr = st.rq, st.tk, st.pg, st.ctr
    p = rq[s, PROG]
    if p < 0 or out < 0:
        return out
    if out & 1:  # aborted: the driver says why that cannot be
        return TEMPLATED
    t = rq[s, TROW]
    f0, fn = tk[t, T_FOLLOW0], tk[t, T_FOLLOWN]
    head = _head(st, p) if tk[t, T_QUEUE] else -1  # what waits for the room it leaves
    if not _room(st, fn + (head >= 0)) or \
            ctr[PRIO_MODE] == DYNASOR and tk[t, T_END] >= st.flc.shape[0]:
        return TEMPLATED  # (a history too short for the program's tokens: the driver's)
    for i in range(fn):
        if pg[p, P_PIN0 + tk[st.tfo[f0 + i], T_POOL]] < 0:
            return TEMPLATED
    if head >= 0 and pg[p, P_PIN0 + tk[head, T_POOL]] < 0:
        return TEMPLATED
    rq[s, PROG] = -1
    st.kfree[ctr[KFREE_N]] = s
    ctr[KFREE_N] += 1
    pg[p, P_OPEN] -= 1
    pg[p, P_TOKENS] += tk[t, T_GAINED]
    out = -1
    if tk[t, T_QUEUE]:
        pg[p, P_QIN] -= 1
        if head >= 0:
            _pop(st, p, _priority(st, p))
            out = FOLDED
    if tk[t, T_BARRIER] and pg[p, P_OPEN] > 0:  # its round's last one sends the next
        return out
    if fn == 0:
        if pg[p, P_OPEN] > 0:
            return out
        n = ctr[KDONE_N]
        # (`stop_calls.DONE_CLOSED`)
        st.kdone[n, 0], st.kdone[n, 1], st.kdone[n, 2], st.kdone[n, 3] = p, rq[s, IDX], 0, \
            tk[t, T_END]
        ctr[KDONE_N] += 1
        if ctr[PRIO_MODE] == DYNASOR:  # the scheduler's history takes the program
            F.add(st.flc, st.flt, tk[t, T_END])
            ctr[FL_N] += 1
        unbook(st, p)
        return FOLDED
    priority = _priority(st, p)
    for i in range(fn):
        send(st, p, st.tfo[f0 + i], priority)
    return FOLDED


@njit(cache=True)
def unbook(st, p):
    """Program p is done: the tokens routing booked for it on each replica it is pinned to
    given back (`sim.workloads.programs.unbooker`)."""
    npools = st.ctr[NPOOLS]
    for c in range(npools):
        rid = st.pg[p, P_PIN0 + c]
        if rid >= 0:
            st.lo[rid] -= st.pg[p, P_PIN0 + npools + c]
            st.lf[rid] -= 1


@njit(cache=True)
def _priority(st, p):
    """The priority of program p's next requests, as its scheduler gives it."""
    mode = st.ctr[PRIO_MODE]
    if mode == FCFS:
        return 0
    if mode == LPM:
        return -st.pg[p, P_TOKENS]
    if mode == APP_FIFO:
        return p
    rank = p % RANKS  # `DynasorGang.priority`
    if st.clock[0] - st.pgf[p] > st.kpar[0]:
        return -RANKS + rank
    m = F.median_remaining(st.flt, st.ctr[FL_N], st.pg[p, P_TOKENS])
    return (st.ctr[DYN_DEFAULT] if m < 0 else m) * RANKS + rank


@njit(cache=True)
def _room(st, fn):
    """Whether fn sends fit: free slots, log rows and result columns, and room for each to
    plan a step (a step row, events, cached blocks) past what the driver keeps for its next
    `CALLS` calls (`KernelRoom._room`)."""
    ctr = st.ctr
    if fn > ctr[KFREE_N] or ctr[KLOG_N] + fn > st.klog.shape[0] or \
            ctr[NEXT_IDX] - ctr[RBASE] + fn > st.rt.shape[1] or ctr[KDONE_N] >= st.kdone.shape[0]:
        return False
    reserve = CALLS + 4 + 2 * fn
    if ctr[FOLD] == 0 and ctr[SEG_N] + reserve > st.seg.shape[0]:
        return False
    return ctr[HEAP_N] + reserve <= st.h.shape[0] and \
        st.free[1] + (CALLS + 1 + fn) * ctr[NODE_ROOM] <= st.pc.shape[0]


@njit(cache=True)
def _head(st, p):
    """The template row first in program p's target queue, or -1 where none waits."""
    if st.pg[p, P_QN] == 0:
        return -1
    return st.pg[p, _queue_col(st)]


@njit(cache=True)
def _queue_col(st):
    """`pg`'s first column of a program's waiting requests, past its pins and bookings."""
    return P_PIN0 + 2 * st.ctr[NPOOLS]


@njit(cache=True)
def _pop(st, p, priority):
    """The request first in program p's target queue sent, the rest moved up."""
    pg = st.pg
    q = _queue_col(st)
    t, index = pg[p, q], pg[p, q + 1]
    n = pg[p, P_QN] - 1
    pg[p, q:q + 2 * n] = pg[p, q + 2:q + 2 * n + 2].copy()
    pg[p, P_QN] = n
    pg[p, P_QIN] += 1
    send_at(st, p, t, priority, index)


@njit(cache=True)
def send(st, p, t, priority):
    """Template request t of program p made, numbered on from the program's last: sent, or,
    where it goes through the program's target queue and the queue's limit is in flight,
    queued (`policies.seed.VerifyQueue`)."""
    pg = st.pg
    index = pg[p, P_NEXT]
    pg[p, P_NEXT] = index + 1
    limit = st.tk[t, T_QUEUE]
    if limit:
        if pg[p, P_QIN] >= limit:
            q = _queue_col(st) + 2 * pg[p, P_QN]
            if q + 1 >= pg.shape[1]:  # more than the record's `queue_room` wait: a bug
                raise RuntimeError("a program's target queue is past its room")
            pg[p, q], pg[p, q + 1] = t, index
            pg[p, P_QN] += 1
            return
        pg[p, P_QIN] += 1
    send_at(st, p, t, priority, index)


@njit(cache=True)
def send_at(st, p, t, priority, index):
    """Template request t of program p, its number `index`, to the replica it is pinned to in
    t's pool, as the driver's `_send_requests` sends it (a free slot of `kfree`, the next
    request idx)."""
    rq, tk, pg, ctr = st.rq, st.tk, st.pg, st.ctr
    rid = pg[p, P_PIN0 + tk[t, T_POOL]]
    ctr[KFREE_N] -= 1
    r = st.kfree[ctr[KFREE_N]]
    idx = ctr[NEXT_IDX]
    ctr[NEXT_IDX] = idx + 1
    n = ctr[KLOG_N]
    ctr[KLOG_N] = n + 1
    st.klog[n, 0], st.klog[n, 1], st.klog[n, 2], st.klog[n, 3], st.klog[n, 4] = \
        p, index, tk[t, T_PATH], tk[t, T_ROLE], tk[t, T_INDEX]
    pg[p, P_OPEN] += 1
    m = 1 + 2 * st.tlinks[t, 0]
    rq[r, LINKS:LINKS + m] = st.tlinks[t, :m]
    rq[r, PROG], rq[r, TROW] = p, t
    c = 2 * st.kclass[rid]
    submit(rq, st.rqf, st.rp, st.rf, st.running, st.sched, st.rt, st.ri, st.h, st.seg, ctr,
           st.clock, st.done, st.pc, st.tab, st.lru, st.free, rid, r, idx, tk[t, T_PROMPT],
           tk[t, T_OUTPUT], priority, CHAINED, tk[t, T_PREFIX], tk[t, T_SCORE_FROM],
           tk[t, T_SEEDED], st.tkf[t, c], st.tkf[t, c + 1])
