"""Online Dynasor experiments: deadline attainment of program workloads vs rate and SLO scale.

Every point is one simulation of a program config with the scheduler, arrival rate or SLO scale
replaced; configs differ only in their allocation policy, so the cluster and its resource cap are
the same for every line.
"""

from __future__ import annotations

from pathlib import Path

from sim.config import read_yaml
from sim.sweep import Backend, Sweep, run_sweep


def _load(path: str | Path) -> tuple[dict, Path]:
    path = Path(path)
    d = read_yaml(path)
    if not isinstance(d, dict) or "programs" not in (d.get("workload") or {}):
        raise ValueError(f"{path}: not a program workload (workload.programs)")
    return d, path.parent


def sweep(configs: list[str | Path], schedulers: list[str], rates: list[float],
          slo_scales: list[float], out_dir: str | Path, backend: Backend | None = None,
          progress: bool = False) -> list[dict]:
    """Attainment rows: every config x scheduler at every rate (SLO scale of the config) and at
    every SLO scale (rate of the config). Points are a sweep under `out_dir`/points (resumable)."""
    rows = []
    for path in configs:
        d, base = _load(path)
        progs = d["workload"]["programs"]
        progs.setdefault("deadline", {}).setdefault("slo_scale", 1.0)
        cases = [{"name": axis, "cluster.scheduler": sched, key: v}
                 for sched in schedulers
                 for axis, key, values in (
                     ("rate_per_s", "workload.programs.rate_per_s", rates),
                     ("slo_scale", "workload.programs.deadline.slo_scale", slo_scales))
                 for v in values]
        df = run_sweep(Sweep(d, base, {}, cases, [d.get("seed", 0)]), out_dir, backend,
                       progress, shared=True)
        for case, s in zip(cases, df.to_dict("records")):
            rate = case.get("workload.programs.rate_per_s", progs["rate_per_s"])
            scale = case.get("workload.programs.deadline.slo_scale",
                             progs["deadline"]["slo_scale"])
            rows.append({"config": str(path), "policy": s["policy"],
                         "scheduler": case["cluster.scheduler"], "axis": case["name"],
                         "rate_per_s": rate, "slo_scale": scale,
                         "slo_attainment": s["slo_attainment"], "accuracy": s["accuracy"],
                         "tokens_per_program": s["tokens_per_program"],
                         "program_latency_p90_s": s["program_latency_s.p90"],
                         "program_latency_mean_s": s["program_latency_s.mean"],
                         "latency_over_deadline_max": s["latency_over_deadline.max"]})
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


ABLATION_SCHEDULERS = ("lpm", "app_fifo", "dynasor", "dynasor_sjf")
"""the ablation's steps on each allocation: LPM (the baseline), + gang, + gang and SJF by the
finished programs' lengths, + gang and SJF by each program's own estimate (the paper's)"""


def ablation(rows: list[dict], target: float = 0.9) -> list[dict]:
    """Dynasor's component ablation (its Fig 19) from `sweep` rows over rate of an even and a
    certaindex config under `ABLATION_SCHEDULERS`: per allocation x scheduler, in that order,
    the mean program latency at each swept rate and the max sustainable rate at `target`
    attainment, each against the first step (the even allocation under LPM)."""
    best = {(b["policy"], b["scheduler"]): b["max_rate_per_s"]
            for b in max_sustainable_rate(rows, target)}
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    steps = [(p, s) for p in policies for s in ABLATION_SCHEDULERS if (p, s) in best]
    if not steps:
        raise ValueError(f"ablation: no rows under the schedulers {list(ABLATION_SCHEDULERS)}")
    latency = {(r["policy"], r["scheduler"], r["rate_per_s"]): r["program_latency_mean_s"]
               for r in rows if r["axis"] == "rate_per_s"}
    rates = sorted({r["rate_per_s"] for r in rows if r["axis"] == "rate_per_s"})
    base = steps[0]
    out = []
    for p, sched in steps:
        lat = {rate: latency.get((p, sched, rate)) for rate in rates}
        rate_vs = None if best[p, sched] is None or not best[base] else \
            best[p, sched] / best[base]
        out.append({"policy": p, "scheduler": sched, "max_rate_per_s": best[p, sched],
                    "max_rate_vs_baseline": rate_vs, "mean_latency_s": lat,
                    "mean_latency_vs_baseline": {
                        rate: lat[rate] / latency[(*base, rate)] for rate in rates
                        if lat[rate] is not None and latency.get((*base, rate))}})
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



def plot_ablation(steps: list[dict], path: str | Path) -> Path:
    """The ablation as Fig 19 draws it: each step's mean program latency over the baseline's,
    one group of bars per swept rate."""
    from sim.report import pyplot, save_figure

    plt = pyplot()
    rates = sorted({r for s in steps for r in s["mean_latency_vs_baseline"]}, key=float)
    width = 0.8 / len(steps)
    fig, ax = plt.subplots(figsize=(9.5, 4))
    for k, s in enumerate(steps):
        ax.bar([i + k * width for i in range(len(rates))],
               [s["mean_latency_vs_baseline"].get(r, float("nan")) for r in rates], width,
               label=f"{s['policy']} / {s['scheduler']}")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rates))],
                  [f"{float(r):g}/s" for r in rates])
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("program arrival rate")
    ax.set_ylabel("mean program latency / baseline's")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return save_figure(fig, path)
