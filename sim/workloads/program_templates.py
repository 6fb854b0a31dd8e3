"""Programs sent from templates: each question's requests decided once, timed per program.

A search program (`programs.search`: SC, MCTS or Rebase on a branches trace) is deterministic
given its outcomes, and the simulator answers them from the trace (`TracedSearch`): every
program of one question (one seed) sends the same requests. It sends them in rounds: a round
goes out together once the previous round has all returned (an SC round, an MCTS rollout, a
Rebase level), and it never aborts. `TemplateDriver` runs one program object per question
through its rounds against the trace's outcomes (`record`), then sends every program of that
question from the record: the program decides once, the replicas time each program's requests
as they time any other. A program the record cannot hold (a request sent before its round
returned, an abort) is driven as the plain driver drives it. A program whose every request
sends what follows from its own outcome (asynchronous A1: `sends_on_own_outcome`) is recorded
request by request instead (`sim.workloads.request_templates`); one that says it does not (a
synchronous or target-capped A1 program) keeps the plain driver. So is a CoT or SC program on a
probes trace whose paths run in rounds (`paths_in_rounds`: no probe mid-path), a path's last
request waiting for its round's others; a CoT path that probes mid-path (its stop aborts what
is in flight) is recorded as its whole chain and stopped in the kernel only
(`sim.workloads.stop_templates`); a ToT program with its target queue (`target_queue`; a
multi-candidate one keeps the plain driver), its rows its recording's. On compiled replicas under a
scheduler whose priority the kernel computes (all but one that asks each program's own
estimate) such a record (and a search program's rounds, written request by request) goes
into the program kernel (`sim.workloads.kernel_templates`), which sends each request's
follow-ups itself. The tables equal the plain driver's
(`tests/test_program_templates.py`, `tests/test_kernel_templates.py`,
`tests/test_tot_templates.py`).
"""

from __future__ import annotations

import copy

from policies.scheduling import FinishedLengths, ProgramView
from programs.base import RequestSpec
from sim.engine.request_state import Sent
from sim.workloads.kernel_templates import KernelTemplates, flattened, kernel_mode
from sim.workloads.program_driver import ProgramDriver, SimProgram, too_long
from sim.workloads.request_templates import RequestTemplate, made, record_requests, \
    returned
from sim.workloads.stop_templates import record_stopping
from sim.workloads.kernel_arrivals import KernelArrivals, arrives_in_kernel
from sim.kernels.stop_calls import CLOSED, DONE_CLOSED, SEND

_new = tuple.__new__


class Template:
    """A question's program as recorded: its rounds and its program object at the end."""

    __slots__ = ("rounds", "program", "sends")

    def __init__(self, rounds: list, program):
        self.rounds = rounds
        """per round: (its requests, the program's tokens and own estimate as it sent them);
        a request is (spec, prompt, prefix, chain, output)"""
        self.program = ProgramEnd(program)
        """the recording program's accounting once done: every program of the question ends
        as it did"""
        self.sends: list = [{} for _ in rounds]
        """per round: its requests as the replicas of one request-cost class take them
        (`TemplateDriver._sends`), by class"""


class ProgramEnd:
    """A finished program's accounting as its `programs` row reads it (`program_row`), read
    once: the rows of a question's programs share it."""

    __slots__ = ("paths_used", "reasoning", "probe_tokens", "tokens", "stop_at", "answer")

    def __init__(self, program):
        for name in self.__slots__:
            setattr(self, name, getattr(program, name))


def record(run: SimProgram, oracle, own_estimate: bool) -> Template | None:
    """Run a copy of the program through its rounds, each request answered by the oracle as
    if it ran to its traced end: the template, or None where the program is not round by round
    (a request sent before its round returned, an abort, content not named as a chain)."""
    program = copy.deepcopy(run.program)
    sends, rounds = program.start(), []
    while sends:
        if any(type(s) is not RequestSpec or s.role != sends[0].role for s in sends):
            return None
        estimate = program.remaining_tokens() if own_estimate else None
        requests = tuple((s,) + oracle.request(run, s) for s in sends)
        if any(type(chain) is not tuple for _, _, _, chain, _ in requests):
            return None
        rounds.append((requests, program.tokens, estimate))
        sends = []
        for i, (spec, _prompt, _prefix, _chain, output) in enumerate(requests):
            sends = program.on_done(spec, oracle.outcome(run, spec, output, False))
            if sends and i < len(requests) - 1:
                return None
    return Template(rounds, program) if program.done else None


