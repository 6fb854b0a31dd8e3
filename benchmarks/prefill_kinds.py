"""How a fidelity run's calibration prices prefill steps, by idle before them and attention span.

    reasonsim fidelity -o RUN
    python benchmarks/prefill_kinds.py RUN [--json]

For the run's grid, calibration traffic and first live run of each request workload: the median
of measured / predicted (the serving model at its mean fit) over one-sequence-or-more prefill
steps without decodes, per band of idle before the step and by prefill sequences and tokens
(median ms beside the ratio: what a model with one attention term must price), and over all
prefill steps split into
those whose chunks attend to tokens computed before them (prefix-cache hits, later chunks) and
those that do not (`step_prefill`; traces recorded before it have no split). Then the same split
under a refit in which `step_prefill`'s new x spanned tokens replaces prefill x context (whose
context counts the decode sequences' too) and prefill^2 / sequences: whether the span prices
cached and chunked prefills better (fitted here on the calibration's traces, greedy terms only).
Last, warm prefill steps (<= 1 ms idle before them, not a new shape) of the calibration's traces and
of the live runs: the step's measured time less every term of the prediction but the
prefill-step constant and the spanned-context term, by prefill tokens and by the earlier context
their chunks attend to (median), beside what the model charges for it.
Program workloads' steps also pay seeded sampling and log-probabilities, which the ratio leaves
in the measured time and out of the prediction: a ratio under 1 there is an overpriced step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time import registry as step_time  # noqa: E402
from sim.step_time import serving_latency  # noqa: E402, F401  (registers `serving`)
from sim.step_time.serving_features import (  # noqa: E402
    attach_spans, engine_features, feature_matrix)
from traces import read_table  # noqa: E402

IDLE_BANDS_MS = [-1, 1, 10, 50, 150, 300, 1000, 1e6]
CONTEXT_BANDS = [-1, 0, 128, 256, 512, 1024, 2048, 1e6]
TOKEN_BANDS = [0, 32, 128, 512, 2048]
SHAPE_BANDS = [0, 256, 512, 1024, 1536, 2048]
PREFILL_STEP, SPAN_CONTEXT = 5, 15
"""the prefill-step constant's and the spanned-context term's places in FEATURES"""


def _steps(trace: Path) -> pd.DataFrame:
    s = read_table(trace, "steps").to_pandas()
    cols = ["replica_id", "step_id", "prefill_context_tokens"]  # attach_spans adds the pairs
    span = read_table(trace, "step_prefill").to_pandas()[cols] \
        if (trace / "step_prefill").is_dir() else pd.DataFrame(columns=cols)  # older traces
    s = attach_spans(s, [trace]).merge(span, on=["replica_id", "step_id"], how="left")
    s = engine_features(s)
    return s[s.duration_ms > 0]


def _span_matrix(s: pd.DataFrame) -> np.ndarray:
    x = feature_matrix(s)
    x[:, 4] = s.prefill_pair_tokens.fillna(0).to_numpy(float) / 1e3
    x[:, 10] = 0.0
    return x


def _refit(steps: pd.DataFrame) -> np.ndarray:
    y = steps.duration_ms.to_numpy(float)
    x = _span_matrix(steps)
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls((x / scale) / y[:, None], np.ones_like(y))
    return coef / scale


def table(run: Path) -> dict:
    """Idle-band and span rows for the run's traces."""
    cal = json.loads((run / "calibration.json").read_text())
    model = step_time.from_json(cal["step_time_model"])
    fitted = [Path(p) for p in cal["provenance"]["traces"]]
    lives = sorted(d / "live1" for d in run.iterdir() if (d / "live1" / "steps").is_dir())
    traces = {p.name: _steps(p) for p in fitted} | {p.parent.name: _steps(p) for p in lives}
    coef = _refit(pd.concat([traces[p.name] for p in fitted]))
    idle, span, warm, shapes = [], [], [], []
    c = np.asarray(model.coef_ms)
    for name, s in traces.items():
        ratio = s.duration_ms.to_numpy() / model.predict_ms(s)
        refit = s.duration_ms.to_numpy() / (_span_matrix(s) @ coef)
        pre = s.prefill_tokens.to_numpy() > 0
        alone = pre & (s.decode_seqs.to_numpy() == 0)
        band = pd.cut(s.idle_ms[alone], IDLE_BANDS_MS)
        for b, r in pd.Series(ratio[alone]).groupby(band.to_numpy(), observed=True):
            idle.append({"trace": name, "idle_ms": str(b), "ratio": float(r.median()),
                         "steps": int(r.size)})
        spanning = (s.prefill_context_tokens > s.prefill_tokens).to_numpy() & pre
        known = s.prefill_context_tokens.notna().to_numpy() & pre
        for kind, m in (("fresh", known & ~spanning), ("spanning", spanning)):
            if m.any():
                span.append({"trace": name, "prefills": kind, "ratio": float(np.median(
                    ratio[m])), "ratio_span_refit": float(np.median(refit[m])),
                    "steps": int(m.sum())})
        for (seqs, band), g in pd.DataFrame({"seqs": s.prefill_seqs, "ms": s.duration_ms,
                                             "ratio": ratio}).loc[alone].groupby(
                [s.prefill_seqs[alone], pd.cut(s.prefill_tokens[alone], SHAPE_BANDS)],
                observed=True):
            shapes.append({"trace": name, "prefill_seqs": int(seqs), "prefill_tokens": str(band),
                           "ms": float(g.ms.median()), "ratio": float(g.ratio.median()),
                           "steps": int(len(g))})
        x = feature_matrix(s, model.idle_seen_ms, model.new_shape_cap_tokens,
                           getattr(model, "pairs", False))
        left = s.duration_ms.to_numpy() - x @ c + x[:, PREFILL_STEP] * c[PREFILL_STEP] \
            + x[:, SPAN_CONTEXT] * c[SPAN_CONTEXT]
        m = pre & (s.idle_ms.to_numpy() <= 1.0) & (s.new_shape.to_numpy() == 0)
        earlier = (s.prefill_context_tokens.fillna(0) - s.prefill_tokens).clip(lower=0)
        warm.append(pd.DataFrame({
            "traces": "calibration" if name in {p.name for p in fitted} else "live",
            "prefill_tokens": pd.cut(s.prefill_tokens[m], TOKEN_BANDS).astype(str).to_numpy(),
            "earlier_context": pd.cut(earlier[m], CONTEXT_BANDS).astype(str).to_numpy(),
            "left_ms": left[m]}))
    warm = pd.concat(warm).groupby(["traces", "prefill_tokens", "earlier_context"], sort=False)
    warm = [{"traces": k[0], "prefill_tokens": k[1], "earlier_context": k[2],
             "left_ms": float(v.median()), "steps": int(v.size)} for k, v in warm.left_ms]
    model_ms = {str(b): c[PREFILL_STEP] + c[SPAN_CONTEXT] * max(b.mid, 0.0) / 1e3
                for b in pd.cut([], CONTEXT_BANDS).categories if b.right < 1e6}
    return {"idle": idle, "span": span, "warm": warm, "warm_model_ms": model_ms,
            "shapes": shapes}


