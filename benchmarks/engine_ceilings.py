"""The PyTorch engine's speed against the device's measured ceilings: prints numbers.

    python benchmarks/engine_ceilings.py [--model models/configs/llama-3.1-8b] [--json]
    python benchmarks/engine_ceilings.py --dry-run     # the testbed model on the CPU, seconds

Measures the device first (a device-to-device copy's bandwidth, counting bytes read and
written; a bf16 matrix product's rate on random data; float32 on the CPU), then the engine in
each mode (`MODES`: per-prompt, serving, serving with decode graphs; on the CPU the graphs'
static code runs eagerly): a decode step at each batch size (median of timed
steps after warm-up, context ~`--context` tokens) against the bytes it must read (every weight
but the embedding table, plus the batch's KV) over the measured bandwidth; a prefill of one
prompt of each length against 2 x parameters x tokens FLOP over the measured matrix rate.
Medians of repeats; the ratio is engine time / ceiling time (1.0 = at the ceiling). And whether
the decode graphs, replayed, give the tokens their static code gives run eagerly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from engines.pytorch.engine import TorchEngine
from engines.pytorch.spec import TorchSpec


MODES = ("per-prompt", "serving", "serving-graphs")
"""the engine's modes, side by side (`TorchSpec.serving`, `TorchSpec.graphs`)"""


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _median_s(fn, dev, repeats: int = 5, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync(dev)
        t = time.perf_counter()
        fn()
        _sync(dev)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def device_ceilings(dev: torch.device, dtype: torch.dtype, mb: int, n: int) -> dict:
    """Copy bandwidth (bytes read + written per second) and matrix product rate (FLOP/s)."""
    src = torch.empty(mb * 2**20 // 4, dtype=torch.float32, device=dev).uniform_()
    dst = torch.empty_like(src)
    copy_s = _median_s(lambda: dst.copy_(src), dev, repeats=9)
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    mm_s = _median_s(lambda: a @ b, dev, repeats=9, warmup=3)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {"device": name, "copy_bytes_per_s": 2 * src.numel() * 4 / copy_s,
            "matmul_flop_per_s": 2 * n**3 / mm_s, "matmul_dtype": str(dtype).removeprefix("torch.")}


def _weights_bytes(engine: TorchEngine) -> tuple[int, int]:
    """(bytes a decode step reads of the weights, parameters a token's forward multiplies)."""
    m = engine.model
    embed = m.model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in m.parameters())
    params = sum(p.numel() for p in m.parameters())
    if m.lm_head.weight.data_ptr() != embed.data_ptr():  # untied: the table is only indexed
        total -= embed.numel() * embed.element_size()
        params -= embed.numel()
    return total, params


def decode_ms(engine: TorchEngine, batch: int, context: int, steps: int) -> float:
    """Median decode step (ms) of `batch` sequences at about `context` tokens."""
    for i in range(batch):
        engine.add(f"d{batch}-{i}", [7] * context, steps + 4, stop_at_eos=False)
    while engine.waiting or any(s.length < len(s.prompt_ids) for s in engine.running.values()):
        engine.step()  # the prompts, chunked or whole
    times = [engine.step().duration_ms for _ in range(steps)]
    while engine.has_unfinished():
        engine.step()
    for i in range(batch):
        engine.output_ids(f"d{batch}-{i}")
    return statistics.median(times[2:] if len(times) > 4 else times)


def prefill_ms(engine: TorchEngine, tokens: int, repeats: int) -> float:
    """Median time (ms) of the step that prefills one prompt of `tokens`."""
    times = []
    for r in range(repeats + 1):
        engine.add(f"p{tokens}-{r}", [7] * tokens, 1, stop_at_eos=False)
        times.append(engine.step().duration_ms)
        while engine.has_unfinished():
            engine.step()
        engine.output_ids(f"p{tokens}-{r}")
    return statistics.median(times[1:])


def graphs_agree(spec: TorchSpec, prompts: int = 4, tokens: int = 16) -> bool:
    """Whether the decode graphs replay the tokens their static code gives run eagerly (on the
    CPU both are eager: the check runs, it cannot differ)."""
    outs = []
    for capture in (False, True):
        engine = TorchEngine(TorchSpec(**{**spec.__dict__, "serving": True, "graphs": True}))
        engine._graphs.capture = capture and engine.device.type == "cuda"
        for i in range(prompts):
            engine.add(f"g{i}", [7 + i] * 32, tokens, stop_at_eos=False)
        while engine.has_unfinished():
            engine.step()
        outs.append([engine.output_ids(f"g{i}") for i in range(prompts)])
        del engine
    return outs[0] == outs[1]


def measure(args) -> dict:
    """Every figure of one run."""
    spec = TorchSpec(model=args.model, load_format=args.load_format, device=args.device,
                     max_num_seqs=max(args.batches), max_model_len=max(
                         max(args.prefill) + 8, args.context + args.steps + 16),
                     max_num_batched_tokens=max(args.prefill))
    probe = TorchEngine(spec)
    dev, dtype = probe.device, probe.dtype
    out = {"model": args.model, "torch": torch.__version__,
           **device_ceilings(dev, dtype, args.copy_mb, args.matmul_n)}
    weights, params = _weights_bytes(probe)
    kv_token = probe.kv_bytes_per_token_layer() * probe.num_layers
    out |= {"weights_bytes": weights, "params": params, "kv_bytes_per_token": kv_token,
            "decode": [], "prefill": []}
    del probe
    out["graphs_tokens_equal"] = graphs_agree(spec)
    for mode in MODES:
        engine = TorchEngine(TorchSpec(**{**spec.__dict__, "serving": mode != "per-prompt",
                                          "graphs": mode == "serving-graphs"}))
        for b in args.batches:
            ms = decode_ms(engine, b, args.context, args.steps)
            floor_ms = (weights + b * args.context * kv_token) / out["copy_bytes_per_s"] * 1e3
            out["decode"].append({"mode": mode, "batch": b, "step_ms": ms,
                                  "ceiling_ms": floor_ms, "x_ceiling": ms / floor_ms})
        for t in args.prefill:
            ms = prefill_ms(engine, t, args.repeats)
            floor_ms = 2 * params * t / out["matmul_flop_per_s"] * 1e3
            out["prefill"].append({"mode": mode, "tokens": t, "step_ms": ms,
                                   "tokens_per_s": t / ms * 1e3, "ceiling_ms": floor_ms,
                                   "of_matmul_rate": floor_ms / ms})
        del engine
    return out


def main() -> None:
    """Measure and print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/configs/llama-3.1-8b")
    ap.add_argument("--load-format", default="dummy", choices=["auto", "dummy"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64])
    ap.add_argument("--prefill", type=lambda s: [int(x) for x in s.split(",")], default=[512, 2048])
    ap.add_argument("--context", type=int, default=128, help="decode context tokens")
    ap.add_argument("--steps", type=int, default=12, help="decode steps timed per batch")
    ap.add_argument("--repeats", type=int, default=3, help="prefills timed per length")
    ap.add_argument("--copy-mb", type=int, default=2048)
    ap.add_argument("--matmul-n", type=int, default=8192)
    ap.add_argument("--dry-run", action="store_true",
                    help="the testbed model on the CPU, small: checks the script, not a device")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.dry_run:
        args.model, args.load_format, args.device = "models/testbed/target-large", "auto", "cpu"
        args.batches, args.prefill, args.context, args.steps = [1, 4], [64, 256], 32, 6
        args.repeats, args.copy_mb, args.matmul_n = 2, 64, 512
    out = measure(args)
    if args.json:
        print(json.dumps(out))
        return
    print(f"decode graphs replay their eager tokens: {out['graphs_tokens_equal']}")
    print(f"{out['device']} ({out['matmul_dtype']}): copy {out['copy_bytes_per_s'] / 1e12:.3f} "
          f"TB/s, matmul {out['matmul_flop_per_s'] / 1e12:.1f} TFLOP/s; {args.model}: "
          f"{out['weights_bytes'] / 1e9:.2f} GB of weights read per decode step")
    for d in out["decode"]:
        print(f"decode {d['mode']:>14} batch {d['batch']:>3}: {d['step_ms']:8.2f} ms, ceiling "
              f"{d['ceiling_ms']:7.2f} ms, {d['x_ceiling']:5.2f}x")
    for p in out["prefill"]:
        print(f"prefill {p['mode']:>14} {p['tokens']:>5} tokens: {p['step_ms']:8.2f} ms, "
              f"{p['tokens_per_s']:9.0f} tokens/s, {p['of_matmul_rate']:6.1%} of the matmul rate")


if __name__ == "__main__":
    main()
