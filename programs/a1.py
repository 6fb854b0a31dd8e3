"""A1 on one question: m paths of draft steps scored by the target, engine-free.

Each turn of a path: the draft writes a step (role `draft`, up to Kd tokens, ends at a newline);
the target scores it (role `target`: a prefill of question + path + step with prompt log-
probabilities, `max_tokens=1`; the question and path are prefix-cached); the policy accepts it
(it joins the path) or the target writes the step itself from the same context (role `target`,
up to Kt tokens). A path ends at an answer (`\\boxed{}`), the end of sequence, or turn T.

Every request's seed derives from (program seed, sample, turn, role), never from the path taken,
so a path is a deterministic function of its decisions: replaying the same policy reproduces a
traced path request for request (unless batching changes the numerics).

Several policies may run in one program (the conformity tracer runs a grid of them): a node of
the path tree carries the policies that agree so far and forks where they disagree, so each
policy's path is exactly what it would be alone, and shared prefixes are computed once. A node's
identity is its decision string (`path`: 'A' accepted, 'R' rejected, per turn), which is how a
trace answers a simulated path. `sync` (the synchronous baseline, one policy) holds every turn's
scoring until all of the turn's drafts are back, and every next turn until all steps are.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from itertools import chain, repeat

from policies.a1 import A1Settings, mean_nll
from policies.certaindex import extract_boxed
from policies.search import majority_vote
from programs.base import Outcome, RequestSpec, Sampling
from programs.rowlog import RowLog
from traces import ids

ROLE_SEED = {"draft": 1, "target": 2}
STEP_FIELDS = {kind: tuple(f"{kind}_{f}" for f in ("tokens", "text", "request", "answer", "ended"))
               for kind in ROLE_SEED}
"""a step's record fields (a node's conformity columns) by the step's kind"""
ROW_FIELDS = {"sample": "q", "turn": "q", "path": "", "policies": "", "context_tokens": "q",
              "accepted_by": "", **dict.fromkeys(STEP_FIELDS["draft"], ""), "score": "",
              "score_request": "", "score_prefill_tokens": "",
              **dict.fromkeys(STEP_FIELDS["target"], ""), "target_score": ""}
"""a node's conformity row as a program logs it: its fields and their `RowLog` codes (a step's
fields are None where the node had no such step)"""
RECORD_FIELDS = tuple(ROW_FIELDS)[6:]
"""the fields a node's steps record (`Node.record`)"""


def a1_program_seed(seed: int, question_id: str, calibration: bool = False) -> int:
    """A traced A1 program's seed: the trace seed, its question, and its phase."""
    return (seed * 1_000_003 + ids.question_index(question_id)) * 2 + int(calibration)


def step_end(step: Outcome) -> tuple[str | None, bool]:
    """(answer, the path ends here) after a step: an answer, the end of sequence, or nothing."""
    answer = step.answer if step.answer is not None else extract_boxed(step.text)
    return answer, answer is not None or step.eos or step.ended or step.tokens == 0


def a1_seed(program_seed: int, sample: int, turn: int, role: str) -> int:
    """Sampling seed of one step request: the same on every path of the sample's turn."""
    return ((program_seed * 10_007 + sample) * 1_009 + turn) * 4 + ROLE_SEED[role]


@dataclass(eq=False)
class Node:
    """A path of one sample after some turns, followed by the policies that agree so far."""

    sample: int
    path: str
    """decisions so far, one letter a turn: A (draft step accepted) or R (target's step)"""
    policies: tuple[int, ...]
    tokens: int = 0
    """path tokens after the question"""
    ids: list = field(default_factory=list)
    text: str = ""
    draft: Outcome | None = None
    accept: tuple[int, ...] = ()
    reject: tuple[int, ...] = ()
    record: dict = field(default_factory=dict)

    @property
    def turn(self) -> int:
        """Turns taken before this node's step."""
        return len(self.path)


