"""HELIOS figures and tables: throughput and batch by policy, the model/depth timeline, and the
sim-vs-live comparison of a replay."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from sim.families.helios.serving import HeliosResult
from sim.report import pyplot, save_figure

METRICS = ("throughput_tok_s", "ttft_p50_s", "tpot_p50_s", "mean_batch", "perplexity")


def plot_policies(results: dict[str, HeliosResult], path: str | Path) -> Path:
    """Throughput and mean batch per policy (same prompt stream)."""
    plt = pyplot()
    names = list(results)
    summ = [r.summary() for r in results.values()]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    axes[0].bar(names, [s["throughput_tok_s"] for s in summ], color="tab:blue")
    axes[0].set_ylabel("throughput (tokens/s)")
    axes[1].bar(names, [s["mean_batch"] for s in summ], color="tab:green")
    axes[1].set_ylabel("mean batch (sequences per step)")
    for ax in axes:
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_timeline(results: dict[str, HeliosResult], path: str | Path) -> Path:
    """Per HELIOS policy: the model and loaded depth serving each prompt, with LD/SW events."""
    plt = pyplot()
    dynamic = {k: r for k, r in results.items() if r.events}
    fig, axes = plt.subplots(len(dynamic) or 1, 1, figsize=(10, 1.8 + 1.6 * len(dynamic)),
                             squeeze=False)
    for ax, (name, r) in zip(axes[:, 0], dynamic.items()):
        req = r.requests.sort_values("prompt")
        for model, part in req.groupby("model"):
            ax.scatter(part.prompt, part.depth, s=8, label=model)
        for i, s in r.events:
            if s.event in ("load", "switch"):
                ax.axvline(i, color="red" if s.event == "switch" else "orange", lw=1)
                ax.text(i, ax.get_ylim()[1], "SW" if s.event == "switch" else "LD",
                        fontsize=7, va="top")
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("loaded depth")
        ax.legend(fontsize=7, loc="lower right")
    axes[-1, 0].set_xlabel("prompt index")
    fig.tight_layout()
    return save_figure(fig, path)


# How a metric scales with step time: throughput inversely, latencies along, the rest not at all
_TIME_POWER = {"throughput_tok_s": -1, "ttft_p50_s": 1, "tpot_p50_s": 1}


def compare(sim: HeliosResult, lives: list[HeliosResult]) -> dict:
    """Decision agreement and, per metric, sim, live median, error and live-vs-live spread; for
    time metrics also the error at the live runs' step speed (`step_speed`: a live run's step
    time over the simulated, summed over rounds; the simulated times scaled by its median,
    loads included), beside the raw error."""
    s = sim.summary()
    sim_busy_ms = float(sim.rounds.busy_ms.sum())
    speed = [float(lv.rounds.busy_ms.sum()) / sim_busy_ms if sim_busy_ms else math.nan
             for lv in lives]
    level = float(np.median(speed))
    out: dict = {"decisions": agreement(sim, lives[0]), "step_speed": speed, "metrics": {}}
    for m in METRICS:
        vals = [lv.summary()[m] for lv in lives]
        live = float(np.median(vals))
        spread = (max(vals) - min(vals)) / live if len(vals) > 1 and live else math.nan
        out["metrics"][m] = row = {"sim": s[m], "live": live, "error": (s[m] - live) / live
                                   if live else math.nan, "live_spread": spread}
        if m in _TIME_POWER and live:
            row["error_at_live_speed"] = s[m] * level ** _TIME_POWER[m] / live - 1.0
    return out


def agreement(a: HeliosResult, b: HeliosResult) -> dict:
    """Share of prompts served by the same model and depth; equal event lists; equal output
    lengths; share of tokens (by prompt and position) leaving at the same exit layer."""
    m = a.requests.merge(b.requests, on="prompt", suffixes=("_a", "_b"))
    same = (m.model_a == m.model_b) & (m.depth_a == m.depth_b)
    ev_a = [(i, s.event, s.model, s.depth) for i, s in a.events]
    ev_b = [(i, s.event, s.model, s.depth) for i, s in b.events]
    tokens = same_exit = 0
    for xa, xb in zip(m.exit_layers_a, m.exit_layers_b):
        tokens += max(len(xa), len(xb))
        same_exit += sum(x == y for x, y in zip(xa, xb))
    return {"prompts": float(same.mean()), "events_equal": ev_a == ev_b,
            "events": len(ev_a), "same_output_tokens": float(
                (m.output_tokens_a == m.output_tokens_b).mean()),
            "same_exit_layers": same_exit / tokens if tokens else math.nan}
