"""What a live vLLM step costs beyond the grid's: a never-run shape, and idle before the step.

    python benchmarks/step_shapes.py [--lengths LO:HI:STEP,..] [--order random|asc|desc]
                                     [--bands N] [--idle-lengths N,..] [--json]
    REASONSIM_DEFAULT_HEAP=1 python benchmarks/step_shapes.py ...   # glibc's default heap

Two measurements on the testbed target (vLLM CPU build), each a one-prompt prefill step:
1. shapes: prefill prompts of distinct lengths (`--lengths`, default 101-395 tokens by 6) once
   (each length the engine's first step of that many tokens), then the same lengths twice more
   (seen shapes), each pass in `--order`; median ratio first / seen, per length, and by
   `--bands` bands of lengths each pass's median step and first - seen (ms): how the
   first-of-shape cost grows with tokens, and (with glibc's default heap) how much a step's cost
   depends on the allocator's history (`engines/allocator.py`).
2. idle: prompts of 64, 128, 256 and 400 tokens (`--idle-lengths`; shapes seen) after the engine sat idle for
   0, 2, 5, 10, 20, 50, 100, 300 ms, interleaved over `--repeats` rounds; median extra ms over
   the busy (0 ms) step.
These are the terms of the `serving` step-time model (sim/step_time/serving_latency.py).
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
from engines.allocator import steady_heap  # noqa: E402
from engines.vllm_engine import Engine, EngineSpec  # noqa: E402

GAPS_S = (0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.3)
IDLE_LENGTHS = (64, 128, 256, 400)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "models" / "testbed" / "target-large"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lengths", default="101:400:6",
                    help="prompt lengths: LO:HI:STEP ranges, comma-separated")
    ap.add_argument("--idle-lengths", default=",".join(map(str, IDLE_LENGTHS)),
                    help="prompt lengths of the idle measurement, comma-separated")
    ap.add_argument("--order", choices=("random", "asc", "desc"), default="random",
                    help="order of the lengths in each pass")
    ap.add_argument("--bands", type=int, default=1, help="bands of lengths in the table")
    ap.add_argument("--json", action="store_true")
    return ap


def main() -> None:
    args = _parser().parse_args()
    idle_lengths = [int(n) for n in args.idle_lengths.split(",")]
    lengths = sorted({int(n) for r in args.lengths.split(",")
                      for n in np.arange(*(int(v) for v in r.split(":")))})
    from vllm import SamplingParams

    engine = Engine(EngineSpec(model=args.model, max_num_seqs=16, max_num_batched_tokens=2048))
    engine.warm_up()
    heap = "steady" if steady_heap() else "glibc default"
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.permutation(lengths)]
    if args.order != "random":
        lengths = sorted(lengths, reverse=args.order == "desc")
    runs = [[prefill_step_ms(engine, SamplingParams, 1, n, f"s{r}-{n}", rng) for n in lengths]
            for r in range(3)]
    first_over_seen = [a / statistics.median([b, c]) for a, b, c in zip(*runs)]
    seen_ms = {n: statistics.median([b, c]) for n, b, c in zip(lengths, runs[1], runs[2])}
    first_extra_ms = {n: a - seen_ms[n] for n, a in zip(lengths, runs[0])}
    bands = [[int(n) for n in b] for b in np.array_split(sorted(lengths), args.bands)]
    for n in idle_lengths:  # make the idle probe's shapes seen
        for r in range(2):
            prefill_step_ms(engine, SamplingParams, 1, n, f"w{r}-{n}", rng)
    idle: dict[tuple[float, int], list[float]] = {(g, n): [] for g in GAPS_S for n in idle_lengths}
    for r in range(args.repeats):
        for g in GAPS_S:
            for n in idle_lengths:
                time.sleep(g)
                idle[(g, n)].append(prefill_step_ms(engine, SamplingParams, 1, n,
                                                    f"i{r}-{g}-{n}", rng))
    busy = {n: statistics.median(idle[(0.0, n)]) for n in idle_lengths}
    out = {"device": f"{engine.device} x{engine.device_count}", "heap": heap,
           "first_shape_ratio": {"median": statistics.median(first_over_seen),
                                 "p10": float(np.quantile(first_over_seen, 0.1)),
                                 "p90": float(np.quantile(first_over_seen, 0.9)),
                                 "lengths": len(lengths)},
           "by_band": [{"tokens": [b[0], b[-1]],
                        "pass_ms": [statistics.median(dict(zip(lengths, run))[n] for n in b)
                                    for run in runs],
                        "seen_ms": statistics.median(seen_ms[n] for n in b),
                        "first_extra_ms": statistics.median(first_extra_ms[n] for n in b)}
                       for b in bands],
           "busy_ms": busy,
           "idle_extra_ms": {f"{g * 1e3:g}": {n: statistics.median(idle[(g, n)]) - busy[n]
                                              for n in idle_lengths} for g in GAPS_S[1:]}}
    if args.json:
        print(json.dumps(out))
        return
    _print(out, args, idle_lengths)


def _print(out: dict, args: argparse.Namespace, idle_lengths: list[int]) -> None:
    f, busy = out["first_shape_ratio"], out["busy_ms"]
    print(f"{args.model} on {out['device']}, {out['heap']} heap, lengths in {args.order} order")
    print(f"first step of a token count / the same count seen: median {f['median']:.2f} "
          f"(P10 {f['p10']:.2f}, P90 {f['p90']:.2f}) over {f['lengths']} lengths")
    for b in out["by_band"]:
        passes = " / ".join(f"{v:6.2f}" for v in b["pass_ms"])
        print(f"  {b['tokens'][0]:5d}-{b['tokens'][1]:<5d} tokens: passes {passes} ms, "
              f"first - seen {b['first_extra_ms']:+5.2f} ms")
    print("extra ms after idle (median of %d), by prompt tokens:" % args.repeats)
    print("  idle   " + "  ".join(f"{n:>6d}" for n in idle_lengths))
    print("  busy   " + "  ".join(f"{busy[n]:6.2f}" for n in idle_lengths))
    for g, row in out["idle_extra_ms"].items():
        print(f"  {g:>4s}ms " + "  ".join(f"{row[n]:+6.2f}" for n in idle_lengths))


if __name__ == "__main__":
    main()
