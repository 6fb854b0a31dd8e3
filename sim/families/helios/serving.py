"""Early-exit serving in simulation: HELIOS and its baselines over a traced prompt stream.

The program (`programs.helios.HeliosProgram`) plans rounds; HELIOS replicas
(`sim.families.helios.replica`) serve them, each on its own clock (they never interact; a
SimPy environment gives the same rows). With several replicas a router
(`policies.routing`, as the cluster model routes requests) assigns each prompt of the stream to a
replica, and each replica runs its own program and policy over its share: independent devices,
each choosing its own model and loaded depth. The stream is a backlog at time 0, so every prompt
is routed, in stream order, before any is served; the router sees each prompt's tokens and its
token budget.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
import simpy

from policies.helios import Serve
from policies.routing import ClusterView, RequestView, make_router
from programs.helios import HeliosProgram
from sim.families.helios.profile import ModelProfile
from sim.families.helios.replica import HeliosReplica
from sim.families.helios.rows import request_frame


@dataclass
class HeliosResult:
    """Per-prompt rows, per-round rows and the policy's events."""

    requests: pd.DataFrame
    rounds: pd.DataFrame
    events: list[tuple[int, Serve]]
    candidates: list[str] = field(default_factory=list)
    """the models the policy chose among"""

    def summary(self) -> dict:
        """Throughput, latencies, batch, perplexity, agreement with the full model, energy
        proxy, events, candidates."""
        return {**summarise(self.requests, self.rounds, self.events),
                "candidates": list(self.candidates)}


def summarise(requests: pd.DataFrame, rounds: pd.DataFrame, events: list) -> dict:
    """The figures a HELIOS run is judged by (sim and live alike)."""
    r = requests
    span_s = float(r.finish_s.max()) if len(r) else 0.0  # the stream starts at 0
    tokens = int(r.output_tokens.sum())
    tpot = (r.finish_s - r.first_token_s) / (r.output_tokens - 1).clip(lower=1)
    return {"prompts": int(len(r)), "tokens": tokens, "span_s": span_s,
            "throughput_tok_s": tokens / span_s if span_s > 0 else math.nan,
            "ttft_p50_s": float((r.first_token_s - r.arrival_s).median()),
            "tpot_p50_s": float(tpot.median()),
            "mean_batch": float(np.average(rounds.batch, weights=rounds.steps)),
            "perplexity": float(math.exp(r.nll_sum.sum() / max(tokens, 1))),
            "layer_token_executions": int(rounds.layer_tokens.sum()),
            "exit_shares": exit_shares(r),
            "events": [f"{i}:{s.event}:{s.model}@{s.depth}" for i, s in events],
            **full_model_agreement(r, tokens)}


def full_model_agreement(requests: pd.DataFrame, tokens: int) -> dict:
    """{"full_model_agreement": share of the output tokens equal to the full model's greedy
    token at the same position (the traced full-depth stream)}; {} where the rows have no
    such count (a what-if profile). A reference-free quality proxy, not accuracy: a token that
    differs may be as good, and tokens after a divergence are compared all the same."""
    agree = requests.get("reference_agree_tokens")
    if agree is None or not len(agree) or agree.isna().any():
        return {}
    return {"full_model_agreement": float(agree.sum() / max(tokens, 1))}


def exit_shares(requests: pd.DataFrame) -> dict[str, float]:
    """Share of the output tokens by model and exit layer, `model@layer` (HELIOS's Table 5: the
    models used and the exits taken)."""
    # rows of one model sharing one exits object counted once (served at a depth, they do)
    same: dict[tuple[str, int], list] = {}
    for model, exits in zip(requests.model.tolist(), requests.exit_layers.tolist()):
        key = (model, id(exits))
        if key in same:
            same[key][1] += 1
        else:
            same[key] = [exits, 1]
    counts: dict[str, int] = {}
    for (model, _), (exits, rows) in same.items():
        for layer, n in Counter(exits).items():
            key = f"{model}@{int(layer)}"
            counts[key] = counts.get(key, 0) + n * rows
    total = sum(counts.values())
    return {k: counts[k] / total for k in sorted(counts)} if total else {}


def simulate_stream(program: HeliosProgram, profiles: dict[str, ModelProfile]) -> HeliosResult:
    """Serve the program's rounds on one replica; per-prompt and per-round rows."""
    return simulate_cluster(lambda prompts: program, profiles, program.num_prompts)


def simulate_cluster(make_program: Callable[[list[int]], HeliosProgram],
                     profiles: dict[str, ModelProfile], num_prompts: int, replicas: int = 1,
                     router: str = "least_outstanding", budget_tokens: int = 0,
                     overlap_loading: bool = False, simpy_events: bool = False,
                     shares: list[list[int]] | None = None) -> HeliosResult:
    """Route the stream over `replicas` HELIOS replicas, each serving its share with the program
    `make_program(its stream indices)` builds; the rows of all, the events at stream indices.
    The replicas never interact: each serves its timeline in a plain loop (`simpy_events`: as
    SimPy processes in one environment instead, the same rows). `shares`: the routing, made
    already (`route_stream` of the same arguments)."""
    if shares is None:
        shares = route_stream(profiles, num_prompts, replicas, router, budget_tokens) \
            if replicas > 1 else [list(range(num_prompts))]
    servers = [HeliosReplica(k, make_program(share), profiles, overlap_loading)
               for k, share in enumerate(shares)]
    if simpy_events:
        env = simpy.Environment()
        for s in servers:
            env.process(s.process(env))
        env.run()
    else:
        for s in servers:
            s.serve()
    requests = request_frame([s.requests for s in servers])
    rounds = pd.DataFrame([r for s in servers for r in s.round_rows])
    if len(servers) > 1 and len(requests):
        requests = requests.sort_values("prompt", kind="stable", ignore_index=True)
        rounds = rounds.sort_values(["start_s", "replica_id"], kind="stable", ignore_index=True)
    events = sorted((e for s in servers for e in s.program.stream_events()), key=lambda e: e[0])
    return HeliosResult(requests, rounds, events, candidates_of(servers[0].program.policy))


def route_stream(profiles: dict[str, ModelProfile], num_prompts: int, replicas: int,
                 router: str, budget_tokens: int) -> list[list[int]]:
    """Each replica's stream indices, in stream order, as the router assigns them."""
    prompt_tokens = next(iter(profiles.values())).prompt_tokens
    route = make_router(router)
    view = ClusterView(outstanding_tokens=np.zeros(replicas, dtype=np.int64),
                       num_requests=np.zeros(replicas, dtype=np.int64))
    shares: list[list[int]] = [[] for _ in range(replicas)]
    for i in range(num_prompts):
        k = route.route(RequestView(i, prompt_tokens[i], budget_tokens), view)
        if not 0 <= k < replicas:
            raise ValueError(f"router returned replica {k}; the cluster has {replicas}")
        view.outstanding_tokens[k] += prompt_tokens[i] + budget_tokens
        view.num_requests[k] += 1
        shares[k].append(i)
    return shares


def candidates_of(policy) -> list[str]:
    """The models a policy chooses among (HELIOS: its shortlist; a baseline: its one model)."""
    return list(getattr(policy, "order", None) or [policy.candidate.name])
