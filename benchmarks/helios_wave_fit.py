"""How a layered step-time fit prices prefills larger than the waves it was fitted on.

    reasonsim trace exits --model models/testbed/target-large -o DIR \
        --waves 24,1,32,4,16,2,8,3,12 --prompts-per-phase 120 --ee-thresholds ''
    python benchmarks/helios_wave_fit.py DIR --fit-max 12

Fits the HELIOS layered model (`sim.families.helios.profile.fit_steps`) twice on one exits
trace's steps at a loaded depth: once on the steps that prefill at most `--fit-max` prompts
(with every decode step), once on all of them; prints, per prompts prefilled and depth, the
median traced step time over each fit's price. The steps above `--fit-max` are held out of the
first fit, so its column at those sizes is how a trace with smaller waves extrapolates; the
same steps timed by the same engine minutes apart, so the machine's drift is not in the ratio.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.families.helios.profile import fit_steps, traced_steps  # noqa: E402


def priced(model, steps: pd.DataFrame) -> np.ndarray:
    """Each step's price under a layered model at its own depth."""
    return model.steps_ms(steps.prefill_tokens, steps.decode_seqs, steps.attended_tokens,
                          steps.depth, steps.prefill_seqs)


def wave_table(trace_dir: Path, fit_max: int) -> pd.DataFrame:
    """Per (prompts prefilled, depth): steps, median ms, and traced over priced under the fit on
    waves up to `fit_max` and under the fit on all."""
    steps = traced_steps(trace_dir)
    steps = steps[steps.cell_id.str.startswith("depth")]
    layers = int(steps.depth.max())
    fits = {f"fit <= {fit_max}": fit_steps(steps[steps.prefill_seqs <= fit_max], layers),
            "fit all": fit_steps(steps, layers)}
    prefills = steps[steps.prefill_seqs > 0].copy()
    for name, model in fits.items():
        prefills[name] = prefills.duration_ms / priced(model, prefills)
    decodes = steps[steps.prefill_seqs == 0]
    for name, model in fits.items():
        ratio = decodes.duration_ms / priced(model, decodes)
        print(f"{name}: decode steps traced/price median {ratio.median():.3f}")
    return prefills.groupby(["prefill_seqs", "depth"]).agg(
        steps=("duration_ms", "size"), ms=("duration_ms", "median"),
        **{name: (name, "median") for name in fits})


def main() -> None:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path, help="an exits trace directory (reasonsim trace exits)")
    ap.add_argument("--fit-max", type=int, default=12,
                    help="the first fit sees prefills of at most this many prompts")
    args = ap.parse_args()
    table = wave_table(args.trace, args.fit_max)
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(table.unstack("depth").round(2).to_string())


if __name__ == "__main__":
    main()
