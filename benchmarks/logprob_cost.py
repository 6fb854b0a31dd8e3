"""What returned log-probabilities add to a vLLM step (CPU), side by side.

    python benchmarks/logprob_cost.py [--json]

One prompt of each length (40, 200 tokens; random ids, prefix caching off) prefilled with no
log-probabilities, then with prompt log-probabilities at top-k 1, 8 and the vocabulary (whole
distributions, what sampled speculative acceptance needs), in a shuffled order in each of
`--repeats` rounds (the first dropped); the median step time of each, and the extra ms per
prompt position. These are the rows `sim/step_time/logprob_cost.py` fits a per-position and a
per-entry cost on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engines.vllm_engine import Engine, EngineSpec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "models" / "testbed" / "target-large"))
    ap.add_argument("--lengths", default="40,200")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from vllm import SamplingParams

    engine = Engine(EngineSpec(model=args.model, max_model_len=1024,
                               extra={"max_logprobs": -1}))
    engine.warm_up()
    vocab = int(engine.engine.vllm_config.model_config.get_vocab_size())
    ks = [None, 1, 8, vocab]
    rng = np.random.default_rng(0)
    times: dict[tuple, list[float]] = {}
    shapes = [(k, n) for k in ks for n in map(int, args.lengths.split(","))]
    for rep in range(args.repeats):
        # A shuffled order per round: no shape always follows the same one.
        for i in rng.permutation(len(shapes)):
            k, n = shapes[i]
            tag = f"r{rep}-{k}-{n}"
            sp = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=k,
                                detokenize=False)
            engine.add(tag, rng.integers(5, vocab - 1, n).tolist(), sp)
            total = 0.0
            while engine.has_unfinished():
                total += engine.step()[2]
            engine.forget(tag)
            if rep:  # the first round builds each shape's kernels
                times.setdefault((n, k), []).append(total * 1e3)
    rows = []
    for (n, k), v in sorted(times.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        plain = statistics.median(times[(n, None)])
        med = statistics.median(v)
        rows.append({"prompt_tokens": n, "top_k": k, "median_ms": round(med, 3),
                     "range_ms": [round(min(v), 3), round(max(v), 3)],
                     "extra_ms_per_position": round((med - plain) / n, 4)})
    if args.json:
        print(json.dumps({"model": args.model, "vocab": vocab, "device": engine.device,
                          "rows": rows}))
        return
    print(f"{args.model} on {engine.device}; vocabulary {vocab}")
    for r in rows:
        print(f"{r['prompt_tokens']:4d} tokens, top-k {str(r['top_k']):>4}: "
              f"{r['median_ms']:7.2f} ms (range {r['range_ms'][0]:.2f}-{r['range_ms'][1]:.2f}), "
              f"+{r['extra_ms_per_position']:.4f} ms per position")


if __name__ == "__main__":
    main()
