"""A saved `helios replay --json` report judged again by this checkout's simulation.

    reasonsim helios replay CONFIG --retrace DIR --repeats 2 --json > report.json
    python benchmarks/helios_rejudge.py CONFIG DIR report.json

Simulates each policy of the report on the retraced profiles in DIR (`DIR/<model>`, as
`--retrace` wrote them) with the code of this checkout and prints, against the report's live
medians, each time metric's error as simulated and at the live runs' step speed (the report's
`step_speed` median), beside the live-vs-live spread: a change to the model judged on the very
live runs the report measured (run it from two checkouts for a side-by-side).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.config import read_yaml  # noqa: E402
from sim.families.helios.config import Experiment  # noqa: E402
from validation.helios import TIME_POWER  # noqa: E402


def retraced(config: Path, retrace: Path) -> Experiment:
    """The config's experiment on the profiles `helios replay --retrace` wrote (`retrace/<model>`:
    each model under the name its first trace gave it, as `load_profile` names it)."""
    from traces.store import read_run

    d = read_yaml(config)
    for m in d["helios"]["models"]:
        exits = Path(m["exits"]) if Path(m["exits"]).is_absolute() else config.parent / m["exits"]
        name = m.get("name") or Path(str(read_run(exits)["model_id"])).name
        m["exits"] = str((retrace / name).resolve())
    return Experiment(d, config.parent)


def rejudge(config: Path, retrace: Path, report: dict) -> dict:
    """Per policy of `report`, per time metric: (error, error at live speed, live spread)."""
    results = retraced(config, retrace).simulate()
    out = {}
    for policy, r in report.items():
        s = results[policy].summary()
        level = float(np.median(r["step_speed"]))
        out[policy] = {m: (s[m] / r["metrics"][m]["live"] - 1,
                           s[m] * level ** p / r["metrics"][m]["live"] - 1,
                           r["metrics"][m]["live_spread"]) for m, p in TIME_POWER.items()}
    return out


def main() -> None:
    """Print the re-judged errors, one row per policy and metric."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("retrace", type=Path)
    ap.add_argument("report", type=Path)
    args = ap.parse_args()
    got = rejudge(args.config, args.retrace, json.loads(args.report.read_text()))
    print(f"{'policy':28} {'metric':18} {'error':>8} {'at live speed':>14} {'live spread':>12}")
    for policy, metrics in got.items():
        for m, (err, at_live, spread) in metrics.items():
            print(f"{policy:28} {m:18} {err:>+8.1%} {at_live:>+14.1%} {spread:>12.1%}")


if __name__ == "__main__":
    main()
