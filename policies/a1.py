"""A1's decisions: conformal p-values of draft steps, accept or hand the step to the target.

A draft model proposes a reasoning step; the target scores it (the step's mean negative log-
likelihood under the target: a nonconformity score, higher = less like what the target would
write). Against calibration scores of draft steps, the conformal p-value is

    p = (#{calibration scores >= s} + 1) / (N + 1)

(a calibration score a rounding below s counts as a tie, `SCORE_TIE_NATS`: one text's score
is one score whichever machine or batch computed it) and the step is accepted when p > alpha,
else the target writes the step itself. Under exchangeability P(p <= alpha) <= alpha (and
~alpha for continuous scores): alpha is the target's intervention (rejection) rate, which is
what A1 holds. Marginal coverage pools one calibration
set; conditional coverage calibrates per question (its own pre-sampled draft steps).

Baselines, with the same interface: `Threshold` (SpecReason-style: a fixed score threshold, no
calibration), `DraftOnly` (every step accepted, never scored) and `TargetOnly` (every step the
target's, never drafted).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Mapping, NamedTuple

COVERAGES = ("marginal", "conditional")
SCORE_TIE_NATS = 2e-7
SCORE_TIE_REL = 4e-6
"""two scores closer than SCORE_TIE_NATS + SCORE_TIE_REL x the score are one. The same draft
step scored by the target on another machine, or in another batch, moves by up to ~6e-8 nats
near 0 and ~1e-6 relative above (its numerics); a conditional set holds the question's own
pre-sampled draft steps, often the very text being decided, so an exact tie would otherwise
break by the machine's rounding (`docs/measurements/2026-12-06-family-replays.md`)."""
A1_KINDS = ("conformal", "threshold", "draft_only", "target_only")


@dataclass(frozen=True)
class ConformalSet:
    """Nonconformity scores of a calibration split (sorted ascending on construction)."""

    scores: tuple[float, ...]

    def __post_init__(self):
        bad = [s for s in self.scores if not math.isfinite(s)]
        if bad:
            raise ValueError(f"calibration scores must be finite, got {bad[:3]}")
        object.__setattr__(self, "scores", tuple(sorted(self.scores)))

    def p_value(self, score: float) -> float:
        """Conformal p-value of a score, with the +1 correction: (#{c >= s} + 1) / (N + 1), a
        calibration score a rounding below s (`SCORE_TIE_NATS`) counted as a tie."""
        tie = SCORE_TIE_NATS + SCORE_TIE_REL * abs(score)
        at_least = len(self.scores) - bisect.bisect_left(self.scores, score - tie)
        return (at_least + 1) / (len(self.scores) + 1)


def calibration_sets(rows) -> tuple[ConformalSet, dict]:
    """(marginal set, per-question sets) from (question split, question id, score) rows of
    draft steps: the marginal set pools the calibration-split questions (never evaluated); an
    evaluated question's own calibration samples make its conditional set."""
    marginal, by_q = [], {}
    for split, question_id, score in rows:
        if split == "calibration":
            marginal.append(score)
        else:
            by_q.setdefault(question_id, []).append(score)
    return ConformalSet(tuple(marginal)), {q: ConformalSet(tuple(v)) for q, v in by_q.items()}


class StepDecision(NamedTuple):
    """A policy's verdict on one draft step (a named tuple: one is made per decision)."""

    accepted: bool
    p_value: float | None = None
    """None: the policy decided without a score (baselines)"""


@dataclass(frozen=True)
class Conformal:
    """A1: accept a draft step when its conformal p-value exceeds alpha (alpha = rejection rate)."""

    alpha: float
    coverage: str = "marginal"
    marginal: ConformalSet | None = None
    by_question: Mapping[str, ConformalSet] = field(default_factory=dict)

    needs_draft = True
    needs_score = True

    def __post_init__(self):
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"a1 alpha must be in (0, 1), got {self.alpha}")
        if self.coverage not in COVERAGES:
            raise ValueError(f"a1 coverage must be one of {COVERAGES}, got {self.coverage!r}")

    @cached_property  # read for every traced node
    def name(self) -> str:
        """Label of the policy in tables and figures."""
        return f"conformal-{self.coverage}-{self.alpha:g}"

    def calibrated(self, marginal: ConformalSet, by_question: Mapping[str, ConformalSet]):
        """This policy with its calibration sets."""
        return replace(self, marginal=marginal, by_question=dict(by_question))

    def calibration_for(self, question_id: str) -> ConformalSet:
        """The calibration set a step of this question is compared with."""
        if self.coverage == "marginal":
            cal = self.marginal
        else:
            cal = self.by_question.get(question_id)
        if cal is None or not cal.scores:
            raise ValueError(f"{self.name}: no calibration scores for question {question_id!r} "
                             "(calibrate the policy from a conformity trace first)")
        return cal

    def decide(self, question_id: str, score: float | None) -> StepDecision:
        """Accept when p > alpha."""
        if score is None:
            raise ValueError(f"{self.name} needs the target's score of the step")
        p = self.calibration_for(question_id).p_value(score)
        return StepDecision(p > self.alpha, p)


