"""Figures of sweeps and capacity searches (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path


def plot_capacity(answers: list, path: str | Path) -> Path:
    """The metric at every probe (mean and interval over seeds) per policy, the target, and
    each policy's answer with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, a in enumerate(answers):
        p = a.probes.sort_values("value")
        color = f"C{i}"
        ax.errorbar(p["value"], p["mean"], yerr=[p["mean"] - p["lo"], p["hi"] - p["mean"]],
                    fmt="o-", ms=3, lw=1, capsize=2, color=color, label=a.label)
        if a.answer is not None:
            lo, hi = (v if v is not None else a.answer for v in a.interval)
            ax.axvspan(lo, hi, color=color, alpha=0.08)
            ax.axvline(a.answer, color=color, ls=":", lw=1)
    q = answers[0].question
    ax.axhline(q.target, color="gray", ls="--", lw=0.8)
    ax.set_xlabel("arrival rate (1/s)" if q.over == "rate" else "replicas")
    ax.set_ylabel(f"{q.metric} (mean, {q.level:.0%} CI over {len(q.seeds)} seeds)")
    if q.over == "rate":
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
