"""Dynasor's programs in the simulator: CoT/SC paths answered from a probes trace, SC/MCTS/Rebase
search programs from a branches trace (the oracles: `sim.workloads.program_driver`)."""

from __future__ import annotations

from programs.reasoning import ReasoningProgram, ReasoningSetup
from programs.search import SearchProgram, SearchSettings, program_seed
from programs.traced import QuestionBank, SearchBank
from sim.families.registry import SimFamily, register_sim_family
from sim.workloads.program_driver import SimProgram, TracedReasoning, TracedSearch
from traces import ids


def max_requests(q, method: str, policy, stride: int) -> int:
    """Upper bound on the requests a cot/sc program of this question sends (buffer sizing)."""
    samples = q.samples if method == "sc" else (max(q.samples, key=lambda t: t.reasoning_tokens),)
    if method == "sc":
        samples = samples[:policy.samples]
    return sum(2 * (-(-t.reasoning_tokens // stride)) + 2 for t in samples)

def reasoning_setup(bank: QuestionBank) -> ReasoningSetup:
    """The generation settings of a probes trace's paths (what the simulator needs of them)."""
    return ReasoningSetup(bank.stride_tokens, bank.budget_tokens, bank.suffix_tokens)


def build_search_runs(wl, bank: SearchBank, plans) -> tuple[list[SimProgram], int, TracedSearch]:
    """Search program objects of planned programs, their request count, and their oracle."""
    by_id = {q.question_id: q for q in bank.questions}
    settings = SearchSettings(**bank.settings)
    seeds = {q: program_seed(bank.seed, ids.question_index(q), wl.method) for q in by_id}
    runs = [SimProgram(p, SearchProgram(p.program_id, wl.method, wl.policy, None,
                                        seeds[p.question_id], settings),
                       by_id[p.question_id]) for p in plans]
    return runs, sum(len(r.question.requests) for r in runs), TracedSearch()


def build_reasoning_runs(wl, bank: QuestionBank, plans
                         ) -> tuple[list[SimProgram], int, TracedReasoning]:
    """CoT/SC program objects of planned programs, a bound on their requests, their oracle."""
    by_id = {q.question_id: q for q in bank.questions}
    setup = reasoning_setup(bank)
    # per question, once: its samples' request seeds, and its programs' bound on requests
    seeds = {k: {t.sample_id: t.request_seed for t in q.samples} for k, q in by_id.items()}
    bound = {k: max_requests(q, wl.method, wl.policy, bank.stride_tokens)
             for k, q in by_id.items()}
    runs = []
    capacity = 0
    for p in plans:
        q, seed = by_id[p.question_id], seeds[p.question_id]
        runs.append(SimProgram(p, ReasoningProgram(wl.method, wl.policy, setup, q.prompt_tokens,
                                                   p.sample_ids,
                                                   tuple(seed[s] for s in p.sample_ids)), q))
        capacity += bound[p.question_id]
    return runs, capacity, TracedReasoning()


register_sim_family(SimFamily("reasoning", build_reasoning_runs, releases_programs=True,
                              compiles=True, templated=True))
register_sim_family(SimFamily("search", build_search_runs, releases_programs=True,
                              compiles=True, templated=True))
