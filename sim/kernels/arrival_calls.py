"""Programs that arrive in the program kernel: routed, pinned and started where their arrival
event comes, with no round trip to the Python driver.

Once a question's record is in the kernel (`sim.workloads.kernel_templates`), every later
program of that question whose first requests go to one pool is a row of `pk` (its record's
first row, how many requests it starts with, the tokens routing books for it, its gate probes,
its pools' columns). When the arrival event of the next program (`NEXT_PROG`) comes and it is
such a row, the kernel does what the driver's arrival process does
(`sim.workloads.programs.arrivals`): routes it by least outstanding tokens among its pool's
replicas (`tpool`; `policies.routing.LeastOutstanding`, ties to the lowest replica id), books
the tokens, pins it (and where its first requests go to another pool, there too, as the driver
pins a pool at a program's first request there: A1's draft pool), sends its first requests at
its scheduler's priority, and goes on to the next program: at once where it is due too, else
at an event at its arrival time, as the driver's process waits. A program that is not such a
row (its question's first, a record kept in Python) or past the room the driver left goes back
to the driver (`HAND`), which starts it and sets `NEXT_PROG` past it. A program's bookings are
given back where it is done (`template_calls.unbook`).
"""

from __future__ import annotations

from numba import njit

from sim.kernels.program_state import NEXT_PROG, NPOOLS
from sim.kernels.state import push_event
from sim.kernels.template_calls import (
    P_GATES, P_PIN0, P_TOKENS, _priority, _room, send)

PK_FIRST, PK_NFIRST, PK_BOOKED, PK_GATES, PK_POOL, PK_POOL2, PK_BOOKED2, PK_COLS = range(8)
"""a program's row of `pk`: its record's first row in the kernel (-1: the driver starts it), its
first requests, the tokens its routing books, its gate probes (`stop_calls`), the pool column
it is pinned to at arrival, and the pool column its first requests go to where that is
another (-1: none) with the tokens routing books there (the first one's prompt and output, as
the driver pins a pool at its first request there)"""
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
    pg, pk = st.pg, st.pk
    pg[p, P_TOKENS:P_PIN0] = 0
    pg[p, P_GATES] = pk[p, PK_GATES]
    _pin(st, p, pk[p, PK_POOL], pk[p, PK_BOOKED])
    if pk[p, PK_POOL2] >= 0:
        _pin(st, p, pk[p, PK_POOL2], pk[p, PK_BOOKED2])
    st.pgf[p] = st.pa[p]
    priority = _priority(st, p)
    for k in range(pk[p, PK_NFIRST]):
        send(st, p, pk[p, PK_FIRST] + k, priority)


@njit(cache=True)
def _pin(st, p, pool, tokens):
    """Program p pinned to the replica of pool column `pool` with the fewest outstanding
    tokens (its members in `tpool`, in id order: ties to the first), `tokens` booked there."""
    lo, members = st.lo, st.tpool[pool]
    best = members[0]
    for m in members:
        if m < 0:
            break
        if lo[m] < lo[best]:
            best = m
    lo[best] += tokens
    st.lf[best] += 1
    npools = st.ctr[NPOOLS]
    st.pg[p, P_PIN0 + pool], st.pg[p, P_PIN0 + npools + pool] = best, tokens
