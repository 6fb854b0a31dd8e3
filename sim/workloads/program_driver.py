"""Drives program objects (`programs/`) on simulated replicas, answering outcomes from a trace.

The driver turns each `RequestSpec` a program sends into a replica request (priority from the
inter-program scheduler, its cacheable content: a prefix-cache group per program path or the
content chain the oracle names, output length from the trace) and, when the replica finishes or
aborts it, hands the program the traced `Outcome`. The program decides; the driver only
delivers, and never re-implements a program's logic.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

from policies.routing import RequestView
from policies.scheduling import FinishedLengths, ProgramView, program_estimate
from programs.base import Abort, Outcome, RequestSpec
from programs.traced import Trajectory
from sim.workloads.reasoning_content import PathContent
from sim.engine.prefix_cache import OWN
from sim.engine.request_state import Sent
from sim.workloads.owners import Owners


_new = tuple.__new__

LP_FLAG_MS = 1e-9
"""a row cost too small to tell, so that a step knows it returns log-probabilities"""


class SimProgram:
    """A program object in the simulator: its plan, where it runs and when it finished."""

    __slots__ = ("plan", "idx", "arrival_s", "program", "question", "replicas", "booked",
                 "groups", "contents", "traced", "open", "finish_s", "template", "round",
                 "tokens", "waiting", "qin")

    def __init__(self, plan, program, question):
        self.plan = plan
        self.idx = plan.index  # the program's index in the workload
        self.arrival_s = plan.arrival_s
        self.program: Any = program  # None once closed (`sim.workloads.programs`)
        self.question = question
        self.replicas: dict[str, int] = {}  # pool -> the replica the program is pinned to there
        self.booked: dict[int, int] = {}    # replica -> outstanding tokens booked by routing
        self.groups: dict[int, int] = {}    # prefix-cache key -> the driver's group number
        self.contents: set | None = None    # content keys its requests' chains named (for
        #                                     Dynasor's eviction hint only)
        self.traced: Any = []               # the oracle's memo per program path (None once
        #                                     closed)
        self.open = 0                       # its requests in flight
        self.finish_s = math.nan
        self.template: Any = None           # the rounds it sends, and the next one's index
        self.round = 0                      # (`sim.workloads.program_templates`); a
        #                                     request-by-request template's: its requests sent
        self.tokens = 0                     # a request-by-request template's program tokens
        self.waiting: list | None = None    # a queued template's (request, index) waiting in
        self.qin = 0                        # its target queue; its queued requests in flight


class TracedReasoning:
    """Outcomes of cot/sc requests from a probes trace: the traced trajectory at that position."""

    def __init__(self):
        self._paths: dict[tuple[str, int], tuple[Trajectory, dict, PathContent]] = {}
        # Outcomes are values: one object per distinct outcome, not one per request.
        self._outcomes: dict[tuple, Outcome] = {}

    def _path(self, run: SimProgram, path: int) -> tuple[Trajectory, dict, PathContent]:
        """(traced trajectory, probe position -> (probe, its tokens), its prompts' content) of
        a program path."""
        memo = run.traced  # the program's own: no key to build and hash
        if path < len(memo) and memo[path] is not None:
            return memo[path]
        q, sample = run.question, run.program.paths[path].sample
        key = (q.question_id, sample)
        if key not in self._paths:
            traj = next(t for t in q.samples if t.sample_id == sample)
            probes = dict(zip((p.position_tokens for p in traj.probes),
                              zip(traj.probes, traj.probe_tokens)))
            self._paths[key] = (traj, probes, PathContent(q.question_id, q.prompt_tokens, traj))
        memo.extend([None] * (path + 1 - len(memo)))
        memo[path] = self._paths[key]
        return memo[path]

    def request(self, run: SimProgram, spec: RequestSpec) -> tuple[int, int, tuple, int]:
        """(prompt tokens, prefix-cacheable tokens, the prompt's content chain, tokens the
        request generates if it runs to its end).

        The content is the question's and the traced text's, not the program's
        (`sim.workloads.reasoning_content`): programs that draw the same question send the same
        prompt, and the same tokens as far as their samples' texts agree (a sample's seed fixes
        its tokens), so the engine serves one program's cached blocks to another."""
        memo, path = run.traced, spec.path  # `_path`'s memo read inline: once a request
        traj, probes, content = (memo[path] if path < len(memo) else None) or \
            self._path(run, path)
        prompt = spec.prompt_tokens
        if spec.kind == "probe":
            output = probes[spec.position][1]
            chain = content.probe(spec.position, prompt)
        else:
            output = min(spec.sampling.max_tokens, traj.reasoning_tokens - spec.position)
            chain = content.text(spec.position + output if spec.continues else spec.position)
        return prompt, chain[-1][1], chain, output

    def outcome(self, run: SimProgram, spec: RequestSpec, tokens: int, aborted: bool) -> Outcome:
        """What the request returned, as the trace recorded it."""
        if aborted:
            key: tuple = (tokens, True, False, None, False)
        else:
            memo, path = run.traced, spec.path
            traj, probes, _ = (memo[path] if path < len(memo) else None) or self._path(run, path)
            if spec.kind == "probe":
                probe = probes[spec.position][0]
                key = (tokens, False, False, probe.answer, probe.hesitant)
            else:
                ended = spec.position + tokens >= traj.reasoning_tokens
                key = (tokens, False, ended, traj.final_answer if ended else None, False)
        out = self._outcomes.get(key)
        if out is None:
            tokens, aborted, ended, answer, hesitant = key
            out = self._outcomes[key] = Outcome(tokens, aborted=aborted, ended=ended,
                                                answer=answer, hesitant=hesitant)
        return out


