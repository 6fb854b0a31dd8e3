"""The protocol between a program and whoever drives it: request specs, outcomes, aborts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol


class Sampling(NamedTuple):
    """How a request samples (a live engine maps it to its own parameters). A named tuple: a
    value made for every request, at a quarter of a frozen dataclass's cost."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    """stop strings (kept in the output)"""
    logprobs: bool = False
    """return each sampled token's log-probability"""
    prompt_logprobs: int = 0
    """return the log-probabilities of the prompt's last this many tokens (a scored tail)"""
    top_logprobs: int = 0
    """with it, every generated and scored position's top this many log-probabilities (whole
    distributions when it is the vocabulary size: speculative acceptance)"""


@dataclass(eq=False, slots=True)
class RequestSpec:
    """One request a program wants sent. Identity is the object: drivers key their maps by it."""

    kind: str
    """what it is to the program: chunk, probe (CoT/SC), step or rollout (search)"""
    index: int
    """request order within the program"""
    prompt_tokens: int
    """prompt length"""
    sampling: Sampling
    path: int = 0
    """the program's path (or node parent) it extends"""
    position: int = 0
    """reasoning tokens of the path before this request"""
    prefix_tokens: int = 0
    """leading prompt tokens shared with the path's earlier requests (prefix caching)"""
    prefix_chain: tuple = ()
    """the prompt's content as nested prefixes, ((content key, end tokens), ...) with ascending
    ends (`sim.engine.prefix_cache`): branches that wrote the same text share cached blocks;
    empty: one prefix of `prefix_tokens` per path"""
    prompt_ids: list | None = None
    """prompt token ids (live); None when the driver needs only lengths (simulator)"""
    role: str = "target"
    """model role or pool the request goes to"""
    table_role: str = "main"
    """`role` column of the requests table: main or probe"""
    sent: tuple | None = None
    """the simulator's driver's handle while the request is in flight, for an abort: where a
    map from spec to handle would cost a lookup per request"""
    continues: bool = False
    """its output continues its prompt's content: the path's next request sends this prompt
    and these tokens back (a reasoning chunk), so the engine's cached blocks of its output
    serve that one (vLLM caches every full block a request computed, its output's too)"""


class Outcome(NamedTuple):
    """What a finished (or aborted) request returned, in the program's terms. A named tuple: a
    value oracles and engines make for every request, at a quarter of a frozen dataclass's cost
    (whose constructor sets each of its sixteen fields through `object.__setattr__`)."""

    tokens: int
    """output tokens generated"""
    aborted: bool = False
    ended: bool = False
    """the reasoning path reached its end (end of sequence or the token budget)"""
    answer: str | None = None
    """the answer the output gives, if any (final answer, probe answer)"""
    hesitant: bool = False
    """a probe's text hesitated"""
    reward: float = 0.0
    """the path's reward (search programs: its likelihood under the model)"""
    step: tuple | None = None
    """the part of the output that becomes a search node (ids, text, log-prob sum, tokens,
    terminal); None: the whole output (the simulator). A speculative verification's: (drafted
    tokens accepted, tokens drafted, per-position acceptance)"""
    token_ids: tuple = ()
    """output token ids (live; empty in the simulator)"""
    text: str = ""
    """output text (live)"""
    logprobs: tuple = ()
    """per-token log-probabilities (live, when asked)"""
    pieces: tuple = ()
    """per-token text (live, when log-probabilities were asked)"""
    eos: bool = False
    """ended with the end-of-sequence token (not a stop string or the length limit)"""
    prompt_logprobs: tuple = ()
    """log-probabilities of the prompt's scored tail (live, when asked)"""
    score: float | None = None
    """a scoring request's score in the program's terms (A1: the step's mean NLL)"""
    top_logprobs: tuple = ()
    """per scored prompt position, then per generated token: {token id: log-probability}
    (live, when `Sampling.top_logprobs` asked)"""
    cached_tokens: int = 0
    """prompt tokens the engine's prefix cache served (live)"""


@dataclass(frozen=True)
class Abort:
    """Abort a request of the program that is still in flight."""

    spec: RequestSpec


class Program(Protocol):
    """A reasoning program: the driver calls start once, then on_done per finished request."""

    done: bool

    def start(self) -> list: ...

    def on_done(self, spec: RequestSpec, outcome: Outcome) -> list: ...
