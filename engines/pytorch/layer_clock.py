"""Per-layer times of one PyTorch engine step, without a sync per layer on CUDA."""

from __future__ import annotations

import time

import torch


class LayerClock:
    """Per-layer times of one step. On CUDA, events read after the step's one sync: a sync per
    layer would keep the host from queueing the next layer's kernels while the device runs this
    one, so the step would be timed as it does not run. On the CPU, wall time."""

    def __init__(self, cuda: bool, layers: int):
        self.cuda, self.ms = cuda, [0.0] * layers
        self.marks: list = []
        self.ran = layers  # layers the step ran (a skipping step stops early)

    def start(self):
        """A mark before a layer runs."""
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def stop(self, layer: int, mark) -> None:
        """Layer `layer` (0-based) ran since `mark`."""
        if not self.cuda:
            self.ms[layer] += (time.perf_counter() - mark) * 1e3
            return
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.marks.append((layer, mark, ev))

    def read_ms(self) -> list[float]:
        """Per-layer ms of the layers the step ran (CUDA: after the step's sync)."""
        for layer, a, b in self.marks:
            self.ms[layer] += a.elapsed_time(b)
        self.marks.clear()
        return self.ms[:self.ran]
