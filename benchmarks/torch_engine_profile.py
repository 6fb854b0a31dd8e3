"""Where the PyTorch engine's decode step spends its time: torch.profiler over a few steps of a
steady batch, top operators by self CPU and by device time (prints tables).

    python benchmarks/torch_engine_profile.py --model models/testbed/target-large --batch 8
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from engines.pytorch.engine import TorchEngine
from engines.pytorch.spec import TorchSpec


def main() -> None:
    """Profile and print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/testbed/target-large")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--record-exits", action="store_true")
    args = ap.parse_args()
    eng = TorchEngine(TorchSpec(model=args.model, load_format=args.load_format,
                                max_num_seqs=args.batch, max_model_len=1024,
                                record_exits=args.record_exits))
    for i in range(args.batch):
        eng.add(f"r{i}", [5 + (i + j) % 50 for j in range(args.prompt)], 200, stop_at_eos=False)
    for _ in range(10):
        eng.step()
    t = time.perf_counter()
    walls = [eng.step().duration_ms for _ in range(args.steps)]
    print(f"{args.model} batch {args.batch}: step ms {[round(w, 2) for w in walls]} "
          f"({(time.perf_counter() - t) * 1e3 / args.steps:.2f} ms wall each)")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for _ in range(args.steps):
            eng.step()
    avg = prof.key_averages()
    print(avg.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=40))
    if torch.cuda.is_available():
        print(avg.table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=40))


if __name__ == "__main__":
    main()
