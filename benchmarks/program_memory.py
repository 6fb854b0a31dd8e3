"""Where a program run's memory sits once its programs have all closed: Python's allocations by
file and by line (tracemalloc), taken as the family's results are about to be built.

    python benchmarks/program_memory.py examples/a1-async-separate.yaml --count 1000 [--no-steps]
        [--no-requests]

What a family keeps per program (its rows, its request records, the replicas' per-request
state) is what a million programs multiply; the top lines say which to stream or let go first.
tracemalloc slows the run several-fold: the figures are sizes, not times.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from programs.families import family_of  # noqa: E402
from sim.config import load_config  # noqa: E402
from sim.families.registry import register_sim_family, sim_family  # noqa: E402
from sim.simulate import simulate  # noqa: E402


def main() -> None:
    """Print the run's peak and the top allocation sites at the results."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--count", type=int, default=None, help="override the number of programs")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--no-steps", action="store_true",
                    help="write no steps table (as the million-program runs of sim_speed.py)")
    ap.add_argument("--no-requests", action="store_true",
                    help="keep no requests table: each request folds as it finishes "
                         "(output.requests: false)")
    args = ap.parse_args()
    cfg = load_config(args.config)
    if cfg.programs is None:
        raise SystemExit(f"{args.config}: not a program workload")
    if args.count:
        cfg = dataclasses.replace(cfg, programs=dataclasses.replace(cfg.programs,
                                                                    count=args.count))
    if args.no_steps:
        cfg = dataclasses.replace(cfg, write_steps=False)
    if args.no_requests:
        cfg = dataclasses.replace(cfg, write_requests=False)
    family = sim_family(family_of(cfg.programs.method, cfg.programs.policy).name)
    taken = {}

    def results(runs, driver, cluster, makespan_s):
        taken["snapshot"] = tracemalloc.take_snapshot()  # every program closed, tables not built
        return family.results(runs, driver, cluster, makespan_s)

    if family.results is None:
        raise SystemExit(f"the {family.name} family builds no results of its own: nothing to hook")
    register_sim_family(dataclasses.replace(family, results=results))
    tracemalloc.start(1)
    run = simulate(cfg)
    peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
    register_sim_family(family)
    snapshot = taken["snapshot"]
    total_mb = sum(s.size for s in snapshot.statistics("filename")) / 1e6
    print(f"{args.config}: {cfg.programs.count} programs, {run.summary['requests']} requests, "
          f"simulator {run.summary['simulator']}: traced peak {peak_mb:.1f} MB, "
          f"{total_mb:.1f} MB held at the results")
    for kind in ("filename", "lineno"):
        print(f"\ntop by {kind}: MB, blocks, where")
        for s in snapshot.statistics(kind)[:args.top]:
            frame = s.traceback[0]
            where = frame.filename.replace(str(REPO) + "/", "")
            print(f"{s.size / 1e6:8.1f} {s.count:9d}  {where}"
                  + (f":{frame.lineno}" if kind == "lineno" else ""))


if __name__ == "__main__":
    main()
