"""Workloads: the request arrivals and lengths that the simulator and a live replay both consume.

A workload is built from the `workload:` mapping of a YAML config, in one of two forms:

- synthetic: an arrival process (poisson, gamma, constant) and length distributions, drawn from a
  per-run generator seeded by `seed`;
- replay of a trace file (reasonsim `requests` table, Azure, Mooncake, BurstGPT, Vidur CSV), with
  arrival times taken from the file and shifted so the first is 0.

Every config key is checked: an unknown key or an impossible value raises `ValueError` naming it;
a trace row that cannot be read raises naming the file and the row. Rows are never dropped or
clipped silently (the one filter, BurstGPT's failed requests, is the explicit `drop_failed`).

Only numpy is imported at module load: pandas and the trace store are imported by the trace
readers, so the synthetic path stays light. Never imports an engine (torch, vllm) or simpy.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np

from inputs.limits import MAX_REQUESTS
from sim.workloads.base import Workload
from sim.workloads.schema import (PROMPT_TEXTS, TRACE_FORMATS, Choice, Constant, Gamma, Length,
                                  Lognormal, Poisson, Prefix, Replayed, Synthetic, Uniform,
                                  workload_spec)
from sim.workloads.traces import replay

__all__ = ["PROMPT_TEXTS", "TRACE_FORMATS", "Workload", "workload_from_config",
           "workload_to_vidur_csv"]

# One independent child stream per quantity: changing, say, the arrival kind or the request count
# leaves the drawn prompt lengths untouched, so sweeps over one knob compare like with like.
_STREAMS = ("arrival", "prompt_tokens", "output_tokens", "prefix")


# ---------------------------------------------------------------- synthetic workloads

Sampler = Callable[[np.random.Generator, int], np.ndarray]


def _length_sampler(spec: Length, where: str) -> Sampler:
    """The sampler of a checked length spec (a whole number, uniform, lognormal, choice)."""
    if isinstance(spec, int):
        return lambda rng, n: np.full(n, spec, dtype=np.int64)
    if isinstance(spec, Uniform):
        # Both bounds included: {low: 1, high: 1} is the fixed length 1.
        return lambda rng, n: rng.integers(spec.low, spec.high, size=n, endpoint=True,
                                           dtype=np.int64)
    if isinstance(spec, Lognormal):
        return _lognormal(spec, where)
    assert isinstance(spec, Choice)
    choices = np.array(spec.values, dtype=np.int64)
    probs = None if spec.weights is None else np.array(spec.weights) / sum(spec.weights)
    return lambda rng, n: rng.choice(choices, size=n, p=probs)


def _lognormal(spec: Lognormal, where: str) -> Sampler:
    mean, sigma, cap = spec.mean, spec.sigma, spec.max
    # `mean` is the mean of the token counts: E[exp(N(mu, s^2))] = exp(mu + s^2/2).
    mu = math.log(mean) - sigma ** 2 / 2

    def lognormal(rng: np.random.Generator, n: int) -> np.ndarray:
        # Rounded to whole tokens, at least 1 and at most `max`: part of the distribution's
        # definition (a length of 0 or above the model's window cannot be served).
        tokens = np.maximum(1, np.rint(rng.lognormal(mu, sigma, size=n)))
        if cap is not None:
            tokens = np.minimum(tokens, cap)
        floor = float(np.mean(tokens == 1)) if n else 0.0
        if n >= 20 and mean >= 4 and floor > 0.5:  # the clip, not the distribution
            raise ValueError(f"{where}: sigma {sigma} with mean {mean} puts {floor:.0%} of "
                             "lengths at the 1-token floor; the workload would not have the "
                             "mean asked for (lower sigma)")
        return tokens.astype(np.int64)

    return lognormal


def _gap_sampler(spec: Poisson | Gamma | Constant) -> Sampler:
    """The inter-arrival gap sampler of a checked `workload.arrival`."""
    rate = spec.rate_per_s
    if isinstance(spec, Poisson):
        return lambda rng, n: rng.exponential(1.0 / rate, size=n)
    if isinstance(spec, Gamma):
        # Gamma(shape k, scale t) has mean k*t and cv 1/sqrt(k): k = 1/cv^2, t = 1/(rate*k).
        shape = 1.0 / spec.cv ** 2
        scale = 1.0 / (rate * shape)
        return lambda rng, n: rng.gamma(shape, scale, size=n)
    return lambda rng, n: np.full(n, 1.0 / rate)


def _synthetic_arrivals(spec: Synthetic, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a synthetic workload: `num_requests` of them, or all before `duration_s`."""
    rate, gaps = spec.arrival.rate_per_s, _gap_sampler(spec.arrival)
    constant = isinstance(spec.arrival, Constant)
    if spec.num_requests is not None:
        n = spec.num_requests
        return np.arange(n) / rate if constant else np.cumsum(gaps(rng, n))
    duration = spec.duration_s
    if duration * rate > MAX_REQUESTS:  # checked before anything is drawn or allocated
        raise ValueError(f"workload.duration_s={duration} at rate_per_s={rate} expects "
                         f"{duration * rate:.3g} requests, over the cap of {MAX_REQUESTS:,}; "
                         "shorten the duration or lower the rate")
    if constant:
        arrivals = np.arange(math.ceil(duration * rate) + 1) / rate
    else:
        arrivals = _arrivals_before(duration, rate, gaps, rng)
    # Arrivals fall in [0, duration_s): one exactly at duration_s belongs to the next window.
    arrivals = arrivals[arrivals < duration]
    if not len(arrivals):
        raise ValueError(f"workload.duration_s={duration} at rate_per_s={rate} produces no "
                         "request; lengthen the duration or raise the rate")
    return arrivals


