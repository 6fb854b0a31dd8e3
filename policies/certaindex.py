"""Certaindex (Dynasor): how certain a reasoning program is, and when to stop it. Pure.

- Probe consistency for chain-of-thought: stop when the last `window` probe answers are all
  non-empty, show no hesitation, and are equal. (Dynasor's public server path stops once it has
  `window` answers whether or not they agree; that is a bug we do not copy.)
- Answer entropy for multi-path programs (self-consistency, MCTS, Rebase): `1 - H/log(n)` over
  answer groups; 1 means every path agrees.
- Reward certainty: the mean (MCTS) or max (Rebase) of step rewards from a model signal.
- Combinations with per-signal thresholds: certain when every configured signal passes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

BOXED = "\\boxed{"
PROBE_SUFFIX = "... Oh, I suddenly got the answer to the whole problem, Final Answer: \\boxed{"
HESITATION_WORDS = ("wait", "hold", "but", "okay", "no", "hmm")
# Whole words only: the reference matched substrings, so "no" also hit "not" and "know".
_HESITATION = re.compile(r"\b(" + "|".join(HESITATION_WORDS) + r")\b", re.IGNORECASE)

# (window, probe every k tokens) presets of the public reference.
EFFORT_PRESETS = {"mild": (8, 64), "low": (5, 64), "mid": (3, 64), "high": (2, 64),
                  "crazy": (2, 32)}


def probe_answer(continuation: str) -> str:
    """A probe's answer: the text before the first unmatched ``}`` (Dynasor's rule), stripped."""
    depth = 0
    for i, ch in enumerate(continuation):
        if ch == "{":
            depth += 1
        elif ch == "}":
            if depth == 0:
                return continuation[:i].strip()
            depth -= 1
    return continuation.strip()


def extract_boxed(text: str) -> str | None:
    """The answer in the last ``\\boxed{...}`` of `text`, or None when there is none or it is open."""
    start = text.rfind(BOXED)
    if start < 0:
        return None
    body = text[start + len(BOXED):]
    end = body.find("}")
    return body[:end].strip() if end >= 0 else None


def is_hesitant(text: str) -> bool:
    """Whether a probe's text contains a hesitation word (as a whole word)."""
    return _HESITATION.search(text) is not None


@dataclass(frozen=True)
class Probe:
    """One probe's outcome, as a policy sees it."""

    position_tokens: int
    """reasoning tokens generated when the probe was sent"""
    answer: str
    """extracted answer (empty when the probe gave none)"""
    hesitant: bool
    """the probe text contained a hesitation word"""


def probe_from_text(position_tokens: int, continuation: str) -> Probe:
    """A Probe from the raw text a probe request returned."""
    answer = probe_answer(continuation)
    return Probe(position_tokens, answer, is_hesitant(continuation))


@dataclass(frozen=True)
class ProbeConsistency:
    """Stop a chain of thought once the last `window` probes agree with no hesitation."""

    window: int = 3
    """how many consecutive agreeing probes certify an answer"""
    every_tokens: int = 64
    """probe interval in reasoning tokens"""

    def __post_init__(self) -> None:
        if self.window < 1 or self.every_tokens < 1:
            raise ValueError(f"ProbeConsistency needs window >= 1 and every_tokens >= 1, got "
                             f"window={self.window}, every_tokens={self.every_tokens}")

    @property
    def name(self) -> str:
        """Label in tables and figures."""
        return f"certaindex(w={self.window},k={self.every_tokens})"

    @classmethod
    def preset(cls, effort: str) -> "ProbeConsistency":
        """One of the reference's effort presets: mild, low, mid, high, crazy."""
        if effort not in EFFORT_PRESETS:
            raise ValueError(f"unknown effort {effort!r}; expected one of {list(EFFORT_PRESETS)}")
        window, every = EFFORT_PRESETS[effort]
        return cls(window=window, every_tokens=every)

    def should_stop(self, probes: Sequence[Probe]) -> bool:
        """True when the last `window` probes exist, are non-empty, unhesitant and equal."""
        if len(probes) < self.window:
            return False
        last = probes[-self.window:]
        first = last[0].answer
        return bool(first) and all(p.answer == first and not p.hesitant for p in last)

    def stop_index(self, probes: Sequence[Probe]) -> int | None:
        """Index of the probe at which this policy stops a full probe history, or None."""
        for i in range(self.window - 1, len(probes)):
            if self.should_stop(probes[: i + 1]):
                return i
        return None


def answer_certainty(answers: Sequence[str | None]) -> float:
    """`1 - H/log(n)` over answer groups; a missing answer is its own group; 1 for n < 2."""
    n = len(answers)
    if n < 2:
        return 1.0
    counts = Counter(answers)  # counted in C, groups in first-seen order
    if None in counts and "" in counts:  # both kinds of missing answer: one group
        counts = Counter("\0none" if a is None or a == "" else a for a in answers)
    h = -sum(c / n * math.log(c / n) for c in counts.values())
    return 1.0 - h / math.log(n)


def reward_certainty(rewards: Sequence[float], aggregate: str = "mean") -> float:
    """Aggregated step reward: mean (MCTS) or max (Rebase)."""
    if not rewards:
        raise ValueError("reward_certainty needs at least one reward")
    if aggregate == "mean":
        return sum(rewards) / len(rewards)
    if aggregate == "max":
        return max(rewards)
    raise ValueError(f"unknown reward aggregate {aggregate!r}; expected 'mean' or 'max'")


@dataclass(frozen=True)
class Certaindex:
    """Per-signal thresholds; certain when every configured signal reaches its threshold."""

    entropy_threshold: float | None = None
    """minimum answer certainty (1 - normalised entropy)"""
    reward_threshold: float | None = None
    """minimum aggregated reward"""
    reward_aggregate: str = "mean"

    def __post_init__(self) -> None:
        if self.entropy_threshold is None and self.reward_threshold is None:
            raise ValueError("Certaindex needs at least one threshold (entropy or reward)")
        for name in ("entropy_threshold", "reward_threshold"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v)):
                raise ValueError(f"{name}: expected a finite number, got {v!r}")
        # Answer certainty is 1 - normalised entropy: a threshold outside [0, 1] is never (or
        # always) met, which is a typo, not a policy.
        if self.entropy_threshold is not None and not 0 <= self.entropy_threshold <= 1:
            raise ValueError(f"entropy_threshold: {self.entropy_threshold} is outside [0, 1] "
                             "(answer certainty = 1 - normalised entropy)")

    def is_certain(self, answers: Sequence[str | None] = (),
                   rewards: Sequence[float] = ()) -> bool:
        """Whether the program's paths so far are certain enough to stop."""
        if self.entropy_threshold is not None and \
                answer_certainty(answers) < self.entropy_threshold:
            return False
        if self.reward_threshold is not None and \
                reward_certainty(rewards, self.reward_aggregate) < self.reward_threshold:
            return False
        return True
