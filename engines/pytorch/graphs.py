"""Decode-only serving steps at static shapes, replayed as CUDA graphs (`TorchSpec.graphs`).

A decode step's shapes change from step to step (the batch, each sequence's context) and a
CUDA graph replays fixed ones, as vLLM's and gpt-fast's decode graphs do. So the batch pads to a
bucket (a power of two, at most `max_num_seqs`) and the key span to a multiple of `SPAN_TOKENS`;
a padded entry writes and reads a scratch slot past the real ones (the cache has one more slot
when graphs are on), which no sequence holds. A graph per (batch, span) bucket is captured at
its first use, its inputs copied into the captured buffers in one host-to-device copy per step.
On the CPU the same static-shape code runs eagerly (the tests check its tokens); a step replayed
as a graph reports no per-layer times.
"""

from __future__ import annotations

import torch

SPAN_TOKENS = 256
"""key span bucket (tokens): a decode step attends over its bucket's span, masked"""


class DecodeGraphs:
    """The captured decode graphs of one engine (`TorchEngine`, serving mode)."""

    def __init__(self, engine):
        self.engine = engine
        self.capture = engine.device.type == "cuda"
        self.graphs: dict[tuple[int, int], tuple] = {}  # (batch, span) -> graph, in, out

    def buckets(self, batch: int, span: int) -> tuple[int, int]:
        """The (batch, key span) a step of `batch` sequences seeing `span` tokens runs at."""
        spec = self.engine.spec
        b = 1
        while b < batch:
            b *= 2
        return min(b, spec.max_num_seqs), min(-(-span // SPAN_TOKENS) * SPAN_TOKENS,
                                              spec.max_model_len)

    def decode(self, ids: list[int], pos: list[int], slots: list[int]):
        """Logits [1, batch, vocab] of one decode token per sequence (at `pos`, in `slots`)."""
        e, n = self.engine, len(ids)
        b, span = self.buckets(n, max(pos) + 1)
        pad = b - n
        inputs = torch.tensor([ids + [0] * pad, pos + [0] * pad,
                               slots + [e.spec.max_num_seqs] * pad], device=e.device)
        if not self.capture:
            return e.static_decode(inputs, span)[:, :n]
        entry = self.graphs.get((b, span))
        if entry is None:
            entry = self.graphs[b, span] = self._capture(inputs, span)
        graph, static_in, static_out = entry
        static_in.copy_(inputs)
        graph.replay()
        return static_out[:, :n]

    def _capture(self, inputs, span: int) -> tuple:
        """Capture the static decode at this bucket (its warm-up runs write the same K/V the
        step writes: the same tokens at the same positions)."""
        e, static_in = self.engine, inputs.clone()
        side = torch.cuda.Stream(e.device)
        side.wait_stream(torch.cuda.current_stream(e.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                e.static_decode(static_in, span)
        torch.cuda.current_stream(e.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = e.static_decode(static_in, span)
        return graph, static_in, static_out