class TemplateDriver(ProgramDriver):
    """`ProgramDriver` for search programs: each question's rounds from its template."""

    def __init__(self, cluster, oracle, scheduler, on_program_done=None):
        super().__init__(cluster, oracle, scheduler, on_program_done)
        self._templates: dict = {}  # (question id, seed) -> Template, or None: not templated
        # replicas whose request costs (`program_driver._costs`) are equal send alike: a class
        # per distinct costs, so a template holds a round's sends once per class, not replica
        classes: dict = {}
        self._cost_class = [classes.setdefault(c, len(classes)) for c in self._costs]
        # request-by-request templates in the program kernel, where it can compute the priority
        self._kernel = None
        mode = kernel_mode(scheduler)
        if hasattr(cluster, "on_fold") and mode is not None and not self._demote:
            self._kernel = KernelTemplates(self, cluster, mode)
            cluster.on_fold, cluster.on_template = self._fold, self._on_template

    def prepare(self, runs: list) -> None:
        """Before the run: the programs' arrivals in the kernel, where it can route them."""
        if self._kernel is not None and runs and arrives_in_kernel(self.cluster):
            self.kernel_arrivals = KernelArrivals(self._kernel, runs, _key)

    def start(self, run: SimProgram) -> None:
        """A program arrives: send its first round (from its question's template)."""
        if self._demote:  # the eviction hint reads each request's content: the plain driver
            return super().start(run)
        key = _key(run)
        tpl = fresh = self._templates.get(key, False)
        if tpl is False:
            tpl = self._templates[key] = self._record(run)
        if tpl is None:
            return super().start(run)
        if type(tpl) is RequestTemplate:
            kernel = self._kernel is not None and self._kernel.holds(tpl)
            if tpl.stops is not None and not kernel:  # a path stops in the kernel only
                return super().start(run)
            if fresh is False and kernel and self.kernel_arrivals is not None:
                self.kernel_arrivals.fill(key, tpl)  # its question's other programs
            run.program, run.template, run.round, run.tokens = tpl.program, tpl, 0, 0
            if kernel:
                self._kernel.start(run)
                self._kernel.load(run)
            ks, at = tpl.first, None
            if tpl.queued is not None:
                run.waiting, run.qin, ks, at = [], 0, [], []
                made(run, tpl, tpl.first, ks, at)
            slots = self._send_requests(run, tpl, ks, at)
            if kernel:
                self._kernel.store(run, tpl, ks, slots)
            return
        run.program, run.template = tpl.program, tpl  # the program's own object: not needed
        if tpl.rounds:
            self._send_round(run, tpl, 0)
        else:
            self._finish(run)

    def _record(self, run: SimProgram):
        """The program's template: request by request where the program says its sends follow
        each request's own outcome (`sends_on_own_outcome`) or its paths' rounds
        (`paths_in_rounds`; the program's estimate, asked at each send, keeps the plain driver),
        else round by round for a program that says neither; None: driven as the plain driver
        drives it."""
        if hasattr(type(run.program), "target_queue"):  # a ToT program: through its queue
            queue = run.program.target_queue
            if queue is None or self._own_estimate:
                return None
            return record_requests(run, self.oracle, queue=queue)
        own = getattr(run.program, "sends_on_own_outcome", None)
        if own is not None:
            return record_requests(run, self.oracle) if own and not self._own_estimate else None
        rounds = getattr(run.program, "paths_in_rounds", None)
        if rounds is not None:
            if self._own_estimate:
                return None
            if rounds():
                return record_requests(run, self.oracle, rounds=True)
            if self._kernel is not None and run.program.stops_on_probes():
                return record_stopping(run, self.oracle)
            return None
        tpl = record(run, self.oracle, self._own_estimate)
        if tpl is not None and self._kernel is not None:  # the kernel sends its rounds
            return flattened(tpl) or tpl
        return tpl

    def on_request_done(self, idx: int, generated: int, aborted: bool) -> None:
        """Replica callback: once a program's round has all returned, its next round; a
        request-by-request template's request: what follows it."""
        i = idx - self._base
        run = self._live[i]
        if type(run) is tuple:
            run, k = run
            if type(k) is not int:  # (run, spec): a program the plain driver drives
                return super().on_request_done(idx, generated, aborted)
            # (run, its request in a request-by-request template): the program's count takes
            # the request's tokens, and what follows it goes out
            if aborted:
                raise RuntimeError(f"program {run.idx}: a templated request was aborted")
            self._live[i] = None
            tpl = run.template
            follow, at = returned(run, tpl, k)
            if follow:
                self._send_requests(run, tpl, follow, at)
            elif not run.open:  # nothing in flight and nothing to send: done
                self._finish(run)
            return
        if aborted:
            raise RuntimeError(f"request {idx}: a templated request was aborted")
        self._live[i] = None
        run.open -= 1
        if run.open:
            return
        if run.round < len(run.template.rounds):
            self._send_round(run, run.template, run.round)
        else:
            self._finish(run)

    def _send_kernel(self, run: SimProgram, tpl: RequestTemplate, ks: tuple) -> None:
        """`_send_requests` for a program whose state is in the kernel."""
        self._kernel.load(run)
        self._kernel.store(run, tpl, ks, self._send_requests(run, tpl, ks))

    def _on_template(self, p: int, t: int, s: int) -> None:
        """The kernel handed back program p's template request t in slot s
        (`template_calls.follow`): what follows it, as `on_request_done` sends it (a path
        that stops: counted, stopped or closed in the kernel, `stop_calls.take`)."""
        run = self._kernel.runs[p]
        tpl = run.template
        k = t - tpl.kernel_row
        if tpl.stops is not None:
            sends = self._kernel.take(s, p, t) == SEND
            self._fold()  # the program done or closed there
            if sends:
                self._send_kernel(run, tpl, tpl.follow[k])
            return
        self._kernel.load(run)
        follow, at = returned(run, tpl, k)
        self._kernel.store(run, tpl, follow, self._send_requests(run, tpl, follow, at))
        if not follow and not run.open:  # nothing in flight and nothing to send: done
            self._kernel.unbook(run)
            self._finish(self._kernel.runs.pop(p))

    def _fold(self) -> bool:
        """What the kernel sent and finished since the last fold (`KernelTemplates.fold`):
        nothing left to read (False)."""
        counted = type(self.finished_tokens) is not FinishedLengths  # added in the kernel
        for run, finish_s, event, tokens in self._kernel.fold():
            if event == CLOSED:
                self._close(run)
            else:
                self._finish(run, finish_s, counted, event == DONE_CLOSED, tokens)
        return False

    def _finish(self, run: SimProgram, finish_s: float | None = None, counted: bool = False,
                close: bool = True, tokens: int | None = None) -> None:
        """As `ProgramDriver._act` once the program is done (at `finish_s`, else now;
        `counted`: the scheduler's history has its `tokens` already), closed where nothing of
        it is in flight (`close`)."""
        run.finish_s = self.env.now if finish_s is None else finish_s
        if not counted:
            self.finished_tokens.add(run.program.tokens if tokens is None else tokens)
        if self.on_program_done is not None:
            self.on_program_done(run)
        if close:
            self._close(run)

    def _close(self, run: SimProgram) -> None:
        """The program closes, its row read from its record's end (a program the kernel
        started has its own object still), or a path that stopped from its own accounting."""
        tpl = run.template
        if type(tpl) is RequestTemplate:
            run.program = tpl.program if tpl.stops is None else self._kernel.end_of(run)
        self._closed(run)

    def _send_round(self, run: SimProgram, tpl: Template, k: int) -> None:
        """Send round k of the program's template, as `ProgramDriver._submit` sends each."""
        requests, tokens, estimate = tpl.rounds[k]
        run.round = k + 1
        role = requests[0][0].role
        rid = run.replicas.get(self._pools.get(role, ""))  # pinned at arrival, mostly
        if rid is None:
            prompt, output = requests[0][1], requests[0][4]
            rid = self.pin(run, role, prompt, prompt + output)
        by_class, c = tpl.sends[k], self._cost_class[rid]
        sends = by_class.get(c)
        if sends is None:
            sends = by_class[c] = self._sends(run, rid, requests)
        group = run.groups.get(0)  # content named as chains: one group per program
        if group is None:
            group = run.groups[0] = self._groups
            self._groups += 1
        priority = self.scheduler.priority(
            _new(ProgramView, (run.idx, self.env.now - run.arrival_s, tokens, estimate)),
            self.finished_tokens)
        owner, live, send, p = self.owner, self._live, self.cluster.send, run.idx
        if self.trows is not None:
            self.trows.extend([-1] * len(sends))
        for index, path, code, chain, head, tail in sends:
            idx = self._base + len(live)  # a send may let folded requests go
            owner.program.append(p)
            owner.index.append(index)
            owner.path.append(path)
            owner.role.append(code)
            live.append(run)
            run.open += 1
            send(rid, _new(Sent, (idx,) + head + (priority, group) + tail), chain)

    def _send_requests(self, run: SimProgram, tpl: RequestTemplate, ks, at=None) -> list:
        """Send the template's requests ks, numbered on from the program's last (a queued
        template's: numbered as made, `at`), as `ProgramDriver._submit` sends each (one
        priority: the program's state is the same): their slots."""
        priority = self.scheduler.priority(
            _new(ProgramView, (run.idx, self.env.now - run.arrival_s, run.tokens, None)),
            self.finished_tokens)
        group = run.groups.get(0)  # content named as chains: one group per program
        if group is None:
            group = run.groups[0] = self._groups
            self._groups += 1
        owner, live, send, p, pools = self.owner, self._live, self.cluster.send, run.idx, \
            self._pools
        slots = []
        if self.trows is not None:
            self.trows.extend(ks)
        for i, k in enumerate(ks):
            request = tpl.requests[k]
            role = request[0].role
            rid = run.replicas.get(pools.get(role, ""))  # pinned already, mostly
            if rid is None:
                rid = self.pin(run, role, request[1], request[1] + request[4])
            c = self._cost_class[rid]
            sends = tpl.sends.get(c)
            if sends is None:
                sends = tpl.sends[c] = [None] * len(tpl.requests)
            sent = sends[k]
            if sent is None:
                sent = sends[k] = self._sends(run, rid, (request,))[0]
            _, path, code, chain, head, tail = sent
            idx = self._base + len(live)  # a send may let folded requests go
            owner.program.append(p)
            if at is None:
                owner.index.append(run.round)
                run.round += 1
            else:
                owner.index.append(at[i])
            owner.path.append(path)
            owner.role.append(code)
            live.append((run, k))
            run.open += 1
            slots.append(send(rid, _new(Sent, (idx,) + head + (priority, group) + tail), chain))
        return slots

    def _sends(self, run: SimProgram, rid: int, requests: tuple) -> list:
        """A round's requests on replica rid: (index, path, role code, chain, Sent's fields
        before the priority, after the group), the limit checked as `_submit` checks it."""
        limit, token_ms, top_k_ms, flag_ms = self._costs[rid]
        out = []
        for spec, prompt, prefix, chain, output in requests:
            if limit is not None and prompt + output > limit:
                raise too_long(run, spec, prompt, output, limit, rid)
            code = self.owner.codes.get((spec.role, spec.table_role))
            if code is None:
                code = self.owner.code(spec)
            s = spec.sampling  # Sent's fields as `_submit` makes them (the tests hold them equal)
            row_ms = token_ms + top_k_ms * s.top_logprobs or flag_ms
            scored = s.prompt_logprobs
            out.append((spec.index, spec.path, code, chain, (prompt, output), (
                prefix, prompt - scored if scored else 0,
                s.temperature > 0.0 and s.seed is not None, row_ms if scored else 0.0,
                row_ms if s.top_logprobs or s.logprobs else 0.0)))
        return out


def _key(run: SimProgram) -> tuple:
    """What fixes a program's requests: its question and a search or A1 program's seed, or a
    CoT/SC program's traced samples (one record each)."""
    return run.question.question_id, getattr(run.program, "seed", None), run.plan.sample_ids