def _arrivals_before(duration: float, rate: float, gaps: Sampler,
                     rng: np.random.Generator) -> np.ndarray:
    """Arrivals of a random process until the clock passes `duration`, drawn in chunks that
    cover the expected count plus slack (one draw nearly always suffices)."""
    chunk = int(duration * rate * 1.2) + 64
    parts, clock, drawn = [], 0.0, 0
    while clock < duration:
        part = clock + np.cumsum(gaps(rng, chunk))
        # Only arrivals before the duration are kept: a bursty process (large cv) may need
        # many draws, but memory holds just those.
        parts.append(part[part < duration])
        drawn += int((part < duration).sum())
        if drawn > MAX_REQUESTS:
            raise ValueError(f"workload.duration_s={duration} at rate_per_s={rate} generates "
                             f"more than {MAX_REQUESTS:,} requests; shorten the duration or "
                             "lower the rate")
        clock = part[-1]
    return np.concatenate(parts)


def _synthetic(spec: Synthetic, seed: int) -> Workload:
    """A synthetic workload: arrival process and length distributions drawn from `seed`."""
    prompt = _length_sampler(spec.prompt_tokens, "workload.prompt_tokens")
    output = _length_sampler(spec.output_tokens, "workload.output_tokens")
    rngs = _rngs(seed)
    # Poisson and gamma: the first request arrives after one gap (the process starts at 0 with
    # no request); constant: the first request arrives at exactly 0.
    arrivals = _synthetic_arrivals(spec, rngs["arrival"])
    n = len(arrivals)
    return Workload(arrivals, prompt(rngs["prompt_tokens"], n), output(rngs["output_tokens"], n))


def _rngs(seed: int) -> dict[str, np.random.Generator]:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected a whole number >= 0, got {seed!r}")
    children = np.random.SeedSequence(seed).spawn(len(_STREAMS))
    return {name: np.random.default_rng(child) for name, child in zip(_STREAMS, children)}


def _with_random_prefix(w: Workload, spec: Prefix, seed: int) -> Workload:
    """Assign each request a prefix group uniformly among `groups`, sharing `tokens` tokens."""
    group = _rngs(seed)["prefix"].integers(0, spec.groups, size=len(w), dtype=np.int64)
    # A prompt shorter than the prefix is all prefix.
    return w._replace(prefix_group=group, prefix_tokens=np.minimum(spec.tokens, w.prompt_tokens))


# ---------------------------------------------------------------- entry points


def workload_from_config(cfg: dict, seed: int, base_dir: str | Path = ".") -> Workload:
    """Build the workload of a config's `workload:` mapping (trace paths relative to base_dir)."""
    spec = workload_spec(cfg)
    if isinstance(spec, Replayed):
        w = replay(spec.trace, Path(base_dir))
        if spec.prefix is not None and w.prefix_group is not None:
            raise ValueError("workload.prefix: this trace carries its own prefix sharing "
                             "(mooncake hash_ids); remove workload.prefix")
    else:
        w = _synthetic(spec, seed)
    if spec.prefix is not None:
        # Random groups are drawn from `seed` even for a replayed trace, whose lengths are fixed.
        w = _with_random_prefix(w, spec.prefix, seed)
    return w


def workload_to_vidur_csv(w: Workload, path: str | Path) -> Path:
    """Write the workload as a Vidur trace CSV (arrived_at,num_prefill_tokens,num_decode_tokens)."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # pandas writes float64 with round-trip precision, so a reload gives the same arrivals.
    pd.DataFrame({"arrived_at": w.arrival_s, "num_prefill_tokens": w.prompt_tokens,
                  "num_decode_tokens": w.output_tokens}).to_csv(path, index=False)
    return path