class TracedSearch:
    """Outcomes of search requests from a branches trace: the traced request of the same index.

    A search program is deterministic given its outcomes, so its i-th request is the traced
    i-th request; its prompt length comes from the trace (the program holds no token ids here).
    A prompt is the question, then the content of each node on the path it extends, and a
    node's content is the start of its creator's output. Each request names that chain
    (`sim.engine.prefix_cache`), extended over the output that later prompts repeat (vLLM
    caches the blocks a request fills while decoding). A program's seed is its question's
    (`programs.search.program_seed`), so programs of one question write the same text: the
    names are the question's and its traced nodes'.
    """

    def __init__(self):
        self._chains: dict[str, list[tuple]] = {}  # question -> each node's chain

    def _traced(self, run: SimProgram, spec: RequestSpec):
        reqs = run.question.requests
        if spec.index >= len(reqs):
            raise ValueError(f"{run.question.question_id}: the program asks for request "
                             f"{spec.index}; the trace has {len(reqs)}")
        return reqs[spec.index]

    def request(self, run: SimProgram, spec: RequestSpec) -> tuple[int, int, tuple, int]:
        """(prompt tokens, prefix-cacheable tokens, the content chain they are, tokens the
        request generates)."""
        t = self._traced(run, spec)
        q = run.question
        chains = self._chains.get(q.question_id) or self._question_chains(q)
        chain = chains[spec.index + 1]  # its own node's: its parent's where nothing extends it
        return t.prompt_tokens, chain[-1][1], chain, t.output_tokens

    def _question_chains(self, q) -> list[tuple]:
        """Per node of the question's traced tree, the chain of the prompts that extend it. The
        traced tree, not a simulated program's path: without the live output's first step
        (`SearchProgram.on_done`) a simulated MCTS node is a whole rollout."""
        ends = q.content_ends
        chains = [((("search question", q.question_id), ends[0]),)]
        for r in q.requests:  # a parent is created before its children
            node, chain = r.index + 1, chains[r.parent]
            if ends[node] > chain[-1][1]:
                chain = chain + ((("search node", q.question_id, node), ends[node]),)
            chains.append(chain)
        self._chains[q.question_id] = chains
        return chains

    def outcome(self, run: SimProgram, spec: RequestSpec, tokens: int, aborted: bool) -> Outcome:
        """What the request returned, as the trace recorded it."""
        t = self._traced(run, spec)
        return Outcome(tokens, aborted=aborted, ended=t.is_leaf,
                       answer=t.answer if t.is_leaf else None, reward=t.reward)


