"""How the sampled speed levels move the judged estimate: a fidelity run judged again, offline.

    python benchmarks/level_variants.py RUN OUT [--variants current,mean1,steps] [--json]
    python benchmarks/level_variants.py RUN OUT --variants current,history,history0 \
        --history RUN2,RUN3

The judged estimate of a `reasonsim fidelity` row is the median over the noise band's draws.
Sampled latency multiplies each step's mean by a residual draw, a run level per replica
(`run_log_quantiles`) and a spell level per window (`spell_log_quantiles`); the mean-latency
run charges the residuals' mean alone. Each variant rewrites RUN's calibration's level
quantiles and judges the same live runs again (`benchmarks/fidelity_offline.py`):

- current: the calibration as fitted
- mean1: both level sets shifted so that each level's mean is 1 (a sampled step's mean is the
  mean run's; their spread is kept)
- steps: no levels (each step's residual drawn alone: the mean run's mean, no correlation in
  time)
- before: the parts as fitted before the split (the whole residual per step, a run level from
  the windows over all steps' median, spells from the windows over their run's), from the
  traces as the next two
- runs: each step's residual over its window's median (the step's own noise), a run level per
  traced run (its median over all steps'), spells as fitted: the three parts of a step's
  residual, each counted once
- windows: the step's own noise and a level per window over all steps' median, drawn anew each
  window (no run level)
- refit: RUN's traces calibrated again by this checkout (`calibrate`): whatever it fits now
  (since the split, the windows' parts, from the fit's own residuals)
- history: the run level drawn from the machine's history, the decode levels of every live
  run of the fidelity runs named by `--history` (each against its own calibration, the level
  `at live speed` reads): the drift between calibrating and serving, as earlier runs on the
  same machine saw it, its median shift included
- history0: the same levels less their median: the history's spread, no shift

The last two read the calibration's greedy traces again (grid and calibration traffic, not
the sampling grid: `benchmarks/prefix_hit_terms.py`) against its model's prediction.

Prints, per variant: rows within tolerance or spread, the judged e2e/program P50 error (median
absolute, mean signed) and every latency row's, and the live values inside the band.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from fidelity_offline import rejudge  # noqa: E402

VARIANTS = ("current", "mean1", "steps", "before", "runs", "windows")
P50 = ("e2e_s.p50", "program_latency_p50")


def history_levels(runs: list[Path]) -> np.ndarray:
    """Log decode level of every live run of fidelity runs `runs` (`step_speed` in each
    fidelity.json: its decode steps over its calibration's prediction, against its own)."""
    return np.log([s["decode"] for run in runs
                   for w in json.loads((run / "fidelity.json").read_text())["workloads"]
                   for s in w.get("step_speed", []) if s.get("decode")])


def variant(cal: dict, name: str, history: np.ndarray | None = None) -> dict:
    """The calibration with its level quantiles rewritten as `name` says (`history`: the log
    levels the history variants draw from)."""
    m = dict(cal["step_time_model"])
    if name in ("history", "history0"):
        from sim.step_time.latency import midpoints

        if history is None or not len(history):
            raise ValueError(f"variant {name}: name earlier fidelity runs with --history")
        q = np.quantile(history, midpoints(21))
        return {**cal, "step_time_model": {**m, "run_log_quantiles": list(
            q - np.median(history) if name == "history0" else q)}}
    if name == "refit":
        from sim.step_time.calibration import calibrate

        return calibrate(cal["provenance"]["traces"], model="serving").to_json()
    if name in ("before", "runs", "windows"):
        return {**cal, "step_time_model": {**m, **parts(cal, name)}}
    for key in ("run_log_quantiles", "spell_log_quantiles"):
        q = np.asarray(m.get(key, [0.0]), float)
        if name == "mean1":
            m[key] = list(q - np.log(np.mean(np.exp(q))))
        elif name == "steps":
            m[key] = [0.0]
    return {**cal, "step_time_model": m}


def parts(cal: dict, name: str) -> dict:
    """A step's log residual in parts: its own noise (over its window's median), its window's
    level over its run's (spells) and its run's over all steps' ("runs"), or its window's over
    all steps' as the spells and no run level ("windows")."""
    from prefix_hit_terms import usable
    from sim.step_time import registry as step_time
    from sim.step_time import serving_latency  # noqa: F401  (registers `serving`)
    from sim.step_time.latency import midpoints
    from sim.step_time.spells import SPELL_S

    model = step_time.from_json(cal["step_time_model"])
    steps = usable([d for d in cal["provenance"]["traces"] if "sampling" not in Path(d).name])
    df = pd.DataFrame({"run": steps.run_id.to_numpy(), "r": np.log(
        steps.duration_ms.to_numpy(float) / model.predict_ms(steps)),
        "window": (steps.start_s.to_numpy() // SPELL_S).astype(int)})
    window = df.groupby(["run", "window"]).r.transform("median")
    run = df.groupby("run").r.transform("median")
    every = df.r.median()
    own = df.r.to_numpy() - window.to_numpy()
    if name == "before":
        windows = df.groupby(["run", "window"]).r.median()
        runs = df.groupby("run").r.median()
        levels = windows.to_numpy() - every
        spells = windows.to_numpy() - runs.loc[windows.index.get_level_values(0)].to_numpy()
        own = df.r.to_numpy() - every
    elif name == "runs":
        level = df.groupby("run").r.median() - every
        levels, spells = level.to_numpy(), (window - run).to_numpy()
    else:
        levels, spells = np.zeros(1), (window - every).to_numpy()
    return {"residual_log_quantiles": list(np.quantile(own + every, midpoints(100))),
            "run_log_quantiles": list(np.quantile(levels, midpoints(21))),
            "spell_log_quantiles": list(np.quantile(spells, midpoints(21)))}


def figures(result: dict) -> dict:
    """Rows ok, judged P50 and latency errors (median |e|, mean e) as judged and with the
    simulation at each live run's decode speed (the band's median there: the machine's drift
    since calibrating taken out), live values in the band."""
    ms = [(k, m) for r in result["workloads"] for k, m in r["metrics"].items()]
    out = {"ok": sum(m["ok"] for _, m in ms), "rows": len(ms),
           "in_band": result["band_coverage"]["inside"], "band_of": result["band_coverage"]["of"]}
    for tag, key in (("", "error"), ("live_", "error_sampled_at_live_speed")):
        p50 = np.array([m[key] for k, m in ms if k in P50 and key in m])
        lat = np.array([m[key] for k, m in ms if "throughput" not in k and key in m])
        out |= {f"{tag}p50_median_abs": float(np.median(np.abs(p50))),
                f"{tag}p50_mean": float(p50.mean()),
                f"{tag}latency_median_abs": float(np.median(np.abs(lat))),
                f"{tag}latency_mean": float(lat.mean())}
    return out


def main() -> None:
    """Judge RUN again under each variant; print one row each."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--history", default="",
                    help="fidelity runs (comma-separated) whose live levels the history "
                         "variants draw from (not RUN itself)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cal = json.loads((args.run / "calibration.json").read_text())
    history = history_levels([Path(p) for p in args.history.split(",") if p])
    rows = {}
    for name in args.variants.split(","):
        out = (args.out / name).resolve()
        out.mkdir(parents=True, exist_ok=True)
        path = out / "calibration.json"
        path.write_text(json.dumps(variant(cal, name, history), indent=1) + "\n")
        rows[name] = figures(rejudge(args.run, out, path))
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{args.run}: judged estimate (the band's median) against the live runs")
    print("| variant | ok | e2e/program P50: median abs, mean | latency rows: median abs, mean | "
          "at live decode speed: P50 | at live decode speed: latency rows | live in band |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        cells = [f"{r[t + 'p50_median_abs']:.1%}, {r[t + 'p50_mean']:+.1%} | "
                 f"{r[t + 'latency_median_abs']:.1%}, {r[t + 'latency_mean']:+.1%}"
                 for t in ("", "live_")]
        print(f"| {name} | {r['ok']}/{r['rows']} | {cells[0]} | {cells[1]} | "
              f"{r['in_band']}/{r['band_of']} |")


if __name__ == "__main__":
    main()
