"""Per-request scheduling state, what a scheduled request adds to its step, the run's result
buffers, and vLLM's priority waiting queue."""

from __future__ import annotations

import heapq
from enum import IntEnum
from typing import NamedTuple

import numpy as np


class Sent(NamedTuple):
    """A request as a driver sends it to a replica (`Cluster.send`): what `Req` is built from,
    in the order the program kernel takes it."""

    idx: int
    prompt: int
    output: int
    priority: int
    group: int
    prefix_tokens: int
    score_from: int
    seeded: bool
    lp_prompt_ms: float
    lp_sample_ms: float

    def req(self, chain: tuple | None = None) -> "Req":
        """The replica's scheduling state of this request."""
        return Req(self.idx, self.prompt, self.output, priority=self.priority, group=self.group,
                   prefix_tokens=self.prefix_tokens, chain=chain, score_from=self.score_from,
                   lp_prompt_ms=self.lp_prompt_ms, lp_sample_ms=self.lp_sample_ms,
                   seeded=self.seeded)


class Status(IntEnum):
    """A request's status at its replica, ordered as vLLM's `RequestStatus` (the finished status
    last: `status >= FINISHED` is vLLM's `is_finished`). An abort asked while the request's step
    is in flight is `Req.aborted`, set at once; the request finishes at the step's end."""

    WAITING = 0
    """queued, never scheduled"""
    RUNNING = 1
    PREEMPTED = 2
    """back in the queue (its KV freed, or a scoring request re-run uncached), scheduled before"""
    FINISHED = 3
    """its tokens generated or aborted; its KV released"""


WAITING, RUNNING, PREEMPTED, FINISHED = Status.WAITING, Status.RUNNING, Status.PREEMPTED, \
    Status.FINISHED


class Req:
    """Mutable per-request scheduling state (results live in the cluster's column buffers)."""

    __slots__ = ("idx", "prompt", "output", "computed", "generated", "target", "blocks",
                 "priority", "group", "prefix_tokens", "chain", "score_from", "held", "shared",
                 "status", "seq", "aborted", "lp_prompt_ms", "lp_sample_ms",
                 "seeded", "spec_cum", "spec_it", "pos", "clock0", "rescore", "reads_cache")

    def __init__(self, idx: int, prompt: int, output: int, priority: int = 0, group: int = -1,
                 prefix_tokens: int = 0, chain: tuple | None = None, score_from: int = 0,
                 lp_prompt_ms: float = 0.0, lp_sample_ms: float = 0.0, seeded: bool = False):
        self.idx = idx
        self.prompt = prompt
        self.output = output
        self.computed = 0          # tokens whose KV is computed
        self.generated = 0         # output tokens emitted
        self.target = prompt       # tokens to (re)compute before decoding
        self.blocks = 0            # KV blocks held privately
        self.priority = priority
        self.group = group         # shared-prefix group (-1: none)
        self.prefix_tokens = prefix_tokens
        # the prompt's content as nested prefixes (`sim.engine.prefix_cache`)
        self.chain = chain
        self.score_from = score_from  # first prompt position it needs log-probabilities of (0: none)
        self.held = None           # identities of the cached blocks it holds
        self.shared = 0            # KV blocks borrowed from the prefix cache
        self.status = WAITING
        self.seq = 0               # arrival order at the replica (priority tie-break)
        self.aborted = False       # an abort was asked (it finishes at its step's end)
        # step time of the log-probabilities it returns (`sim.step_time.logprob_cost`): per prompt
        # position computed, per token sampled
        self.lp_prompt_ms = lp_prompt_ms
        self.lp_sample_ms = lp_sample_ms
        self.seeded = seeded       # samples with a seed of its own (`sim.step_time.sampling_cost`)
        # speculative replicas (`sim.engine.spec_decode`): cumulative tokens after each verify
        # iteration of the decode, drawn when it starts, and the iterations done
        self.spec_cum = None
        self.spec_it = 0
        self.pos = 0               # admission order at the replica (its place in `running`)
        # lazy decode (`sim.engine.decode_cohort`): clock at its last sync
        self.clock0 = -1
        self.rescore = False       # a scoring request that read cached scored positions
        self.reads_cache = True    # False: re-run uncached (vLLM's skip_reading_prefix_cache)

    def rerun_uncached(self) -> None:
        """Back to a fresh request that reads no cache (its blocks were released): the live
        engine's re-run of a scoring request whose tail the cache covered."""
        self.computed = self.generated = 0
        self.target = self.prompt
        self.reads_cache, self.rescore, self.spec_cum = False, False, None
        self.status = PREEMPTED  # scheduled before: its first schedule time stands


