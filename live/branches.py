"""`trace branches`: multi-path reasoning programs (SC, MCTS, Rebase) run to their caps on vLLM.

For each held-out question every method's program (`programs.search.SearchProgram`) runs on the
engine through the live runner and every request it sends is recorded as a node of the
`branches` table (parent, depth, round, tokens, answer, path-likelihood reward, seed), so any
stop policy can later be replayed counterfactually in the simulator (`sim.families.dynasor.search`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from engines.reasoning_engines import open_reasoning_engine
from engines.model_dir import check_model
from live.runner import LiveRun, run_programs
from policies.search import SearchBudget
from programs.search import METHOD_INDEX, SearchProgram, SearchSettings, program_seed
from testbed import tasks
from traces import ids
from traces.store import check_out_dir


@dataclass(frozen=True)
class BranchWorkload:
    """Which questions and programs `trace branches` records."""

    questions_per_cell: int = 6
    sc_samples: int = 16
    mcts_iterations: int = 16
    rebase_widths: tuple[int, ...] = (4, 8, 16)
    methods: tuple[str, ...] = ("sc", "mcts", "rebase")
    settings: SearchSettings = SearchSettings()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.questions_per_cell < 1 or self.sc_samples < 1 or self.mcts_iterations < 1 or \
                not self.rebase_widths or min(self.rebase_widths) < 1:
            raise ValueError("trace branches: questions, samples, iterations and widths must be "
                             ">= 1")
        unknown = set(self.methods) - set(METHOD_INDEX)
        if unknown or not self.methods:
            raise ValueError(f"trace branches: unknown method {sorted(unknown)}; expected some "
                             f"of {list(METHOD_INDEX)}")


# ------------------------------------------------------------------ trace branches
def trace_branches(model: str, out_dir: str | Path, workload: BranchWorkload,
                   resume: bool = False, kv_cache_gb: float = 1.0, batch_questions: int = 8,
                   progress: bool = True, engine: str = "vllm", device: str = "auto") -> dict:
    """Run every question's SC/MCTS/Rebase programs to their caps on vLLM or the PyTorch
    engine's serving mode (`engine="torch"`, on `device`); record every request."""
    model_dir = check_model(model, "auto")
    out_dir = check_out_dir(out_dir, resume)
    live, writer, tok = open_reasoning_engine(engine, model_dir, workload.seed, "branches",
                                              {"workload": asdict(workload)}, out_dir, resume,
                                              kv_cache_gb, device)
    done_units = writer.done_units()
    n_cells = len(tasks.FAMILIES) * len(tasks.LEVELS)
    held = tasks.items(workload.seed, workload.questions_per_cell * n_cells)
    caps = {"sc": (workload.sc_samples,), "mcts": (workload.mcts_iterations,),
            "rebase": workload.rebase_widths}
    stats = {"programs": 0, "requests": 0}
    from rich.progress import Progress

    # One unit per batch of questions: a killed trace resumes at the first unfinished batch.
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("tracing branches", total=len(held))
        for b0 in range(0, len(held), batch_questions):
            unit = f"b{b0:04d}"
            batch = list(enumerate(held))[b0:b0 + batch_questions]
            if unit in done_units:
                bar.advance(task, len(batch))
                continue
            programs, meta = [], []
            for qi, item in batch:
                prompt = tok.encode(item.prompt, add_special_tokens=False)
                for method in workload.methods:
                    for cap in caps[method]:
                        qid = ids.question_id(qi, item.family, item.level)
                        programs.append(SearchProgram(
                            ids.search_program_id(qid, method, cap), method, SearchBudget(cap),
                            prompt, program_seed(workload.seed, qi, method), workload.settings))
                        meta.append((qid, item, method, cap))
            run_programs({"target": live}, [LiveRun(_AtStart, p, p.key) for p in programs])
            for prog, (qid, item, method, cap) in zip(programs, meta):
                for row in prog.rows:
                    writer.add("branches", program_id=prog.key, question_id=qid, method=method,
                               cap=cap, difficulty=item.level, gold_answer=item.answer,
                               is_correct=row["answer"] == item.answer, **row)
                stats["requests"] += len(prog.rows)
            stats["programs"] += len(programs)
            writer.flush(unit)
            bar.advance(task, len(batch))
    writer.seal()
    stats["wall_s"] = round(live.now_s(), 2)
    return stats


class _AtStart:
    """The plan of a traced program: every program of a batch arrives at once."""

    arrival_s = 0.0
