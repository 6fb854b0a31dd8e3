"""Prefill steps over cached context: live time over the calibration's prediction, by shape.

    python benchmarks/prefill_context_error.py RUN [--calibration CAL.json] [--workloads A,B]

For each workload of a `reasonsim fidelity` run (RUN), its live runs' prefill steps (spans and
attention pairs attached as `calibrate` fits them: `sim.step_time.live_speed.step_ratios`),
each over the same run's decode level (the median of its decode steps' ratio), so the machine's
speed of the moment is out: grouped by the step's new prefill tokens, the earlier context its
chunks attend to (a prefix-cache hit or an earlier chunk) and whether decodes share the step.
A group at 1 is priced right; one above 1 runs slower than the model says. CAL (default RUN's
own calibration) lets two step-time models be compared on the same live steps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time.live_speed import step_ratios  # noqa: E402

NEW_TOKENS = (0, 64, 256, 512, 1024, 4096)
CACHED_TOKENS = (-1, 0, 256, 512, 1024, 4096)


def prefill_steps(run: Path, calibration: Path, workload: str) -> pd.DataFrame:
    """A workload's live prefill steps with `rel`, their ratio over their run's decode level."""
    frames = []
    for live in sorted((run / workload).glob("live[0-9]*")):
        got = step_ratios(calibration, live)
        if got is None:
            continue
        ratio, steps = got
        steps = steps.assign(ratio=ratio)
        level = steps.ratio[steps.prefill_tokens.eq(0)].median()
        frames.append(steps[steps.prefill_tokens.gt(0)].assign(rel=lambda s: s.ratio / level))
    return pd.concat(frames) if frames else pd.DataFrame()


def by_shape(pre: pd.DataFrame) -> pd.DataFrame:
    """Median `rel` and count per (new tokens, cached context, with decodes) group."""
    return pre.groupby([pd.cut(pre.prefill_tokens, NEW_TOKENS).rename("new tokens"),
                        pd.cut(pre.span_context_tokens, CACHED_TOKENS).rename("earlier context"),
                        pre.decode_seqs.gt(0).rename("with decodes")],
                       observed=True).rel.agg(["median", "count"])


def main() -> None:
    """Print each workload's table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--calibration", type=Path)
    ap.add_argument("--workloads", help="comma-separated (default: every one with live runs)")
    args = ap.parse_args()
    cal = args.calibration or args.run / "calibration.json"
    names = args.workloads.split(",") if args.workloads else sorted(
        {p.parent.name for p in args.run.glob("*/live[0-9]*")})
    for name in names:
        pre = prefill_steps(args.run, cal, name)
        if not len(pre):
            continue
        print(f"## {name}: {len(pre)} prefill steps, median {pre.rel.median():.3f} of the "
              "decode level")
        print(by_shape(pre).round(3).to_string(), end="\n\n")


if __name__ == "__main__":
    main()
