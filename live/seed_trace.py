"""`trace tot`: Tree-of-Thoughts BFS on two vLLM engines (draft, target), every request recorded.

Each held-out testbed question's tree is grown twice through the live runner (`live.seed`): by
the target alone (`ar`, the tree its own sampling builds) and in speculative rounds (`sd`:
draft, then the target verifies; every speculative mode, SEED's included, builds this same tree,
whatever the schedule), once more per `k_config` in multi-candidate rounds (tree `sd-k2`
for (2, 1, 1, 1): their accepted lengths are their own), and with `speculative_eval` once
more with the value prompts' answers drafted and verified too (tree `sd-se`). Every request's
outcome goes to the
`tot_requests` table keyed by (program, thought, kind, round): what the simulator answers a ToT
program's requests from.
Programs of a tree run at once (timing here is not the measurement: the steps are).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from live.runner import LiveRun
from live.seed import open_session, run_tot
from policies.seed import SeedPolicy, ToTSettings
from programs.seed import tot_program_seed
from testbed import tasks
from traces import ids
from traces.store import check_out_dir


@dataclass(frozen=True)
class TotWorkload:
    """What `trace tot` records."""

    questions_per_cell: int = 2
    """questions per family x level"""
    settings: ToTSettings = ToTSettings()
    seed: int = 0
    k_configs: tuple = ()
    """multi-candidate rounds' k_configs: a tree each, beside ar and sd"""
    speculative_eval: bool = False
    """also the tree of speculative evaluations (`sd-se`: thoughts and value prompts drafted
    and verified)"""

    def __post_init__(self) -> None:
        if self.questions_per_cell < 1:
            raise ValueError("trace tot: questions must be >= 1")
        if self.settings.k_config or self.settings.speculative_eval:
            raise ValueError("trace tot: the settings' k_config must be empty and "
                             "speculative_eval false (k_configs and speculative_eval name the "
                             "trees traced beside ar and sd)")

    def policies(self) -> list[SeedPolicy]:
        """The policies whose trees are traced: ar, sd, sd per k_config, then sd-se."""
        return [SeedPolicy("ar", self.settings), SeedPolicy("sd", self.settings)] + \
            [SeedPolicy("sd", replace(self.settings, k_config=tuple(k))) for k in self.k_configs] \
            + ([SeedPolicy("sd", replace(self.settings, speculative_eval=True))]
               if self.speculative_eval else [])


@dataclass(frozen=True)
class TracePlan:
    """A traced program: it arrives at the start; no deadline binds it (an hour, nominal)."""

    program_id: str
    question_id: str
    difficulty: int
    arrival_s: float = 0.0
    deadline_s: float = 3600.0


def tot_questions(seed: int, per_cell: int) -> list[tuple[str, object]]:
    """Held-out testbed items with their ids, every family x level."""
    n = per_cell * len(tasks.FAMILIES) * len(tasks.LEVELS)
    return [(ids.question_id(i, it.family, it.level), it)
            for i, it in enumerate(tasks.items(seed, n))]


def trace_tot(draft_model: str, target_model: str, out_dir: str | Path, workload: TotWorkload,
              kv_cache_gb: float = 0.5, progress: bool = True) -> dict:
    """Grow every question's tree under ar, sd and each k_config; write tot_requests, programs
    and both engines' steps and requests."""
    out_dir = check_out_dir(out_dir, False, can_resume=False)
    session = open_session(draft_model, target_model, out_dir, "tot", workload.seed,
                           kv_cache_gb, {"workload": asdict(workload)})
    questions = tot_questions(workload.seed, workload.questions_per_cell)
    stats = {}
    t0 = time.perf_counter()
    for policy in workload.policies():
        tree = policy.tree
        runs, meta = [], {}
        for qid, item in questions:
            key = ids.tot_program_id(qid, tree)
            prog = session.program(qid, item.prompt, policy,
                                   tot_program_seed(workload.seed, qid))
            runs.append(LiveRun(TracePlan(key, qid, item.level), prog, key))
            meta[key] = (qid, item.level, item.answer, policy)
        rows = run_tot(session, runs, tree, meta)
        right = sum(r.program.answer == meta[r.key][2] for r in runs)
        stats[tree] = {"requests": len(rows), "accuracy": round(right / len(runs), 3)}
        if progress:
            print(f"tree {tree}: {len(rows)} requests, accuracy {right}/{len(runs)}", flush=True)
    session.seal()
    stats["wall_s"] = round(time.perf_counter() - t0, 2)
    return stats
