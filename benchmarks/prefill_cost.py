"""Where prefill time goes on vLLM (CPU): per prompt token, per prompt, and after idle.

    python benchmarks/prefill_cost.py --json

The latency model charges a prefill by its tokens (and tokens x context); the simulated TTFT of
the fidelity issue runs 40-57% below live. This measures, on the testbed target, the iteration
time of one prefill-only step that admits k prompts of `total / k` tokens each (the same tokens
split over more prompts), interleaved over `--repeats` rounds, so the slope over k is the cost of
one more prompt in a step at equal tokens; and the same step right after the engine sat idle
for `--idle-s` seconds against one after a busy step; and the wall time of `add_request` (input
processing, which no step duration contains). Medians with the min-max spread.
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

from engines.vllm_engine import Engine, EngineSpec  # noqa: E402


ADD_MS: list[float] = []
"""wall time of each `add_request` (input processing outside any step)"""


def prefill_step_ms(engine: Engine, SamplingParams, k: int, total: int, tag: str,
                    rng: np.random.Generator) -> float:
    """Duration of the iteration that prefills k prompts of total // k tokens (random ids: no
    prefix-cache hits), then finish them."""
    n = total // k
    sp = SamplingParams(max_tokens=1, ignore_eos=True)
    for i in range(k):
        ids = rng.integers(4, 100, size=n).tolist()
        t0 = time.perf_counter()
        engine.add(f"{tag}-{i}", ids, sp)
        ADD_MS.append((time.perf_counter() - t0) * 1e3)
    first = None
    while engine.has_unfinished():
        _, _, dt, sched = engine.step()
        if first is None and sched is not None and sched["prefill_tokens"]:
            if sched["prefill_seqs"] != k:
                raise RuntimeError(f"step admitted {sched['prefill_seqs']} prompts, not {k}: "
                                   "raise --max-num-batched-tokens")
            first = dt * 1e3
    for i in range(k):
        engine.forget(f"{tag}-{i}")
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "models" / "testbed" / "target-large"))
    ap.add_argument("--total-tokens", type=int, default=256)
    ap.add_argument("--prompts", default="1,2,4,8,16", help="k values (prompts per step)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--idle-s", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from vllm import SamplingParams

    ks = [int(x) for x in args.prompts.split(",")]
    engine = Engine(EngineSpec(model=args.model, max_num_seqs=max(ks),
                               max_num_batched_tokens=max(2048, args.total_tokens)))
    engine.warm_up()
    rng = np.random.default_rng(0)
    by_k: dict[int, list[float]] = {k: [] for k in ks}
    warm, idle = [], []
    for r in range(args.repeats):
        for k in ks:  # interleaved: a slow spell lands on every k alike
            by_k[k].append(prefill_step_ms(engine, SamplingParams, k, args.total_tokens,
                                           f"r{r}k{k}", rng))
        warm.append(prefill_step_ms(engine, SamplingParams, 1, args.total_tokens, f"w{r}", rng))
        time.sleep(args.idle_s)
        idle.append(prefill_step_ms(engine, SamplingParams, 1, args.total_tokens, f"i{r}", rng))
    med = {k: statistics.median(v) for k, v in by_k.items()}
    slope, intercept = np.polyfit(ks, [med[k] for k in ks], 1)
    out = {"model": args.model, "total_tokens": args.total_tokens, "repeats": args.repeats,
           "device": f"{engine.device} x{engine.device_count}",
           "prefill_step_ms": {k: {"median": med[k], "min": min(v), "max": max(v)}
                               for k, v in by_k.items()},
           "per_prompt_ms": float(slope), "step_ms_at_k0": float(intercept),
           "after_busy_ms": statistics.median(warm), "after_idle_ms": statistics.median(idle),
           "idle_ratio": statistics.median(idle) / statistics.median(warm),
           "add_request_ms": {"median": statistics.median(ADD_MS),
                              "p90": float(np.quantile(ADD_MS, 0.9)), "n": len(ADD_MS)}}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.model} on {out['device']}: one prefill step of {args.total_tokens} tokens "
          f"split over k prompts (median of {args.repeats}, min-max)")
    for k in ks:
        s = out["prefill_step_ms"][k]
        print(f"  k={k:3d}: {s['median']:7.2f} ms  ({s['min']:.2f}-{s['max']:.2f})")
    print(f"  fit: {intercept:.2f} ms + {slope:.3f} ms per prompt")
    print(f"  after busy {out['after_busy_ms']:.2f} ms, after {args.idle_s:g} s idle "
          f"{out['after_idle_ms']:.2f} ms (ratio {out['idle_ratio']:.2f})")
    a = out["add_request_ms"]
    print(f"  add_request (input processing, outside steps): median {a['median']:.3f} ms, "
          f"P90 {a['p90']:.3f} ms over {a['n']} requests")


if __name__ == "__main__":
    main()