SEG_COLUMNS = ("replica_id", "start_s", "k_iters", "a_ms", "b_ms", "factor", "prefill_tokens",
               "prefill_seqs", "decode_seqs", "context_tokens", "num_running", "num_waiting",
               "kv_blocks_used", "kv_blocks_total", "preemptions", "echo_ms", "echo_at")
"""a run of iterations as recorded: `echo_ms`, `echo_at` the after-prefill echo its first
iterations carry (`sim.step_time.latency.run_ms`)"""
_K = SEG_COLUMNS.index("k_iters")
_BLOCK = 1 << 14
"""run-of-iterations records per packed block"""



def entry_totals(r: Req, n: int, width: int, lp_ms: float, seeded: int
                 ) -> tuple[int, int, float, int]:
    """(context tokens, prefill tokens, log-probability ms, seeded sequences so far) with step
    entry (r, n): as vLLM counts context, tokens computed once the step is done (decode: 1 + K
    verified, `width` 1 + K)."""
    if r.computed < r.target:
        lp_ms += n * r.lp_prompt_ms
        if r.computed + n >= r.target:  # the prompt's last chunk samples a token
            return r.computed + n, n, lp_ms + r.lp_sample_ms, seeded + r.seeded
        return r.computed + n, n, lp_ms, seeded
    return r.computed + width, 0, lp_ms + r.lp_sample_ms, seeded + r.seeded


def step_totals(sched: list, width: int) -> tuple[int, int, int, float, int]:
    """(prefill tokens, prefill sequences, context, log-probability ms, seeded sequences) of a
    step's entries."""
    prefill_tokens = prefill_seqs = context = seeded = 0
    lp_ms = 0.0
    for r, n in sched:
        c, p, lp_ms, seeded = entry_totals(r, n, width, lp_ms, seeded)
        context, prefill_tokens, prefill_seqs = context + c, prefill_tokens + p, \
            prefill_seqs + (p > 0)
    return prefill_tokens, prefill_seqs, context, lp_ms, seeded


