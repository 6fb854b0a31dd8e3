"""In-engine speculative decoding on a simulated replica (vLLM `speculative_config`).

Each iteration of a decoding request verifies the K tokens the draft proposed after the last
one (K + 1 positions of the target, the draft's K forward passes in the same step) and keeps the
accepted prefix plus one token of the target's own: 1 + A tokens, A in 0..K. The step's time is
the spec calibration's (`calibrate --spec-k K` on spec-decoding steps); A is drawn per iteration
from an accepted-length distribution: measured on a trace's `spec_steps` (per K and sampling
temperature; each simulated request draws the distribution of one traced request, because
acceptance is a property of the text: on the testbed's random-token traffic a request's mean
ranges 0.26-1.91 of K = 4, and iid draws would shrink the spread of per-request TPOT) or given
as per-position acceptance rates, as vLLM's synthetic rejection sampler takes them (the
unconditional probability that position i is accepted, non-increasing; iid per step).

Cost grows with requests, not tokens: when a request starts decoding, its accepted lengths are
drawn in one vectorised call and kept as cumulative tokens per iteration, so the replica's
fast-forward still advances a whole run of iterations in one event.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class SpecDecoding:
    """K and the distribution of draft tokens accepted per verify iteration."""

    k: int
    """num_speculative_tokens"""
    accepted_share: tuple[float, ...]
    """P(A = a) for a = 0..K"""
    source: str = "rates"
    """where the distribution came from (a trace directory, or `rates`)"""
    per_request: tuple[tuple[float, ...], ...] = ()
    """accepted-length distributions of single traced requests, one drawn per simulated
    request (empty: every request draws from `accepted_share`)"""

    def __post_init__(self):
        p = np.asarray(self.accepted_share, float)
        if self.k < 1 or len(p) != self.k + 1 or np.any(p < 0) or abs(p.sum() - 1) > 1e-6:
            raise ValueError(f"speculative: accepted-length shares for K = {self.k} must be "
                             f"K + 1 probabilities summing to 1, got {list(self.accepted_share)}")

    @property
    def tokens_per_iteration(self) -> float:
        """Mean tokens a verify iteration yields (1 + mean accepted)."""
        return 1.0 + float(np.dot(np.arange(self.k + 1), self.accepted_share))

    def cumulative_tokens(self, rng: np.random.Generator, tokens: int) -> np.ndarray:
        """Tokens emitted after each of the iterations that decode `tokens` (the last capped:
        the engine stops at max_tokens)."""
        if tokens <= 0:
            return np.zeros(0, dtype=np.int64)
        p = self.per_request[int(rng.integers(len(self.per_request)))] if self.per_request \
            else self.accepted_share
        n = int(tokens / (1.0 + float(np.dot(np.arange(self.k + 1), p))) * 1.25) + 8
        cum = np.cumsum(1 + rng.choice(self.k + 1, size=n, p=p))
        while cum[-1] < tokens:  # rare: a long unlucky draw
            more = np.cumsum(1 + rng.choice(self.k + 1, size=n, p=p))
            cum = np.concatenate([cum, cum[-1] + more])
        end = int(np.searchsorted(cum, tokens)) + 1
        cum = cum[:end]
        cum[-1] = tokens
        return cum


def spec_tokens(r, j: int) -> int:
    """Tokens a speculative request gains in its next j verify iterations."""
    cum, it = r.spec_cum, r.spec_it
    return int(cum[it + j - 1]) - (int(cum[it - 1]) if it else 0)


def from_rates(rates: list[float]) -> SpecDecoding:
    """vLLM's synthetic acceptance: rates[i] = P(position i accepted), non-increasing."""
    r = [float(x) for x in rates]
    if not r or any(not 0.0 <= x <= 1.0 for x in r) or any(b > a for a, b in zip(r, r[1:])):
        raise ValueError(f"speculative: acceptance_rates must be non-increasing values in "
                         f"[0, 1], got {rates!r}")
    at_least = [1.0] + r + [0.0]  # P(A >= a)
    return SpecDecoding(len(r), tuple(at_least[a] - at_least[a + 1] for a in range(len(r) + 1)))


def from_trace(trace_dir: str | Path, k: int, temperature: float = 0.0) -> SpecDecoding:
    """The accepted-length distribution a trace measured for K and temperature: a spec trace's
    `spec_steps`, or a ToT trace's program-level verifications
    (`sim.engine.speculative.spec_rows`)."""
    from sim.engine.speculative import spec_rows

    spec = spec_rows(trace_dir)
    rows = spec[(spec.num_speculative_tokens == k) & ((spec.temperature - temperature).abs()
                                                      < 1e-9)]
    if rows.empty:
        have = sorted({(int(a), float(b)) for a, b in
                       zip(spec.num_speculative_tokens, spec.temperature)})
        raise ValueError(f"{trace_dir}: no verify steps for K = {k} at temperature "
                         f"{temperature:g}; it has (K, temperature) {have}")

    def share(a: np.ndarray) -> tuple[float, ...]:
        counts = np.bincount(a, minlength=k + 1)[:k + 1]
        return tuple(float(c) for c in counts / counts.sum())
    per_request = tuple(share(g.to_numpy()) for _, g in
                        rows.groupby("request_id", sort=True).accepted_tokens)
    return SpecDecoding(k, share(rows.accepted_tokens.to_numpy()), str(trace_dir), per_request)


def parse(d: dict, k: int, base_dir: Path) -> SpecDecoding:
    """A replica group's `speculative:` mapping, for a calibration fitted at K."""
    if ("acceptance_rates" in d) == ("acceptance_trace" in d):
        raise ValueError("speculative: give exactly one of acceptance_rates (per position, "
                         "as vLLM's synthetic sampler) or acceptance_trace (a trace with "
                         "spec_steps)")
    if "acceptance_rates" in d:
        spec = from_rates(d["acceptance_rates"])
        if spec.k != k:
            raise ValueError(f"speculative: {spec.k} acceptance rates for a calibration "
                             f"fitted at K = {k}")
        return spec
    path = Path(d["acceptance_trace"])
    return from_trace(path if path.is_absolute() else base_dir / path, k,
                      float(d.get("temperature", 0.0)))
