"""Request-by-request templates written into the program kernel, so that a templated request's
follow-ups go out where it retires (`sim.kernels.template_calls`).

`TemplateDriver` on compiled replicas (`sim.kernels.programs.CompiledCluster`) with an
inter-program scheduler whose priority the kernel computes (FCFS, longest prefix match, app FIFO
from the program's tokens and arrival rank; Dynasor's gang scheduling from its age and the
finished programs' tokens, a history the kernel and the driver share: `KernelFinished`) writes
each question's request-by-request record (`sim.workloads.request_templates`; a search
program's rounds written request by request, `flattened`; a CoT path that stops on its probes,
`sim.workloads.stop_templates`) into the kernel's arrays once, at its first program's start:
per request its follow-ups, the tokens it adds, its pool, owner columns, `Sent` fields (the
log-probability costs per request-cost class) and prefix chain. A program's state then lives in
the kernel (`pg`: tokens, requests in flight and made, the replica it is pinned to per pool, a
ToT program's target queue);
the driver sends its first requests, folds in what the kernel sent (`fold`: the owner columns,
the programs done) and takes back a request the kernel hands back (`on_template`: a pool the
program is not pinned to yet, or no room). A record with a request longer than a replica of its
pool takes stays in Python, where the send raises as the plain driver's does.
"""

from __future__ import annotations

import numpy as np

from policies.scheduling import AppFifo, DynasorGang, Fcfs, LongestPrefixMatch, fenwick
from sim.kernels import finished_lengths as F
from sim.kernels import program_state as S
from sim.kernels import program_calls as C
from sim.kernels import template_calls as T
from sim.kernels.stop_calls import DONE_OPEN
from sim.workloads.program_driver import SimProgram
from sim.workloads.request_templates import RequestTemplate
from sim.workloads.stop_templates import StopEnd

_MODES = {Fcfs: T.FCFS, LongestPrefixMatch: T.LPM, AppFifo: T.APP_FIFO}


def kernel_mode(scheduler) -> int | None:
    """The kernel's priority mode of a scheduler (`template_calls.PRIO_MODE`), or None where the
    priority reads more than the program's tokens, age and arrival rank and the finished
    programs' tokens (the program's own estimate)."""
    if type(scheduler) is DynasorGang and scheduler.estimate == "finished":
        return T.DYNASOR
    return _MODES.get(type(scheduler))


class KernelFinished:
    """`FinishedLengths` on the kernel's arrays (`sim.kernels.finished_lengths`), so that the
    kernel's Dynasor priorities and the driver's read one history."""

    def __init__(self, cluster):
        self.cluster = cluster
        self._medians: dict[int, int | None] = {}  # as `FinishedLengths._medians`
        st = cluster.st
        st.flc, st.flt = np.zeros(1024, dtype=np.int64), np.zeros(1025, dtype=np.int64)
        cluster.repack()

    def __len__(self) -> int:
        return int(self.cluster.st.ctr[S.FL_N])

    def add(self, tokens: int) -> None:
        """One more finished program of `tokens` tokens."""
        if tokens < 0:
            raise ValueError(f"a program's token count must be >= 0, got {tokens}")
        self._medians.clear()
        self.reserve(tokens)
        st = self.cluster.st
        F.add(st.flc, st.flt, tokens)
        st.ctr[S.FL_N] += 1

    def reserve(self, tokens: int) -> None:
        """Room in the history for a program of `tokens` tokens (a power of two past it)."""
        st = self.cluster.st
        if tokens >= st.flc.shape[0]:
            size = st.flc.shape[0]
            while size <= tokens:
                size *= 2
            counts = np.zeros(size, dtype=np.int64)
            counts[:st.flc.shape[0]] = st.flc
            st.flc, st.flt = counts, np.array(fenwick(counts.tolist()), dtype=np.int64)
            self.cluster.repack()

    def median_remaining(self, tokens_done: int) -> int | None:
        """`FinishedLengths.median_remaining`, on the kernel's arrays."""
        m = self._medians.get(tokens_done, -1)
        if m == -1:
            m = F.median_remaining(self.cluster.st.flt, int(self.cluster.st.ctr[S.FL_N]),
                                   tokens_done)
            m = self._medians[tokens_done] = None if m < 0 else m
        return m


