"""Sim-vs-live validation: the same metrics on both requests tables, relative error per row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.metrics import latency_columns, summarize
from traces import read_table


def compare(sim_dir: str | Path, live_dir: str | Path) -> dict:
    """{metric: {sim, live, rel_err}} for TTFT/TPOT/e2e mean,P50,P90,P99 and throughput."""
    sim = read_table(sim_dir, "requests").to_pandas()
    live = read_table(live_dir, "requests").to_pandas()
    missing = set(live.request_id) ^ set(sim.request_id)
    if missing:
        raise ValueError(f"{sim_dir} and {live_dir} hold different requests (e.g. "
                         f"{sorted(missing)[0]}): not the same workload")
    s, l_ = summarize(sim), summarize(live)
    rows = {}
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        for stat in ("mean", "p50", "p90", "p99"):
            rows[f"{metric}.{stat}"] = (s[metric][stat], l_[metric][stat])
    rows["throughput_tok_s"] = (s["throughput_tok_s"], l_["throughput_tok_s"])
    return {k: {"sim": float(a), "live": float(b),
                "rel_err": float((a - b) / b) if b else float("nan")} for k, (a, b) in rows.items()}


def plot_cdfs(sim_dir: str | Path, live_dir: str | Path, out_dir: str | Path) -> Path:
    """Overlaid CDFs of TTFT, TPOT and end-to-end latency; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim = latency_columns(read_table(sim_dir, "requests").to_pandas())
    live = latency_columns(read_table(live_dir, "requests").to_pandas())
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, col in zip(axes, ("ttft_s", "tpot_s", "e2e_s")):
        for df, label, style in ((live, "live (vLLM)", "-"), (sim, "simulated", "--")):
            v = np.sort(df[col].dropna().to_numpy())
            ax.plot(v, np.arange(1, v.size + 1) / max(v.size, 1), style, label=label)
        ax.set_xlabel(col.replace("_s", " (s)"))
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "validate_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def per_request_error(sim_dir: str | Path, live_dir: str | Path) -> pd.DataFrame:
    """Per-request latency of sim and live joined on request_id."""
    sim = read_table(sim_dir, "requests").to_pandas().set_index("request_id")
    live = read_table(live_dir, "requests").to_pandas().set_index("request_id")
    a, b = latency_columns(sim), latency_columns(live)
    return a.join(b, lsuffix="_sim", rsuffix="_live")
