"""The HELIOS replica: one device serving its share of a prompt stream in rounds.

A replica kind of the cluster model: its state is the loaded (model, depth); its work, the rounds
its own program (`programs.helios.HeliosProgram`, with its own policy) plans over the prompts
routed to it. A layer load or model switch is a timed event (layers x measured load time), then
the round's prefill step and its decode steps, fast-forwarded between sequence finishes with the
step-time model's closed form (events grow with rounds and finishes, not tokens).

With `overlap_loading` a standby server beside the replica loads the next round's model while
the current round serves, where the program knows that round's decision before this one ends
(`HeliosProgram.lookahead`: the evaluation's next candidate, the next interval's first), as the
paper's "model loading concurrently on another server"; at the switch the two servers trade
places, and the round waits only for what of the load is left.

The EE-full baseline (whole model loaded, one sequence, per-token exits at a threshold, EE-LLM's
layer skipping with KV recomputation as `engines/pytorch/engine.py` runs it) serves each prompt
alone: the tokens are the full-depth stream's, each exits at the first layer whose max
probability reaches the threshold, and each decode step runs layers 1..its exit over the new
token plus the pending ones (those fed since the last step that ran every layer). Its step time
is a second layered model fitted on the trace's layer-skipping steps (`ee<t>` cells).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import simpy

from programs.helios import HeliosProgram, Round
from sim.families.helios.blocks import RoundBlock
from sim.families.helios.profile import ModelProfile
from sim.families.helios.rows import RequestColumns
from sim.step_time.latency import feature_matrix, run_ms
from sim.step_time.layered import LayeredModel


class HeliosReplica:
    """One device: serves its program's rounds on its own clock and keeps their rows.

    The replicas of a cluster never interact (each serves its own share), so each runs its
    timeline as a plain loop (`serve`); `steps` gives the same timeline as delays, which a SimPy
    process (`process`) waits out instead."""

    def __init__(self, replica_id: int, program: HeliosProgram,
                 profiles: dict[str, ModelProfile], overlap_loading: bool = False):
        self.replica_id, self.program, self.profiles = replica_id, program, profiles
        self.overlap_loading = overlap_loading
        self.now_s = 0
        """the replica's clock (SimPy's: an int 0 until the first delay)"""
        self.loaded: tuple[str, int] | None = None
        self.standby: tuple[str, int] | None = None
        """what the standby server holds (overlap_loading)"""
        self.prefetch: tuple[tuple[str, int], float] | None = None
        """(what the standby server is loading, when it is ready)"""
        self.requests = RequestColumns()
        self.round_rows: list[dict] = []

    def serve(self) -> None:
        """Every round of the program, in turn, on the replica's own clock."""
        for delay_s in self.steps():
            self.now_s = self.now_s + delay_s

    def process(self, env: simpy.Environment):
        """The same timeline as a SimPy process (the reference `serve` is checked against)."""
        for delay_s in self.steps():
            yield env.timeout(delay_s)
            self.now_s = env.now

    def steps(self):
        """Every round of the program, in turn: yields each delay (a load, a round's serving)
        for the caller to advance `now_s` by."""
        while (rnd := self.program.next_round()) is not None:
            s = rnd.serve
            wait_ms = self._switch((s.model, s.depth))
            if wait_ms:
                yield wait_ms / 1e3
            start = self.now_s
            if self.overlap_loading:
                self._prefetch(self.program.lookahead(), start)
            block = RoundBlock(self.profiles[s.model].streams[s.depth], rnd.prompts)
            times, layer_tokens = self._timing(rnd, start, block)
            yield times["end_s"]
            self._round_row(rnd, start, times, wait_ms, layer_tokens)
            self.program.finish_block(block)

    def _switch(self, want: tuple[str, int]) -> float:
        """Serve `want` next: the milliseconds the round waits for its layers (what is left of
        the standby server's load, or the serving server's own)."""
        if want == self.loaded:
            return 0.0
        if self.prefetch is not None and self.prefetch[0] == want:
            wait_ms = max(0.0, (self.prefetch[1] - self.now_s) * 1e3)
            self.standby, self.loaded, self.prefetch = self.loaded, want, None
            return wait_ms
        wait_ms = reload_ms(self.loaded, want, self.profiles)
        self.loaded = want
        return wait_ms

    def _prefetch(self, nxt, now_s: float) -> None:
        """The standby server starts loading the next round's layers (nothing to load: none)."""
        self.prefetch = None
        if nxt is None or (nxt.model, nxt.depth) == self.loaded:
            return
        want = (nxt.model, nxt.depth)
        self.prefetch = (want, now_s + reload_ms(self.standby, want, self.profiles) / 1e3)

    def _timing(self, rnd: Round, start: float, block: RoundBlock) -> tuple[dict, int]:
        """The round's timing and layer-token executions (its tokens: `block`); its prompts'
        rows kept."""
        s = rnd.serve
        p = self.profiles[s.model]
        prompts = [p.prompt_tokens[i] for i in rnd.prompts]
        if s.exit_threshold is None:
            served = p.served_at(block)
            outputs = served.output_tokens.tolist()
            times = round_times(p.step.at_depth(s.depth), prompts, outputs,
                                scale=mean_scale(p.step),
                                per_seq_ms=p.step.prefill_seqs_ms(s.depth, 1),
                                gap_ms=p.step_gap_ms, first_scale=median_scale(p.step),
                                padded=p.padded_decode)
            self.requests.add_round(self.replica_id, s, rnd.prompts, prompts, start, times,
                                    served)
            # tokens each layer processed: the prompts, and every output but the last
            return times, s.depth * (sum(prompts) + sum(outputs) - len(outputs))
        if len(rnd.prompts) != 1:
            raise ValueError("layer skipping (an exit threshold) serves one sequence at "
                             f"a time; the program planned {len(rnd.prompts)}")
        exits, nll, agree = p.served_with(s.depth, rnd.prompts[0], s.exit_threshold)
        times = ee_times(_ee_step(p), prompts[0], exits, s.depth, p.step_gap_ms)
        self.requests.add_one(self.replica_id, s, rnd.prompts[0], prompts[0], start, times,
                              (exits, nll, agree))
        return times, times["layer_tokens"]

    def _round_row(self, rnd: Round, start: float, times: dict, load_ms: float,
                   layer_tokens: int) -> None:
        s = rnd.serve
        self.round_rows.append({"start_s": start, "model": s.model, "depth": s.depth,
                                "batch": len(rnd.prompts), "steps": times["steps"],
                                "busy_ms": times["busy_s"] * 1e3,
                                "first_step_ms": times["first_s"] * 1e3, "load_ms": load_ms,
                                "event": s.event or "", "layer_tokens": layer_tokens,
                                "replica_id": self.replica_id})


