"""Candidate serving-model terms for prefills over prefix-cache hits, fitted and scored offline.

    python benchmarks/prefix_hit_terms.py RUN [RUN ...] [--terms hit_pairs,hit_context]

For each `reasonsim fidelity` run: the serving model refitted on the run's own calibration
traces (greedy ones: grid and calibration traffic, as `calibrate` fits them, NNLS on relative
error) with each candidate term added beside the shipped ones, then every live run's prefill
steps of the run's prefix-caching workloads over that refit's prediction and over the run's
decode level (`benchmarks/prefill_context_error.py`'s `rel`): the median by the earlier context
their chunks attend to. A candidate that prices hits right moves every band toward 1 without
moving steps over no earlier context. The candidates tell a hit from a chunk of a long prompt
by the engine: in a trace of an engine with prefix caching, a step whose chunk attends to
earlier context is taken as a hit (traces do not record which it was).

The shipped terms include `hit_pairs_m`: each chunk's new tokens x its own earlier context
(`step_prefill.prefill_span_pair_tokens`). The candidates:

- hit_per_step: that term counted per step instead, the step's prefill tokens x its summed
  earlier context (what traces recorded before the column give; k chunks' cross terms counted
  k times over)
- hit_context: the earlier context of such steps
- hit_step: 1 on such steps (a fixed cost per hit step)
- prefill_seqs: the step's prefill chunks beyond its first (a cost per prefill sequence the
  decode-sequence term does not charge; any engine, hit or not)

Each row gives the bands for every prefill step, then for spanning steps of one chunk and of
several (where per step and per chunk differ).
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

from sim.step_time.serving_features import (FEATURES, HIT, attach_spans,  # noqa: E402
                                            engine_features, feature_matrix)
from traces import read_table  # noqa: E402
from traces.store import read_run  # noqa: E402

BANDS = (-1, 0, 256, 512, 1024, 4096)
TERMS = ("hit_per_step", "hit_context", "hit_step", "prefill_seqs")


def caches_prefixes(trace_dir: Path) -> bool:
    """Whether the trace's engine ran with prefix caching."""
    p = json.loads(read_run(trace_dir)["params_json"])
    return bool(p.get("engine", {}).get("enable_prefix_caching") or any(
        r.get("enable_prefix_caching") for r in p.get("config", {}).get("replicas", [])))


def usable(dirs: list) -> pd.DataFrame:
    """Steps with engine features and spans, each flagged `hits` (its engine caches)."""
    frames = [read_table(d, "steps").to_pandas().assign(hits=caches_prefixes(Path(d)))
              for d in dirs]
    steps = engine_features(attach_spans(pd.concat(frames, ignore_index=True), dirs))
    return steps[steps.duration_ms > 0]


def design(steps: pd.DataFrame, terms: tuple) -> np.ndarray:
    """The serving model's features, then each candidate term's column."""
    p = steps.prefill_tokens.to_numpy(float)
    span = steps.span_context_tokens.to_numpy(float)
    hit = steps.hits.to_numpy() & (span > 0)
    x = feature_matrix(steps)
    if "hit_per_step" in terms:  # in the shipped term's place
        x[:, HIT] = np.where(hit, p * span / 1e6, 0.0)
    cols = {"hit_context": np.where(hit, span / 1e3, 0.0), "hit_step": hit.astype(float),
            "prefill_seqs": np.maximum(steps.prefill_seqs.to_numpy(float) - 1.0, 0.0)}
    return np.column_stack([x] + [cols[t] for t in terms if t in cols])


def fit(steps: pd.DataFrame, terms: tuple) -> tuple[np.ndarray, float]:
    """NNLS on relative error, as `fit_serving`; (coefficients, the fit's own median ratio)."""
    x, y = design(steps, terms), steps.duration_ms.to_numpy(float)
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls((x / scale) / y[:, None], np.ones_like(y))
    coef = coef / scale
    return coef, float(np.exp(np.median(np.log(y / (x @ coef)))))


def scored(run: Path, coef: np.ndarray, own: float, terms: tuple) -> pd.DataFrame:
    """Prefill steps of the run's prefix-caching live runs with `rel` under the refit."""
    out = []
    for live in sorted(run.glob("*/live[0-9]*")):
        if not caches_prefixes(live):
            continue
        s = usable([live])
        s = s.assign(r=s.duration_ms.to_numpy() / (design(s, terms) @ coef) / own)
        level = s.r[s.prefill_tokens.eq(0)].median()
        out.append(s[s.prefill_tokens.gt(0)].assign(rel=lambda t: t.r / level,
                                                    workload=live.parent.name))
    return pd.concat(out) if out else pd.DataFrame()


def _band(iv) -> str:
    return "none" if iv.right <= 0 else f"{iv.left + 1:.0f}-{iv.right:.0f}"


def main() -> None:
    """Print, per run and candidate, its coefficients and the bands' medians."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--terms", default=",".join(TERMS))
    args = ap.parse_args()
    candidates = [()] + [(t,) for t in args.terms.split(",")]
    print("| run | term | hit, its coefficient (ms) | prefill steps by earlier context: median "
          "rel (count) | spanning, one chunk | spanning, several |")
    print("|---|---|---|---|---|---|")
    for run in args.runs:
        cal = json.loads((run / "calibration.json").read_text())
        train = usable([d for d in cal["provenance"]["traces"] if "sampling" not in Path(d).name])
        for terms in candidates:
            coef, own = fit(train, terms)
            pre = scored(run, coef, own, terms)
            if not len(pre):
                break
            bands = pre.groupby(pd.cut(pre.span_context_tokens, BANDS), observed=True).rel
            cells = ", ".join(f"{_band(iv)}: {m:.3f} ({n})" for iv, m, n in
                              zip(bands.median().index, bands.median(), bands.size()))
            extra = ", ".join(f"{c:.4g}" for c in [coef[HIT], *coef[len(FEATURES):]])
            span = pre[pre.span_context_tokens.gt(0)]
            chunks = [f"{x.rel.median():.3f} ({len(x)})" if len(x) else "-"
                      for x in (span[span.prefill_seqs.eq(1)], span[span.prefill_seqs.gt(1)])]
            print(f"| {run.name} | {'+'.join(terms) or 'shipped terms'} | {extra} | {cells} | "
                  f"{chunks[0]} | {chunks[1]} |")


if __name__ == "__main__":
    main()
