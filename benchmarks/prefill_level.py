"""How fast prefill steps run against their price, relative to the decode steps beside them.

    reasonsim fidelity -o RUN
    python benchmarks/prefill_level.py RUN [RUN...] [--by-shape] [--refit] [--json]

For every fidelity run: per step of each trace directory (the calibration traffic the run's
calibration was fitted on, and each live run of each request workload), measured / predicted
time (`sim.step_time.live_speed.step_ratios`, the run's calibration at its mean fit); the
median over steps with prefill tokens over the median over decode-only steps. A machine that
runs faster or slower moves both alike; a ratio above 1 is a prefill step the model prices low
against the decodes it prices right. Prints one line per run (the calibration traffic's median
and the live runs') and, over all runs, each workload's median. `--by-shape`: the same ratio
per cell of prefill size and first-of-shape or not (a step that prefills a token count its
engine ran before: `new_shape` 0), over the calibration traffic and over the live runs, each
cell's median over traces and its median distance from 1. `--refit`: against each run's
calibration fitted again on its traces by this checkout's model (a candidate judged on old
runs' steps, as `fidelity_offline.py --refit` judges its tables).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time.live_speed import step_ratios  # noqa: E402

MIN_DECODES, MIN_PREFILLS = 20, 5
"""steps a trace needs of each kind for its ratio"""
SIZE_EDGES = (1, 64, 256, 1024)
"""the prefill-token bands of `--by-shape` (the last open-ended)"""
MIN_CELL = 3
"""steps a trace needs in a cell for its ratio there"""


def prefill_over_decode(calibration: Path, steps_dir: Path) -> float | None:
    """Median measured / predicted over prefill steps, over that of decode-only steps; None
    with too few of either."""
    got = step_ratios(calibration, steps_dir)
    if got is None:
        return None
    ratio, steps = got
    decode = steps.prefill_tokens.eq(0).to_numpy()
    if decode.sum() < MIN_DECODES or (~decode).sum() < MIN_PREFILLS:
        return None
    return float(np.median(ratio[~decode]) / np.median(ratio[decode]))


def shape_cells(calibration: Path, steps_dir: Path) -> dict[str, float]:
    """Per cell "SIZE:new" or "SIZE:old" (SIZE: the band's lower edge in prefill tokens), the
    cell's median measured / predicted over that of decode-only steps; cells of fewer than
    MIN_CELL steps left out, none with too few decodes."""
    got = step_ratios(calibration, steps_dir)
    if got is None:
        return {}
    ratio, steps = got
    p = steps.prefill_tokens.to_numpy()
    decode, new = p == 0, steps.new_shape.to_numpy() > 0
    if decode.sum() < MIN_DECODES:
        return {}
    level, band = np.median(ratio[decode]), np.searchsorted(SIZE_EDGES, p, side="right")
    out = {}
    for b, lo in enumerate(SIZE_EDGES, start=1):
        for name, mask in (("new", new), ("old", ~new)):
            cell = (band == b) & mask & ~decode
            if cell.sum() >= MIN_CELL:
                out[f"{lo}:{name}"] = float(np.median(ratio[cell]) / level)
    return out


def trace_dirs(run: Path) -> list[tuple[str, Path]]:
    """A fidelity run's trace directories: ("traffic:NAME", dir) per calibration traffic,
    ("WORKLOAD/liveN", dir) per live run of each request workload."""
    result = json.loads((run / "fidelity.json").read_text())
    dirs = [("traffic:" + d.name.removeprefix("calibration_traffic").lstrip("_") or "base", d)
            for d in sorted(run.glob("calibration_traffic*"))]
    return dirs + [(f"{w['workload']}/{d.name}", d) for w in result["workloads"]
                   if w["kind"] == "requests"
                   for d in sorted((run / w["workload"]).glob("live[0-9]"))]


def run_levels(run: Path, calibration: Path | None = None) -> dict[str, float]:
    """Per trace directory of a fidelity run (`trace_dirs`' names), its prefill-over-decode
    ratio against `calibration` (default: the run's)."""
    cal = calibration or run / "calibration.json"
    out = {}
    for name, d in trace_dirs(run):
        r = prefill_over_decode(cal, d)
        if r is not None:
            out[name] = r
    return out


def refitted(run: Path, folder: Path) -> Path:
    """The run's calibration fitted again on its traces by this checkout's model, under
    folder."""
    from sim.step_time.calibration import calibrate

    traces = json.loads((run / "calibration.json").read_text())["provenance"]["traces"]
    path = folder / f"{run.name}.calibration.json"
    path.write_text(json.dumps(calibrate(traces, model="serving").to_json()))
    return path


def by_shape(runs: list[Path], refit: bool) -> dict[str, dict[str, list[float]]]:
    """Over every run's traces, "traffic" or "live": per `shape_cells` cell, its ratios."""
    out: dict[str, dict[str, list[float]]] = {"traffic": {}, "live": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            cal = refitted(run, Path(tmp)) if refit else run / "calibration.json"
            for name, d in trace_dirs(run):
                kind = out["traffic" if name.startswith("traffic:") else "live"]
                for cell, r in shape_cells(cal, d).items():
                    kind.setdefault(cell, []).append(r)
    return out


def main() -> None:
    """Parse arguments, read every run, print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--by-shape", action="store_true",
                    help="per cell of prefill size and first-of-shape or not")
    ap.add_argument("--refit", action="store_true",
                    help="against each run's calibration refitted by this checkout's model")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    found = [r for r in args.runs if (r / "fidelity.json").exists()]
    if args.by_shape:
        cells = by_shape(found, args.refit)
        if args.json:
            print(json.dumps(cells))
            return
        for kind, by_cell in cells.items():
            for cell, v in sorted(by_cell.items(), key=lambda kv: (int(kv[0].split(":")[0]),
                                                                    kv[0])):
                d = np.abs(np.asarray(v) - 1.0)
                print(f"{kind:8s} {cell:9s} median {_med(v)}  distance from 1 "
                      f"{np.median(d):.3f}  ({len(v)} traces)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        runs = {str(r): run_levels(r, refitted(r, Path(tmp)) if args.refit else None)
                for r in found}
    if args.json:
        print(json.dumps(runs))
        return
    by_workload: dict[str, list] = {}
    for run, levels in runs.items():
        traffic = [v for k, v in levels.items() if k.startswith("traffic:")]
        live = [v for k, v in levels.items() if not k.startswith("traffic:")]
        print(f"{Path(run).name:12s} calibration traffic {_med(traffic)}  live runs {_med(live)}")
        for k, v in levels.items():
            by_workload.setdefault("traffic" if k.startswith("traffic:") else k.split("/")[0],
                                   []).append(v)
    print("over all runs (median, min-max, traces):")
    for name, vals in sorted(by_workload.items()):
        print(f"  {name:22s} {_med(vals)} ({min(vals):.3f}-{max(vals):.3f}, {len(vals)})")


def _med(values: list) -> str:
    return f"{np.median(values):.3f}" if values else "-"


if __name__ == "__main__":
    main()
