"""Chain of thought with probes (`cot`) and self-consistency (`sc`) on one question (Dynasor).

A path decodes in chunks of `stride_tokens`, each chunk a request whose prompt is the question
plus the path so far (prefix-cached). `cot` runs one path; after every `interval` tokens of it a
probe request (path + probe suffix) asks for the answer so far, and the allocation policy
(`ProbeConsistency`, `TokenBudget`, `FullReasoning`) may stop the path: its chunk and probes in
flight are aborted. `sc` launches paths in rounds (`SelfConsistency`) and votes. The same object
runs in the simulator (outcomes from a probes trace) and live (outcomes from the engine's text,
`interpret`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from policies.allocation import SelfConsistency, TokenBudget
from policies.certaindex import Probe, ProbeConsistency, probe_from_text
from policies.search import majority_vote
from programs.base import Abort, Outcome, RequestSpec, Sampling
from traces.seeds import chunk_seed

_new = tuple.__new__
_DEFAULTS = tuple(Sampling._field_defaults[f] for f in Sampling._fields[4:])
"""`Sampling`'s fields after the seed, as its defaults"""


@dataclass(frozen=True)
class ReasoningSetup:
    """How paths generate: the probes trace's settings, shared by every program of a workload."""

    stride_tokens: int
    """reasoning tokens per chunk request"""
    budget_tokens: int
    """a path's token budget (it ends there if not before)"""
    suffix_tokens: int
    """tokens the probe suffix adds to a probe's prompt"""
    temperature: float = 0.7
    probe_tokens: int = 20
    probe_temperature: float = 0.6
    probe_top_p: float = 0.95
    suffix_ids: tuple | None = None
    """probe suffix token ids (live)"""


@dataclass(eq=False, slots=True)
class Path:
    """One reasoning path: a traced sample decoded chunk by chunk."""

    index: int
    """its place among the program's paths"""
    sample: int
    """traced sample id it replays"""
    seed: int
    limit: int
    """reasoning tokens at which it stops for good (path budget, policy budget)"""
    probe_every: int
    pos: int = 0
    chunks: int = 0
    ids: list | None = None
    text: str = ""
    probes: list = field(default_factory=list)        # probe answers seen, in position order
    next_probe: list = field(default_factory=list)    # positions of probes in flight, in order
    returned: dict = field(default_factory=dict)      # position -> probe returned out of order
    in_flight: dict = field(default_factory=dict)     # spec -> None (insertion-ordered set)
    ended: bool = False
    answer: str | None = None


