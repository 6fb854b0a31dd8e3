"""A step plan and its price: what the scheduler composed for one engine step, priced whole.

`StepPlan` is the simulator's analogue of vLLM's `SchedulerOutput`: the requests scheduled one
by one with their tokens, the totals the step-time model reads, and the preemptions the step
took. The replicas compose one per step (`sim.engine.replica`, `sim.engine.lazy_replica`, whose
decode cohort is counted in `decode_seqs` without being listed), `StepPricer` prices it, and the
steps table records its fields (`sim.engine.request_state.SEG_COLUMNS`).
"""

from __future__ import annotations


class StepPlan:
    """One engine step as the scheduler composed it."""

    __slots__ = ("scheduled", "prefill_tokens", "prefill_seqs", "decode_seqs", "context_tokens",
                 "logprob_ms", "seeded_seqs", "preempted")

    def __init__(self, scheduled: list, prefill_tokens: int, prefill_seqs: int, decode_seqs: int,
                 context_tokens: int, logprob_ms: float = 0.0, seeded_seqs: int = 0,
                 preempted: int = 0):
        self.scheduled = scheduled
        """(request, tokens) entries scheduled one by one: prefill chunks and decodes"""
        self.prefill_tokens = prefill_tokens
        self.prefill_seqs = prefill_seqs
        """sequences with prompt tokens in the step"""
        self.decode_seqs = decode_seqs
        self.context_tokens = context_tokens
        """tokens computed once the step is done, summed over its sequences (as vLLM counts)"""
        self.logprob_ms = logprob_ms
        """the log-probabilities the step returns, priced per request (`step_time.logprob_cost`)"""
        self.seeded_seqs = seeded_seqs
        """sequences that sample with a seed of their own (`step_time.sampling_cost`)"""
        self.preempted = preempted
        """requests preempted to make KV room for the step"""


class StepPricer:
    """Prices a plan whole: the step-time model's mean step (with the engine state it reads),
    and the terms fitted beyond the mean step (log-probabilities returned, seeded sampling),
    which take no residual factor."""

    __slots__ = ("model", "logprob_step_ms", "seeded_step_ms", "seeded_seq_ms")

    def __init__(self, cal, prefix_caching: bool = False):
        """`prefix_caching`: the engine caches prefixes (its spanning prefills are hits)."""
        model = cal.stepping  # the loop's gap between two steps included
        self.model = model if prefix_caching or not hasattr(model, "without_hits") \
            else model.without_hits()
        self.logprob_step_ms = cal.logprob_step_ms  # once a step that returns log-probabilities
        self.seeded_step_ms, self.seeded_seq_ms = cal.seeded_step_ms, cal.seeded_seq_ms

    def mean_ms(self, plan: StepPlan, engine=None, now_s: float = 0.0) -> tuple[float, bool]:
        """The model's mean step time, and whether the step is plain (no first-of-shape or
        after-idle cost: a decode run may fast-forward, carrying any echo, `echo_head`);
        `engine`: the replica's `EngineState` where the model reads one (it records the
        step)."""
        p = plan
        if engine is None:
            return self.model.step_ms(p.prefill_tokens, p.decode_seqs, p.context_tokens), True
        new_shape, idle_ms, echo = engine.before_step(now_s, p.prefill_tokens, p.decode_seqs)
        step_ms = self.model.step_ms(p.prefill_tokens, p.decode_seqs, p.context_tokens,
                                     new_shape=new_shape, idle_ms=idle_ms,
                                     prefill_seqs=p.prefill_seqs, echo=echo,
                                     **(prefill_spans(p.scheduled) if p.prefill_tokens else {}))
        return step_ms, not new_shape and idle_ms == 0.0

    def echo_head(self, engine) -> tuple[float, int]:
        """(`ServingModel.echo_ms`, `EngineState.echo_at`) of the step just begun: what a decode
        run starting with it adds to its first iterations; (0.0, 0) where it carries no echo."""
        at = engine.echo_at if engine is not None else 0
        return (self.model.echo_ms(*engine.prefill), at) if at else (0.0, 0)

    def extra_ms(self, plan: StepPlan) -> float:
        """The log-probability and seeded-sampling terms of the step (ms, before any factor)."""
        return (plan.logprob_ms + self.logprob_step_ms if plan.logprob_ms > 0.0 else 0.0) + (
            self.seeded_step_ms + self.seeded_seq_ms * plan.seeded_seqs
            if plan.seeded_seqs else 0.0)


def prefill_spans(scheduled: list) -> dict[str, int]:
    """The step's prefill chunks' `span_context_tokens` (the context computed before them,
    prefix-cache hits and earlier chunks, that they attend to; the serving model prices such
    prefills higher), `prefill_pair_tokens` (new tokens x the tokens each attends to, its
    attention work) and `span_pair_tokens` (new tokens x that earlier context), summed:
    `ServingModel.step_ms`'s keyword arguments."""
    span = own = span_pairs = 0  # one pass: this runs for every prefill step
    for r, n in scheduled:
        if r.computed < r.target:
            span += r.computed
            own += n * n
            span_pairs += n * r.computed
    return {"span_context_tokens": span, "prefill_pair_tokens": span_pairs + own,
            "span_pair_tokens": span_pairs}
