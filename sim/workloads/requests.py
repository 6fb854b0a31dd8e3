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
from typing import Any, Callable

import numpy as np

from sim.workloads.traces import TRACE_FORMATS, replay
from sim.workloads.base import Workload, check_keys, integer, number, positive, require

__all__ = ["TRACE_FORMATS", "Workload", "workload_from_config", "workload_to_vidur_csv"]

_SYNTHETIC_KEYS = ("arrival", "num_requests", "duration_s", "prompt_tokens", "output_tokens",
                   "prefix", "prompt_text")
_TRACE_FORM_KEYS = ("trace", "prefix", "prompt_text")
PROMPT_TEXTS = ("random", "testbed")
"""what a live replay's prompts are made of (the simulator sees lengths only): random token ids,
or the testbed's questions (text a draft model predicts: it sets speculative acceptance)"""
_ARRIVAL_KEYS = {"poisson": ("kind", "rate_per_s"), "gamma": ("kind", "rate_per_s", "cv"),
                 "constant": ("kind", "rate_per_s")}
_LENGTH_KEYS = {"uniform": ("kind", "low", "high"), "lognormal": ("kind", "mean", "sigma", "max"),
                "choice": ("kind", "values", "weights")}
_PREFIX_KEYS = ("groups", "tokens")

MIN_RATE_PER_S = 1e-5
"""arrival rates below this put arrivals so far out (1e-300: at 1e300 s) that a request's
latency vanishes in the clock's float precision: latencies of 0"""
MAX_REQUESTS = 10_000_000
MAX_SIGMA = 4.0
"""a lognormal length's sigma beyond this is no length distribution (its mass sits at 1 token)"""
MAX_CV = 100.0
"""a gamma arrival's coefficient of variation beyond this has a shape that underflows"""
"""a workload may not generate more requests than this (memory stays bounded)"""

# One independent child stream per quantity: changing, say, the arrival kind or the request count
# leaves the drawn prompt lengths untouched, so sweeps over one knob compare like with like.
_STREAMS = ("arrival", "prompt_tokens", "output_tokens", "prefix")


# ---------------------------------------------------------------- synthetic workloads

Sampler = Callable[[np.random.Generator, int], np.ndarray]


def _length_sampler(spec: Any, where: str) -> Sampler:
    """Parse a length spec (int, uniform, lognormal, choice) into a sampler; validate it now."""
    if not isinstance(spec, dict):
        tokens = integer(spec, where, minimum=1)
        return lambda rng, n: np.full(n, tokens, dtype=np.int64)
    kind = require(spec, "kind", where)
    if not isinstance(kind, str) or kind not in _LENGTH_KEYS:
        raise ValueError(f"{where}.kind is {kind!r}; allowed kinds: {', '.join(_LENGTH_KEYS)} "
                         "(or a plain int for a fixed length)")
    check_keys(spec, _LENGTH_KEYS[kind], where)
    if kind == "uniform":
        low = integer(require(spec, "low", where), f"{where}.low", minimum=1)
        high = integer(require(spec, "high", where), f"{where}.high", minimum=1)
        if high < low:
            raise ValueError(f"{where}.high ({high}) must be >= {where}.low ({low})")
        # Both bounds included: {low: 1, high: 1} is the fixed length 1.
        return lambda rng, n: rng.integers(low, high, size=n, endpoint=True, dtype=np.int64)
    if kind == "lognormal":
        mean = positive(require(spec, "mean", where), f"{where}.mean")
        sigma = number(require(spec, "sigma", where), f"{where}.sigma")
        if not 0 <= sigma <= MAX_SIGMA:
            raise ValueError(f"{where}.sigma must be within 0..{MAX_SIGMA}, got {sigma}")
        cap = integer(spec["max"], f"{where}.max", minimum=1) if "max" in spec else None
        if cap is not None and mean > cap:
            raise ValueError(f"{where}.mean ({mean}) must be <= {where}.max ({cap})")
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
    values = require(spec, "values", where)
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"{where}.values must be a non-empty list, got {values!r}")
    choices = np.array([integer(v, f"{where}.values[{i}]", minimum=1) for i, v in enumerate(values)],
                       dtype=np.int64)
    probs = None
    if "weights" in spec:
        weights = spec["weights"]
        if not isinstance(weights, (list, tuple)) or len(weights) != len(choices):
            raise ValueError(f"{where}.weights must be a list of {len(choices)} numbers (one "
                             f"per value), got {weights!r}")
        w = np.array([number(x, f"{where}.weights[{i}]") for i, x in enumerate(weights)])
        if np.any(w < 0) or w.sum() <= 0:
            raise ValueError(f"{where}.weights must be >= 0 with a positive sum, got {weights!r}")
        probs = w / w.sum()
    return lambda rng, n: rng.choice(choices, size=n, p=probs)


