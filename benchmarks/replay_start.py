"""How soon a live replay serves its first requests: the first arrival against the first step.

    python benchmarks/replay_start.py RUN_OR_TRACE... [--json]

For each live trace (a fidelity run's `<workload>/live1`, `live2`, or any replay's directory;
a fidelity run directory stands for all of its live traces), the first request's arrival, when
it was scheduled, and when the engine's first step started, in ms since the run's start. A
replay that is busy with itself at the start (an import, a lazy set-up) shows as a first step
well after a first arrival near 0; `tracers/replay.py` keeps such work out of the timed run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from traces import read_table  # noqa: E402


def start(trace: Path) -> dict:
    """The first arrival, its scheduling and the first step's start of one live trace (ms)."""
    reqs = read_table(trace, "requests").to_pandas().sort_values("arrival_s")
    steps = read_table(trace, "steps").to_pandas()
    first = reqs.iloc[0]
    return {"trace": str(trace), "programs": bool(reqs.program_id.notna().any()),
            "first_arrival_ms": round(1e3 * float(first.arrival_s), 2),
            "first_scheduled_ms": round(1e3 * float(first.scheduled_s), 2),
            "first_step_ms": round(1e3 * float(steps.start_s.min()), 2)}


def traces(paths: list[Path]) -> list[Path]:
    """Every live trace named: a fidelity run's `*/live*` directories, else the path itself."""
    out = []
    for p in paths:
        out += sorted(p.glob("*/live[0-9]*")) if (p / "fidelity.json").exists() else [p]
    return out


def main() -> None:
    """Parse arguments, print one line per live trace."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", type=Path, nargs="+")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [start(t) for t in traces(args.paths)]
    if args.json:
        print(json.dumps(rows))
        return
    for r in rows:
        print(f"{r['trace']}: first arrival {r['first_arrival_ms']:.1f} ms, scheduled "
              f"{r['first_scheduled_ms']:.1f}, first step {r['first_step_ms']:.1f}")


if __name__ == "__main__":
    main()
