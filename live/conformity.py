"""`trace conformity`: A1 on two vLLM engines (draft, target), every turn of every path recorded.

Two phases over held-out testbed questions, both driven by the live runner over two in-process
engines (prefix caching on; each writes its own `steps`/`requests` under DIR/draft, DIR/target):

1. calibration: draft-only paths, every draft step scored by the target. Questions of the
   calibration split (never evaluated) give the marginal calibration set; `calib_samples` extra
   samples of each evaluation question (seeds disjoint from its evaluated samples) give its
   conditional (per-question) set.
2. evaluation: each evaluation question's `samples` paths run under every policy at once (draft-
   only, target-only, conformal at each alpha x coverage), the path tree forking where policies
   disagree (`programs.a1`), and at every node the target's own step is asked too. So any policy
   of the grid replays exactly from the trace, and any alpha one step off its path.

Rows go to the `conformity` table (one per node: draft step, score, p-values under both
coverages, target step, answers, times).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow.parquet as pq

from engines.live_engine import VllmEngine
from live.runner import LiveRun, run_programs
from policies.a1 import (COVERAGES, A1Settings, Conformal, ConformalSet, DraftOnly, TargetOnly,
                        Threshold, calibration_sets)
from policies.certaindex import extract_boxed
from programs.a1 import A1Program, a1_program_seed
from engines.model_dir import check_model
from engines.vllm_engine import reasoning_engine
from testbed import tasks
from traces import ids
from traces.store import TraceWriter, check_out_dir, read_table


@dataclass(frozen=True)
class ConformityWorkload:
    """What `trace conformity` records."""

    questions_per_cell: int = 3
    """evaluation questions per family x level (as many again for calibration)"""
    samples: int = 8
    """evaluated paths per question"""
    calib_samples: int = 8
    """draft-only calibration paths per evaluation question (conditional coverage)"""
    alphas: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
    settings: A1Settings = A1Settings()
    seed: int = 0
    calib_draft_tokens: int | None = None
    """Kd of the calibration phase's draft steps (None: the sampling Kd); another length than
    sampling's is A1's calibration-sampling mismatch (Fig 6)"""
    thresholds: tuple[float, ...] = ()
    """fixed-threshold baselines (SpecReason-style) in the evaluation grid: their paths traced"""

    def __post_init__(self) -> None:
        if self.questions_per_cell < 1 or self.samples < 1 or self.calib_samples < 1:
            raise ValueError("trace conformity: questions, samples and calib_samples must be >= 1")
        if not self.alphas or not all(0 < a < 1 for a in self.alphas):
            raise ValueError(f"trace conformity: alphas must lie in (0, 1), got {self.alphas}")
        if self.calib_draft_tokens is not None and self.calib_draft_tokens < 1:
            raise ValueError("trace conformity: calib_draft_tokens must be >= 1, got "
                             f"{self.calib_draft_tokens}")
        for t in self.thresholds:
            Threshold(t)  # a bad threshold fails here, before any engine starts


def split_questions(wl: ConformityWorkload) -> tuple[list, list]:
    """(calibration, evaluation) held-out items with their ids: disjoint, each family x level."""
    n_cells = len(tasks.FAMILIES) * len(tasks.LEVELS)
    held = tasks.items(wl.seed, 2 * wl.questions_per_cell * n_cells)
    out = ([], [])
    for i, item in enumerate(held):
        # items cycle over the cells: alternate whole rounds between the two splits
        out[(i // n_cells) % 2].append((ids.question_id(i, item.family, item.level), item))
    return out


def eval_policies(wl: ConformityWorkload, marginal: ConformalSet, by_question: dict) -> tuple:
    """The policy grid of the evaluation phase: baselines, conformal per coverage x alpha, then
    the fixed thresholds."""
    conformal = tuple(Conformal(a, c).calibrated(marginal, by_question)
                      for c in COVERAGES for a in wl.alphas)
    return (DraftOnly(), TargetOnly()) + conformal + tuple(Threshold(t) for t in wl.thresholds)


def trace_conformity(draft_model: str, target_model: str, out_dir: str | Path,
                     workload: ConformityWorkload, kv_cache_gb: float = 0.5,
                     progress: bool = True) -> dict:
    """Run both phases; write the conformity table and both engines' steps and requests."""
    draft_dir, target_dir = check_model(draft_model, "auto"), check_model(target_model, "auto")
    out_dir = check_out_dir(out_dir, False, can_resume=False)
    draft = reasoning_engine(draft_dir, workload.seed, kv_cache_gb)
    target = reasoning_engine(target_dir, workload.seed, kv_cache_gb)
    params = {"workload": asdict(workload), "engine": target.params(),
              "draft": {"model_id": str(draft_dir), "model_config_hash": draft.config_hash,
                        "engine": draft.params()}}
    writer = TraceWriter(out_dir, target.run_row("conformity", workload.seed, params))
    writers = {"draft": TraceWriter(out_dir / "draft", draft.run_row(
                   "conformity", workload.seed, {"role": "draft", "engine": draft.params()})),
               "target": TraceWriter(out_dir / "target", target.run_row(
                   "conformity", workload.seed, {"role": "target", "engine": target.params()}))}
    tok = target.engine.get_tokenizer()
    for e in (draft, target):
        e.warm_up()
    t0 = time.perf_counter()
    engines = {"draft": VllmEngine(draft, writers["draft"], t0),
               "target": VllmEngine(target, writers["target"], t0)}
    calib_q, eval_q = split_questions(workload)
    s = workload.settings
    all_writers = (writer, *writers.values())

    def run_phase(unit: str, jobs: list) -> list[dict]:
        return _run_phase(unit, jobs, tok, engines, all_writers, out_dir, workload.seed)

    calib_settings = A1Settings(samples=workload.calib_samples, turns=s.turns,
                                draft_tokens=workload.calib_draft_tokens or s.draft_tokens,
                                target_tokens=s.target_tokens,
                                temperature=s.temperature)
    jobs = [(q, it, "calibration", (DraftOnly(),), calib_settings, True) for q, it in calib_q]
    jobs += [(q, it, "evaluation", (DraftOnly(),), calib_settings, True) for q, it in eval_q]
    calib_rows = run_phase("calibration", jobs)
    marginal, by_q = calibration_sets((r["question_split"], r["question_id"], r["score"])
                                      for r in calib_rows if r["score"] is not None)
    policies = eval_policies(workload, marginal, by_q)
    eval_rows = run_phase("evaluation",
                          [(q, it, "evaluation", policies, s, False) for q, it in eval_q])
    for row in calib_rows + eval_rows:
        score, cal = row["score"], by_q.get(row["question_id"])
        row["p_value_marginal"] = marginal.p_value(score) if score is not None else None
        row["p_value_conditional"] = cal.p_value(score) if score is not None and cal else None
        writer.add("conformity", **row)
    writer.flush("conformity")
    for w in (*writers.values(), writer):
        w.seal()
    return {"rows": len(calib_rows) + len(eval_rows), "calibration_scores": len(marginal.scores),
            "rescored": sum(e.rescored for e in engines.values()),
            "wall_s": round(time.perf_counter() - t0, 2)}


