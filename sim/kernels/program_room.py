"""The program kernel's arrays (`sim.kernels.program_state.State`): made for a run's replicas
(`new_state`), and grown as the run fills them (`KernelRoom`).

Step rows, events, cached blocks, result columns and request slots start small and double as a
run needs them: the driver checks before every `CALLS` kernel calls that they could not run
short (`KernelRoom._room`), and the kernel's own sends of templated requests
(`sim.kernels.template_calls`) leave that margin untouched. Slots are kept in two stacks: the
driver's (a Python list) and the kernel's (`kfree`, topped up from the driver's), each request's
slot freed where it retires.
"""

from __future__ import annotations

import numpy as np

from sim.kernels import prefix as P
from sim.kernels import program_state as S
from sim.kernels import arrival_calls as A
from sim.kernels import template_calls as T
from sim.kernels.serving import serving_state
from sim.kernels.state import SEG_COLS

CALLS = S.CALLS
KERNEL_SLOTS = 256
"""free slots kept for the kernel's own sends (`template_calls`), topped up with room"""
FOLD_COLUMNS = 4096
"""result columns a run that folds its finished requests starts with (they grow while a
quarter of them would not fold)"""
KLOG_ROWS, KDONE_ROWS = 4096, 1024
"""the kernel's sends and programs done it logs before the driver must read them"""


class KernelRoom:
    """`CompiledCluster`'s growth of its arrays (`st`), its slots and its send buffer."""

    def _grow_pend(self) -> None:
        """Twice the room for sends waiting for the next kernel call."""
        pend = np.zeros(2 * self._pend.shape[0], dtype=np.uint8)
        pend[:self._pend.shape[0]] = self._pend
        self._pend = pend
        self._pend_room *= 2
        self.st.pend_i, self.st.pend_f = pend.view(np.int64), pend.view(np.float64)
        self._st = self.st.packed()

    def _room(self) -> None:
        """Grow whatever the next CALLS kernel calls could fill (each adds at most a step row, an
        event and `node_room` cached blocks), and the kernel's sends (`KERNEL_ROOM`); fold the
        finished requests' results where the run folds them (`folded`)."""
        st = self.st
        self._calls = CALLS
        if self.folded is not None and st.ctr[S.NEXT_IDX] >= self._fold_at:
            self._fold_finished()
        grown = False
        # with templates in the kernel, room for its sends past the driver's next calls (a
        # replica of its own step row, `FOLD`, needs none)
        extra = S.KERNEL_ROOM if self.on_fold is not None else 0
        if st.ctr[S.SEG_N] + CALLS + 2 + (0 if st.ctr[S.FOLD] else extra) > st.seg.shape[0]:
            st.seg = doubled(st.seg)
            grown = True
        if st.ctr[S.HEAP_N] + CALLS + 4 + extra > st.h.shape[0]:
            st.h = doubled(st.h)
            grown = True
        if st.free[1] + (CALLS + 1 + extra) * self.node_room > st.pc.shape[0]:
            st.pc, st.tab = P.grow_cache(st.pc, st.free)
            grown = True
        if self.on_fold is not None and st.ctr[S.KFREE_N] < KERNEL_SLOTS:
            grown = self._kernel_slots() or grown
        if grown:
            self._st = st.packed()
            self._room()  # doubled once may not be enough

    def _kernel_slots(self) -> bool:
        """Top the kernel's free slots up to twice `KERNEL_SLOTS` from the driver's (as many
        more made as it takes): whether the arrays were replaced."""
        grown = False
        want = 2 * KERNEL_SLOTS - int(self.st.ctr[S.KFREE_N])
        while len(self._free) <= want:  # one left for the send that checks room
            self._grow_slots()
            grown = True
        st, n = self.st, int(self.st.ctr[S.KFREE_N])
        taken = self._free[-want:]
        del self._free[-want:]
        st.kfree[n:n + want] = taken[::-1]  # taken as `send` would pop them
        st.ctr[S.KFREE_N] = n + want
        return grown

    def _grow_results(self, idx: int) -> None:
        """Result columns past request idx (doubling)."""
        st = self.st
        n, base = st.rt.shape[1], int(st.ctr[S.RBASE])
        while n <= idx - base:
            n *= 2
        # empty: the kernel sets a request's float columns when it is sent, and fresh memory
        # costs its first touch (a million programs' columns are gigabytes)
        rt, ri = np.empty((S.RT_ROWS, n)), np.zeros((S.RI_ROWS, n), dtype=np.int32)
        rt[:, :st.rt.shape[1]], ri[:, :st.ri.shape[1]] = st.rt, st.ri
        st.rt, st.ri = rt, ri
        self._requests = base + n
        self._st = st.packed()

    def _fold_finished(self) -> None:
        """Fold the finished requests at the front of the result columns into `folded` and move
        the rest up, where half the columns are in use and a quarter or more would go (else
        look again once an eighth more are sent: the columns grow as they fill)."""
        st = self.st
        rows, base, top = st.rt.shape[1], int(st.ctr[S.RBASE]), int(st.ctr[S.NEXT_IDX])
        end = self._settled_below(base, top)
        if end - base >= rows // 4:
            self.fold_results(end, top)
            self._fold_at = end + rows // 2
        else:
            self._fold_at = top + rows // 8

    def _settled_below(self, base: int, top: int) -> int:
        """The first request from `base` whose results may still change or be read: one not
        finished (its finish unset), one in flight (a scoring request's re-run), a program's
        last request whose time the driver has yet to read (`kdone`), one the kernel sent
        that the driver has yet to read (`klog`: who sent it) or one it handed back that the
        driver is taking (`_handed`: its program's end logs it)."""
        st = self.st
        top = max(base, top - int(st.ctr[S.KLOG_N]))  # the kernel's unread sends: its last
        unset = np.isnan(st.rt[S.FINISH_S, :top - base])
        end = base + int(unset.argmax()) if unset.any() else top
        live = st.rq[:, S.DONE] == 0
        if live.any():
            end = min(end, int(st.rq[live, S.IDX].min()))
        if self._handed:
            end = min(end, min(self._handed))
        n = int(st.ctr[S.KDONE_N])
        return min(end, int(st.kdone[:n, 1].min())) if n else end

    def fold_results(self, end: int, top: int) -> None:
        """Fold requests `RBASE`..end-1 (each settled) into `folded`; requests end..top-1 move
        to the front of the columns."""
        st = self.st
        base = int(st.ctr[S.RBASE])
        k, m = end - base, top - base
        self.folded.add(base, result_columns(st.rt[:, :k], st.ri[:, :k]))
        st.rt[:, :m - k], st.ri[:, :m - k] = st.rt[:, k:m], st.ri[:, k:m]
        st.ri[:, m - k:m] = 0  # as fresh columns: `submit` sets only a send's own counts
        st.rq[:, S.ROW] -= k  # a free slot's too: `submit` sets it anew
        st.ctr[S.RBASE] = end
        self._requests = end + st.rt.shape[1]

    def _more_slots(self) -> None:
        """Free slots for the driver's sends: the kernel's past twice `KERNEL_SLOTS` (its
        templated requests' retire there), else twice as many slots."""
        st = self.st
        n = int(st.ctr[S.KFREE_N])
        if n > 2 * KERNEL_SLOTS:
            self._free.extend(st.kfree[KERNEL_SLOTS:n].tolist())
            st.ctr[S.KFREE_N] = KERNEL_SLOTS
        else:
            self._grow_slots()

    def _grow_slots(self) -> None:
        """Twice the request slots, the new ones free for the driver."""
        st = self.st
        n = st.rq.shape[0]
        st.rq, st.rqf = doubled(st.rq), doubled(st.rqf)
        st.rq[n:, S.PROG], st.rq[n:, S.DONE] = -1, 1  # free: no request in flight
        st.kfree = doubled(st.kfree)  # every slot may be free in the kernel at once
        self._idx += [0] * n
        self._free.extend(range(2 * n - 1, n - 1, -1))
        self._st = st.packed()


