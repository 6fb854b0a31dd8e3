"""What-if early-exit profiles for real model shapes that have no trained exits or traces here.

Everything that is not the model's shape is stated in the config and labelled what-if: the exit
distribution per phase of the prompt stream (share of tokens whose first confident exit is each
exit layer), the prompt stream itself, and the device (memory bandwidth, peak compute, weight
load bandwidth). Shapes come from the model's `config.json` (OPT and Llama families): weight
bytes per decoder layer and KV bytes per token per layer.

Step time is a roofline sum per loaded layer (`sim.step_time.layered.LayeredModel` coefficients):
reading the layer's weights once per step (memory-bound decode: the cost a larger batch amortises),
its matmul FLOPs per token computed, and reading each sequence's KV for the layer. Summing the terms
instead of taking their max errs slow; it is a what-if, not a measurement.

Tokens are drawn per prompt from the phase's exit distribution (seeded); a token's max
probability is `CONFIDENT` at its first confident exit and every later exit, `UNSURE` at earlier
exits, 0 where a layer has no exit. The token stream does not depend on the loaded depth (a
what-if cannot know how a shallower model's tokens would differ). A round's tokens are read
from their first confident exits alone, in compiled passes (`sim.kernels.whatif_tokens`), so
no array of their probabilities is made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from policies.exit_tokens import FLOOR, first_exits
from sim.families.helios.profile import ModelProfile
from sim.kernels.whatif_tokens import (column_sums_at, drawn_exits, first_exit_counts,
                                       past_depth, sums_at_depth)
from sim.model_shape import layer_shape
from sim.step_time.layered import LayeredModel

CONFIDENT, UNSURE = 0.95, 0.3
DRAW_STRETCH = 1 << 16
"""uniforms drawn at once (512 KB: read back from cache, not memory)"""
SHARES_ATOL = float(np.sqrt(np.finfo(np.float64).eps))
"""how far a phase's exit shares may sum from 1 (numpy's own tolerance for probabilities)"""


@dataclass(frozen=True)
class Device:
    """A what-if accelerator (datasheet figures, not measured)."""

    memory_bw_gb_s: float
    peak_tflops: float
    load_gb_s: float
    """host-to-device bandwidth for loading layer weights"""
    step_overhead_ms: float = 0.0
    """per-step time outside the layers (scheduling, embedding, head)"""


@dataclass(frozen=True)
class Phase:
    """A stretch of the prompt stream with one task mix."""

    prompts: int
    prompt_tokens: int
    output_tokens: int


def roofline(device: Device, weight_bytes: int, params: int, kv_bytes: int,
             layers: int) -> LayeredModel:
    """Per-layer step time from the device's bandwidth and compute (what-if)."""
    bw = device.memory_bw_gb_s * 1e9 / 1e3   # bytes per ms
    flops = device.peak_tflops * 1e12 / 1e3  # FLOP per ms
    per_token = 2 * params / flops
    layer = (weight_bytes / bw, per_token, per_token, kv_bytes / bw, 0.0)
    return LayeredModel((device.step_overhead_ms, 0.0, 0.0, 0.0, 0.0), layer, layers)


class SyntheticStreams:
    """`streams[depth]`: the stream with `depth` layers loaded (`WhatIfDepth`, on demand)."""

    def __init__(self, first_exit: np.ndarray, starts: np.ndarray, exit_layers: list[int],
                 layers: int):
        self.first_exit, self.starts = first_exit, starts
        """each token's first confident exit layer, stream order; each prompt's first token"""
        self.has_exit = np.zeros(layers + 1, dtype=bool)
        self.has_exit[exit_layers] = True
        self.deepest = int(first_exit.max()) if first_exit.size else 0
        """the deepest first confident exit: at and past it, every token is confident"""
        self.longest = int(np.diff(starts).max()) if len(starts) > 1 else 0
        self.depths: dict[int, WhatIfDepth] = {}

    def __getitem__(self, depth: int) -> "WhatIfDepth":
        if depth not in self.depths:
            self.depths[depth] = WhatIfDepth(self, depth)
        return self.depths[depth]