def _gap_sampler(spec: Any) -> tuple[str, float, Callable[[np.random.Generator, int], np.ndarray]]:
    """Parse `workload.arrival` into (kind, rate, inter-arrival gap sampler)."""
    where = "workload.arrival"
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be a mapping like {{kind: poisson, rate_per_s: 4.0}}, "
                         f"got {spec!r}")
    kind = require(spec, "kind", where)
    if not isinstance(kind, str) or kind not in _ARRIVAL_KEYS:
        raise ValueError(f"{where}.kind is {kind!r}; allowed kinds: {', '.join(_ARRIVAL_KEYS)}")
    check_keys(spec, _ARRIVAL_KEYS[kind], where)
    rate = positive(require(spec, "rate_per_s", where), f"{where}.rate_per_s")
    if rate < MIN_RATE_PER_S:
        raise ValueError(f"{where}.rate_per_s must be >= {MIN_RATE_PER_S:g} (a request a day "
                         f"or more), got {rate:g}")
    if kind == "poisson":
        return kind, rate, lambda rng, n: rng.exponential(1.0 / rate, size=n)
    if kind == "gamma":
        cv = positive(require(spec, "cv", where), f"{where}.cv")
        if cv > MAX_CV:
            raise ValueError(f"{where}.cv must be <= {MAX_CV}, got {cv}")
        # Gamma(shape k, scale t) has mean k*t and cv 1/sqrt(k): k = 1/cv^2, t = 1/(rate*k).
        shape = 1.0 / cv ** 2
        scale = 1.0 / (rate * shape)
        return kind, rate, lambda rng, n: rng.gamma(shape, scale, size=n)
    return kind, rate, lambda rng, n: np.full(n, 1.0 / rate)


