"""Tree-of-Thoughts BFS on one question, served as AR, serial SD or SEED, engine-free.

Level by level, each kept state gets `thoughts` next reasoning lines; each new state is
evaluated by the target with a value prompt (the testbed's probe suffix after the state: the
probability of its first greedy token is the state's value, its `eval_tokens` tokens the answer;
with `speculative_eval` drafted and verified in rounds, `programs.seed_eval`); the `breadth`
best states go on. A thought that ends the sequence (a boxed answer) ends its path as a candidate.
After `depth` levels the answer is the best candidate's, else the best state's probe answer.

A thought is written by the target (`ar*`: one request up to the thought cap, ending at a
newline) or in speculative rounds: the draft writes up to K tokens (role `draft`), the target
verifies them (role `target`: a prefill of the drafted tokens over the cached context with their
prompt log-probabilities, one token generated) and `policies.seed.verify` keeps a prefix plus
one token of the target's. The mode decides what may go at once (`policies.seed`): one thought
at a time or all, and the target's queue (one request at a time, first come first served:
SEED's Rounds-Scheduled strategy; or batched by the engine).

Every sampling seed and acceptance uniform derives from (program seed, thought, round), never
from timing, so the tree is a function of the outcomes and every speculative mode builds the
same tree. A thought's key is its indices from the root, '.'-joined ("0.2": the third thought
of the first thought's state); with the request kind and round it names every request.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from policies.certaindex import extract_boxed
from policies.seed import SeedPolicy, VerifyQueue, select, verify
from programs.base import Outcome, RequestSpec, Sampling
from programs.seed_branch import BranchRound, DraftPath, MultiCandidateRounds, content_link, \
    tot_seed
from programs.rowlog import RowLog
from programs.seed_eval import EVAL_KINDS, Evaluation, SpeculativeEvaluation
from traces import ids

ROW_FIELDS = {"node": "", "level": "q", "round": "q", "kind": "", "role": "", "request_index": "q",
              "prompt_tokens": "q", "output_tokens": "q", "text": "", "ended": "", "eos": "",
              "drafted_tokens": "", "accepted_tokens": "", "accepted_positions": "", "value": "",
              "answer": ""}
"""a `tot_requests` row as a program logs it: its fields and their `RowLog` codes (8-byte
integers where a value is always an integer; drafted and accepted tokens are None for the
kinds that do not draft or verify)"""


@dataclass(eq=False)
class State:
    """Question plus the thoughts on one path; value and answer once evaluated."""

    key: str
    level: int
    tokens: int = 0
    """tokens after the question"""
    ids: list = field(default_factory=list)
    text: str = ""
    links: tuple = ()
    """(content key, tokens after the question) at the end of every piece of text the path was
    written in: the prefix cache's identity of its content (`content_link`)"""
    value: float = -math.inf
    answer: str | None = None
    final: bool = False
    """the path ended (end of sequence or a boxed answer)"""


@dataclass(eq=False)
class Thought:
    """One thought being written from a state."""

    key: str
    index: int
    """position among its level's thoughts (the order selection breaks ties in)"""
    parent: State
    tokens: int = 0
    ids: list = field(default_factory=list)
    text: str = ""
    links: tuple = ()
    """the parent's links and one per piece written so far"""
    rounds: int = 0
    eos: bool = False
    drafted: Outcome | None = None
    branch: BranchRound | None = None
    """the round's draft tree (multi-candidate drafts)"""
    child: State | None = None
    eval: Evaluation | None = None
    """the child's evaluation in speculative rounds"""


