"""What a step of a token count the engine has not run yet costs, on the live engine, in isolation.

    python benchmarks/first_of_shape.py [--idle-ms 0] [--beside-decode] [--larger-first] [--json]

One fresh vLLM engine (the testbed's target-large, the fidelity loop's limits) warmed up as a
replay's is; then one-token requests of 20 small prompt lengths (9-47 tokens), each alone, its
prefill step timed: first each length once (a first-of-shape step), then each again (a
repeated shape). `--idle-ms`: the engine sits idle that long before each request;
`--beside-decode`: a long request decodes meanwhile, so each prefill is a mixed step;
`--larger-first`: 20 prompts of 101-481 tokens run before (their shapes compiled first). Prints
the medians of the first-of-shape and repeated steps and their difference, what the serving
model's first-of-shape term prices (`sim.step_time.serving_features`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SMALL = tuple(range(9, 49, 2))
LARGER = tuple(range(101, 501, 20))


def prefill_ms(eng, prompt: list[int], request_id: str, idle_s: float) -> float:
    """Submit a one-token request after `idle_s` (steps of any other request running on) and
    return the ms of the step that prefilled it."""
    from vllm import SamplingParams

    end = time.perf_counter() + idle_s
    while time.perf_counter() < end:
        if eng.has_unfinished():
            eng.step()
        else:
            time.sleep(max(end - time.perf_counter(), 0.0))
    eng.add(request_id, prompt, SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0,
                                               detokenize=False))
    while True:
        _, _, dt, sched = eng.step()
        if sched and sched["prefill_tokens"]:
            return dt * 1e3


def main() -> None:
    """Start the engine, time the steps, print the medians."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--idle-ms", type=float, default=0.0)
    ap.add_argument("--beside-decode", action="store_true")
    ap.add_argument("--larger-first", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from vllm import SamplingParams

    from engines.vllm_engine import Engine, EngineSpec
    from validation.replay import DEFAULT_MODEL

    eng = Engine(EngineSpec(model=str(DEFAULT_MODEL), max_num_seqs=16,
                            max_num_batched_tokens=2048))
    eng.warm_up()
    vocab = int(eng.engine.vllm_config.model_config.get_vocab_size())
    rng = np.random.default_rng(0)

    def prompt(n: int) -> list[int]:
        return rng.integers(10, vocab - 1, n).tolist()
    if args.beside_decode:  # long enough to outlast every prefill below
        eng.add("decode", prompt(64), SamplingParams(max_tokens=1900, ignore_eos=True,
                                                     temperature=0.0, detokenize=False))
        for _ in range(10):
            eng.step()
    idle_s = args.idle_ms / 1e3
    for i, n in enumerate(LARGER if args.larger_first else ()):
        prefill_ms(eng, prompt(n), f"larger{i}", idle_s)
    first = [prefill_ms(eng, prompt(n), f"first{i}", idle_s) for i, n in enumerate(SMALL)]
    again = [prefill_ms(eng, prompt(n), f"again{i}", idle_s) for i, n in enumerate(SMALL)]
    out = {"idle_ms": args.idle_ms, "beside_decode": args.beside_decode,
           "larger_first": args.larger_first, "first_ms": float(np.median(first)),
           "repeated_ms": float(np.median(again)),
           "first_of_shape_ms": float(np.median(first) - np.median(again))}
    print(json.dumps(out) if args.json else
          f"first-of-shape {out['first_ms']:.2f} ms, repeated {out['repeated_ms']:.2f} ms: "
          f"+{out['first_of_shape_ms']:.2f} ms (idle {args.idle_ms:g} ms"
          f"{', beside a decode' if args.beside_decode else ''}"
          f"{', larger shapes first' if args.larger_first else ''})")


if __name__ == "__main__":
    main()
