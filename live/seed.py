"""ToT programs live on two in-process vLLM engines (draft, target): `trace tot` and `seed replay`.

Each program is the `programs.seed.ToTProgram` the simulator drives; the engines answer, and the
program decides acceptance from their log-probabilities (whole distributions: the engines'
top-k covers the vocabulary). A directory holds the `tot_requests` and `programs` tables, and
each engine's `steps`/`requests` under DIR/draft and DIR/target.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from engines.live_engine import VllmEngine
from live.runner import LiveRun, run_programs
from policies.certaindex import PROBE_SUFFIX
from programs.records import program_row
from programs.seed import ToTProgram
from engines.model_dir import check_model
from engines.vllm_engine import reasoning_engine
from traces import ids
from traces.store import TraceWriter

ROLES = ("draft", "target")


@dataclass
class TotSession:
    """Two warmed-up engines, their writers, and what programs need of the tokenizer."""

    engines: dict
    """role -> VllmEngine"""
    writer: TraceWriter
    """DIR: tot_requests, programs"""
    writers: dict
    out_dir: Path
    encode: object
    decode: object
    newline_id: int
    eos_id: int
    vocab: int
    probe_ids: list
    close_id: int
    """the token that closes a value prompt's box"""

    def program(self, question_id: str, prompt: str, policy, seed: int) -> ToTProgram:
        """A ToT program on a question, wired to these engines' tokenizer."""
        ids_ = self.encode(prompt)
        return ToTProgram(question_id, policy, len(ids_), seed, len(self.probe_ids),
                          prompt_ids=ids_, probe_ids=self.probe_ids, decode=self.decode,
                          newline_id=self.newline_id, eos_id=self.eos_id, vocab=self.vocab,
                          close_id=self.close_id)

    def flush(self, unit: str) -> None:
        """Write every engine's steps and requests of a unit of work."""
        for w in (self.writer, *self.writers.values()):
            w.flush(unit)

    def seal(self) -> None:
        """Seal every engine's directory and the session's (its writers' last act)."""
        for w in (*self.writers.values(), self.writer):
            w.seal()


def open_session(draft_model: str, target_model: str, out_dir: str | Path, kind: str,
                 seed: int, kv_cache_gb: float, params: dict,
                 max_num_seqs: dict | None = None) -> TotSession:
    """Start, warm up and clock both engines (prefix caching, whole-vocabulary log-probs)."""
    out_dir = Path(out_dir)
    models = {"draft": check_model(draft_model, "auto"), "target": check_model(target_model, "auto")}
    # whole distributions for sampled acceptance: top-k over the vocabulary
    vocab = int(json.loads((models["target"] / "config.json").read_text())["vocab_size"])
    engines = {r: reasoning_engine(m, seed, kv_cache_gb, (max_num_seqs or {}).get(r),
                                   max_logprobs=vocab) for r, m in models.items()}
    tok = engines["target"].engine.get_tokenizer()

    def encode(text: str) -> list:
        return tok.encode(text, add_special_tokens=False)

    def decode(token_ids) -> str:
        return tok.decode(list(token_ids), skip_special_tokens=True)

    probe_ids = encode(PROBE_SUFFIX)
    params = {**params, "probe_tokens": len(probe_ids), "vocab": vocab,
              "draft": {"model_id": str(models["draft"]),
                                  "model_config_hash": engines["draft"].config_hash,
                                  "engine": engines["draft"].params()},
              "engine": engines["target"].params()}
    writer = TraceWriter(out_dir, engines["target"].run_row(kind, seed, params))
    writers = {r: TraceWriter(out_dir / r, e.run_row(kind, seed, {"role": r,
                                                                  "engine": e.params()}))
               for r, e in engines.items()}
    for e in engines.values():
        e.warm_up()
    t0 = time.perf_counter()
    return TotSession({r: VllmEngine(e, writers[r], t0) for r, e in engines.items()}, writer,
                      writers, out_dir, encode, decode, encode("\n")[0], int(tok.eos_token_id),
                      vocab, probe_ids, encode("}")[-1])


