"""Live replay: the simulator's workload served in real time by vLLM's engine, same tables out.

Takes plain arrays (arrival_s, prompt_tokens, output_tokens) so `tracers` never imports `sim`.
Requests are added at their planned arrival time (the engine loop checks between iterations, which
is also where the simulator admits them) with seeded random token-id prompts and `ignore_eos`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
# At import, never inside the timed run: rich.progress's first import takes 15-35 ms, which
# the first requests of a run spent waiting (a burst at t=0 met a 13-20-ms-late first step).
from rich.progress import Progress

from engines.model_dir import check_model
from engines.vllm_engine import Engine, EngineSpec
from tracers.step_profile import FIRST_TOKEN_ID
from traces import ids
from testbed import tasks
from traces.store import TraceWriter


def replay_live(model: str, out_dir: str | Path, arrival_s, prompt_tokens, output_tokens,
                seed: int, max_num_seqs: int, max_num_batched_tokens: int, kv_cache_gb: float,
                params: dict, warmup_requests: int = 4, progress: bool = True,
                prefix_group=None, prefix_tokens=None, enable_prefix_caching: bool = False,
                speculative: dict | None = None, prompt_text: str = "random",
                speed_probe: bool = True) -> dict:
    """Serve the workload live on an in-process vLLM engine; write requests/steps/token_times.

    With `prefix_group`/`prefix_tokens`, requests of a group start with the same tokens (the
    simulator's shared prefixes). With `speculative` ({k, draft}), the engine decodes with
    vLLM's draft-model speculative decoding and the trace gets its `spec_steps`. `prompt_text`
    "testbed": prompts are windows of the testbed's questions instead of random token ids.
    `speed_probe`: the fixed decode probe runs just before and after the run (`speed_probe`
    table; not with speculation, whose steps a probe without it would not price)."""
    from vllm import SamplingParams

    from engines.recorder import StepRecorder
    from engines.speed_probe import run_speed_probe

    check_model(model, "auto")
    speed_probe = speed_probe and not speculative
    arrival_s = np.asarray(arrival_s, float)
    n = len(arrival_s)
    longest = int(np.max(np.asarray(prompt_tokens) + np.asarray(output_tokens))) if n else 256
    engine = Engine(EngineSpec(model=model, seed=seed, max_model_len=max(longest, 256),
                               max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=max_num_batched_tokens,
                               kv_cache_gb=kv_cache_gb,
                               enable_prefix_caching=enable_prefix_caching,
                               extra={"speculative_config": {
                                   "method": "draft_model", "model": str(speculative["draft"]),
                                   "num_speculative_tokens": int(speculative["k"])}}
                               if speculative else {}))
    vocab = int(engine.engine.vllm_config.model_config.get_vocab_size())
    rng = np.random.default_rng(seed)
    prompts = _prompts(engine, rng, vocab, prompt_tokens, prompt_text, seed, prefix_group,
                       prefix_tokens)
    eng = engine.params()
    if speculative:  # what `calibrate --spec-k` checks
        eng["speculative"] = {"k": int(speculative["k"]), "method": "draft_model",
                              "draft_model_id": str(speculative["draft"])}
    run = engine.run_row("replay", seed, {**params, "engine": eng, "prompt_text": prompt_text,
                                          "sampling": {
        "temperature": 0.0, "logprobs": None, "ignore_eos": True}})
    writer = TraceWriter(out_dir, run)
    _warm_up(engine, rng, vocab, [len(p) for p in prompts[:warmup_requests]])
    if speed_probe:  # the machine's speed level just before the run (`engines.speed_probe`)
        run_speed_probe(engine, writer, "before", max_num_seqs, seed)
    # made before the run's clock starts: the timed loop only adds and steps
    sampling = [SamplingParams(max_tokens=int(k), min_tokens=int(k), ignore_eos=True,
                               temperature=0.0, detokenize=False) for k in output_tokens]
    rec = StepRecorder(engine, writer, t0=time.perf_counter(), host_cpu=True)
    spec = None
    if speculative:
        from tracers.spec import SpecRows

        spec = SpecRows(engine, writer, int(speculative["k"]), str(speculative["draft"]),
                        str(model), 0.0)
    _serve(engine, rec, spec, prompts, arrival_s, sampling, progress)
    rec.sample_host()
    if speed_probe:
        run_speed_probe(engine, writer, "after", max_num_seqs, seed)
    writer.flush("all")
    writer.seal()
    return {"requests": n, "wall_s": round(rec.now_s(), 2)}


def _serve(engine, rec, spec, prompts: list, arrival_s, sampling: list, progress: bool) -> None:
    """Add each request at its arrival time (with its `sampling` params) and step the engine
    until every one is done."""
    n = len(arrival_s)
    i = 0
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("live replay", total=n)
        while i < n or engine.has_unfinished():
            now = rec.now_s()
            while i < n and arrival_s[i] <= now:
                rec.add(ids.request_id(i), prompts[i], sampling[i], arrival_s=float(arrival_s[i]))
                i += 1
            if engine.has_unfinished():
                before, step_id = len(rec.finished), rec.step_id
                outputs = rec.step()
                if spec is not None:
                    spec.after_step(step_id, rec.step_id != step_id, outputs,
                                    rec.last_duration_ms)
                bar.advance(task, len(rec.finished) - before)
            elif i < n:
                time.sleep(max(0.0, arrival_s[i] - rec.now_s()))


def _prompts(engine, rng, vocab: int, prompt_tokens, prompt_text: str, seed: int,
             prefix_group, prefix_tokens) -> list[list[int]]:
    """Each request's prompt ids: seeded random ids (or windows of the testbed's questions),
    a group's shared prefix first where the workload has prefix groups."""
    prompts = [rng.integers(FIRST_TOKEN_ID, vocab, size=int(p)).tolist() for p in prompt_tokens]
    if prompt_text == "testbed":
        prompts = tasks.testbed_prompts(engine.engine.get_tokenizer(), prompt_tokens, seed)
    if prefix_group is not None:
        shared = {int(g): rng.integers(FIRST_TOKEN_ID, vocab, size=int(max(
            np.asarray(prefix_tokens)[np.asarray(prefix_group) == g]))).tolist()
            for g in np.unique(prefix_group)}
        prompts = [shared[int(g)][:int(t)] + p[int(t):]
                   for g, t, p in zip(prefix_group, prefix_tokens, prompts)]
    return prompts


def _warm_up(engine, rng, vocab: int, prompt_lens: list[int]) -> None:
    """Warm the engine on the workload's shapes first (not recorded): one-off kernel setup
    costs would otherwise land on the first live requests."""
    from vllm import SamplingParams

    for i, length in enumerate(prompt_lens):
        sp = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0, detokenize=False)
        engine.add(f"warmup-{i}", rng.integers(FIRST_TOKEN_ID, vocab, size=length).tolist(), sp)
    while engine.has_unfinished():
        engine.step()
