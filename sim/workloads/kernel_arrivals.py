"""The programs' arrivals handed to the program kernel (`sim.kernels.arrival_calls`), for a
`TemplateDriver` whose records are in the kernel and whose target pool routes by least
outstanding tokens.

The driver starts each question's first program itself (recording it); once its record is in
the kernel, `fill` makes every other program of that question a row the kernel starts at its
arrival event (`pk`), where its first requests go to one pool (the one it is pinned to at
arrival, or another the kernel pins it to as the driver would: A1's draft pool). The
driver's arrival process (`sim.workloads.programs.arrivals`) reads how far the kernel got
(`next_program`) whenever it is handed a program back, and says how far it got (`arrived`).
"""

from __future__ import annotations

import numpy as np

from policies.routing import LeastOutstanding
from sim.kernels import arrival_calls as A
from sim.kernels import program_state as S


def arrives_in_kernel(cluster) -> bool:
    """Whether the kernel can route the programs' arrivals: their pool routes by least
    outstanding tokens (another router is Python's)."""
    return type(cluster.routers[cluster.pool_for("target")]) is LeastOutstanding


class KernelArrivals:
    """The arrival rows of a run's programs (`runs`, in arrival order) in the kernel."""

    def __init__(self, kernel, runs: list, key):
        self.kernel = kernel
        self.by_key: dict = {}  # record key -> its programs, until the record is written
        for run in runs:
            self.by_key.setdefault(key(run), []).append(run)
        st = kernel.cluster.st
        pool = kernel.cluster.pool_for("target")
        self.pool = kernel.pools[pool]
        st.pa = np.array([run.arrival_s for run in runs], dtype=np.float64)
        st.pk = np.full((len(runs), A.PK_COLS), -1, dtype=np.int64)
        members = kernel.cluster.pools
        st.tpool = np.full((len(kernel.pools), max(len(m) for m in members.values())), -1,
                           dtype=np.int64)  # per pool column, its replicas in id order
        for name, c in kernel.pools.items():
            st.tpool[c, :len(members[name])] = members[name]
        kernel.rows_for(len(runs))
        st.ctr[S.KARR], st.ctr[S.NEXT_PROG] = 1, 0
        kernel.cluster.repack()

    def fill(self, key, tpl) -> None:
        """The programs of a record now in the kernel: each a row the kernel starts, where
        the record starts with requests to the pool a program is pinned to at arrival."""
        runs = self.by_key.pop(key, ())
        kernel = self.kernel
        first = tpl.first
        pools = {kernel.pools[kernel.cluster.pool_for(tpl.requests[k][0].role)] for k in first}
        if not runs or first != tuple(range(len(first))) or len(pools) != 1:
            return
        idx = np.array([run.idx for run in runs])
        pk = kernel.cluster.st.pk
        pk[idx, A.PK_FIRST], pk[idx, A.PK_NFIRST], pk[idx, A.PK_POOL] = \
            tpl.kernel_row, len(first), self.pool
        other = pools.pop()
        if other != self.pool:  # its first requests' pool, pinned at the first of them
            _spec, prompt, _prefix, _chain, output = tpl.requests[first[0]]
            pk[idx, A.PK_POOL2], pk[idx, A.PK_BOOKED2] = other, prompt + output
        pk[idx, A.PK_GATES] = tpl.stops.gates if tpl.stops is not None else 0
        pk[idx, A.PK_BOOKED] = [run.question.prompt_tokens + run.question.expected_tokens
                                for run in runs]  # as `arrivals` pins
        for run in runs:
            run.template = tpl
            kernel.runs[run.idx] = run

    def next_program(self) -> int:
        """The next program to arrive (the kernel started those before it)."""
        return int(self.kernel.cluster.st.ctr[S.NEXT_PROG])

    def arrived(self, n: int) -> None:
        """The driver started programs up to n."""
        self.kernel.cluster.st.ctr[S.NEXT_PROG] = n
