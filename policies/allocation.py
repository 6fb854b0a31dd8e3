"""Intra-program allocation (Dynasor): how much compute each reasoning program gets. Pure.

Chain-of-thought programs stop by probe consistency (`policies.certaindex.ProbeConsistency`), a
fixed token budget (baseline-even) or never (full reasoning). Self-consistency programs launch
paths in rounds; after a round the policy decides how many more to launch:

- `SelfConsistency(samples)`: every program gets `samples` paths (baseline-even);
- with `certaindex`: stop once the answers so far are certain enough, after every round or only
  at the detection round `detect_round` (detect@knob; uncertain programs then get every path);
- with `length_tokens`: baseline-length, the same detection but on the first round's mean
  reasoning length (short reasoning = easy question) instead of certaindex.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from policies.certaindex import Certaindex


@dataclass(frozen=True)
class FullReasoning:
    """Let the chain of thought run to its own end."""

    @property
    def name(self) -> str:
        """Label in tables and figures."""
        return "full"


@dataclass(frozen=True)
class TokenBudget:
    """Stop the chain of thought after `budget_tokens` and probe its answer (baseline-even)."""

    budget_tokens: int

    def __post_init__(self) -> None:
        if self.budget_tokens < 1:
            raise ValueError(f"TokenBudget needs budget_tokens >= 1, got {self.budget_tokens}")

    @property
    def name(self) -> str:
        """Label in tables and figures."""
        return f"budget({self.budget_tokens})"


@dataclass(frozen=True)
class SelfConsistency:
    """Launch up to `samples` reasoning paths, `per_round` at a time, and vote."""

    samples: int = 4
    per_round: int = 4
    certaindex: Certaindex | None = None
    """stop early once the finished paths are certain enough"""
    detect_round: int | None = None
    """check only after this round (1-based, detect@knob); None: after every round"""
    length_tokens: float | None = None
    """baseline-length: stop after the detection round if its mean reasoning is this short"""

    def __post_init__(self) -> None:
        if self.samples < 1 or self.per_round < 1:
            raise ValueError(f"SelfConsistency needs samples >= 1 and per_round >= 1, got "
                             f"samples={self.samples}, per_round={self.per_round}")
        if self.certaindex is not None and self.length_tokens is not None:
            raise ValueError("SelfConsistency: choose certaindex or length_tokens, not both")
        if self.detect_round is not None and self.detect_round < 1:
            raise ValueError(f"detect_round must be >= 1, got {self.detect_round}")
        if self.detect_round is not None and self.certaindex is None \
                and self.length_tokens is None:
            raise ValueError(f"detect_round {self.detect_round}: it says when certaindex "
                             "(entropy_threshold) or length_tokens is read; give one")
        rounds = -(-self.samples // self.per_round)
        if self.detect_round is not None and self.detect_round > rounds:  # never reached
            raise ValueError(f"detect_round {self.detect_round}: {self.samples} samples "
                             f"{self.per_round} a round make only {rounds} rounds")

    @property
    def name(self) -> str:
        """Label in tables and figures: samples, per round, the stopping signal."""
        extra = ""
        if self.certaindex is not None:
            extra = f",H>={self.certaindex.entropy_threshold:g}"
        elif self.length_tokens is not None:
            extra = f",len<={self.length_tokens:g}"
        if self.detect_round is not None:
            extra += f"@{self.detect_round}"
        return f"sc(n={self.samples},r={self.per_round}{extra})"

    def first_round(self) -> int:
        """Paths to launch when the program starts."""
        return min(self.per_round, self.samples)

    def next_round(self, answers: Sequence[str | None], reasoning_tokens: Sequence[int]) -> int:
        """Paths to launch after a round, given every finished path's answer and length; 0 stops."""
        launched = len(answers)
        left = self.samples - launched
        if left <= 0:
            return 0
        rounds = -(-launched // self.per_round)
        detect = self.detect_round or (1 if self.length_tokens is not None else None)
        # Entropy over a single answer says nothing: decide from two paths on.
        if (self.certaindex is not None and launched >= 2) or self.length_tokens is not None:
            if detect is None or rounds == detect:
                if self._confident(answers, reasoning_tokens):
                    return 0
                if detect is not None:
                    return left  # detect@knob: an uncertain program gets every remaining path
        return min(self.per_round, left)

    def _confident(self, answers: Sequence[str | None], reasoning_tokens: Sequence[int]) -> bool:
        if self.certaindex is not None:
            return self.certaindex.is_certain(answers)
        return sum(reasoning_tokens) / len(reasoning_tokens) <= self.length_tokens
