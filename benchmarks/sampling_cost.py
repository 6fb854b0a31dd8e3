"""Decode-step cost of vLLM sampling settings on the testbed model (CPU), side by side.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python benchmarks/sampling_cost.py --json

The latency calibration is profiled with greedy sampling; the Dynasor live replays sample at
temperature 0.7 with a per-request seed and (search programs) the sampled tokens' log-probs.
This prints the median decode-step time of each setting for the same batch (8 sequences, 64
prompt tokens, 64 new tokens), interleaved over `--repeats` rounds, and its ratio to greedy.
Every setting returns text (vLLM's default, as the program engines ask) but the `_no_text` ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engines.vllm_engine import Engine, EngineSpec  # noqa: E402

SETTINGS = {
    "greedy": {"temperature": 0.0},
    "temperature": {"temperature": 0.7},
    "seeded": {"temperature": 0.7, "seed": 1},
    "seeded_top_p": {"temperature": 0.7, "seed": 1, "top_p": 0.95},
    "seeded_logprobs": {"temperature": 0.7, "seed": 1, "logprobs": 0},
    # without text (as the grid's greedy and seeded cells): no log-probability entries decoded
    "seeded_no_text": {"temperature": 0.7, "seed": 1, "detokenize": False},
    "seeded_logprobs_no_text": {"temperature": 0.7, "seed": 1, "logprobs": 0,
                                "detokenize": False},
}


def decode_step_ms(engine: Engine, SamplingParams, setting: dict, batch: int, tag: str) -> float:
    """Median duration of the decode-only iterations of one batch."""
    for i in range(batch):
        extra = dict(setting)
        if "seed" in extra:
            extra["seed"] += i
        sp = SamplingParams(max_tokens=64, ignore_eos=True, **extra)
        engine.add(f"{tag}-{i}", [4 + (i * 7 + j) % 40 for j in range(64)], sp)
    times = []
    while engine.has_unfinished():
        _, _, dt, sched = engine.step()
        if sched is not None and sched["prefill_tokens"] == 0:
            times.append(dt * 1e3)
    for i in range(batch):
        engine.forget(f"{tag}-{i}")
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "models" / "testbed" / "target-large"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from vllm import SamplingParams

    engine = Engine(EngineSpec(model=args.model, max_num_seqs=args.batch))
    engine.warm_up()
    ms: dict[str, list[float]] = {k: [] for k in SETTINGS}
    for r in range(args.repeats):
        for name, setting in SETTINGS.items():
            ms[name].append(decode_step_ms(engine, SamplingParams, setting, args.batch,
                                           f"{name}-{r}"))
    base = statistics.median(ms["greedy"])
    result = {name: {"decode_step_ms_median": round(statistics.median(v), 3),
                     "spread_ms": [round(min(v), 3), round(max(v), 3)],
                     "ratio_to_greedy": round(statistics.median(v) / base, 3)}
              for name, v in ms.items()}
    result["batch"], result["repeats"] = args.batch, args.repeats
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