def _synthetic_arrivals(cfg: dict, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a synthetic workload: `num_requests` of them, or all before `duration_s`."""
    kind, rate, gaps = _gap_sampler(require(cfg, "arrival", "workload"))
    if ("num_requests" in cfg) == ("duration_s" in cfg):
        raise ValueError("workload needs exactly one of num_requests and duration_s")
    if "num_requests" in cfg:
        n = integer(cfg["num_requests"], "workload.num_requests", minimum=1)
        if n > MAX_REQUESTS:
            raise ValueError(f"workload.num_requests={n} exceeds the cap of {MAX_REQUESTS:,} "
                             "requests")
        if kind == "constant":
            return np.arange(n) / rate
        return np.cumsum(gaps(rng, n))
    duration = positive(cfg["duration_s"], "workload.duration_s")
    if duration * rate > MAX_REQUESTS:  # checked before anything is drawn or allocated
        raise ValueError(f"workload.duration_s={duration} at rate_per_s={rate} expects "
                         f"{duration * rate:.3g} requests, over the cap of {MAX_REQUESTS:,}; "
                         "shorten the duration or lower the rate")
    if kind == "constant":
        arrivals = np.arange(math.ceil(duration * rate) + 1) / rate
    else:
        # Draw gaps in chunks until the clock passes the duration; the chunk covers the expected
        # count plus slack so one draw nearly always suffices.
        chunk = int(duration * rate * 1.2) + 64
        parts, clock, drawn = [], 0.0, 0
        while clock < duration:
            part = clock + np.cumsum(gaps(rng, chunk))
            # Only arrivals before the duration are kept: a bursty process (large cv) may need
            # many draws, but memory holds just those.
            parts.append(part[part < duration])
            drawn += int((part < duration).sum())
            if drawn > MAX_REQUESTS:
                raise ValueError(f"workload.duration_s={duration} with arrival "
                                 f"{cfg['arrival']} generates more than {MAX_REQUESTS:,} "
                                 "requests; shorten the duration or lower the rate")
            clock = part[-1]
        arrivals = np.concatenate(parts)
    # Arrivals fall in [0, duration_s): one exactly at duration_s belongs to the next window.
    arrivals = arrivals[arrivals < duration]
    if not len(arrivals):
        raise ValueError(f"workload.duration_s={duration} at rate_per_s={rate} produces no "
                         "request; lengthen the duration or raise the rate")
    return arrivals


def _synthetic(cfg: dict, seed: int) -> Workload:
    """A synthetic workload: arrival process and length distributions drawn from `seed`."""
    check_keys(cfg, _SYNTHETIC_KEYS, "workload")
    prompt = _length_sampler(require(cfg, "prompt_tokens", "workload"), "workload.prompt_tokens")
    output = _length_sampler(require(cfg, "output_tokens", "workload"), "workload.output_tokens")
    rngs = _rngs(seed)
    # Poisson and gamma: the first request arrives after one gap (the process starts at 0 with
    # no request); constant: the first request arrives at exactly 0.
    arrivals = _synthetic_arrivals(cfg, rngs["arrival"])
    n = len(arrivals)
    return Workload(arrivals, prompt(rngs["prompt_tokens"], n), output(rngs["output_tokens"], n))


def _rngs(seed: int) -> dict[str, np.random.Generator]:
    seed = integer(seed, "seed", minimum=0)
    children = np.random.SeedSequence(seed).spawn(len(_STREAMS))
    return {name: np.random.default_rng(child) for name, child in zip(_STREAMS, children)}


def _with_random_prefix(w: Workload, spec: Any, seed: int) -> Workload:
    """Assign each request a prefix group uniformly among `groups`, sharing `tokens` tokens."""
    where = "workload.prefix"
    check_keys(spec, _PREFIX_KEYS, where)
    groups = integer(require(spec, "groups", where), f"{where}.groups", minimum=1)
    tokens = integer(require(spec, "tokens", where), f"{where}.tokens", minimum=1)
    group = _rngs(seed)["prefix"].integers(0, groups, size=len(w), dtype=np.int64)
    # A prompt shorter than the prefix is all prefix.
    return w._replace(prefix_group=group, prefix_tokens=np.minimum(tokens, w.prompt_tokens))


# ---------------------------------------------------------------- entry points


def workload_from_config(cfg: dict, seed: int, base_dir: str | Path = ".") -> Workload:
    """Build the workload of a config's `workload:` mapping (trace paths relative to base_dir)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"workload must be a mapping, got {type(cfg).__name__}: {cfg!r}")
    if cfg.get("prompt_text", "random") not in PROMPT_TEXTS:
        raise ValueError(f"workload.prompt_text is {cfg['prompt_text']!r}; allowed: "
                         f"{', '.join(PROMPT_TEXTS)}")
    if "trace" in cfg:
        check_keys(cfg, _TRACE_FORM_KEYS, "workload (a trace replay)")
        w = replay(cfg["trace"], Path(base_dir))
        if "prefix" in cfg and w.prefix_group is not None:
            raise ValueError("workload.prefix: this trace carries its own prefix sharing "
                             "(mooncake hash_ids); remove workload.prefix")
    else:
        w = _synthetic(cfg, seed)
    if "prefix" in cfg:
        # Random groups are drawn from `seed` even for a replayed trace, whose lengths are fixed.
        w = _with_random_prefix(w, cfg["prefix"], seed)
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
