"""Scheduling conformance: the replica's step compositions against vLLM's own scheduler's.

The same requests go through the simulator's reference replica (`sim.engine.replica`, one event
per iteration) and through the installed vLLM's `Scheduler` (`engines.vllm_scheduler`); per
step, the requests scheduled and the tokens each, the preemptions, the prompt tokens found cached
when a request is first scheduled, and the requests finished are compared. Arrivals reach vLLM
before the same step index as they reached the replica, so the two see the same queue whenever
their past steps agreed: a difference is a scheduling difference, never a timing one. The lazy
replica and both compiled kernels are held equal to the reference replica by their own tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engines.vllm_scheduler import PlannedStep


@dataclass(frozen=True)
class SimRequest:
    """A request of a conformance workload."""

    idx: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    priority: int = 0
    group: int = -1
    prefix_tokens: int = 0

    @property
    def rid(self) -> str:
        """Its id on both sides."""
        return f"r{self.idx}"


def replica_steps(cfg, cal, requests: list[SimRequest], fast_forward: bool = False,
                  ) -> tuple[list[PlannedStep], list[int]]:
    """The reference replica's steps, one per iteration, and per request the step index before
    which it arrived. `fast_forward`: the replica runs decode iterations as runs (one event
    each, as simulations do), expanded here into their iterations; a request arriving during a
    run that could not take it counts as arriving at the run's end."""
    import simpy

    from sim.engine.replica import Replica
    from sim.engine.request_state import Req, Results

    runs: list[list] = []  # [step, iterations]
    submitted = [0] * len(requests)  # runs launched when each request arrived
    seen: set[str] = set()

    class Recording(Replica):
        def _launch(self, now, plan):
            step = PlannedStep({f"r{r.idx}": n for r, n in plan.scheduled},
                               ["?"] * plan.preempted)
            for r, _ in plan.scheduled:
                if f"r{r.idx}" not in seen:
                    seen.add(f"r{r.idx}")
                    step.cached[f"r{r.idx}"] = int(self.res.cached_tokens[r.idx])
            super()._launch(now, plan)
            runs.append([step, self.run[4] if self.run is not None else 1])

        def _truncate_to(self, k_new):
            runs[-1][1] = k_new
            super()._truncate_to(k_new)

        def _retire(self, done):
            runs[-1][0].finished.extend(f"r{r.idx}" for r in done)
            super()._retire(done)

    env = simpy.Environment()
    rep = Recording(env, 0, cal, cfg, Results(len(requests)), rng=None,
                    fast_forward=fast_forward)

    def arrive(r: SimRequest):
        yield env.timeout(r.arrival_s)
        submitted[r.idx] = len(runs)
        rep.submit(Req(r.idx, r.prompt_tokens, r.output_tokens, priority=r.priority,
                       group=r.group, prefix_tokens=r.prefix_tokens))

    for r in requests:
        env.process(arrive(r))
    env.run()
    steps, first_step = [], []
    for step, k in runs:
        first_step.append(len(steps))
        # a run of decode iterations (none prefills or preempts): the same requests, one token
        # each, every iteration; what finished, at its last
        steps += [PlannedStep(dict(step.tokens)) for _ in range(k - 1)] + [step]
    first_step.append(len(steps))
    # a request arriving during a run joins after that run's (truncated) iterations
    return steps, [first_step[m] for m in submitted]


def vllm_steps(cfg, model_dir: str | Path, requests: list[SimRequest], arrived: list[int],
               max_model_len: int) -> list[PlannedStep]:
    """vLLM's scheduler's steps on the same requests, each added before the step index at which
    it reached the replica (or, past the replica's last step, once vLLM's queue is empty)."""
    from engines.vllm_scheduler import VllmPlanner, prompt_ids

    planner = VllmPlanner(cfg, model_dir, max_model_len)
    order = sorted(range(len(requests)), key=lambda i: (arrived[i], requests[i].arrival_s, i))
    steps: list[PlannedStep] = []
    k = 0
    while k < len(order) or planner.has_requests():
        while k < len(order) and (arrived[order[k]] <= len(steps) or not planner.has_requests()):
            r = requests[order[k]]
            planner.add(r.rid, prompt_ids(r.idx, r.prompt_tokens, r.group, r.prefix_tokens),
                        r.output_tokens, r.priority)
            k += 1
        step = planner.step()
        if step.tokens:  # an empty step (its one candidate preempted itself) the replica
            steps.append(step)  # composes again at once, as one step
        elif steps:
            steps[-1].finished.extend(step.finished)
    return steps


