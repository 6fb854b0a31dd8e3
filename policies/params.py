"""The parameters of every registered policy type, as strict pydantic models with physical bounds.

A policy type declares its parameters here (or in its own module, handed to
`policies.registry.register`): the model types, bounds and documents them, refuses unknown keys,
and converts nothing (`sync: "no"`, `cap: 16.9`, `depth: "4"`, `cap: true` and NaN are errors
naming the key). The bounds are physical, not tuned: a policy past them describes no program a
reasoning workload runs (a thousand paths per question, a million-token reasoning budget).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from inputs.limits import MAX_PATHS, MAX_TOKENS, MAX_TREE
from inputs.strict import Strict, one_line
from policies.certaindex import EFFORT_PRESETS


def _tuple(value):
    # YAML and JSON give pairs as lists: the shape is taken as given, no value is converted
    return tuple(value) if isinstance(value, list) else value


Paths = Annotated[int, Field(ge=1, le=MAX_PATHS)]
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
TreeSize = Annotated[int, Field(ge=1, le=MAX_TREE)]
Unit = Annotated[float, Field(ge=0, le=1)]
Rule = Annotated[tuple[Unit, Paths], BeforeValidator(_tuple)]


class Params(Strict):
    """The base of every policy's parameters (`inputs.strict.Strict`)."""


class ProbeConsistencyParams(Params):
    """cot `certaindex`: stop when `window` probes in a row agree (Dynasor-CoT)."""

    window: Paths = 3
    interval_tokens: Tokens = 32
    effort: Literal[tuple(EFFORT_PRESETS)] | None = None  # type: ignore[valid-type]
    """a preset (window, interval) of the reference, given instead of both"""

    @model_validator(mode="after")
    def _effort_alone(self) -> "ProbeConsistencyParams":
        both = sorted({"window", "interval_tokens"} & self.model_fields_set)
        if self.effort is not None and both:  # the preset would replace them
            raise ValueError(f"effort sets window and interval_tokens; give it or {both[0]}, "
                             "not both")
        return self


class TokenBudgetParams(Params):
    """cot `budget`: stop every path at a fixed reasoning budget."""

    budget_tokens: Tokens


class FullReasoningParams(Params):
    """cot `full`: every path reasons to its end."""


class SelfConsistencyParams(Params):
    """sc `sc` on a probes trace: launch `samples` paths, `per_round` at a time, and vote."""

    samples: Paths = 4
    per_round: Paths | None = None
    entropy_threshold: Unit | None = None
    detect_round: Paths | None = None
    length_tokens: Annotated[float, Field(gt=0, le=MAX_TOKENS)] | None = None


class SearchParams(Params):
    """sc/mcts/rebase on a branches trace: up to `cap` solutions, with an optional stop."""

    cap: Paths
    per_round: Annotated[int, Field(ge=0, le=MAX_PATHS)] = 0
    """solutions launched per round (sc only; 0: all at once)"""
    detect: Paths | None = None
    entropy_threshold: Unit | None = None
    reward_threshold: Unit | None = None
    """a path's reward is its geometric-mean token likelihood, in (0, 1]"""
    signal: Literal["entropy", "reward"] | None = None
    """frontier: what certaindex the rules read (default entropy)"""
    rules: Annotated[list[Rule], Field(min_length=1, max_length=MAX_PATHS)] | None = None
    """frontier: (certaindex at least, solutions at most) pairs"""
    length_tokens: Annotated[float, Field(gt=0, le=MAX_TOKENS)] | None = None
    """length (baseline-length): stop at the `detect`-th solution if the solving requests' mean
    output length is this short"""
    every: Annotated[int, Field(ge=0, le=MAX_PATHS)] = 0
    """certaindex: check only where a checkpoint crosses a multiple of this many solutions"""


class A1Params(Params):
    """a1 `conformal`, `threshold`, `draft_only`, `target_only`: draft-and-verify reasoning
    steps."""

    samples: Paths = 4
    sync: bool = False
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.4
    coverage: Literal["marginal", "conditional"] = "marginal"
    turns: Annotated[int, Field(ge=1, le=10_000)] | None = None
    """most steps a path takes (default: the trace's)"""
    target_cap: Annotated[int, Field(ge=0, le=100_000)] = 0
    """most target requests (scores, target steps) a program has in flight (0: no cap)"""
    max_score: Annotated[float, Field(ge=0, le=1e6)] | None = None
    """threshold: the highest mean NLL of a draft step the target accepts"""


class ToTParams(Params):
    """tot (SEED): Tree-of-Thoughts search and how its thoughts are decoded."""

    breadth: TreeSize = 2
    thoughts: TreeSize = 3
    depth: TreeSize = 4
    thought_tokens: Annotated[int, Field(ge=1, le=100_000)] = 24
    temperature: Annotated[float, Field(ge=0, le=2)] = 0.0
    draft_tokens: TreeSize = 4
    k_config: Annotated[list[Annotated[int, Field(ge=1, le=8)]],
                        Field(max_length=MAX_TREE)] = []
    eval_tokens: Annotated[int, Field(ge=1, le=1_000)] = 1
    """tokens a value prompt writes (the state's answer)"""
    speculative_eval: bool = False
    """the value prompts' answers drafted and verified in rounds (speculative modes)"""


def validate_params(model: type[Params], args: dict) -> dict:
    """The parameters a config gave, checked by `model`: only the given keys (the factory keeps
    its defaults); a one-line error naming the first bad key."""
    try:
        return model.model_validate(args).model_dump(exclude_unset=True)
    except ValidationError as e:
        raise ValueError(one_line(e, prefix="programs.policy")) from None
