"""Sweep scaling: wall time of one 64-point sweep on 1 and on 2 workers, Ray and process pool.

    python benchmarks/sweep_scaling.py [--points 64] [--requests 4000] [--json]

Each backend is started before its clock starts (Ray's start-up, ~4 s here, is reported apart),
and each run writes into a fresh directory, so every run computes every point. Efficiency =
(t_1 / t_2) / 2: 1.0 is linear scaling. On a machine with C cores, workers beyond C only queue.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.config import read_yaml  # noqa: E402
from sim.sweep import Backend, Sweep, run_sweep  # noqa: E402


def sweep(points: int, requests: int) -> Sweep:
    """The demo cluster at `points / 4` arrival rates x 2 routers x 2 seeds."""
    base = read_yaml(REPO / "examples" / "demo.yaml")
    base["workload"]["num_requests"] = requests
    rates = [8 + 4 * i for i in range(points // 4)]
    return Sweep(base, REPO / "examples", {"workload.arrival.rate_per_s": rates,
                                           "cluster.router": ["round_robin",
                                                              "least_outstanding"]},
                 [], [0, 1])


def timed(spec: Sweep, backend: Backend) -> dict:
    """Start the backend, then time the whole sweep into a fresh directory."""
    t0 = time.perf_counter()
    with backend:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            df = run_sweep(spec, out, backend)
        wall = time.perf_counter() - started
    return {"backend": backend.name(), "workers": backend.workers, "points": len(df),
            "startup_s": started - t0, "wall_s": wall, "points_per_s": len(df) / wall}


def main() -> None:
    """Run both backends on 1 and 2 workers; print a table or JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=64)
    ap.add_argument("--requests", type=int, default=4000, help="requests per point")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    spec = sweep(args.points, args.requests)
    rows = []
    for use_ray in (True, False):
        one = timed(spec, Backend(1, use_ray=use_ray))
        two = timed(spec, Backend(2, use_ray=use_ray))
        rows += [one, two]
        rows[-1]["efficiency_vs_1"] = one["wall_s"] / two["wall_s"] / 2
    if args.json:
        print(json.dumps({"runs": rows}))
        return
    print(f"{'backend':<32} {'points':>6} {'startup_s':>9} {'wall_s':>7} {'pts/s':>6} "
          f"{'efficiency':>10}")
    for r in rows:
        eff = f"{r['efficiency_vs_1']:.2f}" if "efficiency_vs_1" in r else ""
        print(f"{r['backend']:<32} {r['points']:>6} {r['startup_s']:>9.2f} {r['wall_s']:>7.2f} "
              f"{r['points_per_s']:>6.2f} {eff:>10}")


if __name__ == "__main__":
    main()
