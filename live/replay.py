"""`dynasor replay`: a program workload run live on vLLM with the simulator's program objects.

The programs (arrivals, questions, samples, deadlines) are drawn from the config exactly as the
simulator draws them (`programs.workload`). cot/sc paths decode in chunks with the probes trace's
per-chunk seeds and search programs rerun their algorithm with the branches trace's seeds, so
each reproduces its traced requests unless batching changes the numerics. Probe answers, final
answers and rewards are read from the live outputs, never from the trace; a stop aborts what is
in flight; the scheduler's priorities go to vLLM's priority scheduling.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from engines.live_engine import VllmEngine
from engines.speed_probe import run_speed_probe
from engines.vllm_engine import check_model, reasoning_engine
from live.families import live_family
from live.runner import run_programs
from policies.certaindex import extract_boxed
from policies.scheduling import make_scheduler
from programs.families import family_of
from programs.records import program_row
from programs.workload import ProgramWorkload, draw_seed, load_bank, plan_programs
from testbed import tasks
from traces.store import TraceWriter, read_run, read_table


def replay_workload(wl: ProgramWorkload, scheduler_spec, out_dir: str | Path, seed: int = 0,
                    max_num_seqs: int | None = None, model: str | None = None,
                    config_json: str = "{}", url: str | None = None) -> list[dict]:
    """Run a program workload live on one vLLM engine (in-process, or the OpenAI-compatible
    server at `url`); write requests/steps/programs; the programs rows."""
    family = live_family(family_of(wl.method, wl.policy).name)
    bank = load_bank(wl)
    plans = plan_programs(wl, bank, draw_seed(seed, 1))  # one replica: the simulator's draw
    trace_run = read_run(wl.trace)
    params = json.loads(trace_run["params_json"])
    twl, teng = params["workload"], params["engine"]
    model_dir = check_model(model or trace_run["model_id"], "auto")
    config = {"config": json.loads(config_json), family.trace_key: str(wl.trace)}
    out_dir = Path(out_dir)
    if url is not None:
        from transformers import AutoTokenizer

        from engines.http_engine import HttpEngine
        from engines.http_engine import http_run_row

        tok = AutoTokenizer.from_pretrained(str(model_dir))
        url = url.rstrip("/")
        served, run = http_run_row(url, "program_replay", seed, config | {"url": url})
        writer = TraceWriter(out_dir, run)
        engine = None
    else:
        engine = reasoning_engine(model_dir, int(twl["seed"]), float(teng["kv_cache_gb"]),
                                  max_num_seqs, "fcfs" if scheduler_spec == "fcfs" else "priority",
                                  int(teng.get("max_model_len", 1024)),
                                  int(teng.get("block_size", 32)))
        writer = TraceWriter(out_dir, engine.run_row("program_replay", seed,
                                                     config | {"engine": engine.params()}))
        tok = engine.engine.get_tokenizer()

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    runs, gold = family.build_runs(wl, bank, plans, twl, encode)
    if engine is None:
        live = HttpEngine(url, served, writer, 0.0)
        live.warm_up(encode(tasks.items(0, 1)[0].prompt))
        live.t0 = time.perf_counter()
    else:
        engine.warm_up()
        # the machine's speed level just before and after the run (`engines.speed_probe`)
        run_speed_probe(engine, writer, "before", engine.max_num_seqs, seed=seed)
        live = VllmEngine(engine, writer, time.perf_counter())
    try:
        run_programs({"target": live}, runs, make_scheduler(scheduler_spec), extract_boxed)
    finally:
        if engine is None:
            live.close()
    if engine is not None:
        run_speed_probe(engine, writer, "after", engine.max_num_seqs, seed=seed)
    writer.flush("all")
    # Aborted requests were recorded with their partial output: count tokens from the table.
    req = read_table(out_dir, "requests").to_pandas()
    for r in runs:
        row = program_row(r.plan, r.program, r.finish_s, wl.method, wl.policy, scheduler_spec,
                          gold[r.plan.program_id])
        got = req[req.program_id == r.plan.program_id]
        row["tokens_generated"] = int(got.output_tokens.sum())
        row["probe_tokens"] = int(got[got.role == "probe"].output_tokens.sum())
        row["reasoning_tokens"] = row["tokens_generated"] - row["probe_tokens"]
        writer.add("programs", **row)
    writer.flush("programs")
    writer.seal()
    return read_table(out_dir, "programs").to_pylist()
