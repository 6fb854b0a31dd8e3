"""Speculative decoding measured on a trace (`seed offline`): acceptance distributions per K,
sampling mode, position and difficulty, and what a speculative step costs.

A spec trace (`reasonsim trace spec`) holds vLLM's own verify steps (`spec_steps`). A ToT trace
(`reasonsim trace tot`) holds program-level verifications in `tot_requests`: each full round of
a chain draft (K drafted tokens, not cut at the thought's end; tree drafts left out) is one
verify step of K, with the exact acceptance rule at the trace's temperature, which vLLM's CPU
build does not apply to sampled drafts (vllm-project/vllm#40149). The simulator's speculative
replicas draw accepted lengths from either (`sim.engine.spec_decode.from_trace`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from traces.store import read_run, read_table


def spec_rows(trace_dir: str | Path) -> pd.DataFrame:
    """Verify steps with the `spec_steps` columns acceptance reads: a spec trace's (or a
    speculative replay's) own, or a ToT trace's full chain-draft rounds (`request_id`: the
    program, one question's tree)."""
    run = read_run(trace_dir)
    if run["kind"] == "tot":
        settings = run["params"]["workload"]["settings"]
        k = int(settings["draft_tokens"])
        t = read_table(trace_dir, "tot_requests").to_pandas()
        # chain drafts only: tree programs (k_config) end in -k<config>
        v = t[(t.kind == "verify") & (t.drafted_tokens == k)
              & ~t.program_id.str.contains(r"-k[\d.]+$", regex=True)]
        return pd.DataFrame({
            "request_id": v.program_id, "proposed_tokens": v.drafted_tokens.astype(int),
            "accepted_tokens": v.accepted_tokens.astype(int),
            "accepted_positions": v.accepted_positions, "num_speculative_tokens": k,
            "temperature": float(settings["temperature"]), "difficulty": v.difficulty})
    spec = read_table(trace_dir, "spec_steps").to_pandas()
    if spec.empty:  # a spec trace, or a live replay of a speculative engine, records them
        raise ValueError(f"{trace_dir}: a {run['kind']} trace without verify steps: neither a "
                         "spec trace (reasonsim trace spec) nor a ToT trace")
    return spec


def load_spec(trace_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(verify steps, engine steps joined with their drafted tokens) of a spec trace; a ToT
    trace's program-level rounds have no engine steps of their own (None)."""
    spec = spec_rows(trace_dir)
    if read_run(trace_dir)["kind"] == "tot":
        return spec, None
    steps = read_table(trace_dir, "steps").to_pandas()
    drafted = spec.groupby("step_id").proposed_tokens.sum().rename("drafted_tokens")
    steps = steps.join(drafted, on="step_id")
    return spec, steps


def acceptance(spec: pd.DataFrame) -> list[dict]:
    """Per K x temperature: acceptance rate, mean accepted length, the accepted-length
    distribution, per-position acceptance, and the rate per difficulty level."""
    out = []
    for (k, temp), g in spec.groupby(["num_speculative_tokens", "temperature"]):
        lengths = np.bincount(g.accepted_tokens, minlength=k + 1)[:k + 1]
        pos = np.array([list(p) + [False] * (k - len(p)) for p in g.accepted_positions])
        out.append({
            "k": int(k), "temperature": float(temp), "steps": int(len(g)),
            "acceptance_rate": float(g.accepted_tokens.sum() / g.proposed_tokens.sum()),
            "mean_accepted": float(g.accepted_tokens.mean()),
            "tokens_per_step": float(g.accepted_tokens.mean() + 1),
            "accepted_length_share": [float(x) for x in lengths / lengths.sum()],
            "position_acceptance": [float(x) for x in pos.mean(axis=0)],
            "by_difficulty": {int(d): float(h.accepted_tokens.sum() / h.proposed_tokens.sum())
                              for d, h in g.groupby("difficulty")},
        })
    return out


def step_costs(spec: pd.DataFrame, steps: pd.DataFrame) -> list[dict]:
    """Per K and batch band: median step, drafting and verification milliseconds of the
    speculative (verify) steps."""
    per_step = spec.groupby("step_id").agg(k=("num_speculative_tokens", "first"),
                                           draft_ms=("draft_ms", "first"),
                                           verify_ms=("verify_ms", "first"),
                                           seqs=("request_id", "size"))
    per_step = per_step.join(steps.set_index("step_id").duration_ms)
    per_step["band"] = pd.cut(per_step.seqs, [0, 1, 4, 8, 16, 1 << 20],
                              labels=["1", "2-4", "5-8", "9-16", "17+"])
    rows = []
    for (k, band), g in per_step.groupby(["k", "band"], observed=True):
        rows.append({"k": int(k), "seqs": str(band), "steps": int(len(g)),
                     "step_ms": float(g.duration_ms.median()),
                     "draft_ms": float(g.draft_ms.median()),
                     "verify_ms": float(g.verify_ms.median())})
    return rows


def plot_acceptance(rows: list[dict], path: str | Path) -> None:
    """Accepted-length distribution per K x temperature."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    width = 0.8 / max(1, len(rows))
    for i, r in enumerate(rows):
        x = np.arange(len(r["accepted_length_share"])) + i * width
        ax.bar(x, r["accepted_length_share"], width,
               label=f"K={r['k']}, T={r['temperature']:g} (rate {r['acceptance_rate']:.2f})")
    ax.set(xlabel="draft tokens accepted in a step", ylabel="share of verify steps",
           title="Speculative decoding: accepted lengths")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
