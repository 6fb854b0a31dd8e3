"""Where a fidelity run's steps ran against its calibration, by the kind of run that served them.

    python benchmarks/step_levels_by_kind.py RUN [--calibration CAL] [--refit] [--json]

RUN is a `reasonsim fidelity -o` directory. Each decode-only step of the calibration's greedy
grid (`grid`: a profiled grid, cells of one shape in a tight loop), of its calibration traffic
(live replays the calibration was fitted on) and of the live runs of each pass (`live1`,
`live2`), over the prediction of CAL (default: RUN's calibration; `--refit`: RUN's traces
calibrated again by this checkout), as the speed check reads it (`live_over_predicted`: 1 is the
calibration's own median). Prints the median by decode sequences per group, and each group's
median over all its decode steps. A grid and calibration traffic fitted together read about 1
between them; the live passes also carry the machine's drift since.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time.live_speed import step_ratios  # noqa: E402

BINS = (0, 1, 2, 4, 8, 16, 256)
"""decode-sequence bins (right-closed)"""


def decode_ratios(calibration: Path, run: Path) -> pd.DataFrame:
    """Every decode-only step of RUN's grid, calibration traffic and live runs: its group,
    decode sequences and live/predicted under `calibration`."""
    groups = [("grid", run / "grid")] + \
        [("traffic", d) for d in sorted(run.glob("calibration_traffic_*"))] + \
        [(d.name, d) for d in sorted(run.glob("*/live[0-9]*"))]
    frames = []
    for group, d in groups:
        got = step_ratios(calibration, d)
        if got is None:
            continue
        ratio, steps = got
        decode = ((steps.prefill_tokens == 0) & (steps.decode_seqs > 0)).to_numpy()
        frames.append(pd.DataFrame({"group": group, "trace": str(d.relative_to(run)),
                                    "decode_seqs": steps.decode_seqs.to_numpy()[decode],
                                    "ratio": ratio[decode]}))
    return pd.concat(frames, ignore_index=True)


def table(df: pd.DataFrame) -> dict:
    """Per group: the median ratio and step count per decode-sequence bin, and over all."""
    df = df.assign(seqs=pd.cut(df.decode_seqs, BINS).astype(str))
    out = {}
    for group, g in df.groupby("group", sort=False):
        out[group] = {"all": [float(g.ratio.median()), int(len(g))],
                      **{k: [float(b.ratio.median()), int(len(b))]
                         for k, b in g.groupby("seqs", sort=False)}}
    return out


def refit(run: Path, out: Path) -> Path:
    """RUN's calibration fitted again on its traces by this checkout, written to out."""
    from sim.step_time.calibration import calibrate

    traces = json.loads((run / "calibration.json").read_text())["provenance"]["traces"]
    out.write_text(json.dumps(calibrate(traces, model="serving").to_json(), indent=1) + "\n")
    return out


def main() -> None:
    """Parse arguments and print the table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a `reasonsim fidelity -o` directory")
    ap.add_argument("--calibration", type=Path, help="default: RUN/calibration.json")
    ap.add_argument("--refit", action="store_true", help="RUN's traces calibrated again here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.refit and args.calibration:
        ap.error("--refit fits RUN's own traces: leave out --calibration")
    cal = args.calibration or args.run / "calibration.json"
    if args.refit:
        import tempfile

        cal = refit(args.run, Path(tempfile.mkdtemp()) / "calibration.json")
    got = table(decode_ratios(cal, args.run))
    if args.json:
        print(json.dumps(got))
        return
    bins = [str(pd.Interval(a, b, closed="right")) for a, b in zip(BINS[:-1], BINS[1:])]
    print("group    all              " + " ".join(f"{b:>16s}" for b in bins))
    for group, row in got.items():
        cells = [row.get(b) for b in bins]
        print(f"{group:8s} {row['all'][0]:.3f} ({row['all'][1]:6d}) " + " ".join(
            f"{c[0]:.3f} ({c[1]:6d})" if c else " " * 16 for c in cells))


if __name__ == "__main__":
    main()
