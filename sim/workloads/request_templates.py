"""Programs whose every request sends what follows from its own outcome: recorded once per
question, each request's follow-ups sent from the record.

An asynchronous A1 program (`programs.a1`, no target cap) runs its paths side by side: when a
request returns, what the program sends next (a score of the draft step, the target's step, the
path's next draft) follows from that request's node and outcome alone, never from which of its
other paths' requests returned before (`sends_on_own_outcome`). The trace answers every outcome,
so every program of one question (one seed) sends the same requests, each after the same
request, and the program's accounting ends the same. `record_requests` runs one copy of such a
program, answering its requests from the trace, and keeps per request what it sends once it
returns and the tokens it adds; `program_templates.TemplateDriver` then sends every program of
the question from that record, numbering its requests as the program numbers them (in the
order it makes them, which the record checks is the order it sends them). A CoT or SC program
whose paths run in rounds (`paths_in_rounds`) is recorded the same way, each request that ends a
path marked to wait for its round (`barrier`): whichever ends last sends the next round. The
tables equal the request-by-request driver's (`tests/test_program_templates.py`).
"""

from __future__ import annotations

import copy
from collections import deque

from programs.base import RequestSpec
from sim.workloads.program_driver import SimProgram


class RequestTemplate:
    """A question's program as recorded request by request."""

    __slots__ = ("requests", "first", "follow", "gained", "program", "sends", "kernel_row",
                 "barrier", "stops")

    def __init__(self, requests: list, first: tuple, follow: list, gained: list, program,
                 barrier: tuple | None = None):
        self.requests = requests
        """per request in the order made: (spec, prompt, prefix, chain, output)"""
        self.first = first
        """the requests the program sends as it starts"""
        self.follow = follow
        """per request: the requests the program sends once it has returned"""
        self.gained = gained
        """per request: the tokens its outcome adds to the program's count"""
        self.program = program
        """the recording program once done: every program of the question ends as it did"""
        self.sends: dict = {}
        """per request-cost class, per request: the request as those replicas take it
        (`TemplateDriver._sends`), made at its first send there"""
        self.barrier = barrier or (False,) * len(requests)
        """per request: its follow-ups go out once none of the program's requests is in flight
        (a round-by-round template written request by request, `kernel_templates.flattened`;
        a path's last request in a program whose paths run in rounds)"""
        self.stops = None
        """a path that stops on its probes: its flags and ends
        (`sim.workloads.stop_templates.Stops`)"""
        self.kernel_row: int | None = None
        """its first row in the program kernel (`sim.workloads.kernel_templates`); -1: kept in
        Python; None: not written yet"""


def record_requests(run: SimProgram, oracle, rounds: bool = False) -> RequestTemplate | None:
    """Run a copy of the program, each request answered by the oracle as if it ran to its
    traced end, the requests of each outcome breadth first: the template, or None where it
    cannot hold the program (an abort, content not named as a chain, a request numbered out of
    the order it is sent in, a program not done once nothing is in flight).

    `rounds`: the program's paths run in rounds (`paths_in_rounds`): each request that ends a
    path waits for the round (`barrier`), and what the round's last one sent follows each."""
    # its policies are immutable (decisions as data) and may hold large calibrations: shared
    program = copy.deepcopy(run.program, {id(p): p for p in getattr(run.program, "policies", ())})
    mine = SimProgram(run.plan, program, run.question)  # the oracle asks the copy of its nodes
    requests: list = []
    follow: list = []
    gained: list = []
    barrier: list = []
    ended: list = []  # the requests that ended a path since the last round went out

    def add(sends: list) -> tuple | None:
        made = len(requests)
        for i, spec in enumerate(sends):
            if type(spec) is not RequestSpec or spec.index != made + i:
                return None
            request = (spec,) + oracle.request(mine, spec)
            if type(request[3]) is not tuple:
                return None
            requests.append(request)
            follow.append(())
            gained.append(0)
            barrier.append(False)
        return tuple(range(made, len(requests)))

    first = add(program.start())
    waiting = deque(first or ())
    while waiting:
        k = waiting.popleft()
        spec, output = requests[k][0], requests[k][4]
        before = program.tokens
        if rounds and program.path_ended(spec.path):  # returned after its path ended
            return None
        sends = add(program.on_done(spec, oracle.outcome(mine, spec, output, False)))
        if sends is None:
            return None
        follow[k], gained[k] = sends, program.tokens - before
        if rounds and program.path_ended(spec.path):
            barrier[k] = True
            ended.append(k)
            if sends or program.done:  # the round's last path: the next round follows each
                for j in ended:
                    follow[j] = sends
                ended.clear()
        waiting.extend(sends)
    if first is None or not program.done:
        return None
    return RequestTemplate(requests, first, follow, gained, program, tuple(barrier))
