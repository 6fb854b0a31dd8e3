"""What a replica's engine has done that the `serving` step-time model charges a step for."""

from __future__ import annotations

from sim.step_time.latency import ECHO_WEIGHTS
from sim.step_time.serving_features import NO_ECHO


class EngineState:
    """What a replica's engine has done that the serving model charges for: the token counts it
    has run a step with, when its last step ended, and its last prefill step (the echo)."""

    def __init__(self, echo: bool = True):
        self.seen: set[int] = set()
        self.last_end_s = -float("inf")  # never ran: idle since forever (capped)
        # No prefill yet: no echo. Without an echo to price (a model fitted before it), decode
        # runs fast-forward from their first step, as they did then (same events, same draws).
        self.echo_steps = len(ECHO_WEIGHTS) if echo else 0
        self.since_prefill = self.echo_steps
        self.prefill = NO_ECHO[1:]  # (idle before, tokens) of the last prefill step

    def before_step(self, now_s: float, prefill_tokens: int, decode_seqs: int,
                    ) -> tuple[bool, float, tuple[float, float, float]]:
        """(new_shape, idle_ms, echo) of a step at now_s; marks the shape seen. `echo`: (weight,
        idle before and tokens of the prefill step it follows); NO_ECHO past ECHO_WEIGHTS.
        A fast-forwarded run counts as one step here; `ran` counts the rest once it ends."""
        tokens = prefill_tokens + decode_seqs
        new_shape = tokens not in self.seen
        if new_shape:
            self.seen.add(tokens)
        idle_ms = (now_s - self.last_end_s) * 1e3
        # A step that follows the last one (float rounding of event times) did not idle.
        idle_ms = idle_ms if idle_ms >= 1e-3 else 0.0
        if prefill_tokens:
            self.since_prefill, self.prefill = 0, (idle_ms, float(prefill_tokens))
            return new_shape, idle_ms, NO_ECHO
        self.since_prefill = k = min(self.since_prefill + 1, self.echo_steps + 1)
        return new_shape, idle_ms, ((ECHO_WEIGHTS[k - 1],) + self.prefill
                                    if k <= self.echo_steps else NO_ECHO)

    @property
    def echo_at(self) -> int:
        """The echo's place of the step just begun (1-3: decode step k after a prefill; 0: none),
        where a decode run starting with it carries the echo (`sim.step_time.latency.run_ms`)."""
        return self.since_prefill if 0 < self.since_prefill <= self.echo_steps else 0

    def ran(self, k: int) -> None:
        """A decode run of k iterations begun by `before_step` has ended: its later iterations
        were decode steps too."""
        self.since_prefill = min(self.since_prefill + k - 1, self.echo_steps + 1)