class Results:
    """Column buffers of per-request results and per-run-of-iterations step records."""

    def __init__(self, n: int):
        self.scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.replica_id = np.full(n, -1, dtype=np.int32)
        self.cached_tokens = np.zeros(n, dtype=np.int32)
        self.output_tokens = np.zeros(n, dtype=np.int32)  # generated (less than asked if aborted)
        self.aborted = np.zeros(n, dtype=bool)
        self.rescored = np.zeros(n, dtype=bool)  # ran twice: cached, then re-run uncached
        self.preemptions = np.zeros(n, dtype=np.int32)
        # what a driver sent (`Cluster.send`), for program workloads' requests tables
        self.arrival_s = np.full(n, np.nan)
        self.prompt_tokens = np.zeros(n, dtype=np.int32)
        self.priority = np.zeros(n, dtype=np.int32)  # clipped to int32, as the table keeps it
        # One record per scheduled run of iterations (k_iters >= 1); expanded on output. Rows
        # are appended as tuples (one append per run, the hot path), packed into float blocks of
        # _BLOCK rows as they fill (a tuple of boxed numbers takes ~4x the memory), and turned
        # to columns once.
        self._rows: list[tuple] = []
        self._blocks: list[np.ndarray] = []  # full blocks, _BLOCK rows each
        self._packed = 0                     # rows in them
        self._seg: tuple[int, dict] | None = None  # (rows when built, columns)
        self._totals: tuple[np.ndarray, ...] | None = None  # `load_totals`
        self.events = 0
        # the requests folded as the run went (`sim.engine.folded_requests`), where no table
        # keeps them: the columns above then hold none
        self.folded = None

    def grow(self, index: int) -> None:
        """Room for request `index`: every column doubled (at least), new rows at their
        initial values (a program workload's request count is known only as a loose bound)."""
        n = len(self.arrival_s)
        fresh = Results(max(2 * n, index + 1))  # the initial values are __init__'s
        for name, column in vars(fresh).items():
            if isinstance(column, np.ndarray) and not name.startswith("_"):
                column[:n] = getattr(self, name)
                setattr(self, name, column)

    def add_segment(self, values: tuple) -> int:
        """Append one run-of-iterations record (values in SEG_COLUMNS order); its index."""
        rows = self._rows
        rows.append(values)
        if len(rows) == _BLOCK:
            self._blocks.append(np.array(rows, dtype=float))
            self._packed += _BLOCK
            self._rows = []
            return self._packed - 1
        return self._packed + len(rows) - 1

    def truncate_segment(self, index: int, k_iters: int) -> None:
        """Cut record `index` to its first k_iters iterations (an event ended its run early)."""
        i = index - self._packed
        if i >= 0:
            row = self._rows[i]
            self._rows[i] = row[:_K] + (k_iters,) + row[_K + 1:]
        else:
            self._blocks[index // _BLOCK][index % _BLOCK, _K] = k_iters
        self._seg = None

    def load_segments(self, table: np.ndarray) -> None:
        """Take every run-of-iterations record at once (rows in SEG_COLUMNS order: a compiled
        run's, `sim.kernels.plain`) in place of appended rows."""
        self._rows, self._blocks, self._packed = [], [], 0
        self._seg = (0, dict(zip(SEG_COLUMNS, table.T)))  # `seg` keeps it while no row is added

    def load_totals(self, k_iters: np.ndarray, kv_iters: np.ndarray,
                    kv_peak_blocks: np.ndarray) -> None:
        """Take only the runs' totals per replica (a compiled run that writes no steps table
        keeps no record per run): iterations, iterations x the fraction of KV in use, and the
        most KV blocks in use at a run's start."""
        self._rows, self._blocks, self._packed, self._seg = [], [], 0, None
        self._totals = (k_iters, kv_iters, kv_peak_blocks)

    def kv_peak_blocks(self, replicas) -> int:
        """The most KV blocks in use at the start of a run of iterations on any of `replicas`
        (replica ids); 0 where they ran none."""
        if self._totals is not None:
            peaks = self._totals[2][list(replicas)]
            return int(peaks.max()) if len(peaks) else 0
        seg = self.seg
        used = seg["kv_blocks_used"][np.isin(seg["replica_id"], list(replicas))]
        return int(used.max()) if len(used) else 0

    def run_totals(self) -> tuple[int, float]:
        """(iterations, iterations x the fraction of KV blocks in use at their run's start) over
        every run."""
        if self._totals is not None:
            k_iters, kv_iters = self._totals[:2]
            return int(k_iters.astype(np.int64).sum()), float(kv_iters.sum())
        seg = self.seg
        k = seg["k_iters"]
        used = seg["kv_blocks_used"] / seg["kv_blocks_total"]
        return int(k.astype(np.int64).sum()), float((used * k).sum())

    @property
    def seg(self) -> dict[str, np.ndarray]:
        """The run-of-iterations records as float columns, one per SEG_COLUMNS name."""
        if self._totals is not None:
            raise ValueError("this run kept only its runs' totals (no steps table was asked)")
        n = self._packed + len(self._rows)
        if self._seg is None or self._seg[0] != n:  # built once after the run, read many times
            tail = np.array(self._rows, dtype=float).reshape(len(self._rows), len(SEG_COLUMNS))
            table = np.concatenate(self._blocks + [tail]) if self._blocks else tail
            self._seg = (n, dict(zip(SEG_COLUMNS, table.T)))
        return self._seg[1]


def priority_key(r: Req) -> tuple[int, int]:
    """vLLM's priority order: priority, then arrival at the replica."""
    return (r.priority, r.seq)


class PriorityWaiting:
    """vLLM's priority waiting queue: lowest (priority, arrival) first; deque-like interface."""

    def __init__(self):
        self._heap: list[tuple[int, int, Req]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def __getitem__(self, i: int) -> Req:
        if i != 0:
            raise IndexError("only the head of a priority queue is addressable")
        return self._heap[0][2]

    def __contains__(self, r: Req) -> bool:
        return any(q is r for _, _, q in self._heap)

    def append(self, r: Req) -> None:
        heapq.heappush(self._heap, (r.priority, r.seq, r))

    appendleft = append  # a preempted request re-enters by its priority and arrival

    def popleft(self) -> Req:
        return heapq.heappop(self._heap)[2]

    def remove(self, r: Req) -> None:
        self._heap = [e for e in self._heap if e[2] is not r]
        heapq.heapify(self._heap)
