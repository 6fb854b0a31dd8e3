"""`reasonsim demo`: the default cluster on the shipped calibration, a rate sweep, a report."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim import report
from sim.config import load_config, read_yaml
from sim.simulate import simulate
from sim.sweep import Sweep, apply_overrides, run_sweep


DEMO_FILES = frozenset({"report.md", "latency_cdf.png", "attainment_vs_rate.png",
                        "utilisation.png", "summary.json", "sweep.csv"})


def run_demo(config_path: Path, out_dir: Path, quick: bool = False) -> dict:
    """Simulate the demo config, sweep its arrival rate, write report.md + PNGs; return summary.

    The report is written into a hidden sibling and swapped in whole at the end, so `out_dir`
    holds one complete report (a previous one is replaced, never mixed); a directory with other
    files is refused before simulating.
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ValueError(f"{out_dir}: exists and is not a directory")
        other = sorted(p.name for p in out_dir.iterdir() if p.name not in DEMO_FILES)
        if other:
            raise ValueError(f"{out_dir}: holds files that are not a demo report ({other[0]}); "
                             "choose a new directory")
    cfg = load_config(config_path)
    raw = read_yaml(config_path)
    if quick:
        cfg = replace(cfg, workload={**cfg.workload, "num_requests": 2000})
        raw = apply_overrides(raw, [("workload.num_requests", 2000)])
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        summary = _write_demo(cfg, raw, tmp)
        if out_dir.exists():
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return summary


def _write_demo(cfg, raw: dict, out_dir: Path) -> dict:
    main = simulate(cfg)
    base_rate = float(cfg.workload["arrival"]["rate_per_s"])
    rates = [base_rate * scale for scale in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)]
    spec = Sweep(raw, cfg.base_dir, {"workload.arrival.rate_per_s": rates,
                                     "workload.num_requests":
                                     [min(int(cfg.workload["num_requests"]), 4000)]},
                 [], [cfg.seed])
    with tempfile.TemporaryDirectory() as points:
        df = run_sweep(spec, points)
    rows = [{"rate_per_s": r["workload.arrival.rate_per_s"],
             "slo_attainment": r["slo_attainment"], "ttft_p90_s": r["ttft_s.p90"],
             "tpot_p90_s": r["tpot_s.p90"], "throughput_tok_s": r["throughput_tok_s"]}
            for r in df.to_dict("records")]
    sweep = pd.DataFrame(rows)
    reqs = main.requests.to_pandas()
    report.latency_cdfs(reqs, out_dir / "latency_cdf.png")
    report.attainment_vs_rate(sweep, out_dir / "attainment_vs_rate.png")
    span = main.summary["makespan_s"] or 1.0
    steps = main.steps.to_pandas()
    busy = steps.groupby("replica_id").duration_ms.sum().reindex(
        range(main.summary["replicas"]), fill_value=0).to_numpy() / 1e3 / span
    report.utilisation(np.clip(busy, 0, 1), out_dir / "utilisation.png")
    (out_dir / "report.md").write_text(report.markdown(
        f"reasonsim demo: {main.summary['replicas']} replicas, {len(reqs)} requests",
        main.summary, sweep, ["latency_cdf.png", "attainment_vs_rate.png", "utilisation.png"]))
    (out_dir / "summary.json").write_text(json.dumps(main.summary, indent=1) + "\n")
    sweep.to_csv(out_dir / "sweep.csv", index=False)
    return main.summary
