"""Templated paths that stop on a probe, in the program kernel: a CoT program whose probes may
stop its path (`sim.workloads.stop_templates`) sent on, stopped and closed where its requests
retire.

Such a program's record holds its whole chain (every chunk to the path's traced end, a probe
at every interval) and flags per request (`T_STOP`): the probes up to the position where the
policy stops (`GATE`), the chunk that ends the path (`END`), the probes (`PROBE`). The path
stops once its last gate probe has returned (the driver's program decides at the stop probe
once every probe before it has returned, in position order), or ends as its last chunk
returns, whichever comes first: then its requests in flight are aborted in the order they were
sent (`stop`, as the driver's `Abort`s go), those out of the iteration in flight at once, the
program done. A program's tokens take what each request generated, aborted ones too; it closes
once nothing of it is in flight (`kdone`'s event: `DONE_CLOSED`, `DONE`, `CLOSED`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.kernels import finished_lengths as F
from sim.kernels.program_kernel import abort
from sim.kernels.program_state import (
    DONE, FL_N, IDX, KDONE_N, KFREE_N, NPOOLS, PRIO_MODE, PROG, RCOUNT, TROW, WHEAD, WNEXT)
from sim.kernels.template_calls import (
    DYNASOR, FOLDED, P_DONE, P_GATES, P_OPEN, P_PIN0, P_PROBE, P_TOKENS, T_END, T_FOLLOW0,
    T_FOLLOWN, T_POOL, T_STOP, TEMPLATED, _priority, _room, follow, send, unbook)

STOPS, GATE, END, PROBE = 1, 2, 4, 8
"""`T_STOP`'s bits: a row of a stopping template; a probe up to the stop; the path's last
chunk; a probe"""
ENDED, STOPPED = 1, 2
"""`P_DONE`: the path ended at its last chunk; stopped on its probes"""
DONE_CLOSED, DONE_OPEN, CLOSED = 0, 1, 2
"""`kdone`'s events: the program done with nothing in flight; done with aborted requests still
in the iteration in flight; closed (the last of those returned)"""
SEND = -4
"""what `take` returns where the request's follow-ups are to go out"""


@njit(cache=True)
def follow_any(st, s, out):
    """`template_calls.follow`, or `follow_stop` for a row of a stopping template."""
    p = st.rq[s, PROG]
    if p >= 0 and out >= 0 and st.tk[st.rq[s, TROW], T_STOP]:
        return follow_stop(st, s, out)
    return follow(st, s, out)


@njit(cache=True)
def follow_stop(st, s, out):
    """The retired request in slot s of a stopping template (`retire`'s `out`): taken here
    (FOLDED: the driver to read `klog` and `kdone`; -1: nothing to read) or handed back
    (TEMPLATED) where its sends, its stop's aborts or their log lack room."""
    rq, tk, pg, ctr = st.rq, st.tk, st.pg, st.ctr
    p, t = rq[s, PROG], rq[s, TROW]
    trigger, fn = _outcome(st, p, t, out & 1)
    if not _room(st, fn + (pg[p, P_OPEN] if trigger else 0)) or \
            ctr[KDONE_N] >= st.kdone.shape[0] or \
            ctr[PRIO_MODE] == DYNASOR and tk[t, T_END] >= st.flc.shape[0]:
        return TEMPLATED
    for i in range(fn):
        if pg[p, P_PIN0 + tk[st.tfo[tk[t, T_FOLLOW0] + i], T_POOL]] < 0:
            return TEMPLATED
    rq[s, PROG] = -1
    st.kfree[ctr[KFREE_N]] = s
    ctr[KFREE_N] += 1
    code = take(st, p, t, rq[s, IDX], out >> 1, out & 1)
    if code != SEND:
        return code
    priority = _priority(st, p)
    f0 = tk[t, T_FOLLOW0]
    for i in range(fn):
        send(st, p, st.tfo[f0 + i], priority)
    return FOLDED


@njit(cache=True)
def _outcome(st, p, t, aborted):
    """What a return of program p's template request t does: (the path's end it brings,
    `ENDED` / `STOPPED` or 0; the follow-ups it sends)."""
    flags = st.tk[t, T_STOP]
    if aborted or st.pg[p, P_DONE]:
        return 0, 0
    if flags & GATE and st.pg[p, P_GATES] == 1:
        return STOPPED, 0
    if flags & END:
        return ENDED, 0
    return 0, st.tk[t, T_FOLLOWN]


