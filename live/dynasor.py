"""Dynasor's programs live: CoT/SC paths with the probes trace's per-chunk seeds, SC/MCTS/Rebase
search programs with the branches trace's seeds, prompts from the testbed's questions."""

from __future__ import annotations

from live.families import LiveFamily, register_live_family
from live.runner import LiveRun
from policies.certaindex import PROBE_SUFFIX
from programs.reasoning import ReasoningProgram, ReasoningSetup
from programs.search import SearchProgram, SearchSettings, program_seed
from programs.workload import ProgramWorkload
from testbed import tasks
from traces import ids
from traces.store import read_table


def _questions(twl: dict) -> list:
    n_cells = len(tasks.FAMILIES) * len(tasks.LEVELS)
    return tasks.items(int(twl["seed"]), int(twl["questions_per_cell"]) * n_cells)


def build_reasoning_runs(wl: ProgramWorkload, bank, plans, twl: dict, encode
                         ) -> tuple[list, dict]:
    """CoT/SC program objects of planned programs, prompts encoded, and gold answers by id.

    `twl` is the trace's workload parameters (seeds, sampling settings); `encode` maps text to
    token ids (the engine's tokenizer).
    """
    items = _questions(twl)
    setup = ReasoningSetup(bank.stride_tokens, int(twl["budget_tokens"]), bank.suffix_tokens,
                           float(twl["temperature"]), int(twl["probe_tokens"]),
                           float(twl["probe_temperature"]), float(twl["probe_top_p"]),
                           tuple(encode(PROBE_SUFFIX)))
    tr = read_table(wl.trace, "trajectories").to_pandas()
    seeds = dict(zip(zip(tr.question_id, tr.sample_id), tr.request_seed))
    runs, gold = [], {}
    for plan in plans:
        qi = ids.question_index(plan.question_id)
        prompt = encode(items[qi].prompt)
        gold[plan.program_id] = items[qi].answer
        program = ReasoningProgram(
            wl.method, wl.policy, setup, len(prompt), plan.sample_ids,
            tuple(int(seeds[(plan.question_id, s)]) for s in plan.sample_ids), prompt)
        runs.append(LiveRun(plan, program, plan.program_id))
    return runs, gold


def build_search_runs(wl: ProgramWorkload, bank, plans, twl: dict, encode) -> tuple[list, dict]:
    """Search program objects of planned programs, prompts encoded, and gold answers by id."""
    items = _questions(twl)
    settings = SearchSettings(**twl["settings"])
    runs, gold = [], {}
    for plan in plans:
        qi = ids.question_index(plan.question_id)
        prompt = encode(items[qi].prompt)
        gold[plan.program_id] = items[qi].answer
        program = SearchProgram(plan.program_id, wl.method, wl.policy, prompt,
                                program_seed(int(twl["seed"]), qi, wl.method), settings)
        runs.append(LiveRun(plan, program, plan.program_id))
    return runs, gold


register_live_family(LiveFamily("reasoning", build_reasoning_runs, "probes_trace"))
register_live_family(LiveFamily("search", build_search_runs, "branches_trace"))
