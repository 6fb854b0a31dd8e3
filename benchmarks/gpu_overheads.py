"""What a GPU machine charges the eager PyTorch engine per sync, per kernel launch and per decode
layer, beside the same layer replayed as a CUDA graph: prints numbers (medians of repeats).

    python benchmarks/gpu_overheads.py [--model models/configs/llama-3.1-8b] [--json]

The PyTorch engine (`engines.pytorch.engine`) runs eager kernels; where launches are slow (a
sandboxed kernel, say) a step's time is launch time, and a calibration from it says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _median_us(fn, repeats: int = 7, inner: int = 50) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / inner * 1e6)
    return statistics.median(times)


def main() -> None:
    """Measure and print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/configs/llama-3.1-8b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    dev = torch.device("cuda")
    x = torch.zeros(16, device=dev)
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "sync_us": _median_us(torch.cuda.synchronize),
           "tiny_kernel_us": _median_us(lambda: x.add_(1), inner=1000) }
    cfg = AutoConfig.from_pretrained(args.model)
    with torch.device(dev):
        layer = LlamaDecoderLayer(cfg, 0).to(torch.bfloat16).eval()
        rope = LlamaRotaryEmbedding(cfg)
        h = torch.randn(args.batch, 1, cfg.hidden_size, dtype=torch.bfloat16)
        pos = torch.zeros(args.batch, 1, dtype=torch.long)
    with torch.inference_mode():
        cos, sin = rope(h, pos)

        def step():
            return layer(h, position_embeddings=(cos, sin), attention_mask=None)

        out["layer_eager_us"] = _median_us(step)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        out["layer_graph_us"] = _median_us(graph.replay)
    weight_bytes = sum(p.numel() * p.element_size() for p in layer.parameters())
    out["layer_weight_mb"] = weight_bytes / 1e6
    out |= {"model": args.model, "batch": args.batch}
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
