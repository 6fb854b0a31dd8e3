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


def plot_points(table, metrics: list[str], path: str | Path) -> Path | None:
    """Each metric (mean and interval over seeds) against the sweep's first override that
    varies, one line per value of the other varying ones (and per policy where a point has
    several): HELIOS's Fig 17 from a sweep of its interval or threshold. None where the sweep
    has a single point."""
    from sim.report import pyplot, save_figure

    keys = [c for c in table.columns if c not in {"point_id", "seeds"} and
            not c.startswith(tuple(metrics)) and table[c].astype(str).nunique() > 1]
    if not keys:
        return None
    x_key, line_keys = keys[0], keys[1:]
    xs = list(dict.fromkeys(table[x_key].astype(str)))  # categorical: values may be "auto"
    plt = pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics) + 2.5, 4),
                             squeeze=False, layout="constrained")
    groups = table.groupby(line_keys, sort=False, dropna=False) if line_keys else [("", table)]
    for label, g in groups:
        at = [xs.index(v) for v in g[x_key].astype(str)]
        name = ", ".join(map(str, label)) if isinstance(label, tuple) else str(label)
        for ax, m in zip(axes[0], metrics):
            ax.errorbar(at, g[m], yerr=[g[m] - g[f"{m}.lo"], g[f"{m}.hi"] - g[m]], fmt="o-",
                        ms=3, lw=1, capsize=2, label=name or None)
    for ax, m in zip(axes[0], metrics):
        ax.set_xticks(range(len(xs)), xs)
        ax.set(xlabel=x_key, ylabel=m)
        ax.grid(alpha=0.3)
    if line_keys:
        fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside right upper",
                   fontsize=7)
    return save_figure(fig, path)
