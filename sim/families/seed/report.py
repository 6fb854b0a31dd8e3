"""SEED figures and the simulated mode sweep (`seed modes`): speedup over AR per mode and tree
depth, acceptance, and a timeline of the target's busy and idle time under SD vs SEED."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def mode_sweep(load, modes: list[str], depths: list[int]) -> list[dict]:
    """Simulate every mode at every depth; `load(mode, depth)` gives the config. One row per
    point: mean and P90 program latency, speedup over ar and sd at that depth, acceptance,
    target busy fraction and verify queue wait; per component (Thought Generator, State
    Evaluator: SEED's Table 2) its mean time, speedup over ar's and acceptance."""
    from sim.simulate import simulate

    rows = []
    for depth in depths:
        at = {}
        for mode in modes:
            s = simulate(replace(load(mode, depth), write_steps=False)).summary
            lat = s["program_latency_s"]
            at[mode] = {"mode": mode, "depth": depth, "latency_mean_s": lat["mean"],
                        "latency_p90_s": lat["p90"], "accuracy": s.get("accuracy"),
                        "acceptance_rate": s.get("acceptance_rate"),
                        "target_busy_fraction": s.get("target_busy_fraction"),
                        "verify_queue_wait_p90_s": s.get("verify_queue_wait_p90_s"),
                        "generator_mean_s": s.get("generator_mean_s"),
                        "evaluator_mean_s": s.get("evaluator_mean_s"),
                        "eval_acceptance_rate": s.get("eval_acceptance_rate")}
        for r in at.values():
            for base in ("ar", "sd"):
                b = at.get(base)
                r[f"speedup_vs_{base}"] = b["latency_mean_s"] / r["latency_mean_s"] if b else None
            b = at.get("ar")
            for part in ("generator", "evaluator"):
                r[f"{part}_speedup_vs_ar"] = b[f"{part}_mean_s"] / r[f"{part}_mean_s"] \
                    if b and r[f"{part}_mean_s"] else None
            rows.append(r)
    return rows


def plot_speedup(rows: list[dict], path: str | Path, title: str) -> None:
    """Speedup over AR against tree depth, one line per mode."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        pts = sorted((r["depth"], r["speedup_vs_ar"]) for r in rows if r["mode"] == mode)
        ax.plot(*zip(*pts), marker="o", label=mode)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set(xlabel="tree depth (levels)", ylabel="speedup over ar (mean tree latency)",
           title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_timeline(runs: dict, path: str | Path, title: str) -> None:
    """Busy intervals of the draft and target replicas under each mode (one tree):
    `runs`: mode -> (steps DataFrame, {pool: replica id})."""
    plt = _plt()
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 1.2 + 1.1 * len(runs)), sharex=True,
                             squeeze=False)
    for ax, (mode, (steps, pools)) in zip(axes[:, 0], runs.items()):
        for y, pool in enumerate(("draft", "target")):
            s = steps[steps.replica_id == pools[pool]]
            bars = list(zip(s.start_s.to_numpy(), s.duration_ms.to_numpy() / 1e3))
            ax.broken_barh(bars, (y - 0.35, 0.7), color="C1" if pool == "draft" else "C0")
            busy = float(np.sum([b for _, b in bars]))
            end = float(steps.start_s.max() + steps.duration_ms.iloc[-1] / 1e3) if len(steps) \
                else 0.0
            ax.text(1.0, y, f" {busy / end:.0%} busy" if end else "", va="center",
                    transform=ax.get_yaxis_transform(), fontsize=8)
        ax.set_yticks([0, 1], ["draft", "target"])
        ax.set_ylabel(mode, rotation=0, ha="right", va="center")
    axes[-1, 0].set_xlabel("simulated seconds")
    axes[0, 0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
