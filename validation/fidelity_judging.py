"""What the fidelity suite's request and program workloads share (`validation.fidelity`,
`validation.fidelity_programs`): a planned workload, the simulation with its noise band, the
errors at the live runs' own speeds, and a config with its step times scaled."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

LIVE_RUNS = 2
BAND_SEEDS = 20
"""noise draws per workload for the 5-95% step-time band"""


@dataclass(frozen=True)
class Planned:
    """A suite workload set up to run: its live-run directories, one replay into a given one
    (in a fresh process), its judging once every live run is done (the table row; given the
    run's `validation.speed_checks.traffic_levels`, empty without speed checks), and its
    noise-draw medians with each live run's step times scaled by a factor
    (`validation.speed_checks.medians_at`), and a live run's step tail beside its
    calibration's (`validation.bursts.tails_against`: whether it served through a burst)."""

    lives: list[Path]
    replay: Callable[[Path], None]
    judge: Callable[[list[dict]], dict]
    medians: Callable[[list[float]], dict]
    tails: Callable[[Path], tuple]


def leveled_errors(metrics: dict, leveled: list) -> None:
    """Add each metric's mean error at the live runs' decode speeds, of the mean-latency
    simulation and of the sampled draws' median (`at_live_speed`), and whether the latter is
    within the tolerance or the spread (`ok_at_live_speed`); nothing where a run had no decode
    steps."""
    if any(x is None for x in leveled):
        return
    for m, v in metrics.items():
        if m in leveled[0]:
            v["error_at_live_speed"] = float(np.mean([x[m][0] for x in leveled]))
            v["error_sampled_at_live_speed"] = float(np.mean([x[m][1] for x in leveled]))
            v["ok_at_live_speed"] = bool(abs(v["error_sampled_at_live_speed"])
                                         <= max(v["tolerance"], v["spread"]))


P50_METRICS = ("e2e_s.p50", "program_latency_p50")
"""the metrics whose median absolute error over a suite's workloads the fidelity goal bounds"""


def table_summary(result: dict) -> dict:
    """A fidelity table in a few counts: metrics within tolerance or spread as judged (`ok`: at the
    neighbouring live runs' speed, `validation.speed_checks.judge_at_neighbours`), raw (at the
    calibration's speed alone), at the live runs' own decode speed and at probe speed; the median
    absolute e2e/program P50 error of each; the live runs' decode speed levels and the host's
    stolen CPU share while they served (`engines.host_cpu`), and how many live runs it stalled by
    more than e2e's tolerance (`live_runs_stalled`: the host alone could have moved their latency
    errors); the live runs' steps in total over their median speed beside the calibration's
    (`live_tails`, `calibration_tail`) and how many exceeded it by `BURST_TOLERANCE`
    (`live_runs_in_bursts`: they served through a burst of other work, `validation.bursts`); live
    values inside the noise band."""
    from engines.host_cpu import stall_share
    from validation.bursts import in_burst
    from validation.judge import TOLERANCE

    ms = [m for r in result["workloads"] for m in r["metrics"].values()]
    lv = [m for m in ms if "ok_at_live_speed" in m]
    p50 = [r["metrics"][m] for r in result["workloads"] for m in P50_METRICS
           if m in r["metrics"]]
    levels = [s["decode"] for r in result["workloads"] for s in r.get("step_speed", [])
              if s.get("decode") is not None]
    steal = [x for r in result["workloads"] for x in r.get("live_steal", []) if x is not None]
    tails = [(s["tail"], s["calibration_tail"]) for r in result["workloads"]
             for s in r.get("step_speed", []) if s.get("tail") and s.get("calibration_tail")]

    def median_abs(key: str) -> float | None:
        v = [abs(m[key]) for m in p50 if key in m]
        return float(np.median(v)) if v else None

    def within(key: str, tol: float) -> int:
        return sum(abs(m[key]) <= tol for m in lv)

    return {"metrics": len(ms), "ok": sum(m["ok"] for m in ms),
            "at_live_speed": len(lv), "ok_at_live_speed": sum(m["ok_at_live_speed"] for m in lv),
            "at_probe_speed": sum("ok_at_probe_speed" in m for m in ms),
            "ok_at_probe_speed": sum(m.get("ok_at_probe_speed", False) for m in ms),
            "p50_median_abs": median_abs("error"),
            "p50_median_abs_at_live_speed": median_abs("error_sampled_at_live_speed"),
            "p50_median_abs_at_probe_speed": median_abs("error_at_probe_speed"),
            "ok_raw": sum(m.get("ok_raw", m["ok"]) for m in ms),
            "p50_median_abs_raw": median_abs("error_raw"),
            "at_traffic_speed": sum("ok_at_traffic_speed" in m for m in ms),
            "ok_at_traffic_speed": sum(m.get("ok_at_traffic_speed", False) for m in ms),
            "p50_median_abs_at_traffic_speed": median_abs("error_at_traffic_speed"),
            "traffic_levels": [round(c["decode"], 3) for c in result.get("speed_checks", [])],
            "decode_levels": [min(levels), max(levels)] if levels else None,
            "live_steal": [min(steal), max(steal)] if steal else None,
            "live_runs_stalled": [sum(stall_share(x) > TOLERANCE["e2e_s.p50"] for x in steal),
                                  len(steal)],
            "live_tails": [min(t for t, _ in tails), max(t for t, _ in tails)] if tails else None,
            "calibration_tail": max(c for _, c in tails) if tails else None,
            "live_runs_in_bursts": [sum(in_burst(t, c) for t, c in tails),
                                    len(tails)],
            "live_speed_within_5": within("error_at_live_speed", 0.05),
            "sampled_within_5": within("error_sampled_at_live_speed", 0.05),
            "in_band": result["band_coverage"]["inside"],
            "band_of": result["band_coverage"]["of"]}


def sampled_medians(cfg) -> dict:
    """Each metric's median over BAND_SEEDS sampled-latency draws of the config."""
    from sim.bands import bands

    return {m: v["median"] for m, v in bands(cfg, BAND_SEEDS)["metrics"].items()}


def simulate_with_band(cfg, out_dir: Path):
    """Simulate (mean latency) into out_dir and write the noise band beside it."""
    from sim.bands import bands
    from sim.output import write_sim
    from sim.simulate import simulate

    result = simulate(cfg)
    band = bands(cfg, BAND_SEEDS)
    write_sim(cfg, result, out_dir, {"bands.json": json.dumps(band, indent=1) + "\n"})
    return result, band["metrics"]


def probe_levels(probe: dict) -> dict:
    """A table row's speed-probe levels (`sim.step_time.live_speed.probes_level`; None without)."""
    return {"probe_level": probe.get("decode"), "probe_prefill_level": probe.get("prefill"),
            "probe_prefill_factor": probe.get("prefill_factor"),
            "probe_against": probe.get("against")}


def scaled_config(d: dict, factor: float, out_dir: Path, base_dir: Path,
                  prefill_factor: float | None = None):
    """The one-replica-group config `d` with its calibration's step times scaled by `factor`
    (its prefill terms by `prefill_factor`, where given; the scaled calibration written under
    out_dir)."""
    from sim.config import parse_config
    from sim.step_time.live_speed import scaled_calibration

    group = d["cluster"]["replicas"][0]
    # the config's paths are relative to base_dir (the scaled one comes back absolute)
    cal = scaled_calibration(Path(base_dir) / group["calibration"], factor,
                             out_dir / "calibration.json", prefill_factor)
    return parse_config({**d, "cluster": {**d["cluster"], "replicas": [
        {**group, "calibration": str(cal)}]}}, base_dir)
