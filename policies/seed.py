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
- **Multi-candidate drafts** (MCSD; SEED's tree drafts, `k_config`): a branching position
  has k candidates (greedy: the draft's top k; sampled: independent draws), each continued as
  its own path; the target verifies every path and `verify_tree` keeps the longest accepted
  one by SpecInfer's rule, still distributed as the target's sampling.
- **ToT BFS**: the `breadth` best states by value (ties: the earlier) go on to the next level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MODES = ("ar", "ar_batched", "sd", "seed", "seed_batched")
SPECULATIVE = {"sd", "seed", "seed_batched"}
"""the modes that draft and verify"""
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
    leaf: int = 0
    """multi-candidate drafts: the candidate path whose tokens were kept"""


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


def candidates(row: dict, own: int, k: int, temperature: float, uniforms: list) -> list[int]:
    """A branching draft position's `k` candidates, the draft's own token first: greedy, the
    draft's top k (ties: the lower id); sampled, k - 1 more independent draws from the draft's
    distribution (`uniforms`, k - 1 of them), as multi-candidate speculative sampling needs."""
    if temperature == 0.0:
        rest = sorted((t for t in row if t != own), key=lambda t: (-row[t], t))
        return [own] + rest[:k - 1]
    q = distribution(row, temperature)
    return [own] + [sample(q, u) for u in uniforms[:k - 1]]


@dataclass(frozen=True)
class Leaf:
    """One candidate path of a multi-candidate draft, with its rows."""

    choice: tuple[int, ...]
    """candidate index at each branching position"""
    tokens: tuple[int, ...]
    """the drafted path (branching positions, then the draft's continuation)"""
    draft_rows: tuple
    """the draft's raw log-probabilities at each position (unused when greedy)"""
    target_rows: tuple
    """the target's at each position and one after the last (its verification's rows)"""


def verify_tree(leaves: list[Leaf], temperature: float, uniforms: list, slots: int) -> Verdict:
    """Multi-candidate acceptance over candidate paths (SpecInfer's multi-step speculative
    sampling): at each position the candidates are tried in order, each accepted with
    probability min(1, p(c) / q(c)) where p becomes the normalised residual max(0, p - q) after
    every rejection; if none is kept, a token is drawn from what p has become; the output is
    distributed as the target's sampling. Greedy: the candidate that is the target's argmax.
    `uniforms` holds `slots` per position (slots - 1 tests, then the draw) and one after the
    last; with one path it decides as `verify`."""
    for leaf in leaves:
        if len(leaf.target_rows) != len(leaf.tokens) + 1:
            raise ValueError(f"verify_tree: {len(leaf.target_rows)} target rows for "
                             f"{len(leaf.tokens)} drafted tokens")
    under = list(range(len(leaves)))  # the paths through the node reached so far
    depth = 0
    while True:
        first = leaves[under[0]]
        kids: dict[int, list[int]] = {}  # candidate index -> its paths
        for i in under:
            if len(leaves[i].tokens) > depth:
                j = leaves[i].choice[depth] if depth < len(leaves[i].choice) else 0
                kids.setdefault(j, []).append(i)
        base = depth * slots
        if not kids:  # every drafted token kept: the target's next token
            last = first.target_rows[depth]
            token = argmax(last) if temperature == 0.0 else \
                sample(distribution(last, temperature), uniforms[base])
            return Verdict(depth, token, (True,) * depth, under[0])
        p_row = first.target_rows[depth]
        order = sorted(kids)
        if temperature == 0.0:
            best = argmax(p_row)
            nxt = next((kids[j] for j in order if leaves[kids[j][0]].tokens[depth] == best), None)
            if nxt is None:
                return Verdict(depth, best, _positions(depth, first), under[0])
            under, depth = nxt, depth + 1
            continue
        p = distribution(p_row, temperature)
        q = distribution(leaves[kids[order[0]][0]].draft_rows[depth], temperature)
        if len(order) > slots - 1:
            raise ValueError(f"verify_tree: {len(order)} candidates, {slots - 1} test slots")
        for n, j in enumerate(order):
            c = leaves[kids[j][0]].tokens[depth]
            if uniforms[base + n] * q.get(c, 0.0) < p.get(c, 0.0):  # u < p/q
                under = kids[j]
                break
            residual = {t: max(0.0, p.get(t, 0.0) - q.get(t, 0.0)) for t in p.keys() | q.keys()}
            total = sum(residual.values())
            if total > 0.0:  # else p == q up to rounding: the rejection had probability ~0
                p = {t: x / total for t, x in residual.items()}
        else:
            return Verdict(depth, sample(p, uniforms[base + slots - 1]),
                           _positions(depth, first), under[0])
        depth += 1


def _positions(accepted: int, leaf: Leaf) -> tuple[bool, ...]:
    return (True,) * accepted + (False,) * (len(leaf.tokens) - accepted)


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
    k_config: tuple[int, ...] = ()
    """multi-candidate drafts (MCSD; SEED's tree drafts): candidates per drafted position,
    e.g. (2, 1, 1, 1); () or all ones: one candidate"""
    eval_tokens: int = 1
    """tokens a value prompt writes (the state's answer; its value: the first's probability)"""
    speculative_eval: bool = False
    """SEED's State Evaluator under speculative execution: each value prompt's answer drafted
    and verified in rounds, scheduled as the mode schedules thoughts (speculative modes)"""

    def __post_init__(self):
        for k in ("breadth", "thoughts", "depth", "thought_tokens", "draft_tokens",
                  "eval_tokens"):
            if int(getattr(self, k)) < 1:
                raise ValueError(f"tot: {k} must be >= 1, got {getattr(self, k)!r}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"tot: temperature must be in [0, 2], got {self.temperature!r}")
        k_config = tuple(self.k_config)
        if len(k_config) > self.draft_tokens or \
                not all(isinstance(k, int) and 1 <= k <= 8 for k in k_config):
            raise ValueError(f"tot: k_config must be at most draft_tokens ({self.draft_tokens}) "
                             f"counts of 1 to 8 candidates, got {self.k_config!r}")
        # trailing ones: one candidate, as if absent
        object.__setattr__(self, "k_config", _up_to_last_branch(k_config))

    def branching(self, drafted: int) -> tuple[int, ...]:
        """Candidates per position of a round drafting `drafted` tokens, up to the last
        position that branches (() when none does)."""
        return _up_to_last_branch(self.k_config[:drafted])


def _up_to_last_branch(k_config: tuple[int, ...]) -> tuple[int, ...]:
    while k_config and k_config[-1] == 1:
        k_config = k_config[:-1]
    return k_config


@dataclass(frozen=True)
class SeedPolicy:
    """A mode of serving a ToT tree with its settings."""

    mode: str
    settings: ToTSettings

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"tot: mode {self.mode!r}; expected one of {MODES}")
        if self.settings.speculative_eval and not self.speculative:
            raise ValueError(f"tot: speculative_eval needs a speculative mode "
                             f"({sorted(SPECULATIVE)}); {self.mode} evaluates with the target")

    @property
    def speculative(self) -> bool:
        """Thoughts are drafted and verified (sd, seed, seed_batched)."""
        return self.mode in SPECULATIVE

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
        rounds' (sd, seed): the same for every speculative mode, whatever the schedule; with
        multi-candidate drafts, their own rounds (`sd-k2.1`: k_config (2, 1)); with
        speculative evaluations, `-se` after it."""
        if not self.speculative:
            return "ar"
        k = self.settings.k_config
        return "sd" + ("-k" + ".".join(map(str, k)) if k else "") + \
            ("-se" if self.settings.speculative_eval else "")

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