@njit(cache=True)
def take(st, p, t, idx, generated, aborted):
    """Program p's template request t (request idx) returned with `generated` tokens, its
    slot free: the program's counts, its stop or end (the rest aborted, `kdone` logged) or its
    close; SEND where its follow-ups go out, FOLDED where `kdone` has news, else -1."""
    pg = st.pg
    trigger, fn = _outcome(st, p, t, aborted)
    flags = st.tk[t, T_STOP]
    pg[p, P_OPEN] -= 1
    pg[p, P_TOKENS] += generated
    if flags & PROBE:
        pg[p, P_PROBE] += generated
    if pg[p, P_DONE]:
        if pg[p, P_OPEN] == 0:
            _log(st, p, idx, CLOSED)
            return FOLDED
        return -1
    if flags & GATE:
        pg[p, P_GATES] -= 1
    if trigger:
        stop(st, p, trigger)
        _log(st, p, idx, DONE_CLOSED if pg[p, P_OPEN] == 0 else DONE_OPEN)
        return FOLDED
    return SEND if fn else -1


@njit(cache=True)
def _log(st, p, idx, event):
    n = st.ctr[KDONE_N]
    st.kdone[n, 0], st.kdone[n, 1], st.kdone[n, 2], st.kdone[n, 3] = p, idx, event, \
        st.pg[p, P_TOKENS]
    st.ctr[KDONE_N] = n + 1


@njit(cache=True)
def stop(st, p, trigger):
    """Program p's path ends (`trigger`): its requests in flight aborted in the order they
    were sent, each out of the iteration in flight counted and its slot freed now (the others
    return at their step's end), then the Dynasor scheduler's history takes its tokens."""
    rq, pg, ctr = st.rq, st.pg, st.ctr
    pg[p, P_DONE] = trigger
    slots, reps = in_flight(st, p)
    for m in range(slots.shape[0]):
        r, j = slots[m], reps[m]
        flags = st.tk[rq[r, TROW], T_STOP]
        g = abort(rq, st.rqf, st.rp, st.rf, st.running, st.sched, st.rt, st.ri, st.h, st.seg,
                  ctr, st.clock, st.done, st.pc, st.tab, st.lru, st.free, j, r)
        if g >= 0:
            rq[r, PROG] = -1
            st.kfree[ctr[KFREE_N]] = r
            ctr[KFREE_N] += 1
            pg[p, P_OPEN] -= 1
            pg[p, P_TOKENS] += g
            if flags & PROBE:
                pg[p, P_PROBE] += g
    if ctr[PRIO_MODE] == DYNASOR:
        F.add(st.flc, st.flt, pg[p, P_TOKENS])
        ctr[FL_N] += 1
    unbook(st, p)


@njit(cache=True)
def in_flight(st, p):
    """Program p's requests running or waiting on the replicas it is pinned to, in the order
    they were sent (request idx): (their slots, their replicas)."""
    rq, rp = st.rq, st.rp
    n = 0
    pins = range(P_PIN0, P_PIN0 + st.ctr[NPOOLS])
    for c in pins:
        j = st.pg[p, c]
        if j >= 0:
            n += rp[j, RCOUNT] + _waiting(rq, rp, j)
    slots, reps, m = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), 0
    for c in pins:
        j = st.pg[p, c]
        if j < 0:
            continue
        for i in range(rp[j, RCOUNT]):
            r = st.running[j, i]
            if rq[r, PROG] == p and not rq[r, DONE]:
                slots[m], reps[m], m = r, j, m + 1
        r = rp[j, WHEAD]
        while r >= 0:
            if rq[r, PROG] == p:
                slots[m], reps[m], m = r, j, m + 1
            r = rq[r, WNEXT]
    order = np.argsort(rq[slots[:m], IDX], kind="mergesort")
    return slots[:m][order], reps[:m][order]


@njit(cache=True)
def _waiting(rq, rp, j):
    n, r = 0, rp[j, WHEAD]
    while r >= 0:
        n, r = n + 1, rq[r, WNEXT]
    return n

