"""Records of CoT paths that stop on their probes (Dynasor's certaindex), for the program kernel.

A CoT program with probes mid-path (`stops_on_probes`) sends its chunks one after another and,
at every interval, a probe beside the next chunk; once the probes in position order say stop,
the path stops and what it has in flight is aborted; a path that reaches its traced end first
ends there and aborts its probes in flight. Which comes first, and how many tokens the aborted
requests generated, follow the timing; what the program sends and where it would stop do not:
`record_stopping` runs one copy of the program along its whole chain (every chunk answered,
no probe) and another with every probe answered before the next chunk (where the policy
stops), and keeps the chain with flags per request (`sim.kernels.stop_calls`: the gate probes
up to the stop, the chunk that ends the path, the probes). The kernel then sends, stops and
aborts every program of the question from it, and each program's row takes its own tokens
(`StopEnd`). The tables equal the plain driver's (`tests/test_kernel_templates.py`).
"""

from __future__ import annotations

import copy

from programs.base import Abort, RequestSpec
from sim.kernels.stop_calls import END, ENDED, GATE, PROBE, STOPS, STOPPED
from sim.workloads.program_driver import SimProgram
from sim.workloads.request_templates import RequestTemplate


class Stops:
    """A stopping path's record beyond its requests and follow-ups."""

    __slots__ = ("flags", "gates", "ends", "bound")

    def __init__(self, flags: tuple, gates: int, ends: dict, bound: int):
        self.flags = flags
        """per request: `stop_calls`' bits (`STOPS`, `GATE`, `END`, `PROBE`)"""
        self.gates = gates
        """the probes that must return before the path stops (0: it never stops)"""
        self.ends = ends
        """`ENDED` / `STOPPED` -> (answer, stop position) of a path that ended so"""
        self.bound = bound
        """the most tokens a program of the record generates (every request to its end)"""


class StopEnd:
    """A stopped or ended program's accounting as its `programs` row reads it."""

    __slots__ = ("paths_used", "reasoning", "probe_tokens", "tokens", "stop_at", "answer")

    def __init__(self, paths_used: int, tokens: int, probe_tokens: int, end: tuple):
        self.paths_used, self.tokens, self.probe_tokens = paths_used, tokens, probe_tokens
        self.reasoning = tokens - probe_tokens
        self.answer, self.stop_at = end


def record_stopping(run: SimProgram, oracle) -> RequestTemplate | None:
    """The record of a CoT program that stops on its probes: its whole chain with each
    request's flags (`Stops`), or None where the program is not such a chain (a request
    numbered out of order, content not named as a chain, a stop past its chain)."""
    chain = _chain(run, oracle)
    if chain is None:
        return None
    requests, first, follow, program = chain
    stop = _stop(run, oracle, requests)
    if stop is False:
        return None
    gates = 0
    flags = []
    for k, (spec, *_rest) in enumerate(requests):
        f = STOPS
        if spec.kind == "probe":
            f |= PROBE
            if stop is not None and spec.position <= stop[1]:
                f, gates = f | GATE, gates + 1
        elif not follow[k]:
            f |= END
        flags.append(f)
    ends = {ENDED: (program.answer, program.stop_at)}
    if stop is not None:
        ends[STOPPED] = stop
    tpl = RequestTemplate(requests, first, follow, [r[4] for r in requests], program)
    tpl.stops = Stops(tuple(flags), gates, ends, sum(r[4] for r in requests))
    return tpl


def _copy(program):
    """A copy of the program to run, its policy and settings shared (immutable: decisions as
    data)."""
    return copy.deepcopy(program, {id(program.policy): program.policy,
                                   id(program.setup): program.setup})


def _chain(run: SimProgram, oracle):
    """A copy of the program along its chain, each chunk answered as if it ran to its traced
    end and no probe answered: (its requests, the first ones, each one's follow-ups, the
    program at the path's end), or None."""
    program = _copy(run.program)
    mine = SimProgram(run.plan, program, run.question)
    requests: list = []
    follow: list = []

    def add(sends: list) -> tuple | None:
        made = []
        for spec in sends:
            if type(spec) is Abort:  # the path's end aborts the probes in flight
                continue
            if type(spec) is not RequestSpec or spec.index != len(requests):
                return None
            request = (spec,) + oracle.request(mine, spec)
            if type(request[3]) is not tuple:
                return None
            made.append(len(requests))
            requests.append(request)
            follow.append(())
        return tuple(made)

    first = add(program.start())
    chunks = [k for k in first or () if requests[k][0].kind == "chunk"]
    while chunks and not program.done:
        k = chunks.pop()
        spec, output = requests[k][0], requests[k][4]
        made = add(program.on_done(spec, oracle.outcome(mine, spec, output, False)))
        if made is None:
            return None
        follow[k] = made
        chunks += [m for m in made if requests[m][0].kind == "chunk"]
    if first is None or chunks or not program.done or program.stop_at is not None:
        return None
    return requests, first, follow, program


def _stop(run: SimProgram, oracle, requests: list):
    """Where a copy of the program stops with every probe answered before the next chunk:
    (answer, stop position), None where its path runs to its end, False where it sends other
    than its chain's requests."""
    program = _copy(run.program)
    mine = SimProgram(run.plan, program, run.question)
    pending = list(program.start())
    while pending and not program.done:
        probes = [s for s in pending if type(s) is RequestSpec and s.kind == "probe"]
        spec = probes[0] if probes else pending[0]
        pending.remove(spec)
        if type(spec) is not RequestSpec or spec.index >= len(requests) or \
                _key(requests[spec.index][0]) != _key(spec):
            return False
        output = oracle.request(mine, spec)[3]
        pending += program.on_done(spec, oracle.outcome(mine, spec, output, False))
    if not program.done:
        return False
    return None if program.stop_at is None else (program.answer, program.stop_at)


def _key(spec: RequestSpec) -> tuple:
    return spec.index, spec.kind, spec.path, spec.position, spec.prompt_tokens