class ReasoningProgram:
    """A cot or sc program on one question, written once for the simulator and the live runner."""

    __slots__ = ("method", "policy", "setup", "prompt_tokens", "prompt_ids", "samples", "seeds",
                 "paths", "requests", "round_left", "tokens", "reasoning", "probe_tokens",
                 "stop_at", "answer", "done")

    def __init__(self, method: str, policy, setup: ReasoningSetup, prompt_tokens: int,
                 samples: tuple[int, ...], seeds: tuple[int, ...] | None = None,
                 prompt_ids: list | None = None):
        if method not in ("cot", "sc"):
            raise ValueError(f"a reasoning program is cot or sc, not {method!r}")
        self.method = method
        self.policy = policy
        self.setup = setup
        self.prompt_tokens = prompt_tokens
        self.prompt_ids = prompt_ids
        self.samples = samples
        self.seeds = seeds or (0,) * len(samples)
        self.paths: list[Path] = []
        self.requests = 0
        self.round_left = 0
        self.tokens = self.reasoning = self.probe_tokens = 0
        self.stop_at: int | None = None
        self.answer: str | None = None
        self.done = False

    @property
    def paths_used(self) -> int:
        """Reasoning paths launched."""
        return len(self.paths)

    def remaining_tokens(self) -> int:
        """The program's own estimate of the reasoning tokens it may still generate (Dynasor's
        approximate SJF: its chunk length times the chunks its knob leaves): each open path's
        tokens to its limit, and each path not launched yet at the mean length of its own ended
        paths (at the budget before any has ended)."""
        left = sum(p.limit - p.pos for p in self.paths if not p.ended)
        if isinstance(self.policy, SelfConsistency):
            ended = [p.pos for p in self.paths if p.ended]
            per_path = sum(ended) // len(ended) if ended else self.setup.budget_tokens
            left += (self.policy.samples - len(self.paths)) * per_path
        return max(left, 0)

    def paths_in_rounds(self) -> bool:
        """What the program sends when a request returns follows from that request's path and
        outcome alone, but for a path's last request, whose round's next paths go out once
        every path of the round has ended (no probe mid-path, so nothing is aborted): the
        simulator may send every program of a question from one record
        (`sim.workloads.request_templates`)."""
        return not isinstance(self.policy, ProbeConsistency)

    def stops_on_probes(self) -> bool:
        """A CoT path whose probes mid-path may stop it: what it sends follows its own
        outcomes, where it stops does too, but which comes first (the stop, or its path's end)
        and what its aborted requests generated follow the timing
        (`sim.workloads.stop_templates`)."""
        return self.method == "cot" and isinstance(self.policy, ProbeConsistency)

    def path_ended(self, path: int) -> bool:
        """Whether path `path` has ended."""
        return self.paths[path].ended

    # ------------------------------------------------------------------ protocol
    def start(self) -> list:
        """Launch the first path(s)."""
        sc = isinstance(self.policy, SelfConsistency)
        return self._launch(self.policy.first_round() if sc else 1)

    def on_done(self, spec: RequestSpec, outcome: Outcome) -> list:
        """A request finished or was aborted: account for it, then decide what comes next."""
        path = self.paths[spec.path]
        path.in_flight.pop(spec, None)
        self.tokens += outcome.tokens
        if spec.kind == "probe":
            self.probe_tokens += outcome.tokens
        else:
            self.reasoning += outcome.tokens
        if path.ended or outcome.aborted:
            return []
        if spec.kind == "chunk":
            path.pos += outcome.tokens
            path.chunks += 1
            if outcome.text:
                path.text += outcome.text
            if path.ids is not None:
                path.ids += outcome.token_ids
            if outcome.ended:
                return self._end_path(path, outcome.answer)
            if path.pos >= path.limit:
                return [self._probe(path)]  # the budget's answer probe
            if path.probe_every and path.pos % path.probe_every == 0:
                return [self._probe(path), self._chunk(path)]
            return [self._chunk(path)]
        if not path.probe_every:  # the budget's answer probe
            return self._end_path(path, outcome.answer or None)
        path.returned[spec.position] = Probe(spec.position, outcome.answer or "",
                                             outcome.hesitant)
        while path.next_probe and path.next_probe[0] in path.returned:
            p = path.returned.pop(path.next_probe.pop(0))
            path.probes.append(p)
            if self.policy.should_stop(path.probes):
                self.stop_at = p.position_tokens
                return self._end_path(path, p.answer)
        return []

    def interpret(self, spec: RequestSpec, raw: Outcome, answer_of: Callable) -> Outcome:
        """A live outcome in the program's terms: path end and answers read from the text."""
        if raw.aborted:
            return raw
        if spec.kind == "probe":
            probe = probe_from_text(spec.position, raw.text)
            return Outcome(raw.tokens, answer=probe.answer, hesitant=probe.hesitant,
                           text=raw.text)
        path = self.paths[spec.path]
        ended = raw.eos or spec.position + raw.tokens >= self.setup.budget_tokens
        ids = raw.token_ids[:-1] if raw.eos else raw.token_ids  # EOS is not re-sent
        return Outcome(raw.tokens, ended=ended, token_ids=ids, text=raw.text,
                       answer=answer_of(path.text + raw.text) if ended else None)

    # ------------------------------------------------------------------ requests
    def _launch(self, n: int) -> list:
        self.round_left = n
        out = []
        for _ in range(n):
            i = len(self.paths)
            limit = self.setup.budget_tokens
            if isinstance(self.policy, TokenBudget):
                limit = min(limit, self.policy.budget_tokens)
            every = self.policy.every_tokens if isinstance(self.policy, ProbeConsistency) else 0
            path = Path(i, self.samples[i], self.seeds[i], limit, every,
                        ids=[] if self.prompt_ids is not None else None)
            self.paths.append(path)
            out.append(self._chunk(path))
        return out

    def _spec(self, path: Path, kind: str, prompt_tokens: int, prefix_tokens: int,
              sampling: Sampling, prompt_ids) -> RequestSpec:
        # positional (kind, index, prompt, sampling, path, position, prefix, chain, ids, role,
        # table role): made for every request
        spec = RequestSpec(kind, self.requests, prompt_tokens, sampling, path.index, path.pos,
                           prefix_tokens, (), prompt_ids, "target",
                           "probe" if kind == "probe" else "main")
        self.requests += 1
        path.in_flight[spec] = None
        return spec

    def _chunk(self, path: Path) -> RequestSpec:
        s = self.setup
        n = min(s.stride_tokens, path.limit - path.pos)
        ids = None if path.ids is None or self.prompt_ids is None else self.prompt_ids + path.ids
        prompt = self.prompt_tokens + path.pos
        # Sampling(n, temperature, 1.0, seed) made as a tuple: this runs for most requests
        spec = self._spec(path, "chunk", prompt, prompt, _new(Sampling, (
            n, s.temperature, 1.0, chunk_seed(path.seed, path.chunks)) + _DEFAULTS), ids)
        spec.continues = True  # the path's next chunk and probes send its tokens back
        return spec

    def _probe(self, path: Path) -> RequestSpec:
        s = self.setup
        path.next_probe.append(path.pos)
        ids = None if path.ids is None or self.prompt_ids is None else \
            self.prompt_ids + path.ids + list(s.suffix_ids or ())
        prefix = self.prompt_tokens + path.pos
        return self._spec(path, "probe", prefix + s.suffix_tokens, prefix,
                          Sampling(s.probe_tokens, s.probe_temperature, s.probe_top_p,
                                   chunk_seed(path.seed, -1 - path.chunks)), ids)

    def _end_path(self, path: Path, answer: str | None) -> list:
        path.ended = True
        path.answer = answer
        out: list = [Abort(spec) for spec in path.in_flight]  # its chunk and probes in flight
        path.in_flight.clear()
        self.round_left -= 1
        if self.round_left > 0:
            return out
        if isinstance(self.policy, SelfConsistency):
            answers = [p.answer for p in self.paths]
            more = self.policy.next_round(answers, [p.pos for p in self.paths])
            if more > 0:
                return out + self._launch(more)
            self.answer = majority_vote(answers)
        else:
            self.answer = answer
        self.done = True
        return out