class WhatIfDepth:
    """One loaded depth's what-if stream, as `sim.families.helios.blocks.DepthStream` reads a
    traced one (no tokens traced)."""

    argmax = None

    def __init__(self, streams: SyntheticStreams, depth: int):
        self.s, self.depth, self.starts = streams, depth, streams.starts
        self.neglogs = tuple(-math.log(max(p, FLOOR)) for p in (CONFIDENT, UNSURE, 0.0))
        self.repeated: dict[float, np.ndarray] = {}

    def rows(self, index) -> np.ndarray:
        """tokens x exits: the max probabilities of the tokens at `index`."""
        return self._grid(index, (CONFIDENT, UNSURE, 0.0))

    def at(self, index, layer: int) -> np.ndarray:
        """The max probability at `layer` (1-based) of the tokens at `index`."""
        return self._pick(index, layer, (CONFIDENT, UNSURE, 0.0))

    def ids_at(self, index, layer: int) -> None:
        """No tokens: a what-if has none."""
        return None

    def neglog(self, index) -> np.ndarray:
        """tokens x exits: -log(max(p, FLOOR)) of the tokens at `index` (`math.log`'s)."""
        return self._grid(index, self.neglogs)

    def neglog_at(self, index, layer: int) -> np.ndarray:
        """-log(max(p, FLOOR)) at `layer` of the tokens at `index` (`math.log`'s values)."""
        return self._pick(index, layer, self.neglogs)

    def below(self, block, threshold: float) -> np.ndarray:
        """Each token of `block` (a `RoundBlock` of this stream) below `threshold` at the
        depth (`at`'s values compared), in one compiled pass over its prompts' tokens."""
        at_past, before = self._values(self.depth, (CONFIDENT, UNSURE, 0.0))
        if (at_past < threshold) == (before < threshold):  # the same for every token
            return np.full(int(block.lengths.sum()), at_past < threshold)
        past = past_depth(self.s.first_exit, self.starts, block.prompts, self.depth)
        return past if before < threshold else ~past

    def prompt_nll(self, block) -> np.ndarray:
        """Per prompt of `block`, its tokens' -log values at the depth (`neglog_at`'s) added in
        token order (`prompt_sums`'s sums), in one compiled pass."""
        at_past, before = self._values(self.depth, self.neglogs)
        if at_past == before:  # every token the same: k of them sum as any k do
            return self._repeated(at_past)[block.lengths]
        return sums_at_depth(self.s.first_exit, self.starts, block.prompts, self.depth,
                             at_past, before)

    def exit_counts(self, block, threshold: float) -> np.ndarray:
        """Per exit, the tokens of `block` leaving there at `threshold` (`exit_counts` of their
        rows): each first confident exit's tokens counted in one compiled pass, then where a
        token with that first exit leaves."""
        firsts = first_exit_counts(self.s.first_exit, self.starts, block.prompts,
                                   len(self.s.has_exit) - 1)
        f = np.flatnonzero(firsts)
        leave = first_exits(self._grid_of(f, (CONFIDENT, UNSURE, 0.0)), threshold)
        out = np.zeros(self.depth, dtype=np.int64)
        np.add.at(out, leave, firsts[f])
        return out

    def exit_neglog_sums(self, block, start: np.ndarray) -> np.ndarray:
        """Per exit, `start` and the -log values of `block`'s tokens added in token order
        (`column_sums` of their `neglog` rows), in one compiled pass."""
        at = [self._values(layer, self.neglogs) for layer in range(1, self.depth + 1)]
        values = np.array([[before for _, before in at], [at_past for at_past, _ in at]])
        return column_sums_at(self.s.first_exit, self.starts, block.prompts, values,
                              np.asarray(start, dtype=float))

    def _values(self, layer: int, values: tuple) -> tuple:
        """(at and past a token's first confident exit, before it): a layer's two values, the
        same one twice where every token reads it (no exit at the layer, or no token's first
        confident exit past it)."""
        if not self.s.has_exit[layer]:
            return values[2], values[2]
        return (values[0], values[0]) if layer >= self.s.deepest else (values[0], values[1])

    def _repeated(self, value: float) -> np.ndarray:
        """[k]: `value` added k times from 0.0, in turn (a sequential cumulative sum), for k up
        to the longest prompt's tokens."""
        table = self.repeated.get(value)
        if table is None:
            table = self.repeated[value] = np.concatenate(
                [[0.0], np.cumsum(np.full(self.s.longest, value))])
        return table

    def _grid(self, index, values: tuple) -> np.ndarray:
        """tokens x exits: values[0] at and past a token's first confident exit, values[1]
        before it, values[2] where a layer has no exit."""
        return self._grid_of(self.s.first_exit[index], values)

    def _grid_of(self, first: np.ndarray, values: tuple) -> np.ndarray:
        """`_grid` of tokens whose first confident exits are `first`."""
        layer = np.arange(1, self.depth + 1)
        first = np.asarray(first)[:, None]
        return np.where(self.s.has_exit[1:self.depth + 1],
                        np.where(layer >= first, values[0], values[1]), values[2])

    def _pick(self, index, layer: int, values: tuple) -> np.ndarray:
        first = self.s.first_exit[index]
        at_past, before = self._values(layer, values)
        return np.where(layer >= first, at_past, before)


