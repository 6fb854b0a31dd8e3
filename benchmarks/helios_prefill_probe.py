"""A HELIOS round's steps alone: N prompts prefilled together, then decoded, timed on the engine
at each KV row length and priced by an exits profile's layered fit.

    python benchmarks/helios_prefill_probe.py DIR/target-small --depth 1
    python benchmarks/helios_prefill_probe.py DIR/target-small --max-model-len 1024,137

A round admits its prompts together, so its first token comes from one step that prefills them
all, and its decode steps run the whole batch until the first sequence ends. Per N, on one fresh
PyTorch engine of the profile's model at `--depth` per `--max-model-len` (the KV cache's row
length: the tracer's engines hold 1024, a live replay's the stream's longest prompt plus its
output), the stream's next N prompts are added and stepped; the first step (the prefill) and
the median of the steps that decode all N are timed by the engine, against the prices the
simulator gives them (`sim.families.helios.replica.round_times`: the prefill step with the
prompts' tokens as its context, plus the per-sequence term; a decode step of N sequences over
their context). Engines take turns per repeat, so a spell of the machine lands on each alike;
medians of `--repeats`.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engines.pytorch.engine import TorchEngine, TorchSpec  # noqa: E402
from sim.families.helios.profile import load_profile  # noqa: E402
from testbed import lm  # noqa: E402
from testbed.streams import ExitsWorkload  # noqa: E402

DECODE_TOKENS = 16
"""tokens each probe request generates (its decode steps)"""
_IDS = itertools.count()  # request ids, unique across engines and repeats


def probe(trace: str, depth: int, sizes: list[int], lengths: list[int],
          repeats: int) -> list[dict]:
    """Per prompt count and row length: the engine's median prefill and full-batch decode step
    ms, and the profile's prices for them."""
    p = load_profile(trace)
    model = p.step.at_depth(depth)
    prompts = [lm.encode(it.prompt) for _, it in ExitsWorkload(prompts_per_phase=120).prompts()]
    engines = {n_len: TorchEngine(TorchSpec(model=p.model_dir, loaded_layers=depth,
                                            max_num_seqs=max(sizes), max_model_len=n_len,
                                            record_exits=True)) for n_len in lengths}
    for eng in engines.values():
        _serve(eng, prompts[:8])
    rows, k = [], 0
    for n in sizes:
        times = {n_len: ([], []) for n_len in lengths}
        price = ([], [])
        for _ in range(repeats):
            batch = [prompts[(k + j) % len(prompts)] for j in range(n)]
            k += n
            for n_len, eng in engines.items():
                first, decode = _serve(eng, batch)
                times[n_len][0].append(first)
                times[n_len][1].append(decode)
            tokens = sum(len(b) for b in batch)
            price[0].append(model.step_ms(tokens, 0, tokens) + p.step.prefill_seqs_ms(depth, n))
            price[1].append(model.step_ms(0, n, tokens + n * DECODE_TOKENS // 2))
        for n_len in lengths:
            rows.append({"prompts": n, "max_model_len": n_len,
                         "prefill_ms": statistics.median(times[n_len][0]),
                         "decode_ms": statistics.median(times[n_len][1]),
                         "prefill_priced_ms": statistics.median(price[0]),
                         "decode_priced_ms": statistics.median(price[1])})
    return rows


def _serve(eng: TorchEngine, batch: list) -> tuple[float, float]:
    """Add the prompts, step until they finish: (first step ms, median ms of the steps that
    decode every one of them)."""
    for ids in batch:
        eng.add(f"p{next(_IDS)}", ids, DECODE_TOKENS)
    first = eng.step().duration_ms
    decode = []
    while eng.has_unfinished():
        r = eng.step()
        if r.decode_seqs == len(batch):
            decode.append(r.duration_ms)
    return first, statistics.median(decode) if decode else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="an exits trace (e.g. helios replay --retrace DIR's DIR/MODEL)")
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")],
                    default=[1, 4, 8, 16, 32])
    ap.add_argument("--max-model-len", type=lambda t: [int(x) for x in t.split(",")],
                    default=[1024], help="KV row lengths, one engine each (the tracer's: 1024)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    scale = float(np.exp(np.median(load_profile(args.trace).step.residual_log_quantiles)))
    print(f"residual median scale {scale:.3f} (a round's first step is priced times it)")
    for r in probe(args.trace, args.depth, args.sizes, args.max_model_len, args.repeats):
        print(f"prompts {r['prompts']:3d}, rows {r['max_model_len']:5d}: prefill "
              f"{r['prefill_ms']:8.2f} ms (priced/engine "
              f"{r['prefill_priced_ms'] / r['prefill_ms']:.2f}), decode {r['decode_ms']:7.3f} ms "
              f"(priced/engine {r['decode_priced_ms'] / r['decode_ms']:.2f})")


if __name__ == "__main__":
    main()