def reload_ms(loaded: tuple[str, int] | None, want: tuple[str, int],
              profiles: dict[str, ModelProfile]) -> float:
    """Time to go from the loaded (model, depth) to the wanted one: deeper layers of the same
    model, or the whole wanted depth of another (dropping layers is free; a switched-out model
    keeps only its embedding and head)."""
    if loaded == want:
        return 0.0
    model, depth = want
    have = loaded[1] if loaded is not None and loaded[0] == model else 0
    return max(depth - have, 0) * profiles[model].load_ms_per_layer


@lru_cache(maxsize=256)  # a model is frozen: asked once per round, computed once
def median_scale(model) -> float:
    """The multiplicative residual's median: a single step's typical time over the prediction
    (skewed by stalls, the mean sits above it; a run of many steps sums to the mean)."""
    return float(np.exp(np.median(model.residual_log_quantiles)))


@lru_cache(maxsize=256)
def mean_scale(model) -> float:
    """The multiplicative residual's mean (`residual_sampler`'s), which a run of steps sums to."""
    return model.residual_sampler()[0]


def _ee_step(p: ModelProfile) -> LayeredModel:
    if p.ee_step is None:
        raise ValueError(f"{p.name}: the EE-full baseline needs an exits trace with layer-skipping "
                         "steps (reasonsim trace exits --ee-thresholds 0.9)")
    return p.ee_step