def draw_exits(rng: np.random.Generator, exit_layers: list[int], shares: list[float],
               shape: tuple[int, ...], out: np.ndarray | None = None) -> np.ndarray:
    """Each token's first confident exit, as `rng.choice(exit_layers, size=shape, p=shares)`
    draws it (the same uniforms, in turn, against the same normalised cumulative shares), as
    int16, without its per-sample cost: uniforms drawn a cache-sized stretch at a time. `out`:
    the flat integer array to draw into, of a type that holds the layers (None: a new int16
    one)."""
    cdf = np.asarray(shares, dtype=float).cumsum()
    cdf /= cdf[-1]
    if out is None:
        out = np.empty(int(np.prod(shape)), dtype=np.int16)
    layers = np.asarray(exit_layers, dtype=out.dtype)
    uniforms = np.empty(min(DRAW_STRETCH, len(out)))
    for a in range(0, len(out), DRAW_STRETCH):
        u = uniforms[:min(DRAW_STRETCH, len(out) - a)]
        rng.random(out=u)
        out[a:a + len(u)] = drawn_exits(u, cdf, layers) if len(layers) < 256 else \
            layers[cdf.searchsorted(u, side="right")]  # beyond the compiled count's bytes
    return out.reshape(shape)


def what_if_profile(name: str, config_path: str | Path, exit_layers: list[int],
                    exit_shares: list[list[float]], phases: list[Phase], device: Device,
                    seed: int) -> ModelProfile:
    """A model profile from its shape and stated what-if inputs; errors name the input."""
    layers, weight_bytes, params, kv_bytes, embed_bytes = layer_shape(config_path)
    if sorted(set(exit_layers)) != list(exit_layers) or not exit_layers or \
            exit_layers[0] < 1 or exit_layers[-1] != layers:
        raise ValueError(f"exit_layers {exit_layers}: increasing, from 1 up to the last layer "
                         f"({layers})")
    if len(exit_shares) != len(phases):
        raise ValueError(f"exit_shares: one distribution per phase ({len(phases)}), got "
                         f"{len(exit_shares)}")
    for k, shares in enumerate(exit_shares):
        if len(shares) != len(exit_layers) or min(shares) < 0 or \
                abs(sum(shares) - 1) > SHARES_ATOL:
            raise ValueError(f"exit_shares[{k}]: {len(exit_layers)} non-negative shares "
                             "summing to 1 (one per exit layer)")
    prompt_tokens: list[int] = []
    lengths: list[int] = []
    for phase in phases:
        prompt_tokens += [phase.prompt_tokens] * phase.prompts
        lengths += [phase.output_tokens] * phase.prompts
    starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    # a byte a token where the layers fit in one: a stream is the run's largest array
    first_exit = np.empty(int(starts[-1]), np.uint8 if layers < 256 else np.int16)
    rng, at = np.random.default_rng(seed), 0
    for phase, shares in zip(phases, exit_shares):
        # one draw for the phase, into the stream: the same values as a draw per prompt in turn
        n = phase.prompts * phase.output_tokens
        draw_exits(rng, exit_layers, shares, (phase.prompts, phase.output_tokens),
                   out=first_exit[at:at + n])
        at += n
    return ModelProfile(
        name=name, model_dir=str(config_path), layers=layers, prompt_tokens=prompt_tokens,
        streams=SyntheticStreams(first_exit, starts, exit_layers, layers),  # type: ignore
        step=roofline(device, weight_bytes, params, kv_bytes, layers),
        weight_bytes=weight_bytes, kv_bytes_per_token=kv_bytes,
        load_ms_per_layer=weight_bytes / (device.load_gb_s * 1e9) * 1e3,
        device="what-if", workload={"max_tokens": max(p.output_tokens for p in phases)},
        resident_bytes=embed_bytes)
