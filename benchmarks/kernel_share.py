"""How much of a program run's event loop the compiled kernel takes: the rest is Python.

    python benchmarks/kernel_share.py cot a1

Runs each family's `family_speed.FAMILIES` config compiled (after a warm-up run), with the
program kernel's entry points (`sim.kernels.program_calls`: advance, retire, arrival, abort)
timed call by call, and prints per simulated request the run's CPU, its event loop's seconds
and the kernel's. The loop less the kernel is the driver's, the programs' and the oracle's
Python: the part no faster kernel can remove.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO)]

import sim.kernels.program_calls as calls  # noqa: E402
from family_speed import FAMILIES, program_config  # noqa: E402
from sim.simulate import simulate  # noqa: E402

ENTRIES = ("advance_st", "retire_rest_st", "arrival_st", "abort_st")


def timed_kernel() -> dict:
    """Wrap the kernel's entry points with a timer; the dict their seconds and calls add to."""
    spent = {"kernel_s": 0.0, "calls": 0}
    for name in ENTRIES:
        entry = getattr(calls, name)

        def timed(*args, entry=entry):
            t0 = time.perf_counter()
            out = entry(*args)
            spent["kernel_s"] += time.perf_counter() - t0
            spent["calls"] += 1
            return out

        setattr(calls, name, timed)
    return spent


def main() -> None:
    """One timed run per family named on the command line (default: all)."""
    families = sys.argv[1:] or list(FAMILIES)
    spent = timed_kernel()
    print(f"{'family':8} {'requests':>9} {'run us/req':>11} {'loop us/req':>12} "
          f"{'kernel us/req':>14} {'kernel calls/req':>17}")
    for fam in families:
        example, n, replicas = FAMILIES[fam]
        cfg = program_config(example, n, replicas)
        simulate(cfg)  # the kernel's and the trace's first load
        spent.update(kernel_s=0.0, calls=0)
        t0 = time.process_time()
        res = simulate(cfg)
        run_s = time.process_time() - t0
        s = res.summary
        per = 1e6 / s["requests"]
        print(f"{fam:8} {s['requests']:>9,} {run_s * per:>11.1f} {s['event_loop_s'] * per:>12.1f} "
              f"{spent['kernel_s'] * per:>14.1f} {spent['calls'] / s['requests']:>17.2f}")


if __name__ == "__main__":
    main()