def result_columns(rt: np.ndarray, ri: np.ndarray) -> dict:
    """The result columns of requests (`rt`, `ri` columns) by `Results`' names."""
    return {"scheduled_s": rt[S.SCHEDULED_S], "first_token_s": rt[S.FIRST_TOKEN_S],
            "finish_s": rt[S.FINISH_S], "arrival_s": rt[S.ARRIVAL_S],
            "prompt_tokens": ri[S.PROMPT_R], "priority": ri[S.PRIORITY_R],
            "replica_id": ri[S.REPLICA_R], "output_tokens": ri[S.OUT_TOKENS],
            "cached_tokens": ri[S.CACHED], "aborted": ri[S.ABORTED_R].astype(bool),
            "preemptions": ri[S.PREEMPTS], "rescored": ri[S.RESCORED_R].astype(bool)}


def doubled(a: np.ndarray) -> np.ndarray:
    out = np.empty((2 * a.shape[0],) + a.shape[1:], dtype=a.dtype)
    out[:a.shape[0]] = a
    return out


def new_state(specs: list, capacity: int, fold: bool, fold_requests: bool = False) -> S.State:
    """The kernel's arrays for replicas `specs` and `capacity` requests (`fold`: a step row per
    replica, `program_state.FOLD`; `fold_requests`: result columns for the requests in flight,
    `KernelRoom._fold_finished`)."""
    nrep = len(specs)
    st = S.State()
    slots = 64 * nrep
    st.rq = np.zeros((slots, S.LINKS + 1), dtype=np.int64)  # no chain's links yet
    st.rq[:, S.PROG], st.rq[:, S.DONE] = -1, 1  # free: no request in flight
    st.chains = np.zeros((64, 1), dtype=np.int64)
    st.rqf = np.zeros((slots, S.RQF_COLS))
    st.rp = np.zeros((nrep, S.RP_COLS), dtype=np.int64)
    serving = any(getattr(cal.latency, "engine_state", False) for cal, _ in specs)
    budget = max(rc.max_num_batched_tokens for _, rc in specs)
    st.rf = np.zeros((nrep, S.RF_COLS + (budget + 1 if serving else 0)))
    st.rf[:, S.SV0:S.SEEN0] = serving_state(specs, [None] * nrep, False)[0]  # mean: no draws
    for j, (cal, rc) in enumerate(specs):
        st.rp[j, [S.MAX_SEQS, S.BUDGET, S.BS, S.KV_BLOCKS, S.FREE, S.CACHING, S.PRIO]] = (
            rc.max_num_seqs, rc.max_num_batched_tokens, rc.block_size, rc.kv_blocks,
            rc.usable_blocks, rc.enable_prefix_caching, rc.priority_scheduling)
        st.rf[j, S.C0:S.CX + 1] = cal.stepping.coef_ms[:S.CX + 1]  # the step gap included
        st.rf[j, S.NOISE] = cal.latency.residual_sampler()[0]
        st.rf[j, [S.ADD_S, S.ADD_MORE_S, S.WAKE_S]] = (
            cal.add_request_ms / 1e3, cal.add_more_ms / 1e3, cal.wake_ms / 1e3)
        st.rf[j, [S.LP_STEP, S.SEED_STEP, S.SEED_SEQ]] = (
            cal.logprob_step_ms, cal.seeded_step_ms, cal.seeded_seq_ms)
    st.rp[:, [S.WHEAD, S.WTAIL]] = -1
    max_seqs = max(rc.max_num_seqs for _, rc in specs)
    st.running = np.zeros((nrep, max_seqs), dtype=np.int64)
    # a step's entries: the running requests, those admitted, victims scheduled before
    st.sched = np.zeros((nrep, 2 * max_seqs + 2, 2), dtype=np.int64)
    # `capacity` bounds the requests loosely (8x for self-consistency): results and step rows
    # start smaller and grow by doubling
    requests = min(capacity, FOLD_COLUMNS if fold_requests else 1 << 20)
    st.rt = np.empty((S.RT_ROWS, requests))  # set as each request is sent
    st.ri = np.zeros((S.RI_ROWS, requests), dtype=np.int32)
    st.h = np.empty((4 * nrep + 64, 6))
    st.ctr = np.zeros(S.CTR_COLS, dtype=np.int64)
    if fold:  # room for CALLS more rows is checked before each CALLS calls: never short
        st.seg = np.zeros((nrep + CALLS + 4, SEG_COLS))
        st.ctr[S.SEG_N], st.ctr[S.FOLD] = nrep, 1
    else:
        st.seg = np.empty((2 * requests + 16 * nrep + 1024, SEG_COLS))
    st.clock = np.zeros(1)
    st.done = np.zeros(2 * max_seqs + 2, dtype=np.int64)
    st.pc, st.tab, st.lru, st.free = P.new_cache(1024 * nrep, nrep)
    # no template in the kernel until a driver writes one (`kernel_templates`)
    st.tk, st.tkf = np.zeros((1, T.T_COLS), dtype=np.int64), np.zeros((1, 2))
    st.tfo, st.tlinks = np.zeros(1, dtype=np.int64), np.zeros((1, 1), dtype=np.int64)
    st.pg, st.kfree = np.zeros((1, T.P_PIN0), dtype=np.int64), np.zeros(slots, dtype=np.int64)
    st.klog = np.zeros((KLOG_ROWS, 5), dtype=np.int64)
    st.kdone = np.zeros((KDONE_ROWS, 4), dtype=np.int64)
    st.kclass = np.zeros(nrep, dtype=np.int64)
    st.pgf, st.kpar = np.zeros(1), np.zeros(1)
    st.flc, st.flt = np.zeros(1, dtype=np.int64), np.zeros(2, dtype=np.int64)
    # no routing loads or arrivals in the kernel until the cluster and a driver give them
    st.lo, st.lf = np.zeros(nrep, dtype=np.int64), np.zeros(nrep, dtype=np.int64)
    st.pa, st.pk = np.zeros(1), np.zeros((1, A.PK_COLS), dtype=np.int64)
    st.tpool = np.full((1, 1), -1, dtype=np.int64)
    return st