class ToTProgram(MultiCandidateRounds, SpeculativeEvaluation):
    """ToT BFS under one mode, written once for the simulator and the live runner."""

    def __init__(self, question_id: str, policy: SeedPolicy, prompt_tokens: int, seed: int,
                 probe_tokens: int, *, prompt_ids: list | None = None,
                 probe_ids: list | None = None,
                 decode=None, newline_id: int | None = None, eos_id: int | None = None,
                 vocab: int = 0, close_id: int | None = None):
        self.question_id = question_id
        self.policy = policy
        self.settings = policy.settings
        self.prompt_tokens = prompt_tokens
        self.seed = seed
        self.probe_prompt_tokens = probe_tokens
        self.prompt_ids = prompt_ids
        self.probe_ids = probe_ids
        self.decode = decode
        """token ids -> text (live)"""
        self.newline_id = newline_id
        self.eos_id = eos_id
        """a thought ends at a newline or the end of sequence (live)"""
        self.close_id = close_id
        """a value prompt's answer ends at the close of its box (live)"""
        self.vocab = vocab
        """top-k that covers the vocabulary (live sampled acceptance)"""
        self.tokens = 0
        self.reasoning = 0
        self.probe_tokens_used = 0
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.rounds = 0
        self.evaluated = 0
        """states evaluated so far (a level ends at its last)"""
        self.rows = RowLog(ROW_FIELDS)
        """one per finished request: what it asked and returned (the `tot_requests` table)"""
        self.finals: list[State] = []
        self.best: State | None = None
        self._started = False
        self._question_key = hash(("question", question_id))
        """the question prompt's content key: programs on one question share its blocks"""
        self._index = 0
        self._flight: dict[RequestSpec, Thought] = {}
        self._queue = VerifyQueue(policy.target_limit)
        self._todo: list[Thought] = []
        self._active = 0
        self._level: list[Thought] = []
        self._left = 0

    # -- requests ---------------------------------------------------------------------------

    def _spec(self, t: Thought, kind: str, role: str, extra_ids: list, extra_tokens: int,
              sampling: Sampling, state: State | None = None, extra_text: str = "",
              extra_links: tuple = ()) -> RequestSpec:
        base = state if state is not None else t.parent
        own = [] if state is not None else t.ids
        own_tokens = 0 if state is not None else t.tokens
        token_ids = None
        if self.prompt_ids is not None:
            token_ids = list(self.prompt_ids) + base.ids + own + extra_ids
        prompt = self.prompt_tokens + base.tokens + own_tokens + extra_tokens
        p0 = self.prompt_tokens
        links = (base.links if state is not None else t.links) + extra_links
        chain = ((self._question_key, p0),) + tuple((k, p0 + end) for k, end in links)
        if extra_tokens and not extra_links:
            chain += (content_link(chain[-1][0], extra_text, prompt),)
        # positional (kind, index, prompt, sampling, path, position, prefix, chain, ids, role):
        # made for every request, where keywords cost twice as much
        spec = RequestSpec(kind, self._index, prompt, sampling, 0, base.tokens + own_tokens,
                           prompt - extra_tokens, chain, token_ids, role)
        self._index += 1
        self._flight[spec] = t
        return spec

    @property
    def target_queue(self) -> tuple[int, int] | None:
        """How a template records the program (`sim.workloads.request_templates`): the target
        queue's limit and the most requests that can wait in it at once (a level's thoughts:
        each has one request in flight or waiting); None where a round's candidates verify
        together (multi-candidate drafts): not recorded."""
        if self.settings.k_config:
            return None
        s = self.settings
        return self.policy.target_limit, \
            s.thoughts * s.breadth if self.policy.thought_limit > 1 else 1

    def queued(self, spec: RequestSpec) -> bool:
        """Whether the request waits in the target queue (the target's requests)."""
        return spec.role == "target"

    def unlimit_queue(self) -> None:
        """The target queue without its limit, every request sent as it is made: a recording
        (`sim.workloads.request_templates`) keeps what each request makes, and the template
        queues them as the program would."""
        self._queue = VerifyQueue(1 << 62)

    def _to_target(self, item) -> list:
        self._queue.push(item)  # a spec, or a round's verifications (one item: they go at once)
        return self._ready()

    def _ready(self) -> list:
        return [x for item in self._queue.ready()
                for x in (item if isinstance(item, tuple) else (item,))]

    def _first(self, t: Thought) -> list:
        s = self.settings
        if not self.policy.speculative:
            return self._to_target(self._spec(t, "ar", "target", [], 0, Sampling(
                max_tokens=s.thought_tokens, temperature=s.temperature,
                seed=tot_seed(self.seed, t.key, 0, "target"), stop=("\n",))))
        return [self._draft(t)]

    def _draft(self, t: Thought) -> RequestSpec:
        s = self.settings
        room = min(s.draft_tokens, s.thought_tokens - t.tokens)
        widths = s.branching(room)
        if widths:  # a multi-candidate round: its first token, to branch on
            t.branch = BranchRound(widths, room, {(): DraftPath(())}, drafting=1)
            return self._path_draft(t, ())
        return self._spec(t, "draft", "draft", [], 0, Sampling(
            max_tokens=min(s.draft_tokens, s.thought_tokens - t.tokens), temperature=s.temperature,
            seed=tot_seed(self.seed, t.key, t.rounds, "draft"), stop=("\n",),
            top_logprobs=self.vocab if s.temperature > 0 else 0))

    def _verify(self, t: Thought) -> RequestSpec:
        d = t.drafted
        s = self.settings
        return self._spec(t, "verify", "target", list(d.token_ids), d.tokens, Sampling(
            max_tokens=1, temperature=s.temperature, prompt_logprobs=d.tokens,
            seed=tot_seed(self.seed, t.key, t.rounds, "target"),
            top_logprobs=self.vocab if s.temperature > 0 else 1), extra_text=d.text)

    # -- the protocol -----------------------------------------------------------------------

    def start(self) -> list:
        """The first level's thoughts, as the mode lets them go."""
        self._started = True
        return self._begin_level([State("", 0)])

    @property
    def done(self) -> bool:
        """Started, and nothing in flight, queued or left to write."""
        return self._started and not self._flight and not self._left and \
            not self._queue.waiting

    def _begin_level(self, states: list[State]) -> list:
        n = self.settings.thoughts
        self._level = [Thought(f"{s.key}.{i}" if s.key else str(i), j * n + i, s,
                               links=s.links) for j, s in enumerate(states) for i in range(n)]
        self._todo = list(self._level)
        self._left = len(self._level)
        return self._pump()

    def _pump(self) -> list:
        out = []
        while self._todo and self._active < self.policy.thought_limit:
            self._active += 1
            out += self._first(self._todo.pop(0))
        return out

    def on_done(self, spec: RequestSpec, outcome: Outcome) -> list:
        """Advance the thought the request belonged to."""
        t = self._flight.pop(spec)
        if t.branch is not None and spec in t.branch.of:
            return self._on_branch(t, spec, outcome)
        self._log(spec, t, outcome)
        if spec.kind in EVAL_KINDS:
            return self._on_eval(t, spec, outcome)
        if spec.kind == "draft":
            t.drafted = outcome
            self.drafted_tokens += outcome.tokens
            return self._to_target(self._verify(t))
        self._queue.done()
        return self._ready() + self._extend(t, spec.kind, outcome)

    def _extend(self, t: Thought, kind: str, outcome: Outcome) -> list:
        """The thought grows by what a request kept; then its next round, or its evaluation."""
        t.tokens += outcome.tokens
        t.ids += list(outcome.token_ids)
        t.text += outcome.text
        t.links += (content_link(self._thought_key(t), outcome.text, t.parent.tokens + t.tokens),)
        t.eos = t.eos or outcome.eos
        t.rounds += 1
        self.reasoning += outcome.tokens
        self.tokens += outcome.tokens
        if kind == "verify":
            self.rounds += 1
            self.accepted_tokens += outcome.step[0]
            if not outcome.ended and t.tokens < self.settings.thought_tokens:
                return [self._draft(t)]
        p = t.parent
        final = t.eos or extract_boxed(t.text) is not None
        t.child = State(t.key, p.level + 1, p.tokens + t.tokens, p.ids + t.ids, p.text + t.text,
                        t.links, final=final)
        return self._evaluate_state(t)

    def _next_level(self) -> list:
        children = [t.child for t in self._level]
        self.finals += [c for c in children if c.final]
        open_ = [c for c in children if not c.final]
        keep = [open_[i] for i in select([c.value for c in open_], self.settings.breadth)]
        if keep:
            self.best = keep[max(range(len(keep)), key=lambda i: (keep[i].value, -i))]
        if not keep or keep[0].level >= self.settings.depth:
            self._level = []
            return []
        return self._begin_level(keep)

    def _log(self, spec: RequestSpec, t: Thought, o: Outcome) -> None:
        drafted = accepted = positions = None
        if spec.kind in ("verify", "eval-verify"):
            accepted, drafted, positions = o.step[0], o.step[1], tuple(o.step[2])
        elif spec.kind.startswith("draft") or spec.kind == "eval-draft":
            drafted = o.tokens
        self.rows.add(t.key, t.parent.level + 1, self._round(t, spec.kind), spec.kind, spec.role,
                      spec.index, spec.prompt_tokens, o.tokens, o.text, o.ended, o.eos, drafted,
                      accepted, positions, o.score, o.answer)

    def key_of(self, spec: RequestSpec) -> tuple[str, str, int]:
        """(thought key, request kind, round) of a request in flight: its identity in a trace."""
        t = self._flight[spec]
        return t.key, spec.kind, self._round(t, spec.kind)

    @staticmethod
    def _round(t: Thought, kind: str) -> int:
        """A request's round: its evaluation's for speculative evaluations, else its thought's."""
        return t.eval.rounds if kind in ("eval-draft", "eval-verify") else t.rounds

    # -- the accounting `program_row` reads ----------------------------------------------------

    @property
    def answer(self) -> str | None:
        """The best candidate's answer (value, ties: the earlier), else the best state's."""
        if self.finals:
            best = max(range(len(self.finals)), key=lambda i: (self.finals[i].value, -i))
            f = self.finals[best]
            return extract_boxed(f.text) or f.answer
        return self.best.answer if self.best is not None else None

    @property
    def paths_used(self) -> int:
        """States kept per level."""
        return self.settings.breadth

    @property
    def probe_tokens(self) -> int:
        """Tokens the value prompts generated."""
        return self.probe_tokens_used

    stop_at = None

    # -- live outcomes in the program's terms -------------------------------------------------

    def interpret(self, spec: RequestSpec, raw: Outcome, answer_of) -> Outcome:
        """A live engine's outcome in the program's terms (acceptance decided here)."""
        t = self._flight[spec]
        if t.branch is not None and spec in t.branch.of:
            return self._interpret_branch(t, spec, raw)
        if spec.kind in EVAL_KINDS:
            return self._interpret_eval(t, spec, raw)
        if spec.kind == "draft":
            return Outcome(raw.tokens, token_ids=raw.token_ids, text=raw.text, eos=raw.eos,
                           top_logprobs=raw.top_logprobs)
        if spec.kind == "ar":
            return Outcome(raw.tokens, token_ids=raw.token_ids, text=raw.text, ended=True,
                           eos=raw.eos)
        drafted = list(t.drafted.token_ids)
        k = len(drafted)
        if len(raw.top_logprobs) != k + 1:
            raise RuntimeError(f"verify request {spec.index}: {len(raw.top_logprobs)} rows for "
                               f"{k} drafted tokens")
        rng = random.Random(tot_seed(self.seed, t.key, t.rounds, "accept"))
        v = verify(drafted, t.drafted.top_logprobs, list(raw.top_logprobs),
                   self.settings.temperature, [rng.random() for _ in range(2 * k + 1)])
        return self._kept(t, drafted[:v.accepted] + [v.token], (v.accepted, k, v.positions))

    def _kept(self, t: Thought, new: list, step: tuple) -> Outcome:
        """What a round adds to the thought: `new` cut at its end (a newline) or cap."""
        return self._cut(new, self.settings.thought_tokens - t.tokens, self.newline_id, step)

    def _cut(self, new: list, room: int, end_id: int | None, step: tuple,
             score: float | None = None) -> Outcome:
        """A round's kept tokens up to the first `end_id` or end of sequence, at most `room`."""
        ends = (end_id, self.eos_id)
        stop = next((i + 1 for i, x in enumerate(new) if x in ends), len(new))
        new = new[:min(room, stop)]
        return Outcome(len(new), token_ids=tuple(new), text=self.decode(new),
                       ended=new[-1] in ends or len(new) >= room, eos=self.eos_id in new,
                       step=step, score=score)


def tot_program_seed(seed: int, question_id: str) -> int:
    """A ToT program's seed: the trace seed and its question (the same in sim and live)."""
    return seed * 1_000_003 + ids.question_index(question_id)
