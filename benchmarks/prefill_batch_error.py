"""How a calibration prices a grid's prefill-only steps, by prompts per step and tokens.

    python benchmarks/prefill_batch_error.py GRID_TRACE CALIBRATION [--exact] [--json]

Median of measured / predicted (the step-time model at its mean fit, no residual factor) per
(prefill sequences, prefill tokens) band (`--exact`: per token count, with the measured and
predicted ms; steps of a shape seen before only). The serving model's attention term is prefill tokens x
the step's summed context, which for b equal prompts is b times the true sum of each prompt's
tokens x its own context: if the fit compromises over b, one-prompt steps of many tokens come
out slow against it and many-prompt steps fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time import registry as step_time  # noqa: E402
from sim.step_time.live_speed import live_over_predicted  # noqa: E402
from traces import read_table  # noqa: E402

BANDS = [0, 256, 1024, 2048, 4096]


def table(grid: Path, calibration: Path, exact: bool = False) -> pd.DataFrame:
    """Median ratio and count per (prefill_seqs, prefill-token band) of prefill-only steps;
    `exact`: per token count, seen shapes only, with measured and predicted ms."""
    model = step_time.from_json(json.loads(calibration.read_text())["step_time_model"])
    ratio, steps = live_over_predicted(model, read_table(grid, "steps").to_pandas())
    steps = steps.assign(ratio=ratio, predicted_ms=steps.duration_ms / ratio)
    p = steps[(steps.prefill_tokens > 0) & (steps.decode_seqs == 0)]
    if exact:
        p = p[p.new_shape == 0] if "new_shape" in p else p
        return p.groupby(["prefill_seqs", "prefill_tokens"]).agg(
            ms=("duration_ms", "median"), predicted_ms=("predicted_ms", "median"),
            ratio=("ratio", "median"), steps=("ratio", "size")).reset_index()
    return p.groupby(["prefill_seqs", pd.cut(p.prefill_tokens, BANDS)], observed=True).ratio \
        .agg(["median", "size"]).reset_index()


def main() -> None:
    """Print the table (or JSON rows)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("grid", type=Path)
    ap.add_argument("calibration", type=Path)
    ap.add_argument("--exact", action="store_true", help="per token count, not per band")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t = table(args.grid, args.calibration, args.exact)
    t["prefill_tokens"] = t.prefill_tokens.astype(str)
    print(t.to_json(orient="records") if args.json else t.round(3).to_string(index=False))


if __name__ == "__main__":
    main()
