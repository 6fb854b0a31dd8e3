"""Report folder of a simulation: PNG plots and one Markdown page."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.metrics import latency_columns


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 120) -> Path:
    """Write a figure (creating its folder), close it, and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def latency_cdfs(requests: pd.DataFrame, path: Path) -> Path:
    """TTFT / TPOT / e2e CDFs of one run."""
    plt = pyplot()
    lat = latency_columns(requests)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, col in zip(axes, lat.columns):
        v = np.sort(lat[col].dropna().to_numpy())
        ax.plot(v, np.arange(1, v.size + 1) / max(v.size, 1))
        ax.set_xlabel(col.replace("_s", " (s)"))
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def attainment_vs_rate(sweep: pd.DataFrame, path: Path) -> Path:
    """SLO attainment and P90 TTFT against arrival rate."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(sweep.rate_per_s, sweep.slo_attainment, "o-")
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel("SLO attainment")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def utilisation(busy_by_replica: np.ndarray, path: Path) -> Path:
    """Busy share per replica."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.bar(np.arange(len(busy_by_replica)), busy_by_replica)
    ax.set_xlabel("replica")
    ax.set_ylabel("busy share")
    ax.set_ylim(0, 1.02)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(title: str, summary: dict, sweep: pd.DataFrame, images: list[str]) -> str:
    """The report page."""
    lines = [f"# {title}", "", "| metric | mean | p50 | p90 | p99 |", "|---|---|---|---|---|"]
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        s = summary[key]
        lines.append(f"| {key} | {s['mean']:.4f} | {s['p50']:.4f} | {s['p90']:.4f} | "
                     f"{s['p99']:.4f} |")
    lines += ["", "| quantity | value |", "|---|---|"]
    for key in ("requests", "replicas", "throughput_tok_s", "slo_attainment", "utilization",
                "kv_usage_mean", "preemptions", "events", "events_per_request", "wall_s"):
        if key in summary:
            v = summary[key]
            lines.append(f"| {key} | {v:.4g} |" if isinstance(v, float) else f"| {key} | {v} |")
    lines += ["", "## SLO attainment vs arrival rate", "",
              "| " + " | ".join(sweep.columns) + " |", "|" + "---|" * len(sweep.columns)]
    lines += ["| " + " | ".join(f"{v:.4g}" for v in row) + " |"
              for row in sweep.itertuples(index=False)]
    lines.append("")
    lines += [f"![{img}]({img})" for img in images]
    return "\n".join(lines) + "\n"
