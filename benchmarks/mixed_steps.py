"""Small prefill steps with and without decodes beside them, against a fidelity run's calibration.

    reasonsim fidelity -o RUN
    python benchmarks/mixed_steps.py RUN [RUN ...] [--json]

For every trace of RUN (the calibration's grid and traffic, each live run): measured / predicted
(`sim.step_time.live_speed.step_ratios`, the calibration's host terms included, every step of
a program workload priced as seeded) over that trace's own decode-only median, so the machine's
level of the moment drops out. The table gives the median of that relative ratio over prefill
steps of <= 512 tokens, split by whether decodes ran beside the prefill (a mixed step) and by the
engine state before it (warm: <= 1 ms idle and a shape the engine had run; new shape; idle >
1 ms), calibration traces apart from live ones, and per trace the median over mixed steps beside
its decode level. A relative ratio above 1 is a step the model prices low against its own decode
steps, whatever the machine's speed did between calibrating and serving.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time.live_speed import step_ratios  # noqa: E402

SMALL_PREFILL_TOKENS = 512


def traces(run: Path) -> list[tuple[str, bool, Path]]:
    """(name, live, directory) of every trace with steps: the calibration's, then live runs."""
    cal = json.loads((run / "calibration.json").read_text())
    fitted = [Path(p) for p in cal["provenance"]["traces"]]
    lives = sorted(run.glob("*/live[0-9]*"))
    return ([(p.name, False, p) for p in fitted]
            + [(f"{p.parent.name}/{p.name}", True, p) for p in lives])


def relative_steps(run: Path) -> pd.DataFrame:
    """Every small prefill step of RUN's traces with its ratio over its trace's decode level."""
    out = []
    for name, live, d in traces(run):
        if not (d / "steps").is_dir():
            continue
        programs = (d / "programs").is_dir()
        got = step_ratios(run / "calibration.json", d, all_seeded=programs)
        if got is None:
            continue
        ratio, s = got
        decode = ((s.prefill_tokens == 0) & (s.decode_seqs > 0)).to_numpy()
        if not decode.any():
            continue
        level = float(np.median(ratio[decode]))
        small = ((s.prefill_tokens > 0) & (s.prefill_tokens <= SMALL_PREFILL_TOKENS)).to_numpy()
        s = s[small]
        state = np.where(s.idle_ms > 1.0, "idle > 1 ms",
                         np.where(s.new_shape > 0, "new shape", "warm"))
        out.append(pd.DataFrame({"trace": name, "live": live, "level": level,
                                 "mixed": (s.decode_seqs > 0).to_numpy(), "state": state,
                                 "relative": ratio[small] / level}))
    return pd.concat(out, ignore_index=True)


def table(run: Path) -> dict:
    """The split table and the per-trace mixed-step medians."""
    s = relative_steps(run)
    split = [{"traces": "live" if live else "calibration", "mixed": bool(mixed), "state": state,
              "relative": float(g.relative.median()), "steps": int(len(g))}
             for (live, mixed, state), g in s.groupby(["live", "mixed", "state"])]
    per = [{"trace": name, "level": float(g.level.iloc[0]),
            "mixed_relative": float(g.relative[g.mixed].median()) if g.mixed.any() else None,
            "mixed_steps": int(g.mixed.sum())} for name, g in s.groupby("trace", sort=False)]
    return {"run": str(run), "split": split, "per_trace": per}


def main() -> None:
    """Print each run's tables (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", help="`reasonsim fidelity -o` directories")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    got = [table(r) for r in args.runs]
    if args.json:
        print(json.dumps(got))
        return
    for t in got:
        print(f"## {t['run']}\n\n| traces | decodes beside | before the step | relative | steps |")
        print("|---|---|---|---|---|")
        for r in t["split"]:
            print(f"| {r['traces']} | {'yes' if r['mixed'] else 'no'} | {r['state']} | "
                  f"{r['relative']:.3f} | {r['steps']} |")
        print("\n| trace | decode level | mixed steps, relative | steps |\n|---|---|---|---|")
        for r in t["per_trace"]:
            rel = "-" if r["mixed_relative"] is None else f"{r['mixed_relative']:.3f}"
            print(f"| {r['trace']} | {r['level']:.3f} | {rel} | {r['mixed_steps']} |")
        print()


if __name__ == "__main__":
    main()
