"""SEED decisions (pure): speculative acceptance, the verify queue, and Tree-of-Thoughts choices.

- **Acceptance** (Leviathan et al.; Chen et al.): the target keeps drafted token d_i with
  probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection it samples the normalised
  residual max(0, p_i - q_i); after K acceptances it samples p_{K+1}. The output is then
  distributed exactly as the target's own sampling. Greedy (temperature 0): d_i is kept iff it
  is the target's argmax, so the output equals the target's greedy output token for token.
  Distributions come in as raw log-probabilities (token -> log p, the engine's top-k over the
  whole vocabulary) and the uniforms as arguments: a decision is a function of its inputs.
- **Modes** (how a tree's work reaches the models): `ar` (the target writes each thought, one
  at a time), `ar_batched` (all of a level's thoughts at once), `sd` (serial speculative
  decoding: one thought at a time, draft then verify), `seed` (every thought drafts in parallel
  and the target verifies one drafted sequence at a time, first come first served: SEED's
  Rounds-Scheduled strategy), `seed_batched` (drafts in parallel, verifications batched).
- **ToT BFS**: the `breadth` best states by value (ties: the earlier) go on to the next level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MODES = ("ar", "ar_batched", "sd", "seed", "seed_batched")
_SPECULATIVE = {"sd", "seed", "seed_batched"}
_PARALLEL_THOUGHTS = {"ar_batched", "seed", "seed_batched"}
_BATCHED_TARGET = {"ar_batched", "seed_batched"}


def distribution(logprobs: dict, temperature: float) -> dict:
    """Sampling probabilities at `temperature` (> 0) from raw log-probabilities."""
    top = max(logprobs.values())
    w = {t: math.exp((lp - top) / temperature) for t, lp in logprobs.items()}
    total = sum(w.values())
    return {t: x / total for t, x in w.items()}


def argmax(logprobs: dict) -> int:
    """The most likely token (ties: the lowest id)."""
    return min(logprobs, key=lambda t: (-logprobs[t], t))


def sample(probs: dict, u: float) -> int:
    """The token a uniform `u` in [0, 1) picks (inverse CDF over token ids in order)."""
    acc = 0.0
    last = None
    for t in sorted(probs):
        if probs[t] <= 0.0:
            continue
        acc += probs[t]
        last = t
        if u < acc:
            return t
    if last is None:
        raise ValueError("sampling from an empty distribution")
    return last  # u above the rounded total


@dataclass(frozen=True)
class Verdict:
    """What one verification keeps: the first `accepted` drafted tokens, then `token`."""

    accepted: int
    token: int
    positions: tuple[bool, ...]
    """per drafted position: accepted (False from the first rejection on)"""


def verify(drafted: list, draft_rows: list, target_rows: list, temperature: float,
           uniforms: list) -> Verdict:
    """Speculative acceptance of `drafted` against the target's rows (one per drafted position
    plus one after the last); `draft_rows` are the draft's rows (unused when greedy);
    `uniforms` holds 2 per position plus one (acceptance test, then residual draw)."""
    k = len(drafted)
    if len(target_rows) != k + 1:
        raise ValueError(f"verify: {len(target_rows)} target rows for {k} drafted tokens")
    for i, d in enumerate(drafted):
        if temperature == 0.0:
            best = argmax(target_rows[i])
            if d != best:
                return Verdict(i, best, (True,) * i + (False,) * (k - i))
            continue
        p = distribution(target_rows[i], temperature)
        q = distribution(draft_rows[i], temperature)
        if uniforms[2 * i] * q.get(d, 0.0) < p.get(d, 0.0):  # u < p/q without dividing by 0
            continue
        residual = {t: max(0.0, p.get(t, 0.0) - q.get(t, 0.0)) for t in p.keys() | q.keys()}
        total = sum(residual.values())
        if total <= 0.0:  # p == q up to rounding: the rejection had probability ~0; keep p
            residual = p
        else:
            residual = {t: x / total for t, x in residual.items()}
        return Verdict(i, sample(residual, uniforms[2 * i + 1]),
                       (True,) * i + (False,) * (k - i))
    last = target_rows[k]
    token = argmax(last) if temperature == 0.0 else \
        sample(distribution(last, temperature), uniforms[2 * k])
    return Verdict(k, token, (True,) * k)


@dataclass(frozen=True)
class ToTSettings:
    """Tree-of-Thoughts BFS on one question, and how thoughts are decoded."""

    breadth: int = 2
    """states kept per level (b)"""
    thoughts: int = 3
    """thoughts generated per state (n)"""
    depth: int = 4
    """levels (T)"""
    thought_tokens: int = 24
    """cap on one thought (a reasoning line)"""
    temperature: float = 0.0
    """thought sampling temperature (0: greedy; acceptance then keeps the target's argmax)"""
    draft_tokens: int = 4
    """K: tokens drafted per speculative round"""

    def __post_init__(self):
        for k in ("breadth", "thoughts", "depth", "thought_tokens", "draft_tokens"):
            if int(getattr(self, k)) < 1:
                raise ValueError(f"tot: {k} must be >= 1, got {getattr(self, k)!r}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"tot: temperature must be in [0, 2], got {self.temperature!r}")


@dataclass(frozen=True)
class SeedPolicy:
    """A mode of serving a ToT tree with its settings."""

    mode: str
    settings: ToTSettings

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"tot: mode {self.mode!r}; expected one of {MODES}")

    @property
    def speculative(self) -> bool:
        """Thoughts are drafted and verified (sd, seed, seed_batched)."""
        return self.mode in _SPECULATIVE

    @property
    def thought_limit(self) -> int:
        """Thoughts in progress at once (serial modes: one, thought and evaluation)."""
        return 1 << 30 if self.mode in _PARALLEL_THOUGHTS else 1

    @property
    def target_limit(self) -> int:
        """Target requests (verifications, evaluations, AR thoughts) in flight at once."""
        return 1 << 30 if self.mode in _BATCHED_TARGET else 1

    @property
    def tree(self) -> str:
        """Whose outputs build the tree: the target's own sampling (ar) or the speculative
        rounds' (sd, seed): the same for every speculative mode, whatever the schedule."""
        return "sd" if self.speculative else "ar"

    @property
    def samples(self) -> int:
        """Paths a program runs (program-row accounting): the states kept per level."""
        return self.settings.breadth


def select(values: list, breadth: int) -> list[int]:
    """Indices of the `breadth` best states by value (ties: the earlier), in index order."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    return sorted(order[:breadth])


class VerifyQueue:
    """Target work waiting for the target, served first come first served up to a limit."""

    def __init__(self, limit: int):
        self.limit = limit
        self.waiting: list = []
        self.in_flight = 0

    def push(self, item) -> None:
        """Queue one item (arrival order is the service order)."""
        self.waiting.append(item)

    def ready(self) -> list:
        """Items that may go now (taken off the queue, counted in flight)."""
        n = max(0, min(len(self.waiting), self.limit - self.in_flight))
        out, self.waiting = self.waiting[:n], self.waiting[n:]
        self.in_flight += n
        return out

    def done(self) -> None:
        """One item in flight came back."""
        self.in_flight -= 1


def make_seed_policy(kind: str, **args) -> SeedPolicy:
    """A ToT policy from its config mapping (`type` = mode; the rest ToTSettings)."""
    unknown = set(args) - set(ToTSettings.__dataclass_fields__)
    if unknown:
        raise ValueError(f"tot policy: unknown key {sorted(unknown)[0]!r}; allowed: "
                         f"{sorted(ToTSettings.__dataclass_fields__)}")
    return SeedPolicy(kind, ToTSettings(**args))
