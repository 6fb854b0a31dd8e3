"""A program run with and without its requests table, side by side: each family's example with
every request kept (the table) and folded as it finishes (`output.requests: false`), each run in
a fresh process (its peak RSS its own): CPU seconds of `simulate` and the process's peak RSS,
median of rounds with the range.

    python benchmarks/folded_requests.py --programs 10000 --replicas 10 --rounds 3 \
        --families a1,seed,cot
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[5])
from family_speed import FAMILIES, program_config
from programs.workload import forget_banks
from sim.simulate import simulate
family, n, replicas, fold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
example = FAMILIES[family][0]
simulate(program_config(example, 4, 1, requests=not fold))  # the kernel loaded, not timed
forget_banks()  # the trace's load timed, as a process's first run
t0 = time.process_time()
res = simulate(program_config(example, n, replicas, requests=not fold))
print(json.dumps({"cpu_s": time.process_time() - t0, "requests": res.summary["requests"],
                  "simulator": res.summary["simulator"],
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def run(family: str, programs: int, replicas: int, fold: bool) -> dict:
    """One run in a fresh process."""
    p = subprocess.run([sys.executable, "-c", CHILD, family, str(programs), str(replicas),
                        "1" if fold else "0", str(REPO / "benchmarks")],
                       capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    """Print each family's kept and folded runs and their CPU ratio."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--programs", type=int, default=10_000)
    ap.add_argument("--replicas", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--families", default="a1,seed,cot")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    families = args.families.split(",")
    runs: dict = {}
    for _ in range(args.rounds):  # alternated, so that a slow spell falls on both
        for family in families:
            for fold in (False, True):
                runs.setdefault((family, fold), []).append(
                    run(family, args.programs, args.replicas, fold))
    out = {}
    for family in families:
        row = {"requests": runs[family, False][0]["requests"]}
        for fold, name in ((False, "table"), (True, "folded")):
            cpu = [r["cpu_s"] for r in runs[family, fold]]
            rss = [r["peak_rss_gb"] for r in runs[family, fold]]
            row[name] = {"cpu_s": statistics.median(cpu), "cpu_s_range": [min(cpu), max(cpu)],
                         "peak_rss_gb": statistics.median(rss),
                         "simulator": runs[family, fold][0]["simulator"]}
        row["table_over_folded_cpu"] = row["table"]["cpu_s"] / row["folded"]["cpu_s"]
        out[family] = row
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for family, row in out.items():
        t, f = row["table"], row["folded"]
        print(f"{family}: {row['requests']} requests ({t['simulator']}): table "
              f"{t['cpu_s']:.2f} CPU-s {t['peak_rss_gb']:.2f} GB, folded {f['cpu_s']:.2f} CPU-s "
              f"{f['peak_rss_gb']:.2f} GB: {row['table_over_folded_cpu']:.2f}x")


if __name__ == "__main__":
    main()