def run_tot(session: TotSession, runs: list[LiveRun], unit: str, meta: dict) -> list[dict]:
    """Run programs to the end; write their tot_requests and programs rows under `unit`.
    `meta`: program key -> (question_id, difficulty, gold answer, policy)."""
    run_programs(session.engines, runs)
    session.flush(unit)
    times = _request_times(session.out_dir, unit)
    rows = []
    for run in runs:
        qid, difficulty, gold, policy = meta[run.key]
        for r in run.program.rows:
            rid = ids.search_request_id(run.key, r.pop("request_index"))
            sent, finish = times[rid]
            row = dict(r, program_id=run.key, question_id=qid, difficulty=difficulty,
                       gold_answer=gold, mode=policy.mode, request_id=rid, sent_s=sent,
                       finish_s=finish, rescored=f"{rid}~full" in times)
            session.writer.add("tot_requests", **row)
            rows.append(row)
        session.writer.add("programs", **program_row(run.plan, run.program, run.finish_s, "tot",
                                                     policy, "fcfs", gold))
    session.writer.flush(f"{unit}-tot")
    return rows


def _request_times(out_dir: Path, unit: str) -> dict:
    """request id -> (arrival_s, finish_s) over both engines' parts of a unit (a request re-run
    without the prefix cache finishes when its re-run does)."""
    out = {}
    for role in ROLES:
        part = out_dir / role / "requests" / f"part-{unit}.parquet"
        if not part.exists():  # no request of that role in the unit (ar: no draft)
            continue
        t = pq.read_table(part, columns=["request_id", "arrival_s", "finish_s"])
        for rid, a, f in zip(*(t.column(i).to_pylist() for i in range(3))):
            out[rid] = (a, f)
    for rid, (_, f) in list(out.items()):
        if rid.endswith("~full"):
            base = rid[:-len("~full")]
            out[base] = (out[base][0], f)
    return out


def replay_tot(wl, cfg, out_dir: str | Path) -> dict:
    """Run a ToT program workload live (the config's draw, the trace's models and seeds) and
    write its tables; the runs and their tot_requests rows."""
    from programs.seed import tot_program_seed
    from programs.workload import draw_seed, load_bank, plan_programs
    from testbed import tasks
    from traces.store import read_run

    bank = load_bank(wl)
    plans = plan_programs(wl, bank, draw_seed(cfg.seed, sum(g.count for g in cfg.replicas)))
    pools = {g.pool: g for g in cfg.replicas}
    if set(pools) != set(ROLES) or any(g.count != 1 for g in cfg.replicas):
        raise ValueError("seed replay drives two engines: the config needs one draft and one "
                         "target replica")
    run = read_run(wl.trace)
    params = json.loads(run["params_json"])
    session = open_session(params["draft"]["model_id"], run["model_id"], out_dir,
                           "program_replay", cfg.seed, float(params["engine"]["kv_cache_gb"]),
                           {"config": json.loads(cfg.to_json()), "tot_trace": str(wl.trace)},
                           {r: pools[r].max_num_seqs for r in ROLES})
    n = int(params["workload"]["questions_per_cell"]) * len(tasks.FAMILIES) * len(tasks.LEVELS)
    items = tasks.items(bank.seed, n)
    runs, meta = [], {}
    for plan in plans:
        item = items[ids.question_index(plan.question_id)]
        prog = session.program(plan.question_id, item.prompt, wl.policy,
                               tot_program_seed(bank.seed, plan.question_id))
        runs.append(LiveRun(plan, prog, plan.program_id))
        meta[plan.program_id] = (plan.question_id, plan.difficulty, item.answer, wl.policy)
    rows = run_tot(session, runs, "replay", meta)
    session.seal()
    return {"runs": runs, "rows": rows}
