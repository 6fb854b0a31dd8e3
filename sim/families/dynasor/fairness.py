"""Finish-time fairness as Dynasor defines it (its Fig 20): each program's latency when it shares
the cluster, over its latency when it runs alone, `rho = T_shared / T_independent` (1: no slower
than alone), per inter-program scheduler, with its CDF.

`T_independent` comes from one simulation of the same programs: the program draw takes its
questions and samples apart from the arrival gaps, which the rate only scales, so the slowest
rate the inputs allow spreads the same programs out until none overlaps another (checked: an
overlap is an error, not a silent bias). Each then runs alone on the cluster, with whatever
the replicas' prefix caches kept from earlier programs.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from inputs.limits import MIN_RATE_PER_S


def _latencies(d: dict, base_dir: Path):
    """Program id -> (arrival, finish) of the config `d` simulated."""
    from sim.config import parse_config
    from sim.simulate import simulate

    progs = simulate(parse_config(d, base_dir)).programs.to_pandas().sort_values("arrival_s")
    return progs.set_index("program_id")[["arrival_s", "finish_s"]]


def independent_latency(d: dict, base_dir: Path) -> dict[str, float]:
    """Each program's latency when it runs alone (the config's programs spread out)."""
    alone = copy.deepcopy(d)
    alone["workload"]["programs"]["rate_per_s"] = MIN_RATE_PER_S
    t = _latencies(alone, base_dir)
    overlap = (t.finish_s.to_numpy()[:-1] > t.arrival_s.to_numpy()[1:]).sum()
    if overlap:
        raise ValueError(f"{overlap} programs still overlap at {MIN_RATE_PER_S} programs/s: "
                         "their independent latencies are not alone")
    return (t.finish_s - t.arrival_s).to_dict()


def fairness(d: dict, base_dir: Path, schedulers: list[str]) -> list[dict]:
    """Per scheduler: rho per program (program id order) and its summary."""
    alone = independent_latency(d, base_dir)
    rows = []
    for scheduler in schedulers:
        shared = copy.deepcopy(d)
        shared.setdefault("cluster", {})["scheduler"] = scheduler
        t = _latencies(shared, base_dir).sort_index()
        rho = ((t.finish_s - t.arrival_s) / t.index.map(alone)).to_numpy(float)
        rows.append({"scheduler": scheduler, "programs": len(rho),
                     "rho": rho.tolist(), "rho_mean": float(rho.mean()),
                     **{f"rho_p{q}": float(np.percentile(rho, q)) for q in (50, 90, 99)},
                     "rho_max": float(rho.max())})
    return rows


def plot_fairness(rows: list[dict], path: str | Path, title: str) -> Path:
    """The CDF of rho per scheduler."""
    from sim.report import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 3.4))
    for r in rows:
        rho = np.sort(r["rho"])
        ax.step(rho, np.arange(1, len(rho) + 1) / len(rho), where="post", label=r["scheduler"])
    ax.set_xlabel("finish-time fairness rho = T_shared / T_independent")
    ax.set_ylabel("programs (CDF)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