@dataclass(frozen=True)
class Threshold:
    """SpecReason-style baseline: accept a draft step when the target's score of it is at most a
    fixed threshold. No calibration: the rejection rate is whatever the questions make it.

    SpecReason has the target rate a step's utility by a prompt; the testbed's analog is the
    same nonconformity score A1 uses (the step's mean NLL under the target), with a threshold
    fixed in advance instead of a calibrated quantile."""

    max_score: float

    needs_draft = True
    needs_score = True

    def __post_init__(self):
        if not math.isfinite(self.max_score) or self.max_score < 0:
            raise ValueError(f"a1 threshold max_score must be a finite score >= 0 (a mean NLL), "
                             f"got {self.max_score}")

    @cached_property  # read for every traced node
    def name(self) -> str:
        """Label of the policy in tables and figures."""
        return f"threshold-{self.max_score:g}"

    def decide(self, question_id: str, score: float | None) -> StepDecision:
        """Accept when the score is at most the threshold."""
        if score is None:
            raise ValueError(f"{self.name} needs the target's score of the step")
        return StepDecision(score <= self.max_score)


@dataclass(frozen=True)
class DraftOnly:
    """Baseline: the draft writes every step (draft-only sampling)."""

    needs_draft = True
    needs_score = False
    name = "draft-only"

    def decide(self, question_id: str, score: float | None) -> StepDecision:
        """Always accept."""
        return StepDecision(True)


@dataclass(frozen=True)
class TargetOnly:
    """Baseline: the target writes every step (target-only sampling)."""

    needs_draft = False
    needs_score = False
    name = "target-only"

    def decide(self, question_id: str, score: float | None) -> StepDecision:
        """Always hand the step to the target."""
        return StepDecision(False)


@dataclass(frozen=True)
class A1Settings:
    """How an A1 program samples: m samples of up to T turns, one reasoning step a turn."""

    samples: int = 4
    """m: candidate reasoning paths per question"""
    turns: int = 16
    """T: most steps a path takes"""
    draft_tokens: int = 32
    """Kd: longest draft step (a step ends at a newline)"""
    target_tokens: int = 32
    """Kt: longest target step"""
    temperature: float = 0.8
    sync: bool = False
    """synchronous baseline: every turn waits for all paths (scores after all drafts, next turn
    after all steps); asynchronous (A1): each path goes on by itself"""
    target_cap: int = 0
    """most target requests (scores and target steps) a program has in flight at once; the
    rest wait in the program, in the order they were asked (0: no cap)"""

    def __post_init__(self):
        for name in ("samples", "turns", "draft_tokens", "target_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"a1 {name} must be >= 1, got {getattr(self, name)}")
        if self.target_cap < 0:
            raise ValueError(f"a1 target_cap must be >= 0 (0: no cap), got {self.target_cap}")
        if self.temperature < 0:
            raise ValueError(f"a1 temperature must be >= 0, got {self.temperature}")


@dataclass(frozen=True)
class A1Policy:
    """How an A1 program runs: the step policy, its paths, and whether turns synchronise."""

    step: object
    """Conformal, Threshold, DraftOnly or TargetOnly"""
    samples: int = 4
    sync: bool = False
    turns: int | None = None
    """T: most steps a path takes (the per-sample token budget, T x Kt at most); None: the
    trace's"""
    target_cap: int = 0
    """most target requests in flight per program (0: no cap; `A1Settings.target_cap`)"""

    def __post_init__(self):
        if self.samples < 1:
            raise ValueError(f"a1 samples must be >= 1, got {self.samples}")
        if self.turns is not None and self.turns < 1:
            raise ValueError(f"a1 turns must be >= 1, got {self.turns}")
        if self.target_cap < 0:
            raise ValueError(f"a1 target_cap must be >= 0 (0: no cap), got {self.target_cap}")

    @property
    def name(self) -> str:
        """Label in tables and figures."""
        turns = f",T={self.turns}" if self.turns else ""
        cap = f",cap={self.target_cap}" if self.target_cap else ""
        return f"{self.step.name},m={self.samples}{',sync' if self.sync else ''}{turns}{cap}"


def make_a1_policy(kind: str, samples: int = 4, sync: bool = False, turns: int | None = None,
                   target_cap: int = 0, **args) -> A1Policy:
    """An `A1Policy` from a config's `{type: conformal|threshold|draft_only|target_only, ...}`."""
    if kind == "conformal":
        step = Conformal(args.pop("alpha", 0.4), args.pop("coverage", "marginal"))
    elif kind == "threshold":
        if "max_score" not in args:
            raise ValueError("a1 threshold: needs max_score (the highest mean NLL accepted)")
        step = Threshold(float(args.pop("max_score")))
    elif kind in ("draft_only", "target_only"):
        step = DraftOnly() if kind == "draft_only" else TargetOnly()
    else:
        raise ValueError(f"unknown a1 policy {kind!r}")
    if args:
        raise ValueError(f"{kind}: unknown keys {sorted(args)}")
    return A1Policy(step, samples, sync, turns, target_cap)


def mean_nll(logprobs) -> float:
    """A step's nonconformity score: its mean negative log-likelihood under the target."""
    values = list(logprobs)
    if not values:
        raise ValueError("cannot score an empty step")
    return -sum(values) / len(values)


def rejection_rate(decisions) -> float:
    """Share of scored steps the target took over (nan with none)."""
    flags = [not d.accepted for d in decisions]
    return sum(flags) / len(flags) if flags else math.nan
