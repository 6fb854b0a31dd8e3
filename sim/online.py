"""Online Dynasor experiments: deadline attainment of program workloads vs rate and SLO scale.

Every point is one simulation of a program config with the scheduler, arrival rate or SLO scale
replaced; configs differ only in their allocation policy, so the cluster and its resource cap are
the same for every line.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from sim.config import parse_config
from sim.simulate import simulate


def _load(path: str | Path) -> tuple[dict, Path]:
    path = Path(path)
    d = yaml.safe_load(path.read_text())
    if not isinstance(d, dict) or "programs" not in (d.get("workload") or {}):
        raise ValueError(f"{path}: not a program workload (workload.programs)")
    return d, path.parent


def run_point(d: dict, base_dir: Path, scheduler, rate_per_s: float | None = None,
              slo_scale: float | None = None) -> dict:
    """Simulate one config with its scheduler, rate or SLO scale replaced; the summary."""
    d = copy.deepcopy(d)
    progs = d["workload"]["programs"]
    if rate_per_s is not None:
        progs["rate_per_s"] = rate_per_s
    if slo_scale is not None:
        progs["deadline"]["slo_scale"] = slo_scale
    d["cluster"]["scheduler"] = scheduler
    d["output"] = {"steps": False}
    r = simulate(parse_config(d, base_dir))
    return r.summary | {"policy": r.programs["policy"][0].as_py()}


def sweep(configs: list[str | Path], schedulers: list[str], rates: list[float],
          slo_scales: list[float], progress=None) -> list[dict]:
    """Attainment rows: every config x scheduler at every rate (SLO scale of the config) and at
    every SLO scale (rate of the config)."""
    rows = []
    for path in configs:
        d, base = _load(path)
        for sched in schedulers:
            for axis, values in (("rate_per_s", rates), ("slo_scale", slo_scales)):
                for v in values:
                    s = run_point(d, base, sched, **{axis: v})
                    progs = d["workload"]["programs"]
                    rows.append({
                        "config": str(path), "policy": s["policy"], "scheduler": sched,
                        "axis": axis,
                        "rate_per_s": v if axis == "rate_per_s" else progs["rate_per_s"],
                        "slo_scale": v if axis == "slo_scale" else
                        progs["deadline"].get("slo_scale", 1.0),
                        "slo_attainment": s["slo_attainment"], "accuracy": s["accuracy"],
                        "tokens_per_program": s["tokens_per_program"],
                        "program_latency_p90_s": s["program_latency_s"]["p90"],
                        "ftf_max": s["finish_time_fairness"]["max"]})
                    if progress is not None:
                        progress()
    return rows


def max_sustainable_rate(rows: list[dict], target: float = 0.9) -> list[dict]:
    """Per policy x scheduler: the highest rate whose attainment is >= target (linear between
    the swept rates; None when even the lowest rate misses it)."""
    out = []
    keys = sorted({(r["policy"], r["scheduler"]) for r in rows if r["axis"] == "rate_per_s"})
    for policy, sched in keys:
        pts = sorted((r["rate_per_s"], r["slo_attainment"]) for r in rows
                     if r["axis"] == "rate_per_s" and (r["policy"], r["scheduler"]) ==
                     (policy, sched))
        best = None
        for (r0, a0), (r1, a1) in zip(pts, pts[1:] + [(None, None)]):
            if a0 < target:
                break
            best = r0
            if r1 is not None and a1 < target:
                best = r0 + (r1 - r0) * (a0 - target) / (a0 - a1)
                break
        out.append({"policy": policy, "scheduler": sched, "max_rate_per_s": best,
                    "target": target})
    return out


def plot(rows: list[dict], out_dir: str | Path) -> list[Path]:
    """Attainment vs rate, attainment vs SLO scale, accuracy vs attainment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = sorted({(r["policy"], r["scheduler"]) for r in rows})
    paths = []
    for axis, label, name in (("rate_per_s", "program arrival rate (1/s)", "attainment_vs_rate"),
                              ("slo_scale", "SLO scale", "attainment_vs_slo")):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for policy, sched in keys:
            pts = sorted((r[axis], r["slo_attainment"]) for r in rows if r["axis"] == axis and
                         (r["policy"], r["scheduler"]) == (policy, sched))
            if pts:
                x, y = zip(*pts)
                ax.plot(x, y, "o-", label=f"{policy} / {sched}")
        ax.axhline(0.9, color="gray", lw=0.8, ls="--")
        ax.set_xlabel(label)
        ax.set_ylabel("deadline attainment")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(out_dir / f"{name}.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for policy, sched in keys:
        pts = [(r["slo_attainment"], r["accuracy"]) for r in rows
               if (r["policy"], r["scheduler"]) == (policy, sched)]
        ax.scatter(*zip(*pts), s=14, label=f"{policy} / {sched}")
    ax.set_xlabel("deadline attainment")
    ax.set_ylabel("accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "accuracy_vs_attainment.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths

