"""`dynasor replay`: a program workload run live with the simulator's program objects, on the
engine its trace was recorded on (vLLM, or the PyTorch engine's serving mode).

The programs (arrivals, questions, samples, deadlines) are drawn from the config exactly as the
simulator draws them (`programs.workload`). cot/sc paths decode in chunks with the probes trace's
per-chunk seeds and search programs rerun their algorithm with the branches trace's seeds, so
each reproduces its traced requests unless batching changes the numerics. Probe answers, final
answers and rewards are read from the live outputs, never from the trace; a stop aborts what is
in flight; the scheduler's priorities go to the engine's priority scheduling.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from engines.live_engine import VllmEngine
from engines.speed_probe import run_speed_probe
from engines.model_dir import check_model
from engines.vllm_engine import reasoning_engine
from live.families import live_family
from live.runner import run_programs
from policies.certaindex import extract_boxed
from policies.scheduling import make_scheduler
from programs.families import family_of
from programs.records import program_row
from programs.workload import ProgramWorkload, draw_seed, load_bank, plan_programs
from testbed import tasks
from traces.store import TraceWriter, read_run, read_table


def engine_args(cfg) -> dict:
    """What a simulate config (`sim.config.SimConfig`) sets of a replay's engine: its one
    replica's sequence slots and KV pool, and the cluster's eviction order."""
    group = cfg.replicas[0]
    return {"max_num_seqs": group.max_num_seqs, "kv_blocks": group.kv_blocks,
            "kv_eviction": cfg.kv_eviction}


def replay_workload(wl: ProgramWorkload, scheduler_spec, out_dir: str | Path, seed: int = 0,
                    max_num_seqs: int | None = None, model: str | None = None,
                    config_json: str = "{}", url: str | None = None,
                    device: str = "auto", kv_blocks: int | None = None,
                    kv_eviction: str = "free_order") -> list[dict]:
    """Run a program workload live on one engine: the one its trace was recorded on (vLLM
    in-process or the OpenAI-compatible server at `url`; the PyTorch engine's serving mode on
    `device`); write requests/steps/programs; the programs rows. `kv_blocks` sizes the
    in-process vLLM engine's pool; `kv_eviction` as the config's `cluster.kv_eviction`."""
    family = live_family(family_of(wl.method, wl.policy).name)
    bank = load_bank(wl)
    plans = plan_programs(wl, bank, draw_seed(seed, 1))  # one replica: the simulator's draw
    trace_run = read_run(wl.trace)
    params = json.loads(trace_run["params_json"])
    twl, teng = params["workload"], params["engine"]
    model_dir = check_model(model or trace_run["model_id"], "auto")
    config = {"config": json.loads(config_json), family.trace_key: str(wl.trace)}
    out_dir = Path(out_dir)
    policy = "fcfs" if scheduler_spec == "fcfs" else "priority"
    on_torch = trace_run["engine"] == "torch"
    if kv_blocks is not None and (on_torch or url is not None):
        raise ValueError("kv_blocks: only the in-process vLLM engine takes a pool size; the "
                         f"{'PyTorch engine' if on_torch else 'server'} sizes its own")
    engine, writer, tok, served = _open_engine(trace_run["engine"], model_dir, url, twl, teng,
                                               max_num_seqs, policy, seed, config, out_dir,
                                               device, kv_blocks)

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    runs, gold = family.build_runs(wl, bank, plans, twl, encode)
    live = _start(engine, on_torch, url, served, writer, tok,
                  encode(tasks.items(0, 1)[0].prompt), seed)
    try:
        run_programs({"target": live}, runs, make_scheduler(scheduler_spec), extract_boxed,
                     kv_eviction=kv_eviction)
    finally:
        if engine is None:
            live.close()
    if isinstance(live, VllmEngine):  # the run's last second of host ticks
        live.rec.sample_host()
    if engine is not None and not on_torch:
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


def _open_engine(traced: str, model_dir, url: str | None, twl: dict, teng: dict,
                 max_num_seqs: int | None, policy: str, seed: int, config: dict, out_dir: Path,
                 device: str, kv_blocks: int | None = None) -> tuple:
    """The engine a program replay runs on (None: the server at `url`), its writer, its
    tokenizer, and the server's model name (None in-process)."""
    from transformers import AutoTokenizer

    if traced == "torch":
        from engines.torch_live import reasoning_torch_engine, torch_params, torch_run_row

        if url is not None:
            raise ValueError("the trace was recorded on the PyTorch engine, which serves no "
                             "URL; replay it in-process")
        engine = reasoning_torch_engine(model_dir, int(twl["seed"]), device,
                                        max_num_seqs or int(teng["max_num_seqs"]), policy,
                                        int(teng["max_model_len"]))
        run = torch_run_row(engine, "program_replay", seed,
                            config | {"engine": torch_params(engine)})
        return engine, TraceWriter(out_dir, run), AutoTokenizer.from_pretrained(
            str(model_dir)), None
    if url is not None:
        from engines.http_engine import http_run_row

        url = url.rstrip("/")
        served, run = http_run_row(url, "program_replay", seed, config | {"url": url})
        return None, TraceWriter(out_dir, run), AutoTokenizer.from_pretrained(
            str(model_dir)), served
    engine = reasoning_engine(model_dir, int(twl["seed"]), float(teng["kv_cache_gb"]),
                              max_num_seqs, policy, int(teng.get("max_model_len", 1024)),
                              int(teng.get("block_size", 32)), kv_blocks=kv_blocks)
    writer = TraceWriter(out_dir, engine.run_row("program_replay", seed,
                                                 config | {"engine": engine.params()}))
    return engine, writer, engine.engine.get_tokenizer(), None


def _start(engine, on_torch: bool, url, served, writer, tokenizer, prompt: list[int],
           seed: int):
    """The engine speaking `LiveEngine`, warmed up unrecorded (vLLM's speed probed first)."""
    if on_torch:
        from engines.torch_live import TorchLiveEngine

        engine.add("warmup", prompt, 8)
        while engine.has_unfinished():
            engine.step()
        engine.output_ids("warmup")
        return TorchLiveEngine(engine, writer, tokenizer)
    if engine is None:
        from engines.http_engine import HttpEngine

        live = HttpEngine(url, served, writer, 0.0)
        live.warm_up(prompt)
        live.t0 = time.perf_counter()
        return live
    engine.warm_up()
    # the machine's speed level just before and after the run (`engines.speed_probe`)
    run_speed_probe(engine, writer, "before", engine.max_num_seqs, seed=seed)
    return VllmEngine(engine, writer, time.perf_counter(), host_cpu=True)
