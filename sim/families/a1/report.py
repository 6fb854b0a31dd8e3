"""A1 figures: rejection rate vs alpha, tokens to accuracy (from `a1 offline` rows), and
simulated latency vs samples per variant (`a1 samples`)."""

from __future__ import annotations

from pathlib import Path

from policies.a1 import COVERAGES


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_rates(rows: list[dict], path: str | Path) -> None:
    """Rejection rate vs alpha, marginal and conditional, with the diagonal."""
    plt = _plt()
    m = max(r["samples"] for r in rows)
    fig, ax = plt.subplots(figsize=(4.5, 4))
    for cov, marker in zip(COVERAGES, "os"):
        pts = sorted((r["alpha"], r["rejection_rate"]) for r in rows
                     if r["coverage"] == cov and r["samples"] == m)
        ax.plot(*zip(*pts), marker=marker, label=f"{cov} coverage")
    ax.plot([0, 1], [0, 1], "k--", lw=0.8, label="rate = alpha")
    lim = max(r["alpha"] for r in rows if r["alpha"] is not None) + 0.1
    ax.set(xlim=(0, lim), ylim=(0, lim), xlabel="alpha", ylabel="realised rejection rate",
           title=f"A1: target interventions, {m} samples")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_tokens_accuracy(rows: list[dict], path: str | Path) -> None:
    """Majority-vote accuracy against target-side tokens per question (generated + scored),
    at the largest sample count, and against the sample count."""
    plt = _plt()
    m = max(r["samples"] for r in rows)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 4))
    for cov, marker in zip(COVERAGES, "os"):
        pts = sorted((r["alpha"], (r["target_tokens"] + r["score_prefill_tokens"]) /
                      r["questions"], r["accuracy_vote"]) for r in rows
                     if r["coverage"] == cov and r["samples"] == m)
        ax.plot([p[1] for p in pts], [p[2] for p in pts], marker=marker,
                label=f"A1 {cov} (alpha {pts[0][0]:g}..{pts[-1][0]:g})")
    pts = sorted(((r["target_tokens"] + r["score_prefill_tokens"]) / r["questions"],
                  r["accuracy_vote"]) for r in rows
                 if r.get("max_score") is not None and r["samples"] == m)
    if pts:
        ax.plot(*zip(*pts), marker="d", ls=":", label="fixed threshold (SpecReason-style)")
    for name, marker in (("draft-only", "v"), ("target-only", "^")):
        r = next(r for r in rows if r["policy"] == name and r["samples"] == m)
        ax.plot([(r["target_tokens"] + r["score_prefill_tokens"]) / r["questions"]],
                [r["accuracy_vote"]], marker, ms=9, label=name)
    ax.set(xlabel="target tokens per question (generated + scored)",
           ylabel=f"majority-vote accuracy ({m} samples)", title="Tokens to accuracy")
    ax.legend(fontsize=8)
    for name in ("draft-only", "target-only", "conformal-marginal-0.4",
                 "conformal-marginal-0.6", "conformal-conditional-0.6"):
        pts = sorted((r["samples"], r["accuracy_vote"]) for r in rows if r["policy"] == name)
        if pts:
            bx.plot(*zip(*pts), marker="o", label=name)
    bx.set(xscale="log", xlabel="samples per question", ylabel="majority-vote accuracy",
           title="Accuracy vs samples")
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_latency_vs_samples(rows: list[dict], path: str | Path) -> None:
    """Against samples, one line per variant: simulated program latency (P50, P90 dashed), the
    target's peak KV blocks (A1 Fig 1) and its mean FLOP per byte per step (Fig 4a)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for variant in dict.fromkeys(r["variant"] for r in rows):
        pts = sorted((r["samples"], r["p50_s"], r["p90_s"], r["target_kv_peak_blocks"],
                      r["target_flop_per_byte"]) for r in rows if r["variant"] == variant)
        x = [p[0] for p in pts]
        line, = axes[0].plot(x, [p[1] for p in pts], marker="o", label=variant)
        axes[0].plot(x, [p[2] for p in pts], "--", color=line.get_color())
        axes[1].plot(x, [p[3] for p in pts], marker="o", color=line.get_color())
        if all(p[4] is not None for p in pts):  # None: the model's config.json is not here
            axes[2].plot(x, [p[4] for p in pts], marker="o", color=line.get_color())
    axes[0].set(ylabel="program latency (s)", title="latency: P50 (solid), P90 (dashed)")
    axes[1].set(ylabel="target KV blocks, peak", title="target memory (Fig 1)")
    axes[2].set(ylabel="FLOP / byte (roofline estimate)", title="target intensity (Fig 4a)")
    for ax in axes:
        ax.set(xscale="log", xlabel="samples per question")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("A1 simulated against samples")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def simulate_variants(config: dict, base_dir, variants: dict, points: list[dict],
                      rate_per_s: float | None = None) -> list[dict]:
    """Simulate an A1 config under each policy variant (name -> policy mapping replacing the
    config's) at each point (policy settings over it: samples, turns), same workload and seed;
    one row each."""
    import copy

    from sim.config import parse_config
    from sim.families.a1.metrics import pool_intensity
    from sim.simulate import simulate

    rows = []
    for name, policy in variants.items():
        for point in points:
            d = copy.deepcopy(config)
            d["workload"]["programs"]["policy"] = {**policy, **point}
            if rate_per_s is not None:
                d["workload"]["programs"]["rate_per_s"] = rate_per_s
            d["output"] = {"steps": True}
            cfg = parse_config(d, base_dir)
            result = simulate(cfg)
            s = result.summary
            rows.append({"variant": name, **point,
                         "p50_s": s["program_latency_s"]["p50"],
                         "p90_s": s["program_latency_s"]["p90"], "accuracy": s["accuracy"],
                         "rejection_rate": s["rejection_rate"],
                         "async_arithmetic_intensity": s["async_arithmetic_intensity"],
                         "throughput_tok_s": s["throughput_tok_s"],
                         "programs_per_s": s["programs"] / s["makespan_s"],
                         "target_kv_peak_blocks": s["target_kv_peak_blocks"],
                         "target_flop_per_byte": pool_intensity(cfg, result.steps)})
    return rows


def plot_budget(rows: list[dict], path: str | Path) -> None:
    """Simulated throughput against the per-sample step budget (turns), one line per variant."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4))
    for variant in dict.fromkeys(r["variant"] for r in rows):
        pts = sorted((r["budget_tokens"], r["throughput_tok_s"]) for r in rows
                     if r["variant"] == variant)
        ax.plot(*zip(*pts), marker="o", label=variant)
    ax.set(xscale="log", xlabel="per-sample token budget (turns x step tokens)",
           ylabel="generated tokens / s", title="Simulated A1 throughput vs budget")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