def ee_times(model: LayeredModel, prompt_tokens: int, exits: list[int], layers: int,
             gap_ms: float = 0.0) -> dict:
    """One sequence with layer skipping: the prefill runs every layer; the decode step giving
    token j runs layers 1..exits[j] over the new token and the pending ones (fed since the last
    step that ran all `layers`), and leaves them pending unless it ran every layer. The loop's
    host time (`gap_ms`) follows each step; the sequence finishes as its last step returns."""
    n = len(exits)
    pending = np.zeros(n, dtype=float)  # pending tokens each decode step recomputes
    for j in range(2, n):
        pending[j] = 0 if exits[j - 1] == layers else pending[j - 1] + 1
    depth = np.asarray(exits, dtype=float)
    context = prompt_tokens + np.arange(n, dtype=float)  # computed tokens after step j
    x = feature_matrix(pending[1:], np.ones(n - 1), context[1:])
    decode_ms = x @ np.asarray(model.fixed_ms) + depth[1:] * (x @ np.asarray(model.layer_ms))
    first_ms = model.at_depth(layers).step_ms(prompt_tokens, 0, prompt_tokens) \
        + model.prefill_seqs_ms(layers, 1)
    scale, first_scale = mean_scale(model), median_scale(model)
    busy_s = (first_ms * first_scale + float(decode_ms.sum()) * scale) / 1e3
    return {"first_s": first_ms * first_scale / 1e3,
            "finish_s": [busy_s + (n - 1) * gap_ms / 1e3],
            "end_s": busy_s + n * gap_ms / 1e3, "busy_s": busy_s, "steps": n,
            "layer_tokens": int(layers * prompt_tokens + (depth[1:] * (pending[1:] + 1)).sum())}


def round_times(model, prompt_tokens: list[int], output_tokens: list[int],
                scale: float = 1.0, per_seq_ms: float = 0.0, gap_ms: float = 0.0,
                first_scale: float | None = None, padded: bool = False) -> dict:
    """A round's timing: one prefill step for all prompts, then decode steps until each sequence
    has its tokens (batch shrinking as they finish; with `padded`, each attending over the
    running batch padded to its longest sequence, `sim.families.helios.attended`); closed form
    between finishes. `scale` is
    the mean multiplicative residual (the relative-error fit predicts below the mean), which
    the decode runs' sums take; `first_scale` the prefill step's own (a single step: the
    residual's median, `median_scale`; None: `scale`). The loop's host time (`gap_ms`) follows
    each step: a sequence finishes as its last step returns, the round ends after that step's
    host time."""
    first_scale = scale if first_scale is None else first_scale
    total = sum(prompt_tokens)
    first_s = (model.step_ms(total, 0, total) + per_seq_ms * len(prompt_tokens)) / 1e3 \
        * first_scale
    order = np.argsort(output_tokens, kind="stable")
    target = np.asarray(output_tokens, dtype=np.int64)[order]
    prompts = np.asarray(prompt_tokens, dtype=np.int64)[order]
    # the sequences still running from each finish on: their prompts' sum and longest
    context = np.cumsum(prompts[::-1])[::-1].tolist()
    longest = np.maximum.accumulate(prompts[::-1])[::-1].tolist()
    # in units the `scale` multiplies: the first step enters at its own scale
    t_ms, done_steps, steps = first_s * 1e3 / scale, 1, 1
    group = np.flatnonzero(np.r_[True, target[1:] != target[:-1]]).tolist()
    at_finish = []
    for i in group:  # sequences finishing together: the first of them decodes the run
        k = int(target[i]) - done_steps  # decode steps until it has its tokens
        if k > 0:
            n = len(order) - i
            context0 = n * (longest[i] + done_steps - 1) if padded else \
                context[i] + n * (done_steps - 1)
            a, b = model.decode_run(n, context0)
            t_ms += run_ms(a, b, k)
            done_steps += k
            steps += k
        at_finish.append((t_ms * scale + (steps - 1) * gap_ms) / 1e3)
    finish = np.zeros(len(order))
    finish[order] = np.repeat(at_finish, np.diff(np.r_[group, len(order)]))
    return {"first_s": first_s, "finish_s": finish.tolist(),
            "end_s": (t_ms * scale + steps * gap_ms) / 1e3, "busy_s": t_ms * scale / 1e3,
            "steps": steps}