class A1Program:
    """A1 (or a baseline) on one question, written once for the simulator and the live runner."""

    def __init__(self, question_id: str, policies: tuple, settings: A1Settings,
                 prompt_tokens: int, seed: int, prompt_ids: list | None = None,
                 score_all: bool = False, target_all: bool = False):
        if not policies:
            raise ValueError("an A1 program needs at least one policy")
        if settings.sync and len(policies) > 1:
            raise ValueError("the synchronous variant runs one policy at a time")
        self.question_id = question_id
        self.policies = tuple(policies)
        self.settings = settings
        self.prompt_tokens = prompt_tokens
        self.prompt_ids = prompt_ids
        self.seed = seed
        self.score_all = score_all
        """trace mode: score every draft step, whatever the policies need"""
        self.target_all = target_all
        """trace mode: ask the target's step at every node (what it would write instead)"""
        self._started = False
        self.tokens = 0
        self.tokens_by_role = {"draft": 0, "target": 0, "score": 0}
        self.answers: dict[int, list] = {i: [None] * settings.samples
                                         for i in range(len(policies))}
        self.decisions: dict[int, list] = {i: [] for i in range(len(policies))}
        self.final_paths: dict[int, list] = {i: [""] * settings.samples
                                             for i in range(len(policies))}
        """each policy's decision string per sample, once the path ended"""
        self.rows = RowLog(ROW_FIELDS)
        """one per node whose turn is complete (the `conformity` table)"""
        self._names: dict[tuple, tuple] = {}
        """policy indices -> their names (one tuple shared by the rows that name them)"""
        self.request_log = RowLog({"index": "q", "kind": "", "sample": "q"})
        """(request index, kind, sample) of every request sent"""
        self._index = 0
        self._flight: dict[RequestSpec, Node] = {}
        self._held: list = []      # sync: score specs and next-turn nodes held at the barrier
        self._open = 0             # sync: nodes of this turn not yet at the barrier
        # target requests past `settings.target_cap`, in order (made once a cap holds one)
        self._capped: deque | None = None
        self._target_out = 0       # target requests sent and not yet done

    # -- requests ---------------------------------------------------------------------------

    def _spec(self, node: Node, kind: str, role: str, extra_ids: list, extra_tokens: int,
              sampling: Sampling) -> RequestSpec:
        ids = None
        if self.prompt_ids is not None:
            ids = list(self.prompt_ids) + node.ids + extra_ids
        # The whole prompt is cacheable: a score's step is the next turn's context if accepted.
        prompt_tokens = self.prompt_tokens + node.tokens + extra_tokens
        # positional (kind, index, prompt, sampling, path, position, prefix, chain, ids, role):
        # made for every request, where keywords cost twice as much
        spec = RequestSpec(kind, self._index, prompt_tokens, sampling, node.sample, node.tokens,
                           prompt_tokens, (), ids, role)
        self.request_log.add(self._index, kind, node.sample)
        self._index += 1
        self._flight[spec] = node
        return spec

    def _step_sampling(self, node: Node, role: str) -> Sampling:
        s = self.settings
        # the tracer asks the target's own steps' log-probabilities: their perplexity (Fig 9a)
        # positional (max_tokens, temperature, top_p, seed, stop, logprobs): one a step request
        return Sampling(s.draft_tokens if role == "draft" else s.target_tokens, s.temperature, 1.0,
                        a1_seed(self.seed, node.sample, node.turn, role), ("\n",),
                        self.target_all and role == "target")

    def _begin(self, node: Node) -> list:
        """The node's first request: the draft step, or the target's when no policy drafts."""
        if any(self.policies[i].needs_draft for i in node.policies):
            return [self._spec(node, "draft", "draft", [], 0, self._step_sampling(node, "draft"))]
        node.reject = node.policies
        return [self._spec(node, "target", "target", [], 0, self._step_sampling(node, "target"))]

    def _score(self, node: Node) -> RequestSpec:
        d = node.draft
        return self._spec(node, "score", "target", list(d.token_ids), d.tokens,
                          Sampling(max_tokens=1, prompt_logprobs=d.tokens))

    # -- the protocol -----------------------------------------------------------------------

    def start(self) -> list:
        """Every sample's first turn."""
        nodes = [Node(k, "", tuple(range(len(self.policies))))
                 for k in range(self.settings.samples)]
        self._open = len(nodes)
        self._started = True
        return self._gate([a for n in nodes for a in self._begin(n)])

    @property
    def done(self) -> bool:
        """Started, and nothing in flight or held."""
        return self._started and not self._flight and not self._held

    @property
    def sends_on_own_outcome(self) -> bool:
        """What the program sends when a request returns follows from that request's node and
        outcome alone, whatever returned before (asynchronous paths, no target cap): the
        simulator may send every program of a question from one record
        (`sim.workloads.request_templates`)."""
        return not self.settings.sync and not self.settings.target_cap

    def on_done(self, spec: RequestSpec, outcome: Outcome) -> list:
        """Advance the node the request belonged to; the requests to send next."""
        if spec.role == "target" and self.settings.target_cap:
            self._target_out -= 1
        return self._gate(self._advance_node(spec, outcome))

    def _gate(self, specs: list) -> list:
        """Hold target requests past the cap (`A1Settings.target_cap`) in the program, and let
        held ones go, oldest first, as the target's requests finish."""
        cap = self.settings.target_cap
        if not cap:
            return specs
        if self._capped is None:
            self._capped = deque()
        self._capped.extend(s for s in specs if s.role == "target")
        out = [s for s in specs if s.role != "target"]
        while self._capped and self._target_out < cap:
            out.append(self._capped.popleft())
            self._target_out += 1
        return out

    def _advance_node(self, spec: RequestSpec, outcome: Outcome) -> list:
        node = self._flight.pop(spec)
        if spec.kind == "score":
            step_tokens = spec.sampling.prompt_logprobs
            self.tokens_by_role["score"] += step_tokens
            node.record.update(score=outcome.score, score_request=spec.index,
                               score_prefill_tokens=step_tokens)
            return self._decide(node, outcome.score)
        self.tokens_by_role[spec.role] += outcome.tokens
        self.tokens += outcome.tokens
        answer, ended = step_end(outcome)
        node.record.update(zip(STEP_FIELDS[spec.kind], (outcome.tokens, outcome.text, spec.index,
                                                        answer, ended)))
        if spec.kind == "target":
            if spec.sampling.logprobs:
                node.record["target_score"] = outcome.score
            return self._advance(node, outcome, node.reject, "R")
        node.draft = outcome
        if outcome.tokens == 0:  # an empty step cannot be scored: the least conforming there is
            return self._decide(node, math.inf)
        if self.score_all or any(self.policies[i].needs_score for i in node.policies):
            return self._barrier(self._score(node))
        return self._decide(node, None)

    def _decide(self, node: Node, score: float | None) -> list:
        accept, reject = [], []
        for i in node.policies:
            d = self.policies[i].decide(self.question_id, score)
            self.decisions[i].append(d)
            (accept if d.accepted else reject).append(i)
        node.accept, node.reject = tuple(accept), tuple(reject)
        out = []
        if reject or self.target_all:
            out.append(self._spec(node, "target", "target", [], 0,
                                  self._step_sampling(node, "target")))
        else:
            self._emit(node)
        return out + (self._advance(node, node.draft, node.accept, "A") if accept else [])

    def _advance(self, node: Node, step: Outcome, policies: tuple, letter: str) -> list:
        """Close the node's turn for `policies` with `step` as their path's next step."""
        if letter == "R":
            self._emit(node)
        if not policies:
            return []
        child = Node(node.sample, node.path + letter, policies, node.tokens + step.tokens,
                     node.ids + list(step.token_ids), node.text + step.text)
        answer, ended = step_end(step)
        if ended or child.turn >= self.settings.turns:
            for i in policies:
                self.answers[i][node.sample] = answer
                self.final_paths[i][node.sample] = child.path
            return self._finish_turn(None)
        return self._finish_turn(child)

    def _emit(self, node: Node) -> None:
        """One conformity row per node whose turn is complete."""
        self.rows.add(node.sample, node.turn, node.path, self._names_of(node.policies),
                      self.prompt_tokens + node.tokens, self._names_of(node.accept),
                      *map(node.record.get, RECORD_FIELDS))

    def _names_of(self, policies: tuple[int, ...]) -> tuple[str, ...]:
        names = self._names.get(policies)
        if names is None:
            names = self._names[policies] = tuple(self.policies[i].name for i in policies)
        return names

    # -- the synchronous barrier ------------------------------------------------------------

    def _barrier(self, spec: RequestSpec) -> list:
        if not self.settings.sync:
            return [spec]
        self._held.append(spec)
        return self._release()

    def _finish_turn(self, child: Node | None) -> list:
        if not self.settings.sync:
            return self._begin(child) if child is not None else []
        self._open -= 1
        if child is not None:
            self._held.append(child)
        return self._release()

    def _release(self) -> list:
        """Sync: let the held work go once every open node of the turn has reached the barrier."""
        specs = [h for h in self._held if isinstance(h, RequestSpec)]
        if specs and len(specs) == self._open:      # every draft of the turn is back
            self._held = [h for h in self._held if not isinstance(h, RequestSpec)]
            return specs
        if self._open == 0:                          # every step of the turn is done
            nodes, self._held = self._held, []
            self._open = len(nodes)
            return [a for n in nodes for a in self._begin(n)]
        return []

    def node_rows(self, program_id: str, gold_answer: str, split: str = "evaluation",
                  **question) -> list[dict]:
        """The program's nodes as `conformity` rows (live replays; tracers add times)."""
        return [{**{k: v for k, v in r.items() if not k.endswith("_request")},
                 **self._node_fields(program_id, gold_answer, split, question),
                 "policies": list(r["policies"]), "accepted_by": list(r["accepted_by"])}
                for r in self.rows]

    def _node_fields(self, program_id: str, gold_answer: str, split: str,
                     question: dict) -> dict:
        """The program's own columns of each of its `conformity` rows."""
        return {"program_id": program_id, "question_id": self.question_id,
                "question_split": split, "gold_answer": gold_answer, **question}

    def node_of(self, spec: RequestSpec) -> tuple[int, str]:
        """(sample, decision string) of the node a request in flight belongs to."""
        node = self._flight[spec]
        return node.sample, node.path

    # -- the accounting `program_row` reads (policy 0: a workload runs one) ------------------

    @property
    def answer(self) -> str | None:
        """The majority answer of the paths (ties: the first path's among the tied)."""
        return majority_vote(self.answers[0])

    @property
    def paths_used(self) -> int:
        """Paths run."""
        return self.settings.samples

    @property
    def reasoning(self) -> int:
        """Step tokens generated (draft and target)."""
        return self.tokens

    probe_tokens = 0
    stop_at = None

    def interpret(self, spec: RequestSpec, raw: Outcome, answer_of) -> Outcome:
        """A live engine's outcome in the program's terms (scores from prompt log-probs)."""
        if spec.kind == "score":
            step = spec.sampling.prompt_logprobs
            if len(raw.prompt_logprobs) != step:
                raise RuntimeError(f"score request {spec.index}: {len(raw.prompt_logprobs)} "
                                   f"prompt log-probabilities for a {step}-token step")
            return Outcome(0, score=mean_nll(raw.prompt_logprobs))
        answer = answer_of(raw.text) if answer_of is not None else None
        score = None
        if spec.sampling.logprobs and raw.tokens:
            if len(raw.logprobs) != raw.tokens:
                raise RuntimeError(f"target step {spec.index}: {len(raw.logprobs)} "
                                   f"log-probabilities for {raw.tokens} tokens")
            score = mean_nll(raw.logprobs)  # the target's own step under the target
        return Outcome(raw.tokens, answer=answer, token_ids=raw.token_ids, text=raw.text,
                       eos=raw.eos, score=score)


