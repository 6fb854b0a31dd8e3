"""What an engine job costs to start: the same small step-grid trace of the testbed target run as
a job in a new process, spawned (every job imports torch and vLLM itself) against forked from the
preloaded server (`validation.replay.fresh_process`), alternating, each job's wall seconds.

    python benchmarks/engine_job_start.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tracers.step_profile import StepGrid, profile_steps  # noqa: E402
from validation.replay import DEFAULT_MODEL, fresh_process  # noqa: E402

GRID = StepGrid(batch_sizes=[1, 4], prompt_tokens=[16], output_tokens=[8], repeats=2,
                warm_s=0.5)


def spawned(fn, *args, **kwargs) -> None:
    """One job in a spawned process: the way every engine job started before the fork server."""
    proc = multiprocessing.get_context("spawn").Process(target=fn, args=args, kwargs=kwargs)
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"{fn.__name__} failed (exit {proc.exitcode})")


def job_s(start, folder: Path) -> float:
    """Wall seconds of one trace job started by `start`."""
    t0 = time.perf_counter()
    start(profile_steps, str(DEFAULT_MODEL), folder, GRID, max_model_len=512, max_num_seqs=4,
          progress=False)
    return time.perf_counter() - t0


def main() -> None:
    """Alternate the two ways, print each job's seconds and the medians."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    times = {"spawn": [], "fork server": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name, start in (("spawn", spawned), ("fork server", fresh_process)):
                times[name].append(job_s(start, Path(tmp) / f"{name}-{i}"))
                print(f"{name:12s} job {i}: {times[name][-1]:.1f} s", flush=True)
    median = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"{name:12s} median {median[name]:.1f} s (min {min(t):.1f}, max {max(t):.1f})")
    print(f"fork server / spawn: {median['fork server'] / median['spawn']:.2f}x (the first "
          "fork-server job pays the server's own import)")


if __name__ == "__main__":
    main()
