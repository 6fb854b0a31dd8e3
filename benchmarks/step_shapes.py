"""What a live vLLM step costs beyond the grid's: a never-run shape, and idle before the step.

    python benchmarks/step_shapes.py [--json]

Two measurements on the testbed target (vLLM CPU build), each a one-prompt prefill step:
1. shapes: prefill prompts of 50 distinct lengths (101-395 tokens) once (each length the
   engine's first step of that many tokens), then the same lengths twice more (seen shapes);
   median ratio first / seen, per length.
2. idle: prompts of 64, 128, 256 and 400 tokens (shapes seen) after the engine sat idle for
   0, 2, 5, 10, 20, 50, 100, 300 ms, interleaved over `--repeats` rounds; median extra ms over
   the busy (0 ms) step.
These are the terms of the `serving` step-time model (sim/serving_latency.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from prefill_cost import prefill_step_ms  # noqa: E402
from tracers.engine import Engine, EngineSpec  # noqa: E402

GAPS_S = (0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.3)
IDLE_LENGTHS = (64, 128, 256, 400)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "models" / "testbed" / "target-large"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from vllm import SamplingParams

    engine = Engine(EngineSpec(model=args.model, max_num_seqs=16, max_num_batched_tokens=2048))
    engine.warm_up()
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.permutation(np.arange(101, 400, 6))]
    runs = [[prefill_step_ms(engine, SamplingParams, 1, n, f"s{r}-{n}", rng) for n in lengths]
            for r in range(3)]
    first_over_seen = [a / statistics.median([b, c]) for a, b, c in zip(*runs)]
    for n in IDLE_LENGTHS:  # make the idle probe's shapes seen
        for r in range(2):
            prefill_step_ms(engine, SamplingParams, 1, n, f"w{r}-{n}", rng)
    idle: dict[tuple[float, int], list[float]] = {(g, n): [] for g in GAPS_S for n in IDLE_LENGTHS}
    for r in range(args.repeats):
        for g in GAPS_S:
            for n in IDLE_LENGTHS:
                time.sleep(g)
                idle[(g, n)].append(prefill_step_ms(engine, SamplingParams, 1, n,
                                                    f"i{r}-{g}-{n}", rng))
    busy = {n: statistics.median(idle[(0.0, n)]) for n in IDLE_LENGTHS}
    out = {"device": f"{engine.device} x{engine.device_count}",
           "first_shape_ratio": {"median": statistics.median(first_over_seen),
                                 "p10": float(np.quantile(first_over_seen, 0.1)),
                                 "p90": float(np.quantile(first_over_seen, 0.9)),
                                 "lengths": len(lengths)},
           "busy_ms": busy,
           "idle_extra_ms": {f"{g * 1e3:g}": {n: statistics.median(idle[(g, n)]) - busy[n]
                                              for n in IDLE_LENGTHS} for g in GAPS_S[1:]}}
    if args.json:
        print(json.dumps(out))
        return
    f = out["first_shape_ratio"]
    print(f"{args.model} on {out['device']}")
    print(f"first step of a token count / the same count seen: median {f['median']:.2f} "
          f"(P10 {f['p10']:.2f}, P90 {f['p90']:.2f}) over {f['lengths']} lengths")
    print("extra ms after idle (median of %d), by prompt tokens:" % args.repeats)
    print("  idle   " + "  ".join(f"{n:>6d}" for n in IDLE_LENGTHS))
    print("  busy   " + "  ".join(f"{busy[n]:6.2f}" for n in IDLE_LENGTHS))
    for g, row in out["idle_extra_ms"].items():
        print(f"  {g:>4s}ms " + "  ".join(f"{row[n]:+6.2f}" for n in IDLE_LENGTHS))


if __name__ == "__main__":
    main()
