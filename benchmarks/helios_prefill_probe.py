"""A HELIOS round's first step alone: pure prefills of N prompts, timed on the engine and priced
by an exits profile's layered fit.

    python benchmarks/helios_prefill_probe.py DIR/target-small --depth 1

A round admits its prompts together, so its first token comes from one step that prefills them
all. Per N, on a fresh PyTorch engine of the profile's model at `--depth` (32 slots), the stream's
next N prompts are added and one step is timed by the engine (then the step is drained), against
the price the simulator gives that step (`at_depth(depth).step_ms(tokens, 0, tokens)` plus the
per-sequence term, as `sim.families.helios.replica.round_times` prices it); medians of
`--repeats`. The machine's speed moves both columns alike only when nothing else runs.
"""

from __future__ import annotations

import argparse
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


def probe(trace: str, depth: int, sizes: list[int], repeats: int) -> list[dict]:
    """Per prompt count: the engine's median step ms and the profile's price for that step."""
    p = load_profile(trace)
    model = p.step.at_depth(depth)
    prompts = [lm.encode(it.prompt) for _, it in ExitsWorkload(prompts_per_phase=120).prompts()]
    eng = TorchEngine(TorchSpec(model=p.model_dir, loaded_layers=depth, max_num_seqs=max(sizes),
                                max_model_len=1024, record_exits=True))
    _drain(eng, [(f"warm{i}", prompts[i]) for i in range(8)])
    rows, k = [], 0
    for n in sizes:
        live, price = [], []
        for _ in range(repeats):
            batch = [prompts[(k + j) % len(prompts)] for j in range(n)]
            k += n
            for j, ids in enumerate(batch):
                eng.add(f"r{k}-{j}", ids, 1)
            live.append(eng.step().duration_ms)
            _drain(eng, [])
            tokens = sum(len(b) for b in batch)
            price.append(model.step_ms(tokens, 0, tokens) + p.step.prefill_seqs_ms(depth, n))
        rows.append({"prompts": n, "live_ms": statistics.median(live),
                     "priced_ms": statistics.median(price)})
    return rows


def _drain(eng: TorchEngine, requests: list) -> None:
    for rid, ids in requests:
        eng.add(rid, ids, 4)
    while eng.has_unfinished():
        eng.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="an exits trace (e.g. helios replay --retrace DIR's DIR/MODEL)")
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")],
                    default=[1, 4, 8, 12, 16, 24, 32])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    scale = float(np.exp(np.median(load_profile(args.trace).step.residual_log_quantiles)))
    print(f"residual median scale {scale:.3f} (a round's first step is priced times it)")
    for r in probe(args.trace, args.depth, args.sizes, args.repeats):
        print(f"prompts {r['prompts']:3d}: engine step {r['live_ms']:8.2f} ms, priced "
              f"{r['priced_ms']:8.2f} ms, priced / engine {r['priced_ms'] / r['live_ms']:.2f}")


if __name__ == "__main__":
    main()
