"""`a1 replay`: A1 programs live on two in-process vLLM engines (draft, target).

The programs are drawn from the config exactly as the simulator draws them; each is the same
`programs.a1.A1Program` the simulator drives, with the conformity trace's calibration sets and
seeds, so a path's draft steps reproduce the trace and its decisions can be compared with the
simulator's path for path. Scores, answers and steps come from the live engines, never from the
trace. Writes requests/steps (target engine in DIR, draft engine in DIR/draft), programs and
conformity (the nodes the programs visited) under DIR.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from engines.live_engine import VllmEngine
from live.runner import LiveRun, run_programs
from policies.certaindex import extract_boxed
from policies.scheduling import make_scheduler
from programs.a1 import A1Program, a1_program_seed
from programs.records import program_row
from programs.workload import draw_seed, load_bank, plan_programs
from engines.model_dir import check_model
from engines.vllm_engine import reasoning_engine
from testbed import tasks
from traces import ids
from traces.store import TraceWriter, read_run


def replay_a1(wl, cfg, out_dir: str | Path) -> dict:
    """Run an A1 program workload live and write its tables; the program objects it ran."""
    bank = load_bank(wl)
    policy = bank.calibrate(wl.policy)
    settings = bank.settings_for(policy)
    plans = plan_programs(wl, bank, draw_seed(cfg.seed, sum(g.count for g in cfg.replicas)))
    run = read_run(wl.trace)
    params = json.loads(run["params_json"])
    twl, teng = params["workload"], params["engine"]
    pools = {g.pool: g for g in cfg.replicas}
    if set(pools) != {"draft", "target"} or any(g.count != 1 for g in cfg.replicas):
        raise ValueError("a1 replay drives two engines: the config needs one draft and one "
                         "target replica")
    out_dir = Path(out_dir)
    engines, writers = {}, {}
    for role, model in (("target", run["model_id"]), ("draft", params["draft"]["model_id"])):
        eng = reasoning_engine(check_model(model, "auto"), int(twl["seed"]),
                               float(teng["kv_cache_gb"]), pools[role].max_num_seqs,
                               "fcfs" if cfg.scheduler == "fcfs" else "priority",
                               int(teng.get("max_model_len", 1024)),
                               int(teng.get("block_size", 32)))
        d = out_dir if role == "target" else out_dir / "draft"
        writers[role] = TraceWriter(d, eng.run_row("program_replay", cfg.seed, {
            "role": role, "config": json.loads(cfg.to_json()), "conformity_trace": str(wl.trace),
            "engine": eng.params()}))
        engines[role] = eng
    tok = engines["target"].engine.get_tokenizer()
    n_cells = len(tasks.FAMILIES) * len(tasks.LEVELS)
    items = tasks.items(int(twl["seed"]), 2 * int(twl["questions_per_cell"]) * n_cells)
    runs, gold = [], {}
    for plan in plans:
        item = items[ids.question_index(plan.question_id)]
        prompt = tok.encode(item.prompt, add_special_tokens=False)
        gold[plan.program_id] = item.answer
        prog = A1Program(plan.question_id, (policy.step,), settings, len(prompt),
                         a1_program_seed(bank.seed, plan.question_id), prompt)
        runs.append(LiveRun(plan, prog, plan.program_id))
    for e in engines.values():
        e.warm_up()
    t0 = time.perf_counter()
    live = {role: VllmEngine(e, writers[role], t0) for role, e in engines.items()}
    run_programs(live, runs, make_scheduler(cfg.scheduler), extract_boxed)
    for w in writers.values():
        w.flush("all")
    for r in runs:
        writers["target"].add("programs", **program_row(
            r.plan, r.program, r.finish_s, wl.method, wl.policy, cfg.scheduler,
            gold[r.plan.program_id]))
        for row in r.program.node_rows(r.plan.program_id, gold[r.plan.program_id],
                                       difficulty=r.plan.difficulty):
            writers["target"].add("conformity", **row)
    writers["target"].flush("programs")
    for w in writers.values():
        w.seal()
    return {"runs": runs, "rescored": sum(e.rescored for e in live.values())}
