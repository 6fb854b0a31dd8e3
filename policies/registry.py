"""One registry from config names to policy classes, and one factory for every program family.

A program workload names its allocation policy as `{type: NAME, ...parameters}`; the method
(cot, sc, mcts, rebase, ...) picks the table the name is looked up in. A new family registers
its names here (`register`), with its parameters' model (`policies.params`); nothing else parses
policy specs, and no parameter is converted on the way: `sync: "no"`, `cap: 16.9` and
`depth: "4"` are errors naming the key, not a True, a 16 and a 4.
"""

from __future__ import annotations

from typing import Callable

from policies.a1 import A1_KINDS, make_a1_policy
from policies.allocation import FullReasoning, SelfConsistency, TokenBudget
from policies.certaindex import Certaindex, ProbeConsistency
from policies.params import (A1Params, FullReasoningParams, Params, ProbeConsistencyParams,
                             SearchParams, SelfConsistencyParams, TokenBudgetParams, ToTParams,
                             validate_params)
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
    def make(method: str, cap: int, per_round: int = 0, detect: int | None = None,
             entropy_threshold: float | None = None, reward_threshold: float | None = None,
             signal: str | None = None, rules: list | None = None,
             length_tokens: float | None = None, every: int = 0) -> SearchBudget:
        agg = REWARD_AGGREGATE[method]
        if per_round and method != "sc":  # a tree grows one rollout or wave at a time
            raise ValueError(f"per_round: only sc launches its solutions in rounds, not {method}")
        if kind != "certaindex":
            _none_of(kind, every=every or None)
        if kind == "even":
            _none_of(kind, detect=detect, entropy_threshold=entropy_threshold,
                     reward_threshold=reward_threshold, rules=rules, signal=signal,
                     length_tokens=length_tokens)
            return SearchBudget(cap, reward_aggregate=agg, per_round=per_round)
        if kind == "length":
            _none_of(kind, entropy_threshold=entropy_threshold, reward_threshold=reward_threshold,
                     rules=rules, signal=signal)
            if length_tokens is None or detect is None:
                raise ValueError("length: expected {cap, detect, length_tokens} (stop at the "
                                 "detect-th solution if the solutions' mean length is this short)")
            return SearchBudget(cap, detect=detect, reward_aggregate=agg, per_round=per_round,
                                length_tokens=length_tokens)
        _none_of(kind, length_tokens=length_tokens)
        if kind == "certaindex":
            _none_of(kind, rules=rules, signal=signal)
            cx = certaindex_for(method, entropy_threshold, reward_threshold)
            return SearchBudget(cap, cx, detect, reward_aggregate=agg, per_round=per_round,
                                every=every)
        _none_of(kind, entropy_threshold=entropy_threshold, reward_threshold=reward_threshold)
        if rules is None:
            raise ValueError("frontier: expected {rules: [[certaindex, solutions], ...], "
                             "signal: entropy|reward}")
        return SearchBudget(cap, detect=detect,
                            frontier=ParetoFrontier(tuple(rules), signal or "entropy"),
                            reward_aggregate=agg, per_round=per_round)
    return make


def _none_of(kind: str, **given) -> None:
    """A search parameter another kind reads is a mistake, not a silently ignored key."""
    extra = sorted(k for k, v in given.items() if v is not None)
    if extra:
        raise ValueError(f"{kind}: unknown keys {extra}")


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
                  for k in A1_KINDS}
POLICIES["tot"] = {k: (lambda kind: lambda method, **a: make_seed_policy(kind, **a))(k)
                   for k in TOT_MODES}
for _method in ("sc", "mcts", "rebase"):
    for _kind in ("even", "certaindex", "frontier", "length"):
        POLICIES[_method][_kind] = _search(_kind)


# method -> policy type -> its parameters' model (`policies.params`)
PARAMS: dict[str, dict[str, type[Params]]] = {
    "cot": {"certaindex": ProbeConsistencyParams, "budget": TokenBudgetParams,
            "full": FullReasoningParams},
    "sc": {"sc": SelfConsistencyParams},
    "a1": {k: A1Params for k in A1_KINDS},
    "tot": {k: ToTParams for k in TOT_MODES},
}
for _method in ("sc", "mcts", "rebase"):
    for _kind in ("even", "certaindex", "frontier", "length"):
        PARAMS.setdefault(_method, {})[_kind] = SearchParams


def register(method: str, name: str, factory: Callable, params: type[Params]) -> None:
    """Make `{type: name}` a policy of `method`: `params` checks a config's parameters (a
    `policies.params.Params` model), then factory(method, **given parameters) builds it."""
    POLICIES.setdefault(method, {})[name] = factory
    PARAMS.setdefault(method, {})[name] = params


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
    if not isinstance(kind, str) or kind not in makers:
        raise ValueError(f"programs.policy: {kind!r} is not a {method} policy; known: "
                         f"{', '.join(sorted(makers))}")
    args = validate_params(PARAMS[method][kind], args)
    try:
        return makers[kind](method, **args)
    except TypeError as e:
        raise ValueError(f"programs.policy {kind!r}: {e}") from None
    except ValueError as e:
        raise ValueError(f"programs.policy {e}") from None
