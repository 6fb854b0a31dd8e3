"""Counterfactual early exits from an exits trace: any threshold, any loaded depth.

The trace holds, per output token, every exit's max probability and argmax (greedy, full depth).
Under threshold t a token exits at the first layer whose max probability reaches t (else the last
layer); with D layers loaded it leaves at layer D and counts as a confidence breach when its
max probability there is below t (HELIOS's CBC). Tokens are taken as traced: replaying a
threshold does not regenerate the stream after an early token that differs from the final one,
which the `agree` columns measure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from policies.exit_tokens import first_exits
from traces.store import read_run, read_table


@dataclass
class ExitMatrix:
    """Per token (rows, in stream order) and exit layer (columns): max probability and argmax."""

    model_id: str
    request_ids: np.ndarray
    max_prob: np.ndarray
    argmax: np.ndarray

    @property
    def layers(self) -> int:
        """Exits per token (the model's depth)."""
        return self.max_prob.shape[1]

    def exit_layers(self, threshold: float, depth: int | None = None) -> np.ndarray:
        """1-based exit layer of every token under `threshold` with `depth` layers loaded."""
        d = depth or self.layers
        return first_exits(self.max_prob[:, :d], threshold) + 1


def load_exits(trace_dir: str | Path, depth: int | None = None) -> ExitMatrix:
    """The stream generated with `depth` layers loaded (default: all) as a token x exit matrix."""
    run = read_run(trace_dir)
    if run["kind"] != "exits":
        raise ValueError(f"{trace_dir}: a {run['kind']!r} trace; expected an exits trace "
                         "(reasonsim trace exits)")
    df = read_table(trace_dir, "exits").to_pandas()
    if df.empty:
        raise ValueError(f"{trace_dir}: the exits table is empty")
    depth = int(df.loaded_layers.max()) if depth is None else depth
    df = df[df.loaded_layers == depth]
    if df.empty:
        raise ValueError(f"{trace_dir}: no tokens generated with {depth} layers loaded")
    layers = depth
    if int(df.layer.max()) > depth:  # each token's exits are layers 1..depth, once each
        raise ValueError(f"{trace_dir}: an exit at layer {int(df.layer.max())}, past the "
                         f"{depth} layers loaded")
    counts = df.groupby(["request_id", "token_index"]).layer.nunique()
    if (counts != layers).any() or len(df) != len(counts) * layers:
        r, i = counts.index[(counts != layers).to_numpy()][0] if (counts != layers).any() \
            else counts.index[0]
        raise ValueError(f"{trace_dir}: token {i} of request {r} lacks an exit or has one "
                         f"twice (expected layers 1..{layers} once each)")
    reqs = read_table(trace_dir, "requests").to_pandas()
    reqs = reqs[reqs.request_id.isin(set(df.request_id))].sort_values("arrival_s", kind="stable")
    order = {r: i for i, r in enumerate(reqs.request_id)}
    df["order"] = df.request_id.map(order)
    if df.order.isna().any():
        raise ValueError(f"{trace_dir}: exits name requests missing from the requests table")
    df = df.sort_values(["order", "token_index", "layer"])
    first = df[df.layer == 1]
    return ExitMatrix(model_id=str(run["model_id"]), request_ids=first.request_id.to_numpy(),
                      max_prob=df.max_prob.to_numpy(np.float64).reshape(-1, layers),
                      argmax=df.token_id.to_numpy(np.int64).reshape(-1, layers))


def exit_summary(m: ExitMatrix, thresholds: list[float]) -> list[dict]:
    """Per threshold: exit-layer shares, mean exit layer, and early-token-equals-final share."""
    rows = []
    final = m.argmax[:, -1]
    for t in thresholds:
        e = m.exit_layers(t)
        token = m.argmax[np.arange(len(e)), e - 1]
        shares = np.bincount(e, minlength=m.layers + 1)[1:] / len(e)
        early = e < m.layers
        rows.append({"threshold": t, "tokens": len(e), "mean_exit_layer": float(e.mean()),
                     "exit_share": [float(x) for x in shares],
                     "early_share": float(early.mean()),
                     "early_equals_final": float((token[early] == final[early]).mean())
                     if early.any() else float("nan"),
                     "agree_with_final": float((token == final).mean())})
    return rows


def depth_summary(m: ExitMatrix, threshold: float) -> list[dict]:
    """Per loaded depth D: confidence-breach rate at D and agreement of D's token with the final."""
    final = m.argmax[:, -1]
    return [{"depth": d, "breach_rate": float((m.max_prob[:, d - 1] < threshold).mean()),
             "agree_with_final": float((m.argmax[:, d - 1] == final).mean())}
            for d in range(1, m.layers + 1)]


def plot_exit_shares(summaries: dict[str, list[dict]], path: str | Path) -> None:
    """Stacked exit-layer shares per model and threshold."""
    from sim.report import pyplot, save_figure

    plt = pyplot()

    fig, axes = plt.subplots(1, len(summaries), figsize=(5 * len(summaries), 3.6), squeeze=False)
    for ax, (model, rows) in zip(axes[0], summaries.items()):
        labels = [f"{r['threshold']:g}" for r in rows]
        bottom = np.zeros(len(rows))
        for layer in range(len(rows[0]["exit_share"])):
            share = np.array([r["exit_share"][layer] for r in rows])
            ax.bar(labels, share, bottom=bottom, label=f"layer {layer + 1}")
            bottom += share
        ax.set_title(model)
        ax.set_xlabel("exit threshold (max softmax probability)")
        ax.set_ylabel("share of tokens")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    save_figure(fig, path)
