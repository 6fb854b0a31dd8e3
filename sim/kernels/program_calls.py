"""The program kernel's entry points on the packed state (`program_state.State.packed`): one
argument where the arrays are 19, as the driver (`sim.kernels.programs`) calls them (a numba
call unboxes each array argument, and these calls run once per request)."""

from __future__ import annotations

from numba import njit

from sim.kernels.program_kernel import SENT, abort, advance, drain, retire, schedule_arrival
from sim.kernels.program_state import CHAINED, LINKS

GROUP_AT = 6
"""a pending send's group, in int64 words from its start (after replica, slot, idx, prompt,
output and priority: `programs._PACK`)"""


@njit(cache=True)
def place_chains(st, npend):
    """Copy each pending send's prefix chain from its row of `chains` into its slot's links, its
    group then `CHAINED` as `submit` takes it (a row copy here, compiled, instead of a numpy
    slice write per request in the driver)."""
    for k in range(npend):
        o = k * SENT
        g = st.pend_i[o + GROUP_AT]
        if g < CHAINED:
            row = CHAINED - 1 - g
            n = 1 + 2 * st.chains[row, 0]
            st.rq[st.pend_i[o + 1], LINKS:LINKS + n] = st.chains[row, :n]
            st.pend_i[o + GROUP_AT] = CHAINED


@njit(cache=True)
def advance_st(st, npend, node_room, pending):
    """`advance` on the packed state."""
    place_chains(st, npend)
    return advance(st.rq, st.rqf, st.rp, st.rf, st.running, st.sched, st.rt, st.ri, st.h,
                   st.seg, st.ctr, st.clock, st.done, st.pc, st.tab, st.lru, st.free,
                   st.pend_i, st.pend_f, npend, node_room, pending)


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
def retire_st(st, npend, j, r):
    """The pending sends, then `retire` of slot r on replica j, on the packed state."""
    drain_st(st, npend)
    return retire(st.rq, st.rqf, st.rp, st.rf, st.running, st.sched, st.rt, st.ri, st.h, st.seg,
                  st.ctr, st.clock, st.done, st.pc, st.tab, st.lru, st.free, j, r)


@njit(cache=True)
def abort_st(st, npend, j, r):
    """The pending sends, then `abort` of slot r on replica j, on the packed state."""
    drain_st(st, npend)
    return abort(st.rq, st.rqf, st.rp, st.rf, st.running, st.sched, st.rt, st.ri, st.h, st.seg,
                 st.ctr, st.clock, st.done, st.pc, st.tab, st.lru, st.free, j, r)
