"""HELIOS figures: throughput and batch by policy, the model/depth timeline (sim-vs-live:
`validation.helios`)."""

from __future__ import annotations

from pathlib import Path

from sim.families.helios.serving import HeliosResult
from sim.report import pyplot, save_figure


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




def plot_exit_shares(results: dict[str, HeliosResult], path: str | Path) -> Path:
    """Per policy, its output tokens stacked by model and exit layer (HELIOS Table 5)."""
    import numpy as np

    plt = pyplot()
    shares = {name: r.summary()["exit_shares"] for name, r in results.items()}
    keys = sorted({k for s in shares.values() for k in s})
    fig, ax = plt.subplots(figsize=(10, 3.8))
    bottom = np.zeros(len(shares))
    for k in keys:
        part = np.array([s.get(k, 0.0) for s in shares.values()])
        ax.bar(list(shares), part, bottom=bottom, label=k)
        bottom += part
    ax.set_ylabel("share of output tokens")
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="model@exit layer")
    fig.tight_layout()
    return save_figure(fig, path)