def torch_steps(cfg, model_dir: str | Path, requests: list[SimRequest], arrived: list[int],
                max_model_len: int) -> list[PlannedStep]:
    """The PyTorch engine's serving-mode steps (`engines.pytorch.packed`) on the same requests,
    each added before the step index at which it reached the replica (its slot cache: no
    preemption, no prefix caching, FCFS)."""
    from engines.pytorch.engine import TorchEngine
    from engines.pytorch.spec import TorchSpec
    from engines.vllm_scheduler import prompt_ids

    engine = TorchEngine(TorchSpec(model=str(model_dir), device="cpu",
                                   max_num_seqs=cfg.max_num_seqs,
                                   max_num_batched_tokens=cfg.max_num_batched_tokens,
                                   max_model_len=max_model_len, serving=True))
    vocab = int(engine.config.vocab_size)  # the ids only fill the prompt: no cache reads them
    order = sorted(range(len(requests)), key=lambda i: (arrived[i], requests[i].arrival_s, i))
    steps: list[PlannedStep] = []
    k = 0
    while k < len(order) or engine.has_unfinished():
        while k < len(order) and (arrived[order[k]] <= len(steps) or not engine.has_unfinished()):
            r = requests[order[k]]
            ids = prompt_ids(r.idx, r.prompt_tokens, r.group, r.prefix_tokens)
            engine.add(r.rid, [t % vocab for t in ids], r.output_tokens, stop_at_eos=False)
            k += 1
        res = engine.step()
        steps.append(PlannedStep(res.scheduled, finished=list(res.finished)))
    return steps


def compare_steps(ours: list[PlannedStep], theirs: list[PlannedStep]) -> dict:
    """Step by step: identical steps (tokens per request, preemptions, requests finished and
    their order), the first that differs (both sides), cached-token differences, and the step
    counts."""
    same = [a.tokens == b.tokens and len(a.preempted) == len(b.preempted)
            and a.finished == b.finished for a, b in zip(ours, theirs)]
    first = next((i for i, s in enumerate(same) if not s), None)
    if first is None and len(ours) != len(theirs):
        first = min(len(ours), len(theirs))
    out = {"steps": len(ours), "vllm_steps": len(theirs),
           "identical": int(sum(same)), "first_difference": first,
           "preemptions": (sum(len(s.preempted) for s in ours),
                           sum(len(s.preempted) for s in theirs)),
           "cached_differ": sum(a.cached.get(r) != b.cached.get(r)
                                for a, b in zip(ours, theirs) for r in a.cached)}
    if first is not None:
        out["at_first"] = {"ours": _show(ours, first), "vllm": _show(theirs, first)}
    return out


def _show(steps: list[PlannedStep], i: int) -> dict | None:
    if i >= len(steps):
        return None
    s = steps[i]
    return {"tokens": s.tokens, "preempted": len(s.preempted), "cached": s.cached,
            "finished": s.finished}


def random_workload(seed: int, n: int = 24) -> tuple[dict, list[SimRequest]]:
    """A random replica configuration (limits, chunked budget, KV pressure, prefix caching,
    priority) and a workload that stresses it: the fuzzer's one case."""
    rng = np.random.default_rng(seed)
    block = int(rng.choice([16, 32]))
    fits = -(-(300 + 60) // block) + 1  # the longest request fits alone
    limits = {"max_num_seqs": int(rng.choice([2, 4, 8, 16])),
              "max_num_batched_tokens": int(rng.choice([32, 64, 128, 512])),
              "block_size": block, "kv_blocks": int(rng.integers(fits, 6 * fits)),
              "enable_prefix_caching": bool(rng.random() < 0.5),
              "priority_scheduling": bool(rng.random() < 0.3)}
    groups = int(rng.integers(0, 4))
    reqs = []
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(0.05)) if rng.random() < 0.7 else 0.0
        prompt = int(rng.integers(4, 300))
        group = int(rng.integers(groups)) if groups and rng.random() < 0.6 else -1
        prefix = min(prompt - 1, int(rng.choice([16, 48, 100]))) if group >= 0 else 0
        reqs.append(SimRequest(i, t, prompt, int(rng.integers(1, 60)),
                               int(rng.integers(0, 3)) if limits["priority_scheduling"] else 0,
                               group, prefix))
    return limits, reqs