def _run_phase(unit: str, jobs: list, tok, engines: dict, writers: tuple, out_dir: Path,
               seed: int) -> list[dict]:
    """One phase of `trace_conformity`: its programs live, the writers flushed as `unit`;
    jobs: (qid, item, split, policies, settings, calibration run); returns the rows."""
    runs = []
    for qid, item, split, policies, settings, calib in jobs:
        prompt = tok.encode(item.prompt, add_special_tokens=False)
        prog = A1Program(qid, policies, settings, len(prompt),
                         a1_program_seed(seed, qid, calib), prompt, score_all=True,
                         target_all=not calib)
        key = ids.a1_program_id(qid, "calibration" if calib else "evaluation")
        runs.append((LiveRun(_AtStart, prog, key), qid, item, split))
    run_programs(engines, [r[0] for r in runs], answer_of=extract_boxed)
    for w in writers:
        w.flush(unit)
    times = _request_times(out_dir, unit)
    rows = []
    for run, qid, item, split in runs:
        nodes = run.program.node_rows(run.key, item.answer, split, family=item.family,
                                      difficulty=item.level)
        rows += [_timed(node, row, run.key, times)
                 for node, row in zip(run.program.rows, nodes)]
    return rows


def _request_times(out_dir: Path, unit: str) -> dict:
    """request id -> (arrival_s, finish_s, cached prompt tokens) over both engines' unit parts."""
    out = {}
    for role in ("draft", "target"):
        t = pq.read_table(out_dir / role / "requests" / f"part-{unit}.parquet",
                          columns=["request_id", "arrival_s", "finish_s", "cached_prompt_tokens"])
        for rid, a, f, c in zip(*(t.column(i).to_pylist() for i in range(4))):
            out[rid] = (a, f, c)
    return out


def _timed(node: dict, row: dict, key: str, times: dict) -> dict:
    """A conformity row with its requests' ids and latencies (and how its score was cached)."""
    for kind in ("draft", "score", "target"):
        n = node.get(f"{kind}_request")
        if n is None:
            continue
        rid = ids.search_request_id(key, n)
        arrival, finish, cached = times[rid]
        full = times.get(f"{rid}~full")
        if full is not None:  # re-run without the prefix cache: its time counts
            finish = full[1]
        row[f"{kind}_ms"] = (finish - arrival) * 1e3
        row[f"{kind}_request_id"] = rid
        if kind == "score":
            row["score_cached_tokens"] = cached if full is None else 0
            row["score_rescored"] = full is not None
    return row


class _AtStart:
    """Every traced program arrives at once."""

    arrival_s = 0.0


def trace_summary(trace_dir: str | Path) -> dict:
    """Rows, questions and paths of a conformity trace (for the CLI)."""
    t = read_table(trace_dir, "conformity").to_pandas()
    return {"rows": len(t), "questions": int(t["question_id"].nunique()),
            "by_split": json.loads(t.groupby("question_split").size().to_json())}