def main() -> None:
    """Print both tables (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a `reasonsim fidelity -o` directory")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t = table(args.run)
    if args.json:
        print(json.dumps(t))
        return
    idle = pd.DataFrame(t["idle"])
    print("prefill-only steps, measured / predicted by idle before them (median, steps):")
    print(idle.pivot(index="idle_ms", columns="trace", values="ratio").round(3)
          .reindex([str(b) for b in pd.cut([], IDLE_BANDS_MS).categories]).dropna(how="all")
          .to_string())
    print("\nprefill-only steps by prefill sequences and tokens: median ms, measured / "
          "predicted, steps")
    shapes = pd.DataFrame(t["shapes"]).set_index(["trace", "prefill_seqs", "prefill_tokens"])
    print(shapes.round(3).to_string())
    print("\nprefill steps by attention span (median measured / predicted):")
    print(pd.DataFrame(t["span"]).round(3).to_string(index=False))
    warm = pd.DataFrame(t["warm"])
    if warm.empty:
        return
    print("\nwarm prefill steps: ms left to the prefill-step constant and the spanned-context "
          "term (median; the model charges",
          ", ".join(f"{k}: {v:.2f}" for k, v in t["warm_model_ms"].items()) + " ms)")
    order = [str(b) for b in pd.cut([], CONTEXT_BANDS).categories]
    rows = [(g, str(b)) for g in ("calibration", "live")
            for b in pd.cut([], TOKEN_BANDS).categories]
    for values in ("left_ms", "steps"):
        print(warm.pivot_table(index=["traces", "prefill_tokens"], columns="earlier_context",
                               values=values, aggfunc="sum").reindex(index=rows, columns=order)
              .dropna(how="all").dropna(axis=1, how="all").round(2).to_string())


if __name__ == "__main__":
    main()
