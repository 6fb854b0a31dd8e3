"""The engine loop's host time in live replays: per run, what
`sim.step_time.host_time.fit_host_ms` fits.

    python benchmarks/host_time.py RUN_DIR...      # e.g. a `reasonsim fidelity -o DIR` run's
                                                   # DIR/*/live* and DIR/calibration_traffic_*

Prints, per live replay: the gap between steps with nothing added and with one request added
(median, P10-P90, ms), the wait from an arrival at an idle loop to its step's start, and the
fitted add_request_ms / wake_ms.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time.host_time import fit_host_ms, idle_waits_ms, step_gaps  # noqa: E402
from traces.store import read_table  # noqa: E402


def spread(v: np.ndarray) -> str:
    """Median [P10, P90] of v in ms, with its count."""
    if not len(v):
        return "-"
    return f"{np.median(v):.3f} [{np.quantile(v, 0.1):.3f}, {np.quantile(v, 0.9):.3f}] n={len(v)}"


def main(dirs: list[str]) -> None:
    """One line per run directory."""
    for d in map(Path, dirs):
        reqs = read_table(d, "requests").to_pandas()
        start, end, gap_ms, added = step_gaps(read_table(d, "steps").to_pandas(), reqs)
        short = gap_ms < 5.0
        host = fit_host_ms([d])
        print(f"{d}\n  gap, none added: {spread(gap_ms[short & (added == 0)])}\n"
              f"  gap, one added:  {spread(gap_ms[short & (added == 1)])}\n"
              f"  gap, two added:  {spread(gap_ms[short & (added == 2)])}\n"
              f"  idle arrival to its step: {spread(idle_waits_ms(reqs, start, end))}\n"
              f"  fitted add_request_ms {host.add_request_ms:.3f}, add_next_ms "
              f"{host.add_next_ms if host.add_next_ms is None else round(host.add_next_ms, 3)}, "
              f"wake_ms {host.wake_ms:.3f}, step_gap_ms {host.step_gap_ms:.3f}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