class ProgramDriver:
    """Runs program objects on replicas: submits their requests, delivers outcomes, records."""

    def __init__(self, cluster, oracle, scheduler, on_program_done=None):
        self.cluster = cluster
        self.env = cluster.env
        self.oracle = oracle
        self.scheduler = scheduler
        self.finished_tokens = FinishedLengths()  # per finished program, for SJF estimates
        self.owner = Owners()  # per request idx
        self.trows: array | None = None
        """per request idx: its request's number in its program's request-by-request template
        (-1: none), kept where the family's tables read the template's rows (`SimFamily`)"""
        # per request idx from `_base` on: (program, spec) while in flight, then None (a list:
        # idx are dense)
        self._live: list = []
        self._base = 0  # the owner columns' and `_live`'s first request (`forget_folded`)
        self.on_program_done = on_program_done
        # called once a program is done and none of its requests is in flight: nothing can
        # change it any more (a caller may take its row and let it go)
        self.on_program_closed = None
        self._groups = 0  # prefix-cache groups numbered so far, one per (program, path)
        self._pools: dict[str, str] = {}  # role -> its pool
        self._costs = [_costs(cal) for cal, _ in cluster.specs]
        # Dynasor's approximate SJF asks each program for its own estimate (else never asked)
        self._own_estimate = getattr(scheduler, "wants_program_estimate", False)
        # Dynasor's eviction hint: a program with no request in flight has its blocks evicted first
        self._demote = getattr(cluster, "kv_eviction", "free_order") == "idle_programs_first"

    kernel_arrivals = None
    """the programs' arrivals the kernel takes (`sim.workloads.kernel_arrivals`), if any"""

    @property
    def reads_old_owners(self) -> bool:
        """Whether the run reads who sent a request long done (Dynasor's eviction hint reads a
        cached block's request: `_idle`)."""
        return self._demote

    def forget_folded(self, first_idx: int, columns: dict) -> None:
        """A run that folds its requests (`sim.engine.folded_requests`, after the family's own
        fold): let who sent the requests folded go, once they are half of what is kept."""
        upto = first_idx + len(columns["arrival_s"])
        if 2 * (upto - self._base) < len(self._live):
            return
        k = upto - self._base
        self.owner.forget(upto)
        if self.trows is not None:
            del self.trows[:k]
        del self._live[:k]
        self._base = upto

    def prepare(self, runs: list) -> None:
        """Before the run (a driver that hands arrivals to the kernel sets them up here)."""

    def pin(self, run: SimProgram, role: str, prompt_tokens: int, tokens: int) -> int:
        """The replica of a pool a program runs on (its prefix cache lives there): routed once,
        at its first request of that role, booking `tokens` outstanding tokens."""
        pool = self._pools.get(role)
        if pool is None:
            pool = self._pools[role] = self.cluster.pool_for(role)
        rid = run.replicas.get(pool)
        if rid is None:
            rid = self.cluster.route(RequestView(run.idx, prompt_tokens, tokens - prompt_tokens),
                                     tokens, pool)
            run.replicas[pool] = rid
            run.booked[rid] = tokens
        return rid

    def start(self, run: SimProgram) -> None:
        """A program arrives: send its first requests."""
        self._act(run, run.program.start())

    def on_request_done(self, idx: int, generated: int, aborted: bool) -> None:
        """Replica callback: request `idx` finished (or was aborted) with `generated` tokens."""
        live, i = self._live, idx - self._base
        run, spec = live[i]
        live[i] = spec.sent = None
        run.open -= 1
        actions = run.program.on_done(spec, self.oracle.outcome(run, spec, generated, aborted))
        if not aborted:  # an abort lands inside the action that caused it: finish there
            self._act(run, actions)
        elif run.open == 0 and not math.isnan(run.finish_s):  # the last abort of a finished one
            self._closed(run)
        if self._demote and run.open == 0:
            self._idle(run)

    def _idle(self, run: SimProgram) -> None:
        """The program has no request in flight: its cached blocks (its prefix groups' and its
        requests' own and the shared content its requests named, as the live hint demotes the
        blocks the program's requests freed) go first when its replicas evict."""
        groups, program, p = set(run.groups.values()), self.owner.program, run.idx
        groups.update(run.contents or ())

        def owned(key: tuple) -> bool:
            return program[key[1]] == p if key[0] == OWN else key[0] in groups

        for rid in run.replicas.values():
            self.cluster.demote(rid, owned)

    def _act(self, run: SimProgram, actions: list) -> None:
        program = run.program  # an abort's callback may close it before this returns
        for a in actions:
            if type(a) is Abort:
                entry = a.spec.sent  # (replica, handle), None once it is done
                if entry is not None:
                    a.spec.sent = None
                    self.cluster.cancel(*entry)
            else:
                self._submit(run, a)
        if program.done and run.finish_s != run.finish_s:  # not finished yet: NaN (isnan, inlined)
            run.finish_s = self.env.now
            # Aborted requests report their tokens after this: the SJF history takes what is known.
            self.finished_tokens.add(program.tokens)
            if self.on_program_done is not None:
                self.on_program_done(run)
        if run.open == 0 and program.done:
            self._closed(run)

    def _closed(self, run: SimProgram) -> None:
        if self.on_program_closed is not None and run.program is not None:
            self.on_program_closed(run)

    def _submit(self, run: SimProgram, spec: RequestSpec) -> None:
        idx = self._base + len(self._live)  # a list's length: `Owners.__len__` is a Python call
        prompt, prefix, key, output = self.oracle.request(run, spec)
        chain: tuple | None
        if type(key) is tuple:  # content named across programs: the prompt's chain itself
            chain, key = key, 0
        else:
            chain = spec.prefix_chain or None
            if spec.continues:  # its output's blocks are the path's content too (`_finish`)
                prefix = prompt + output
        if chain is not None and self._demote:  # the content its requests free (`_idle`)
            if run.contents is None:
                run.contents = set()
            run.contents.update(link[0] for link in chain)
        rid = run.replicas.get(self._pools.get(spec.role, ""))  # pinned already, mostly
        if rid is None:
            rid = self.pin(run, spec.role, prompt, prompt + output)
        limit, token_ms, top_k_ms, flag_ms = self._costs[rid]
        if limit is not None and prompt + output > limit:
            raise too_long(run, spec, prompt, output, limit, rid)
        group = run.groups.get(key)
        if group is None:
            group = run.groups[key] = self._groups
            self._groups += 1
        s = spec.sampling
        # what the live engine returns (engines/live_engine.py): top-k rows for a scored prompt's
        # positions, and for sampled tokens when it asks their log-probabilities
        row_ms = token_ms + top_k_ms * s.top_logprobs or flag_ms
        # A scoring request needs its tail's log-probabilities, which vLLM has none of for
        # cached positions: the engine runs it cached, then again uncached (`Cluster._finished`).
        scored = s.prompt_logprobs
        # named tuples made as tuples (a named tuple's own constructor costs twice as much)
        priority = self.scheduler.priority(
            _new(ProgramView, (run.idx, self.env.now - run.arrival_s, run.program.tokens,
                               program_estimate(self.scheduler, run.program)
                               if self._own_estimate else None)),
            self.finished_tokens)
        sent = _new(Sent, (idx, prompt, output, priority, group, prefix,
                           prompt - scored if scored else 0,
                           s.temperature > 0.0 and s.seed is not None, row_ms if scored else 0.0,
                           row_ms if s.top_logprobs or s.logprobs else 0.0))
        owner = self.owner  # `Owners.add`, inlined: this runs for every request
        code = owner.codes.get((spec.role, spec.table_role))
        if code is None:
            code = owner.code(spec)
        owner.program.append(run.idx)
        owner.index.append(spec.index)
        owner.path.append(spec.path)
        owner.role.append(code)
        if self.trows is not None:
            self.trows.append(-1)
        self._live.append((run, spec))
        run.open += 1
        spec.sent = (rid, self.cluster.send(rid, sent, chain))


def too_long(run: SimProgram, spec: RequestSpec, prompt: int, output: int, limit: int,
             rid: int) -> ValueError:
    """The error of a request longer than its replica's model takes."""
    return ValueError(f"workload.programs: program {run.idx}'s {spec.kind} request (prompt "
                      f"{prompt} + output {output} tokens) exceeds the model's max_model_len "
                      f"{limit} (replica {rid}'s calibration); the engine would reject it")


def _costs(cal) -> tuple:
    """A replica's terms of a request: (max_model_len, log-probability row ms per token and per
    top-k entry, the row cost when those are zero)."""
    # rows must show for a step to pay its own log-probability term
    flag_ms = LP_FLAG_MS if cal.logprob_step_ms else 0.0
    return (cal.max_model_len, float(cal.logprob_token_ms), float(cal.logprob_top_k_ms), flag_ms)