def flattened(tpl) -> RequestTemplate | None:
    """A round-by-round template (`program_templates.Template`) request by request, for the
    kernel: each request's follow-ups the next round, sent once the last request of its round
    has returned (`barrier`), the tokens the next round is sent with gained by its round's
    first request. None where the program numbers its requests out of the order it sends
    them, starts with tokens, or sends nothing."""
    rounds = tpl.rounds
    requests = [request for sends, _tokens, _estimate in rounds for request in sends]
    if not rounds or rounds[0][1] != 0 or \
            any(request[0].index != i for i, request in enumerate(requests)):
        return None
    follow, gained, start = [], [], 0
    for r, (sends, tokens, _estimate) in enumerate(rounds):
        end = start + len(sends)
        last = r + 1 == len(rounds)
        nxt = () if last else tuple(range(end, end + len(rounds[r + 1][0])))
        follow += [nxt] * len(sends)
        gained += [0 if last else rounds[r + 1][1] - tokens] + [0] * (len(sends) - 1)
        start = end
    return RequestTemplate(requests, tuple(range(len(rounds[0][0]))), follow, gained,
                           tpl.program, barrier=(True,) * len(requests))


class KernelTemplates:
    """The templates and programs a `TemplateDriver` keeps in the program kernel."""

    def __init__(self, driver, cluster, mode: int):
        self.driver, self.cluster = driver, cluster
        st = cluster.st
        self.pools = {name: i for i, name in enumerate(cluster.pools)}  # pool -> pin column
        # per pool, the longest request its every replica takes (`max_model_len`)
        self.limits = {name: min((driver._costs[rid][0] or 1 << 62 for rid in members),
                                 default=1 << 62) for name, members in cluster.pools.items()}
        self.rows = 0     # template requests written
        self.follows = 0  # entries of `tfo` written
        self.runs: dict[int, SimProgram] = {}  # program -> its run, while in the kernel
        # request-cost classes (`TemplateDriver._cost_class`), each class's costs
        classes = driver._cost_class
        self.class_costs = [driver._costs[classes.index(c)] for c in range(max(classes) + 1)]
        st.kclass[:] = classes
        st.tkf = np.zeros((1, 2 * len(self.class_costs)))
        # per program: its state, then per pool its pin and the tokens routing booked there
        self.queue_col = T.P_PIN0 + 2 * len(self.pools)
        """`pg`'s first column of a program's waiting requests (`template_calls._queue_col`)"""
        st.pg = np.full((64, self.queue_col), -1, dtype=np.int64)
        st.pgf = np.zeros(st.pg.shape[0])
        st.ctr[S.PRIO_MODE], st.ctr[S.NPOOLS] = mode, len(self.pools)
        if mode == T.DYNASOR:  # its history on the kernel's arrays, its terms in the kernel's
            scheduler = driver.scheduler
            st.kpar[0], st.ctr[S.DYN_DEFAULT] = scheduler.escalate_after_s, \
                scheduler.default_remaining_tokens
            driver.finished_tokens = KernelFinished(cluster)
        cluster.repack()

    def holds(self, tpl) -> bool:
        """Whether the template is in the kernel, written at its first program's start."""
        if tpl.kernel_row is None:
            tpl.kernel_row = self._write(tpl)
        return tpl.kernel_row >= 0

    def _write(self, tpl) -> int:
        """The template's rows in the kernel's arrays: its first row, or -1 where it stays in
        Python (a request too long for a replica of its pool, or for no pool)."""
        rows, pools = [], []
        for spec, prompt, _prefix, chain, output in tpl.requests:
            try:
                pool = self.cluster.pool_for(spec.role)
            except ValueError:
                return -1
            if prompt + output > self.limits[pool]:
                return -1
            pools.append(self.pools[pool])
        base, owner, at = self.rows, self.driver.owner, self.follows
        stops = tpl.stops
        end = stops.bound if stops else tpl.program.tokens
        for k, (spec, prompt, _prefix, chain, output) in enumerate(tpl.requests):
            code = owner.codes.get((spec.role, spec.table_role))
            if code is None:
                code = owner.code(spec)
            s = spec.sampling
            scored = s.prompt_logprobs
            rows.append((at, len(tpl.follow[k]), tpl.gained[k], pools[k], spec.path, code,
                         prompt, output, chain[-1][1], prompt - scored if scored else 0,
                         int(s.temperature > 0.0 and s.seed is not None), int(tpl.barrier[k]),
                         end, stops.flags[k] if stops else 0,
                         tpl.queued[k] if tpl.queued else 0, k))
            at += len(tpl.follow[k])
        self._room(len(rows), at - self.follows)
        self._queue_room(tpl.queue_room)
        st = self.cluster.st
        st.tk[base:base + len(rows)] = rows
        st.tkf[base:base + len(rows)] = [self._costs(spec) for spec, *_ in tpl.requests]
        st.tfo[self.follows:at] = [base + f for ks in tpl.follow for f in ks]
        for k, request in enumerate(tpl.requests):
            self._link(base + k, request[3])
        self.rows += len(rows)
        self.follows = at
        if type(self.driver.finished_tokens) is KernelFinished:  # room for its end
            self.driver.finished_tokens.reserve(end)
        self.cluster.repack()
        return base

    def _costs(self, spec) -> list:
        """A request's log-probability costs (prompt, sampled) per request-cost class, as
        `TemplateDriver._sends` makes them."""
        s, out = spec.sampling, []
        for _limit, token_ms, top_k_ms, flag_ms in self.class_costs:
            row_ms = token_ms + top_k_ms * s.top_logprobs or flag_ms
            out += [row_ms if s.prompt_logprobs else 0.0,
                    row_ms if s.top_logprobs or s.logprobs else 0.0]
        return out

    def _link(self, row: int, chain: tuple) -> None:
        """A template request's prefix chain as its links (`CompiledCluster._links`)."""
        links = self.cluster._links(chain)
        st = self.cluster.st
        if len(links) > st.tlinks.shape[1]:
            st.tlinks = _wider(st.tlinks, len(links))
        if S.LINKS + len(links) > st.rq.shape[1]:
            st.rq = _wider(st.rq, S.LINKS + len(links))
        st.tlinks[row, :len(links)] = links

    def _room(self, rows: int, follows: int) -> None:
        """Rows for `rows` more template requests and `follows` more follow-ups."""
        st = self.cluster.st
        if self.rows + rows > st.tk.shape[0]:
            n = 2 * (self.rows + rows)
            st.tk, st.tkf, st.tlinks = (_longer(a, n) for a in (st.tk, st.tkf, st.tlinks))
        if self.follows + follows > st.tfo.shape[0]:
            st.tfo = _longer(st.tfo, 2 * (self.follows + follows))

    def _queue_room(self, room: int) -> None:
        """Columns in `pg` for `room` requests waiting in a program's target queue."""
        st = self.cluster.st
        cols = self.queue_col + 2 * room
        if cols > st.pg.shape[1]:
            st.pg = _wider(st.pg, cols)
            self.cluster.repack()

    def rows_for(self, n: int) -> None:
        """Program rows for programs 0..n-1."""
        st = self.cluster.st
        if n > st.pg.shape[0]:
            pg = np.full((max(n, 2 * st.pg.shape[0]), st.pg.shape[1]), -1, dtype=np.int64)
            pg[:st.pg.shape[0]] = st.pg
            st.pg, st.pgf = pg, _longer(st.pgf, pg.shape[0])
            self.cluster.repack()

    def start(self, run: SimProgram) -> None:
        """The program's row in the kernel: no tokens, nothing sent, pinned where it is."""
        st, p = self.cluster.st, run.idx
        self.rows_for(p + 1)
        st.pg[p, :T.P_PIN0] = 0
        if run.template.stops is not None:
            st.pg[p, T.P_GATES] = run.template.stops.gates
        st.pgf[p] = run.arrival_s
        self.runs[p] = run

    def load(self, run: SimProgram) -> None:
        """The program's kernel state into its run's fields, for the driver to send from (its
        pins too: the kernel pins a program it started, `arrival_calls`)."""
        row = self.cluster.st.pg[run.idx]
        run.tokens, run.round, run.open = int(row[T.P_TOKENS]), int(row[T.P_NEXT]), \
            int(row[T.P_OPEN])
        for pool, c in self.pools.items():
            rid = int(row[T.P_PIN0 + c])
            if rid >= 0:
                run.replicas[pool] = rid
        if run.template.queued is not None:  # its target queue: (template row, number)
            q, base = self.queue_col, run.template.kernel_row
            waiting = row[q:q + 2 * int(row[T.P_QN])].tolist()
            run.qin = int(row[T.P_QIN])
            run.waiting = [(t - base, i) for t, i in zip(waiting[::2], waiting[1::2])]

    def store(self, run: SimProgram, tpl, ks: tuple, slots: list) -> None:
        """The driver sent requests ks of the program (in `slots`): its run's fields, pins
        and bookings back into the kernel (which gives the bookings back: `unbook`), each slot
        marked as the template's request."""
        st, p, npools = self.cluster.st, run.idx, len(self.pools)
        row = st.pg[p]
        row[T.P_TOKENS], row[T.P_NEXT], row[T.P_OPEN] = run.tokens, run.round, run.open
        for pool, rid in run.replicas.items():
            c = T.P_PIN0 + self.pools[pool]
            row[c] = rid
            if rid in run.booked:
                row[c + npools] = run.booked.pop(rid)
        if tpl.queued is not None:
            q = self.queue_col
            row[T.P_QIN], row[T.P_QN] = run.qin, len(run.waiting)
            for i, (k, index) in enumerate(run.waiting):
                row[q + 2 * i], row[q + 2 * i + 1] = tpl.kernel_row + k, index
        for k, s in zip(ks, slots):
            st.rq[s, S.PROG], st.rq[s, S.TROW] = p, tpl.kernel_row + k

    def fold(self) -> list:
        """What the kernel sent (its owner columns into the driver's) and the programs it
        found done or closed since the last fold: each such program's run, the time it was
        done, the event (`stop_calls.DONE_CLOSED`, `DONE_OPEN`, `CLOSED`) and its tokens
        then."""
        st, owner = self.cluster.st, self.driver.owner
        ctr = st.ctr
        n = int(ctr[S.KLOG_N])
        if n:
            log = st.klog[:n]
            owner.program.frombytes(log[:, 0].tobytes())
            owner.index.frombytes(log[:, 1].tobytes())
            owner.path.frombytes(log[:, 2].tobytes())
            owner.role.extend(log[:, 3].astype(np.uint8).tobytes())
            if self.driver.trows is not None:
                self.driver.trows.frombytes(log[:, 4].tobytes())
            self.driver._live.extend([None] * n)
            ctr[S.KLOG_N] = 0
        m = int(ctr[S.KDONE_N])
        if not m:
            return []
        ctr[S.KDONE_N] = 0
        if ctr[S.PRIO_MODE] == T.DYNASOR:  # the kernel added them to the scheduler's history
            self.driver.finished_tokens._medians.clear()
        # (program, its last request's idx, event, its tokens): done (or closed) as that one
        # finished
        done = st.kdone[:m]
        events = done[:, 2].tolist()
        runs = [self.runs[p] if e == DONE_OPEN else self.runs.pop(p)
                for p, e in zip(done[:, 0].tolist(), events)]
        return list(zip(runs, st.rt[S.FINISH_S, done[:, 1] - st.ctr[S.RBASE]].tolist(), events,
                        done[:, 3].tolist()))

    def take(self, s: int, p: int, t: int) -> int:
        """`stop_calls.take` of a stopping template's request the kernel handed back (slot s):
        `SEND` where its follow-ups go out; the program's kernel state then read as `load`
        reads it."""
        cluster = self.cluster
        cluster._room()  # its stop's aborts may cache blocks
        if int(cluster.st.ctr[S.KDONE_N]) >= cluster.st.kdone.shape[0]:
            self.driver._fold()
        code = C.take_st(cluster._st, cluster._npend, s, p, t)
        cluster._npend = 0
        return int(code)

    def unbook(self, run: SimProgram) -> None:
        """The program is done where the driver took its last request: what routing booked
        for it given back (`template_calls.unbook`, called on the packed state)."""
        T.unbook(self.cluster._st, run.idx)

    def end_of(self, run: SimProgram) -> StopEnd:
        """A stopping template's program's accounting, from its kernel row once closed."""
        row, stops = self.cluster.st.pg[run.idx], run.template.stops
        return StopEnd(run.template.program.paths_used, int(row[T.P_TOKENS]),
                       int(row[T.P_PROBE]), stops.ends[int(row[T.P_DONE])])


def _wider(a: np.ndarray, cols: int) -> np.ndarray:
    out = np.zeros((a.shape[0], cols), dtype=a.dtype)
    out[:, :a.shape[1]] = a
    return out


def _longer(a: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((n,) + a.shape[1:], dtype=a.dtype)
    out[:a.shape[0]] = a
    return out
