"""Uncertainty bands: the same workload simulated under N draws of the step-time noise.

Each draw samples every iteration's duration from the calibration's residual distribution
(`latency: sampled`, a run of k decode iterations drawing the mean of k residuals), with the
workload and routing fixed (`noise_seed`), so the spread of a metric over the draws is what the
calibration's step-time error alone does to it. `validate` then says whether the live value falls
inside the band; `reasonsim fidelity` counts how often it does over its suite (the band's
coverage), which is the check that the noise model is honest.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from inputs.limits import MAX_SEEDS
from sim.config import SimConfig
from sim.metrics import summarize
from sim.program_metrics import program_summary

BAND = (0.05, 0.95)


def metrics_of(result) -> dict[str, float]:
    """Flat metrics of one simulation: request latency percentiles, throughput, and program
    latency percentiles for program workloads (names as `validation.judge.compare` uses)."""
    # a run that folded its requests summarized them as they folded
    s = result.summary if result.requests is None else summarize(result.requests.to_pandas())
    out = {f"{m}.{q}": float(s[m][q]) for m in ("ttft_s", "tpot_s", "e2e_s")
           for q in ("mean", "p50", "p90", "p99")}
    out["throughput_tok_s"] = float(s["throughput_tok_s"])
    if result.programs is not None:
        p = program_summary(result.programs.to_pandas())
        out.update({f"program_latency_{q}": float(p["program_latency_s"][q])
                    for q in ("mean", "p50", "p90", "p99")})
    return out


MAX_DRAWS = MAX_SEEDS


def bands(cfg: SimConfig, seeds: int, band: tuple[float, float] = BAND) -> dict:
    """{metric: {lo, hi, median}} over `seeds` noise draws of the config (sampled latency)."""
    from sim.simulate import simulate

    if not 2 <= seeds <= MAX_DRAWS:
        raise ValueError(f"--seeds {seeds}: a band needs 2 to {MAX_DRAWS} noise draws")
    draws = [metrics_of(simulate(replace(cfg, latency="sampled", noise_seed=k, write_steps=False)))
             for k in range(seeds)]
    out = {}
    for m in draws[0]:
        v = np.array([d[m] for d in draws])
        out[m] = {"lo": float(np.quantile(v, band[0])), "hi": float(np.quantile(v, band[1])),
                  "median": float(np.median(v))}
    return {"seeds": seeds, "band": list(band), "metrics": out}


def in_band(bands_json: dict, metric: str, live: float) -> bool | None:
    """Whether a live value lies inside the metric's band (None: no band for it)."""
    b = bands_json.get("metrics", {}).get(metric)
    return None if b is None else bool(b["lo"] <= live <= b["hi"])
