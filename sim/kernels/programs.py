"""A program workload's replicas compiled (`sim.kernels.program_kernel`) under the Python driver.

`CompiledCluster` stands where `sim.engine.cluster.Cluster` stands for `sim.workloads.programs`: the
same routers, the same `send` / `cancel` and `env.now` the driver uses, the same result buffers,
and an arrival process written as for SimPy (it yields the seconds to wait). The replicas'
decisions run in the kernel in SimPy's event order, so a run equals the SimPy run
table for table (`tests/test_compiled_programs.py`); the programs themselves stay the objects
the live runner drives. A driver that keeps request-by-request templates in the kernel
(`sim.workloads.kernel_templates`) has the kernel send a templated request's follow-ups where
it retires (`sim.kernels.template_calls`): `advance` then goes on past a step whose retired
requests the kernel took, and the driver reads what the kernel sent before anything of its own
(`on_fold`). `sim.kernels.plain.why_not_compiled_programs` says what keeps a workload under
SimPy; numba loads only once a run takes this path.
"""

from __future__ import annotations

import struct
import time

import numpy as np

from sim.kernels import prefix as P
from sim.kernels import program_calls as C
from sim.kernels import program_kernel as K
from sim.kernels import program_state as S
from sim.kernels import template_calls as T
from sim.kernels.program_room import KernelRoom, new_state, result_columns
from sim.engine.cluster import Cluster, gc_paused, run_summary
from sim.engine.request_state import Results, Sent

_PACK = struct.Struct(f"<{K.SENT - 2}q2d")
"""a pending send in the kernel's `pend` buffer (`program_kernel.SENT`)"""
_PACKED = _PACK.size
CHAIN_ROWS = 4096
"""rows of distinct prefix chains kept for reuse: past it, the next new chain starts the table
again (where no send waits to be placed)"""


class KernelEnv:
    """The simulated clock the driver reads (`env.now`); a timeout is the delay itself."""

    __slots__ = ("now",)

    def __init__(self):
        self.now = 0.0

    @staticmethod
    def timeout(delay: float) -> float:
        """What the arrival process yields to wait `delay` seconds."""
        return delay


class KernelReplica:
    """One compiled replica, as the tables and summaries read it."""

    __slots__ = ("cluster", "id")

    def __init__(self, cluster: "CompiledCluster", replica_id: int):
        self.cluster, self.id = cluster, replica_id

    @property
    def busy_s(self) -> float:
        """Seconds the replica was computing."""
        return float(self.cluster.st.rf[self.id, S.BUSY_S])


