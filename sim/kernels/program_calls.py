"""The program kernel's entry points on the packed state (`program_state.State.packed`): one
argument where the arrays are 19, as the driver (`sim.kernels.programs`) calls them (a numba
call unboxes each array argument, and these calls run once per request)."""

from __future__ import annotations

from numba import njit

from sim.kernels.program_kernel import SENT, abort, advance, drain, retire, schedule_arrival
from sim.kernels.arrival_calls import HAND, arrive
from sim.kernels.program_state import (
    ABORTED, ARRIVAL, CHAINED, GENERATED, IDX, KARR, LINKS, NEXT_IDX, RETIRED)
from sim.kernels.stop_calls import follow_any, take
from sim.kernels.template_calls import FOLDED

IDX_AT = 2
"""a pending send's request idx, in int64 words from its start"""

GROUP_AT = 6
"""a pending send's group, in int64 words from its start (after replica, slot, idx, prompt,
output and priority: `programs._PACK`)"""


@njit(cache=True)
def place_chains(st, npend):
    """Copy each pending send's prefix chain from its row of `chains` into its slot's links, its
    group then `CHAINED` as `submit` takes it (a row copy here, compiled, instead of a numpy
    slice write per request in the driver); the next request idx past theirs."""
    for k in range(npend):
        o = k * SENT
        st.ctr[NEXT_IDX] = st.pend_i[o + IDX_AT] + 1  # the driver numbers them in order
        g = st.pend_i[o + GROUP_AT]
        if g < CHAINED:
            row = CHAINED - 1 - g
            n = 1 + 2 * st.chains[row, 0]
            st.rq[st.pend_i[o + 1], LINKS:LINKS + n] = st.chains[row, :n]
            st.pend_i[o + GROUP_AT] = CHAINED


@njit(cache=True)
def advance_st(st, npend, node_room, pending):
    """`advance` on the packed state, each step's retired requests taken here while the kernel
    takes them (`stop_calls.follow_any`; the step's end then goes on here): as `advance`
    returns, and the index in `done` past the first request the driver takes; whether the
    kernel sent or finished any templated request."""
    place_chains(st, npend)
    folded = False
    while True:
        code, j, n, now, s, out = advance(
            st.rq, st.rqf, st.rp, st.rf, st.running, st.sched, st.rt, st.ri, st.h, st.seg,
            st.ctr, st.clock, st.done, st.pc, st.tab, st.lru, st.free, st.pend_i, st.pend_f,
            npend, node_room, pending)
        npend = 0
        if code == ARRIVAL and st.ctr[KARR] and arrive(st) != HAND:
            folded, pending = True, -1  # started here: on to the next event
            continue
        if code != RETIRED:
            return code, j, n, now, s, out, 1, folded
        out = follow_any(st, s, out)
        i = 1
        while out == FOLDED or out == -1:
            folded = folded or out == FOLDED
            if i == n:
                break
            s = st.done[i]
            out = follow_any(st, s, retire(st.rq, st.rqf, st.rp, st.rf, st.running, st.sched,
                                           st.rt, st.ri, st.h, st.seg, st.ctr, st.clock,
                                           st.done, st.pc, st.tab, st.lru, st.free, j, s))
            i += 1
        else:
            return code, j, n, now, s, out, i, folded
        pending = j  # every retired request taken here: the step ends, and on


@njit(cache=True)
def drain_st(st, npend):
    """`drain` on the packed state."""
    place_chains(st, npend)
    drain(st.rq, st.rqf, st.rp, st.rf, st.running, st.sched, st.rt, st.ri, st.h, st.seg,
          st.ctr, st.clock, st.done, st.pc, st.tab, st.lru, st.free, st.pend_i, st.pend_f, npend)


@njit(cache=True)
def arrival_st(st, npend, gap):
    """`schedule_arrival` on the packed state."""
    place_chains(st, npend)
    schedule_arrival(st.rq, st.rqf, st.rp, st.rf, st.running, st.sched, st.rt, st.ri, st.h,
                     st.seg, st.ctr, st.clock, st.done, st.pc, st.tab, st.lru, st.free,
                     st.pend_i, st.pend_f, npend, gap)


@njit(cache=True)
def abort_st(st, npend, j, r):
    """The pending sends, then `abort` of slot r on replica j, on the packed state."""
    drain_st(st, npend)
    return abort(st.rq, st.rqf, st.rp, st.rf, st.running, st.sched, st.rt, st.ri, st.h, st.seg,
                 st.ctr, st.clock, st.done, st.pc, st.tab, st.lru, st.free, j, r)


@njit(cache=True)
def retire_rest_st(st, npend, j, i, n):
    """The pending sends, then `retire` of `done[i]`, `done[i + 1]`, ... on replica j while the
    kernel takes each (`stop_calls.follow_any`): (the next index; the slot and `out` of the one the
    driver takes, or 0 and -1 once all n are; whether the kernel sent or finished any)."""
    drain_st(st, npend)
    folded = False
    while i < n:
        s = st.done[i]
        out = follow_any(st, s, retire(st.rq, st.rqf, st.rp, st.rf, st.running, st.sched, st.rt,
                                   st.ri, st.h, st.seg, st.ctr, st.clock, st.done, st.pc, st.tab,
                                   st.lru, st.free, j, s))
        i += 1
        if out == FOLDED:
            folded = True
        elif out != -1:
            return i, s, out, folded
    return n, 0, -1, folded


@njit(cache=True)
def take_st(st, npend, s, p, t):
    """The pending sends, then `stop_calls.take` of program p's stopping template request t
    that the kernel handed back (slot s, as it retired): as `take` returns."""
    drain_st(st, npend)
    # its slot as it retired: the tokens its results hold (`finish`), read where they may
    # have been folded away
    return take(st, p, t, st.rq[s, IDX], st.rq[s, GENERATED], st.rq[s, ABORTED])
