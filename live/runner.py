"""The live runner: drives program objects on engines (one per model role) until all are done.

The same objects the simulator drives (`programs/`): the runner submits their `RequestSpec`s at
arrival and as they ask, with the inter-program scheduler's priority, aborts what they abort, and
hands each program the engine's outcome, read in the program's terms (`program.interpret`).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable

from policies.scheduling import FinishedLengths, ProgramView, program_estimate
from programs.base import Abort, RequestSpec
from traces import ids


@dataclass(eq=False)
class LiveRun:
    """One program object in a live run: its plan, id, and when it finished."""

    plan: object
    program: object
    key: str
    """program id in the requests table"""
    finish_s: float = math.nan


class IdleHints:
    """Dynasor's eviction hint (`cluster.kv_eviction: idle_programs_first`): the engines learn
    when a program has no request in flight (`engines.kv_hints`); nothing under `free_order`."""

    def __init__(self, engines: dict, kv_eviction: str):
        self.on = kv_eviction == "idle_programs_first"
        self.engines = list(dict.fromkeys(engines.values()))
        self.open: dict[int, int] = {}  # id(run) -> its requests in flight
        for engine in self.engines if self.on else ():
            if not hasattr(engine, "hint_idle_programs"):
                raise ValueError(f"kv_eviction: idle_programs_first: the {type(engine).__name__} "
                                 "takes no eviction hints (the in-process vLLM engine does)")
            engine.hint_idle_programs()

    def sent(self, run: LiveRun) -> None:
        """A request of the program went to an engine."""
        self.open[id(run)] = self.open.get(id(run), 0) + 1

    def ended(self, run: LiveRun) -> None:
        """A request of the program finished or was aborted."""
        self.open[id(run)] -= 1

    def settled(self, run: LiveRun) -> None:
        """The program acted on an outcome: with nothing in flight, its blocks go first."""
        if self.on and self.open[id(run)] == 0:
            for engine in self.engines:
                engine.idle(run.key)


def _request_id(run: LiveRun, spec: RequestSpec, n: int) -> str:
    if spec.kind == "chunk":
        return ids.chunk_id(run.key, n)
    if spec.kind == "probe":
        return ids.probe_id(run.key, n)
    return ids.search_request_id(run.key, spec.index)


def run_programs(engines: dict, runs: list[LiveRun], scheduler=None,
                 answer_of: Callable | None = None,
                 on_done: Callable[[LiveRun], None] | None = None,
                 kv_eviction: str = "free_order") -> None:
    """Run every program from its plan's arrival until it is done, on `engines[spec.role]`;
    `kv_eviction: idle_programs_first` tells the engines which programs have nothing in flight
    (Dynasor's eviction hint, `engines.kv_hints`)."""
    _ProgramLoop(engines, runs, scheduler, answer_of, on_done, kv_eviction).run()


class _ProgramLoop:
    """`run_programs`' state: requests in flight by id, the programs finished so far."""

    def __init__(self, engines: dict, runs: list[LiveRun], scheduler, answer_of, on_done,
                 kv_eviction: str):
        self.engines, self.runs, self.scheduler = engines, runs, scheduler
        self.answer_of, self.on_done = answer_of, on_done
        self.clock = next(iter(engines.values()))
        self.hints = IdleHints(engines, kv_eviction)
        self.pending: dict[str, tuple[LiveRun, RequestSpec]] = {}
        self.rid_of: dict[RequestSpec, str] = {}
        self.counter = itertools.count()
        self.finished_tokens = FinishedLengths()
        self.index = {id(r): i for i, r in enumerate(runs)}
        self.done = 0

    def run(self) -> None:
        """Admit programs as they arrive and step the engines until every program is done."""
        runs, clock = self.runs, self.clock
        next_arrival = 0
        while self.done < len(runs):
            while next_arrival < len(runs) and runs[next_arrival].plan.arrival_s <= clock.now_s():
                run = runs[next_arrival]
                self._act(run, run.program.start())
                next_arrival += 1
            if not self.pending:  # idle until the next arrival
                if next_arrival == len(runs):
                    raise RuntimeError("live run: programs unfinished with nothing in flight "
                                       "(a bug)")
                time.sleep(max(0.0, runs[next_arrival].plan.arrival_s - clock.now_s()))
                continue
            if not self._step_engines():
                raise RuntimeError(f"live run: {len(self.pending)} requests pending on idle "
                                   "engines (a bug)")

    def _step_engines(self) -> bool:
        """One step of every engine with work; each finished request's program acts on it.
        False when no engine had work."""
        stepped = False
        for engine in self.engines.values():
            if not engine.has_unfinished():
                continue
            stepped = True
            for rid, raw in engine.step():
                if rid not in self.pending:
                    continue
                run, spec = self.pending.pop(rid)
                self.rid_of.pop(spec, None)
                self.hints.ended(run)
                outcome = run.program.interpret(spec, raw, self.answer_of)
                self._act(run, run.program.on_done(spec, outcome))
                self.hints.settled(run)
        return stepped

    def _submit(self, run: LiveRun, spec: RequestSpec) -> None:
        prio = 0
        if self.scheduler is not None:
            view = ProgramView(self.index[id(run)], self.clock.now_s() - run.plan.arrival_s,
                               run.program.tokens, program_estimate(self.scheduler, run.program))
            prio = self.scheduler.priority(view, self.finished_tokens)
        rid = _request_id(run, spec, next(self.counter))
        self.pending[rid] = (run, spec)
        self.rid_of[spec] = rid
        self.hints.sent(run)
        self.engines[spec.role].add(rid, spec.prompt_ids, spec.sampling, prio, run.key,
                                    spec.table_role)

    def _act(self, run: LiveRun, actions: list) -> None:
        for a in actions:
            if isinstance(a, Abort):
                rid = self.rid_of.pop(a.spec)
                self.pending.pop(rid)
                self.hints.ended(run)
                # its tokens are counted from the requests table
                self.engines[a.spec.role].abort(rid)
            else:
                self._submit(run, a)
        if run.program.done and math.isnan(run.finish_s):
            run.finish_s = self.clock.now_s()
            self.finished_tokens.add(run.program.tokens)
            self.done += 1
            if self.on_done is not None:
                self.on_done(run)