class CompiledCluster(KernelRoom, Cluster):
    """The replicas of a config in the program kernel, with the routers of `Cluster`."""

    def __init__(self, cfg, capacity: int, specs: list, on_done=None):
        # not Cluster.__init__: no SimPy environment or replicas, only its routing
        self.wall0 = time.perf_counter()
        self.specs = specs
        self.env = KernelEnv()
        self.res = Results(0)  # no columns of `capacity` to fill: the kernel's replace them
        for name in ("scheduled_s", "first_token_s", "finish_s", "cached_tokens", "output_tokens",
                     "aborted", "preemptions", "arrival_s", "prompt_tokens", "priority",
                     "replica_id"):  # set at the end
            setattr(self.res, name, None)
        self._routing(cfg, specs)
        self.on_done = on_done  # (request idx, tokens generated, aborted): set by the driver
        # set by a driver that writes templates into the kernel (`kernel_templates`): the
        # kernel's sends and programs done to read; a templated request handed back
        self.on_fold = self.on_template = None
        self.replicas = [KernelReplica(self, i) for i in range(len(specs))]
        self.st = new_state(specs, capacity, not cfg.write_steps, not cfg.write_requests)
        self.st.lo, self.st.lf = self.outstanding, self.in_flight  # the routers' own arrays
        self._idx = [0] * self.st.rq.shape[0]   # slot -> the request idx it holds
        self._requests = self.st.rt.shape[1]    # the first request past the result columns
        # where finished requests fold as the run goes (set by the workload, `output.requests`)
        self.folded = None
        self._fold_at = 0  # the next request sent that has `_room` look for some to fold
        self._handed: list[int] = []  # the requests handed back that the driver is taking
        self._free = list(range(self.st.rq.shape[0] - 1, -1, -1))
        # the most nodes one call can cache: a step's blocks (its budget's full blocks, one
        # more per entry), a run of own blocks per request it preempts or retires, and one
        # finished request's (an output that continues its prompt, `finish`)
        self.node_room = max(rc.max_num_batched_tokens // rc.block_size + 3 * rc.max_num_seqs + 3
                             + min(cal.max_model_len or 1 << 40, rc.kv_blocks * rc.block_size)
                             // rc.block_size + 1
                             for cal, rc in specs)
        self._calls = 0  # kernel calls (sends count) left before room is checked again
        self.st.ctr[S.NODE_ROOM] = self.node_room
        # Sends wait in `pend` for the next kernel call, which submits them first: one call
        # where each was one (a kernel call's dispatch costs more than a submit's work).
        self._npend = 0
        self._pend = np.zeros(64 * _PACKED, dtype=np.uint8)
        self._pend_room = 64  # sends it holds
        # prefix-chain keys -> groups past every group the driver numbers (fewer than
        # `capacity`), below the block identities' int64 bound (`prefix.block_key`)
        self._link_ids: dict = {}
        self._chains: dict = {}  # chain -> its row of `st.chains` (`_new_chain`)
        self._link0 = capacity
        self._link_cap = (1 << 62) // (P.MAX_BLOCKS * len(specs))
        self.st.pend_i, self.st.pend_f = self._pend.view(np.int64), self._pend.view(np.float64)
        self._st = self.st.packed()  # packed again whenever an array is replaced
        self.loop_s = 0.0

    # ------------------------------------------------------------------ the driver's calls
    def repack(self) -> None:
        """The state packed again, after the driver replaced or grew one of its arrays."""
        self._st = self.st.packed()

    def send(self, j: int, sent: Sent, chain: tuple | None = None) -> int:
        """`Cluster.send`: the request arrives at replica j; its slot is the handle, valid until
        the request's callback (the driver never cancels a request it was told is done)."""
        self._calls -= 1
        if self._calls <= 0:
            self._room()
        if not self._free:
            self._more_slots()
        idx = sent[0]
        if idx >= self._requests:
            self._grow_results(idx)
        s = self._free.pop()
        self._idx[s] = idx
        if chain is not None:
            sent = self._chained(sent, chain)
        n = self._npend
        if n == self._pend_room:
            self._grow_pend()
        _PACK.pack_into(self._pend, n * _PACKED, j, s, *sent)
        self._npend = n + 1
        return s

    def _chained(self, sent: Sent, chain: tuple) -> tuple:
        """The send as the kernel takes it where the request names a prefix chain: its group the
        chain's row of `chains` (`program_state.CHAINED`; the kernel copies the links into the
        request's slot), its shared content the chain's."""
        row = self._chains.get(chain)  # programs send the same content again and again
        if row is None:
            if len(self._chains) >= CHAIN_ROWS and not self._npend:
                # No send waits to be placed (`place_chains` copied each into its slot): every
                # row may be written again. Content named per traced node (search trees, ToT
                # thoughts) makes a chain per node: the table would grow with the workload.
                self._chains.clear()
            row = self._chains[chain] = self._new_chain(chain)
        return sent[:4] + (S.CHAINED - 1 - row, chain[-1][1]) + sent[6:]

    def _new_chain(self, chain: tuple) -> int:
        """Write a chain's links into the next row of `chains` (`_links`), growing the table and
        the slots' link columns to hold it: the row."""
        links, st, row = self._links(chain), self.st, len(self._chains)
        grown = S.LINKS + len(links) > st.rq.shape[1]
        if grown:  # a longer chain than any before: room
            wider = np.zeros((st.rq.shape[0], S.LINKS + len(links)), dtype=np.int64)
            wider[:, :st.rq.shape[1]] = st.rq
            st.rq = wider
        rows, width = st.chains.shape
        if row == rows or len(links) > width:
            table = np.zeros((2 * rows if row == rows else rows, max(len(links), width)),
                             dtype=np.int64)
            table[:row, :width] = st.chains[:row]
            st.chains, grown = table, True
        st.chains[row, :len(links)] = links
        if grown:
            self._st = st.packed()
        return row

    def _links(self, chain: tuple) -> np.ndarray:
        """A chain as its links' row: its length, then each link's key as a group of its own
        (numbered past the driver's groups, as first seen) and the link's end."""
        ids = self._link_ids
        links = [len(chain)]
        for key, end in chain:
            g = ids.get(key)
            if g is None:
                g = ids[key] = self._link0 + len(ids)
                if g >= self._link_cap:
                    raise ValueError(f"more prefix-chain links ({len(ids)}) than the kernel's "
                                     "block identities hold: simulate with compiled=False")
            links += (g, end)
        return np.array(links, dtype=np.int64)

    def cancel(self, j: int, s: int) -> None:
        """`Cluster.cancel` of the request in slot `s` on replica j (a no-op once it ended)."""
        self._calls -= 1
        if self._calls <= 0:
            self._room()
        generated = C.abort_st(self._st, self._npend, j, s)
        self._npend = 0
        if generated >= 0:
            self._retired(j, s, generated, True)

    # ------------------------------------------------------------------ the loop
    def run(self, process) -> None:
        """Run the arrival process and every event it leads to."""
        loop0 = time.perf_counter()
        env, rest, advance = self.env, C.retire_rest_st, C.advance_st
        retired, arrival, room = S.RETIRED, S.ARRIVAL, S.ROOM
        with gc_paused():
            self._resume(process)
            pending = -1  # a replica whose step end waits for its callbacks to finish
            unfolded = False  # the kernel sent or finished templated requests since last read
            while True:
                code, j, n, env.now, s, out, i, folded = advance(
                    self._st, self._npend, self.node_room, pending)
                self._npend = 0
                pending = -1
                unfolded = unfolded or folded
                if code == retired:
                    while True:
                        # the callback of each, then its slot is free (`_retired`, inlined);
                        # none for a scoring request sent again (`program_kernel.retire`: -1)
                        if out >= 0:
                            if unfolded:  # who sent it kept while the driver reads first
                                self._handed.append(self._idx[s])
                                unfolded = self.on_fold()
                                self._handed.pop()
                            self.on_done(self._idx[s], out >> 1, out & 1 == 1)
                            self._free.append(s)
                        elif out < -1:
                            unfolded = self._templated(s, out, unfolded)
                        if i == n:
                            break
                        i, s, out, folded = rest(self._st, self._npend, j, i, n)
                        self._npend = 0
                        unfolded = unfolded or folded
                    self._calls -= 1
                    if self._calls <= 0:
                        self._room()
                    pending = j
                    continue
                if unfolded:
                    unfolded = self.on_fold()
                if code == arrival:
                    self._resume(process)
                elif code == room:
                    self._room()
                else:
                    break
        self.loop_s = time.perf_counter() - loop0
        self._results()

    def _templated(self, s: int, out: int, unfolded: bool) -> bool:
        """A templated request retired (`template_calls.follow`): sent on or finished in the
        kernel (its sends then to read), or handed back to the driver (what the kernel did
        read first; its slot then free). Whether the kernel's work waits to be read."""
        if out == T.FOLDED:
            return True
        rq = self.st.rq
        # its results and who sent it stay until the driver has taken it (its program's end
        # may read them)
        self._handed.append(int(rq[s, S.IDX]))
        if unfolded:
            self.on_fold()
        p, t = int(rq[s, S.PROG]), int(rq[s, S.TROW])
        rq[s, S.PROG] = -1
        self._free.append(s)
        self.on_template(p, t, s)
        self._handed.pop()
        return False

    def _resume(self, process) -> None:
        try:
            gap = next(process)
        except StopIteration:
            return
        self._calls -= 1
        if self._calls <= 0:
            self._room()
        C.arrival_st(self._st, self._npend, gap)
        self._npend = 0

    def _retired(self, j: int, s: int, generated: int, aborted) -> None:
        """Hand a finished (or aborted) request to the caller, then free its slot."""
        self.on_done(self._idx[s], generated, aborted == 1)
        self._free.append(s)

    def _results(self) -> None:
        st, res = self.st, self.res
        # the requests sent, idx 0..n-1 (beyond: unset); a re-run scoring request arrived twice
        n = int(st.rp[:, S.ARRIVALS].sum() - st.ctr[S.RERUNS])
        if self.folded is not None:  # every request settled: the rest folded, none kept
            self.fold_results(n, n)
            res.folded = self.folded
        for name, column in result_columns(st.rt[:, :n - int(st.ctr[S.RBASE])],
                                           st.ri[:, :n - int(st.ctr[S.RBASE])]).items():
            setattr(res, name, column)
        if st.ctr[S.FOLD]:
            k, rows = st.rf[:, S.RUNS_K].copy(), st.seg[:len(st.rf)]
            kv, peak = st.rf[:, S.RUNS_KV].copy(), st.rf[:, S.RUNS_KV_PEAK].copy()
            ran = rows[:, 2] > 0
            k[ran] += rows[ran, 2]
            kv[ran] += rows[ran, 12] / rows[ran, 13] * rows[ran, 2]
            peak[ran] = np.maximum(peak[ran], rows[ran, 12])
            res.load_totals(k, kv, peak.astype(np.int64))
        else:
            res.load_segments(st.seg[:st.ctr[S.SEG_N]])
        res.events = int(st.ctr[S.EVENTS])

    def summary(self, events: int, makespan_s: float) -> dict:
        """Run-level figures every simulation reports."""
        return run_summary(self.res, self.st.rf[:, S.BUSY_S].copy(), self.wall0, self.loop_s,
                           events, makespan_s)

    def close(self) -> None:
        """Drop the callbacks (the run's cycle through the caller's state)."""
        self.on_done = self.on_fold = self.on_template = None
