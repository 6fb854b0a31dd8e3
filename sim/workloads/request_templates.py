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
path marked to wait for its round (`barrier`): whichever ends last sends the next round. So is a
ToT program (`programs.seed`, one candidate per round): its tree follows from the outcomes
alone, but its target's requests wait in its queue (SEED's one at a time) in the order made,
which follows the timing. It is recorded with the queue unlimited (each request's follow-ups:
what it made) and each target request marked with the limit (`queued`); a program sent from the
record numbers each request as it is made and queues it where the limit is in flight, and a
queued request's return sends the first waiting (`returned`, `made`; the kernel's copy:
`sim.kernels.template_calls`); a level's evaluations each wait for the level. The tables
equal the request-by-request driver's (`tests/test_program_templates.py`,
`tests/test_tot_templates.py`).
"""

from __future__ import annotations

import copy
from collections import deque

from programs.base import RequestSpec
from sim.workloads.program_driver import SimProgram


class RequestTemplate:
    """A question's program as recorded request by request."""

    __slots__ = ("requests", "first", "follow", "gained", "program", "sends", "kernel_row",
                 "barrier", "stops", "queued", "queue_room")

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
        self.queued: tuple | None = None
        """per request: the program's target queue's limit where it waits there, else 0 (a
        ToT program: its verifications, evaluations, the target's thoughts); None: no queue"""
        self.queue_room = 0
        """the most requests that wait in the queue at once"""
        self.kernel_row: int | None = None
        """its first row in the program kernel (`sim.workloads.kernel_templates`); -1: kept in
        Python; None: not written yet"""


def record_requests(run: SimProgram, oracle, rounds: bool = False,
                    queue: tuple[int, int] | None = None) -> RequestTemplate | None:
    """Run a copy of the program, each request answered by the oracle as if it ran to its
    traced end, the requests of each outcome breadth first: the template, or None where it
    cannot hold the program (an abort, content not named as a chain, a request numbered out of
    the order it is sent in, a program not done once nothing is in flight).

    `rounds`: the program's paths run in rounds (`paths_in_rounds`): each request that ends a
    path waits for the round (`barrier`), and what the round's last one sent follows each.
    `queue`: the program's target queue (a ToT program's `target_queue`: its limit, the most
    that wait at once): recorded without its limit, so that each request's follow-ups are what
    it made, each marked with the limit where it waits there (`queued`); a request that
    evaluates a state ends its level's round as a path's end does."""
    # its policies are immutable (decisions as data) and may hold large calibrations: shared
    program = copy.deepcopy(run.program, {id(p): p for p in getattr(run.program, "policies", ())})
    if queue is not None:
        program.unlimit_queue()
    rec = _Recording(SimProgram(run.plan, program, run.question), oracle, queue)
    first = rec.add(program.start())
    waiting = deque(first or ())
    while waiting:
        k = waiting.popleft()
        spec, output = rec.requests[k][0], rec.requests[k][4]
        before, evaluated = program.tokens, getattr(program, "evaluated", 0)
        if rounds and program.path_ended(spec.path):  # returned after its path ended
            return None
        sends = rec.add(program.on_done(spec, oracle.outcome(rec.run, spec, output, False)))
        if sends is None:
            return None
        rec.follow[k], rec.gained[k] = sends, program.tokens - before
        if rounds and program.path_ended(spec.path) or \
                queue is not None and program.evaluated > evaluated:
            rec.end_round(k, sends, program.done)
        waiting.extend(sends)
    if first is None or not program.done:
        return None
    tpl = RequestTemplate(rec.requests, first, rec.follow, rec.gained, program,
                          tuple(rec.barrier))
    if queue is not None:
        tpl.queued, tpl.queue_room = tuple(rec.queued), queue[1]
    return tpl


class _Recording:
    """A template's per-request lists as `record_requests` writes them."""

    def __init__(self, run: SimProgram, oracle, queue: tuple[int, int] | None):
        self.run, self.oracle, self.queue = run, oracle, queue
        self.requests: list = []
        self.follow: list = []
        self.gained: list = []
        self.barrier: list = []
        self.queued: list = []
        self.ended: list = []  # the requests that ended a path since the last round went out

    def add(self, sends: list) -> tuple | None:
        """The requests a program made, numbered on (None: not as the template numbers)."""
        made, queue = len(self.requests), self.queue
        for i, spec in enumerate(sends):
            if type(spec) is not RequestSpec or spec.index != made + i:
                return None
            request = (spec,) + self.oracle.request(self.run, spec)
            if type(request[3]) is not tuple:
                # a ToT request's content: its spec's chain in its program's one group
                if queue is None or request[3] != 0 or not spec.prefix_chain or spec.continues:
                    return None
                request = request[:3] + (spec.prefix_chain,) + request[4:]
            self.requests.append(request)
            self.follow.append(())
            self.gained.append(0)
            self.barrier.append(False)
            self.queued.append(queue[0] if queue is not None and
                               self.run.program.queued(spec) else 0)
        return tuple(range(made, len(self.requests)))

    def end_round(self, k: int, sends: tuple, done: bool) -> None:
        """Request k ended a path of its round: it waits for the round, and the round's last
        one's sends follow each."""
        self.barrier[k] = True
        self.ended.append(k)
        if sends or done:
            for j in self.ended:
                self.follow[j] = sends
            self.ended.clear()


def returned(run: SimProgram, tpl: RequestTemplate, k: int) -> tuple:
    """Request k of the program's request-by-request template returned: its tokens counted,
    what follows it (nothing yet where its round's others are still in flight) and, for a
    queued template, their numbers (else None): first what waited in the program's target
    queue where k leaves room there, then what k made, each that waits there queued instead
    (`policies.seed.VerifyQueue`, as `ToTProgram` sends)."""
    run.open -= 1
    run.tokens += tpl.gained[k]
    if tpl.queued is None:
        return () if tpl.barrier[k] and run.open else tpl.follow[k], None
    ks, at = [], []
    if tpl.queued[k]:
        run.qin -= 1
        if run.waiting:
            j, index = run.waiting.pop(0)
            ks.append(j)
            at.append(index)
            run.qin += 1
    if not (tpl.barrier[k] and (run.open or ks)):
        made(run, tpl, tpl.follow[k], ks, at)
    return ks, at


def made(run: SimProgram, tpl: RequestTemplate, new: tuple, ks: list, at: list) -> None:
    """A queued template's requests `new` made, numbered on from the program's last: each
    that may go now onto (ks, at), each that waits for the target queue into its `waiting`."""
    queued = tpl.queued
    for k in new:
        index = run.round
        run.round += 1
        limit = queued[k]
        if limit:
            if run.qin >= limit:
                if len(run.waiting) >= tpl.queue_room:  # the kernel's columns hold that many
                    raise RuntimeError(f"program {run.idx}: more than {tpl.queue_room} "
                                       "requests wait in its target queue (a bug)")
                run.waiting.append((k, index))
                continue
            run.qin += 1
        ks.append(k)
        at.append(index)
