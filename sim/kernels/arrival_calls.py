"""Programs that arrive in the program kernel: routed, pinned and started where their arrival
event comes, with no round trip to the Python driver.

Once a question's record is in the kernel (`sim.workloads.kernel_templates`), every later
program of that question whose first requests go to the pool it is pinned to at arrival is a
row of `pk` (its record's first row, how many requests it starts with, the tokens routing books
for it, its gate probes, that pool's column). When the arrival event of the next program
(`NEXT_PROG`) comes and it is such a row, the kernel does what the driver's arrival process
does (`sim.workloads.programs.arrivals`): routes it by least outstanding tokens among the pool's
replicas (`tpool`; `policies.routing.LeastOutstanding`, ties to the lowest replica id), books
the tokens, pins it, sends its first requests at its scheduler's priority, and goes on to the
next program: at once where it is due too, else at an event at its arrival time, as the
driver's process waits. A program that is not such a row (its question's first, a record kept
in Python) or past the room the driver left goes back to the driver (`HAND`), which starts it
and sets `NEXT_PROG` past it. A program's booking is given back where it is done
(`template_calls.unbook`).
"""

from __future__ import annotations

from numba import njit

from sim.kernels.program_state import NEXT_PROG, NPOOLS
from sim.kernels.state import push_event
from sim.kernels.template_calls import (
    P_GATES, P_PIN0, P_TOKENS, P_DONE, _priority, _room, send)

PK_FIRST, PK_NFIRST, PK_BOOKED, PK_GATES, PK_POOL, PK_COLS = range(6)
"""a program's row of `pk`: its record's first row in the kernel (-1: the driver starts it), its
first requests, the tokens its routing books, its gate probes (`stop_calls`), the pool column
it is pinned to at arrival"""
HAND, GONE, WAITS = range(3)
"""what `arrive` returns: the next program is the driver's to start; none is left to arrive;
the next arrival waits for its event"""


@njit(cache=True)
def arrive(st):
    """The arrival event of program `NEXT_PROG`: it and each next one due at once started
    here, while each is a row of `pk` with room for its sends (as `arrive` returns)."""
    ctr, pk, n = st.ctr, st.pk, st.pa.shape[0]
    i = ctr[NEXT_PROG]
    while True:
        if pk[i, PK_FIRST] < 0 or not _room(st, pk[i, PK_NFIRST]):
            return HAND
        start(st, i)
        i += 1
        ctr[NEXT_PROG] = i
        if i == n:
            return GONE
        gap = st.pa[i] - st.clock[0]
        if gap > 0:  # as the driver's process waits: an event at now + gap
            push_event(st.h, ctr, st.clock[0] + gap, -1, 0, 0, 0.0)
            return WAITS


@njit(cache=True)
def start(st, p):
    """Program p arrives: routed to the least loaded replica of its pool (booking its tokens),
    pinned there, its first requests sent."""
    pg, pk, lo = st.pg, st.pk, st.lo
    pg[p, P_TOKENS:P_DONE + 1] = 0
    pg[p, P_GATES] = pk[p, PK_GATES]
    best = st.tpool[0]
    for m in st.tpool:
        if lo[m] < lo[best]:
            best = m
    lo[best] += pk[p, PK_BOOKED]
    st.lf[best] += 1
    pool, npools = pk[p, PK_POOL], st.ctr[NPOOLS]
    pg[p, P_PIN0 + pool], pg[p, P_PIN0 + npools + pool] = best, pk[p, PK_BOOKED]
    st.pgf[p] = st.pa[p]
    priority = _priority(st, p)
    for k in range(pk[p, PK_NFIRST]):
        send(st, p, pk[p, PK_FIRST] + k, priority)