def conformity_columns(programs: list[tuple[A1Program, str, str, dict]]) -> dict[str, list]:
    """The `conformity` table of many programs' nodes as columns, as their `node_rows` give it
    row by row (each entry: program, program id, gold answer, question columns; the simulator's
    table, read from the programs' columns rather than through a dictionary per row); each
    program's nodes by (sample, turn, path), whichever order its requests returned in."""
    own = [(prog.rows, prog._node_fields(program_id, gold_answer, "evaluation", question))
           for prog, program_id, gold_answer, question in programs]
    # programs of one question sent from one record share its rows: ordered once
    logs = {id(rows): rows for rows, _ in own if len(rows)}
    orders = {key: node_order(rows) for key, rows in logs.items()}
    own = [(rows, fields, orders[id(rows)]) for rows, fields in own if len(rows)]
    if not own:
        return {}
    keys = dict.fromkeys([k for k in ROW_FIELDS if not k.endswith("_request")] +
                         [k for _, fields, _ in own for k in fields])
    cols = {}
    for k in keys:  # a program's own column overrides a node's of the same name
        cols[k] = list(chain.from_iterable(
            repeat(fields[k], len(rows)) if k in fields
            else map(list, _ordered(rows.column(k), order)) if k in ("policies", "accepted_by")
            else _ordered(rows.column(k), order) if k in ROW_FIELDS
            else repeat(None, len(rows))
            for rows, fields, order in own))
    return cols


def node_order(rows: RowLog) -> list[int] | None:
    """The positions of a program's node rows by (sample, turn, path); None: already so."""
    keys = list(zip(rows.column("sample"), rows.column("turn"), rows.column("path")))
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return None if all(i == k for i, k in enumerate(order)) else order


def _ordered(column: list, order: list[int] | None) -> list:
    return column if order is None else [column[i] for i in order]
