"""One registry from config names to policy classes, and one factory for every program family.

A program workload names its allocation policy as `{type: NAME, ...parameters}`; the method
(cot, sc, mcts, rebase, ...) picks the table the name is looked up in. A new family registers
its names here (`register`), with the types of its parameters; nothing else parses policy specs,
and no parameter is converted on the way: `sync: "no"`, `cap: 16.9` and `depth: "4"` are errors
naming the key, not a True, a 16 and a 4.
"""

from __future__ import annotations

import math
from typing import Callable

from policies.a1 import make_a1_policy
from policies.allocation import FullReasoning, SelfConsistency, TokenBudget
from policies.certaindex import Certaindex, ProbeConsistency
from policies.search import REWARD_AGGREGATE, ParetoFrontier, SearchBudget, certaindex_for
from policies.seed import MODES as TOT_MODES
from policies.seed import make_seed_policy


def _probe_consistency(window: int = 3, interval_tokens: int = 32, effort: str | None = None):
    if effort is not None:
        return ProbeConsistency.preset(effort)
    return ProbeConsistency(window=window, every_tokens=interval_tokens)


def _self_consistency(samples: int = 4, per_round: int | None = None,
                      entropy_threshold: float | None = None,
                      detect_round: int | None = None, length_tokens: float | None = None):
    cx = Certaindex(entropy_threshold=entropy_threshold) if entropy_threshold is not None else None
    # Without a stopping signal every path launches at once (baseline-even).
    return SelfConsistency(samples=samples, per_round=per_round or samples, certaindex=cx,
                           detect_round=detect_round, length_tokens=length_tokens)


def _search(kind: str) -> Callable:
    def make(method: str, cap: int | None = None, per_round: int = 0, **args) -> SearchBudget:
        if cap is None:
            raise ValueError(f"a {method} policy needs 'cap'")
        agg = REWARD_AGGREGATE[method]
        per_round = int(per_round) if method == "sc" else 0
        if kind == "even":
            if args:
                raise ValueError(f"even: unknown keys {sorted(args)}")
            return SearchBudget(int(cap), reward_aggregate=agg, per_round=per_round)
        if kind == "certaindex":
            unknown = set(args) - {"entropy_threshold", "reward_threshold", "detect"}
            if unknown:
                raise ValueError(f"certaindex: unknown keys {sorted(unknown)}")
            cx = certaindex_for(method, args.get("entropy_threshold"),
                                args.get("reward_threshold"))
            return SearchBudget(int(cap), cx, args.get("detect"), reward_aggregate=agg,
                                per_round=per_round)
        if set(args) - {"rules", "signal"} or "rules" not in args:
            raise ValueError("frontier: expected {rules: [[certaindex, solutions], ...], "
                             "signal: entropy|reward}")
        rules = tuple((float(t), int(n)) for t, n in args["rules"])
        return SearchBudget(int(cap), frontier=ParetoFrontier(rules, args.get("signal", "entropy")),
                            reward_aggregate=agg, per_round=per_round)
    return make


def _plain(cls) -> Callable:
    return lambda method, **args: cls(**args)


# method -> policy type -> factory(method, **parameters)
POLICIES: dict[str, dict[str, Callable]] = {
    "cot": {"certaindex": lambda method, **a: _probe_consistency(**a),
            "budget": _plain(TokenBudget), "full": _plain(FullReasoning)},
    "sc": {"sc": lambda method, **a: _self_consistency(**a)},
    "mcts": {},
    "rebase": {},
}
POLICIES["a1"] = {k: (lambda kind: lambda method, **a: make_a1_policy(kind, **a))(k)
                  for k in ("conformal", "draft_only", "target_only")}
POLICIES["tot"] = {k: (lambda kind: lambda method, **a: make_seed_policy(kind, **a))(k)
                   for k in TOT_MODES}
for _method in ("sc", "mcts", "rebase"):
    for _kind in ("even", "certaindex", "frontier"):
        POLICIES[_method][_kind] = _search(_kind)


# parameter -> its type: int, float, bool, str, "ints" (a list of whole numbers) or "any";
# a parameter whose default is None also takes None (`null` in YAML)
_SCALE = {"entropy_threshold": float, "reward_threshold": float}
PARAMS: dict[str, dict[str, dict[str, object]]] = {
    "cot": {"certaindex": {"window": int, "interval_tokens": int, "effort": str},
            "budget": {"budget_tokens": int}, "full": {}},
    "sc": {"sc": {"samples": int, "per_round": int, "entropy_threshold": float,
                  "detect_round": int, "length_tokens": float}},
    "a1": {k: {"samples": int, "sync": bool, "alpha": float, "coverage": str}
           for k in ("conformal", "draft_only", "target_only")},
    "tot": {k: {"breadth": int, "thoughts": int, "depth": int, "thought_tokens": int,
                "temperature": float, "draft_tokens": int, "k_config": "ints"} for k in TOT_MODES},
}
for _method in ("sc", "mcts", "rebase"):
    for _kind in ("even", "certaindex", "frontier"):
        PARAMS.setdefault(_method, {})[_kind] = {"cap": int, "per_round": int, "detect": int,
                                                 "signal": str, "rules": "any", **_SCALE}


def register(method: str, name: str, factory: Callable,
             params: dict[str, object] | None = None) -> None:
    """Make `{type: name}` a policy of `method` (factory(method, **parameters) -> policy);
    `params`: each parameter's type (int, float, bool, str, "ints", "any"), checked before the
    factory sees them (None: the factory checks its own)."""
    POLICIES.setdefault(method, {})[name] = factory
    if params is not None:
        PARAMS.setdefault(method, {})[name] = params


def check_params(method: str, kind: str, args: dict) -> None:
    """Each given parameter of the declared type, unconverted; a one-line error naming it."""
    types = PARAMS.get(method, {}).get(kind)
    if types is None:
        return
    for key, value in args.items():
        want = types.get(key)
        if want is None or want == "any" or value is None:
            continue  # unknown keys are the factory's to name; None means its default
        if not _is(value, want):
            name = want if isinstance(want, str) else want.__name__
            raise ValueError(f"programs.policy.{key}: expected {_WORDS.get(name, name)}, got "
                             f"{value!r}")


_WORDS = {"int": "a whole number", "float": "a finite number", "bool": "true or false",
          "str": "text", "ints": "a list of whole numbers"}


def _is(value, want) -> bool:
    if want is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False  # `cap: true` is a typo, not 1
    if want is int:
        return isinstance(value, int)
    if want is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    if want is str:
        return isinstance(value, str)
    return isinstance(value, (list, tuple)) and all(_is(v, int) for v in value)


def make_policy(method: str, spec: dict | str):
    """The allocation policy a `programs.policy` config names, for a program method."""
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict) or "type" not in spec:
        raise ValueError(f"programs.policy: expected a mapping with 'type', got {spec!r}")
    if method not in POLICIES:
        raise ValueError(f"programs.method {method!r} has no policies; known: {sorted(POLICIES)}")
    args = dict(spec)
    kind = args.pop("type")
    makers = POLICIES[method]
    if kind not in makers:
        raise ValueError(f"programs.policy: {kind!r} is not a {method} policy; known: "
                         f"{', '.join(sorted(makers))}")
    check_params(method, kind, args)
    try:
        return makers[kind](method, **args)
    except TypeError as e:
        raise ValueError(f"programs.policy {kind!r}: {e}") from None
    except ValueError as e:
        raise ValueError(f"programs.policy {e}") from None
