"""Live replay on the PyTorch engine's serving mode: the simulator's workload served in real time,
the same tables out as `tracers.replay` writes from vLLM.

For the machines vLLM cannot run on (the lent GPU machines) and for the CPU tests of that path.
The engine composes steps as vLLM's scheduler does (`engines.pytorch.packed`) over a slot KV
cache: no prefix caching and no speculation, which a config asking for either is refused. Prompts
are seeded random token ids (a prefix group's members share their prefix's ids), decoded to their
requested length whatever the model samples (greedy, end of sequence ignored).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
# At import, never inside the timed run: rich.progress's first import takes 15-35 ms, which
# the first requests of a run spent waiting (a burst at t=0 met a 13-20-ms-late first step).
from rich.progress import Progress

from engines.pytorch.engine import TorchEngine
from engines.pytorch.rows import TorchStepWriter
from engines.pytorch.spec import TorchSpec
from engines.torch_live import torch_params, torch_run_row
from tracers.step_profile import FIRST_TOKEN_ID
from traces import ids
from traces.store import TraceWriter, check_out_dir


def replay_live_torch(model: str, out_dir: str | Path, arrival_s, prompt_tokens, output_tokens,
                      seed: int, max_num_seqs: int, max_num_batched_tokens: int, params: dict,
                      max_model_len: int | None = None, device: str = "auto",
                      load_format: str = "auto", dtype: str = "auto",
                      warmup_requests: int = 4, prefix_group=None, prefix_tokens=None,
                      graphs: bool = False, progress: bool = True) -> dict:
    """Serve the workload live on the PyTorch engine's serving mode; write requests, steps,
    layer_times and token_times; the replay's summary (`graphs`: decode steps as CUDA
    graphs, `TorchSpec.graphs`). `max_model_len` (default: the longest
    request, at least 256) sizes the slot cache, so the KV blocks reported are the calibrated
    engine's."""
    out_dir = check_out_dir(out_dir, resume=False, can_resume=False)
    arrival_s = np.asarray(arrival_s, float)
    longest = int(np.max(np.asarray(prompt_tokens) + np.asarray(output_tokens))) \
        if len(arrival_s) else 256
    if max_model_len is not None and longest > max_model_len:
        raise ValueError(f"a request of {longest} tokens exceeds max_model_len {max_model_len}")
    spec = TorchSpec(model=model, load_format=load_format, dtype=dtype, device=device, seed=seed,
                     max_num_seqs=max_num_seqs, max_model_len=max_model_len or max(longest, 256),
                     max_num_batched_tokens=max_num_batched_tokens, serving=True,
                     graphs=graphs)
    engine = TorchEngine(spec)
    vocab = int(engine.config.vocab_size)
    rng = np.random.default_rng(seed)
    prompts = _prompts(rng, vocab, prompt_tokens, prefix_group, prefix_tokens)
    run = torch_run_row(engine, "replay", seed, {
        **params, "engine": torch_params(engine), "prompt_text": "random",
        "sampling": {"temperature": 0.0, "logprobs": None, "ignore_eos": True}})
    writer = TraceWriter(out_dir, run)
    _warm_up(engine, rng, vocab, [len(p) for p in prompts[:warmup_requests]])
    rows = TorchStepWriter(engine, writer, time.perf_counter(), record_tokens=True)
    _serve(engine, rows, prompts, arrival_s, output_tokens, progress)
    writer.flush("all")
    writer.seal()
    return {"requests": len(arrival_s), "steps": rows.step_id, "wall_s": round(rows.now_s(), 2),
            "engine": "torch", "device": str(engine.device)}


def _serve(engine: TorchEngine, rows: TorchStepWriter, prompts: list, arrival_s, output_tokens,
           progress: bool) -> None:
    """Add each request at its arrival time and step the engine until every one is done."""
    n, i = len(arrival_s), 0
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("live replay (torch)", total=n)
        while i < n or engine.has_unfinished():
            now = rows.now_s()
            while i < n and arrival_s[i] <= now:
                rows.add(ids.request_id(i), prompts[i], int(output_tokens[i]), None,
                         stop_at_eos=False, arrival_s=float(arrival_s[i]))
                i += 1
            if engine.has_unfinished():
                bar.advance(task, len(rows.step(None).finished))
            elif i < n:
                time.sleep(max(0.0, arrival_s[i] - rows.now_s()))


def _prompts(rng, vocab: int, prompt_tokens, prefix_group, prefix_tokens) -> list[list[int]]:
    """Seeded random prompt ids; a prefix group's members start with the same ids."""
    prompts = [rng.integers(FIRST_TOKEN_ID, vocab, size=int(p)).tolist() for p in prompt_tokens]
    if prefix_group is None:
        return prompts
    group, shared_tokens = np.asarray(prefix_group), np.asarray(prefix_tokens)
    shared = {int(g): rng.integers(FIRST_TOKEN_ID, vocab,
                                   size=int(shared_tokens[group == g].max())).tolist()
              for g in np.unique(group[group >= 0])}
    return [shared[int(g)][:int(t)] + p[int(t):] if g >= 0 else p
            for g, t, p in zip(group, shared_tokens, prompts)]


def _warm_up(engine: TorchEngine, rng, vocab: int, prompt_lens: list[int]) -> None:
    """Run the workload's first shapes once, unrecorded: one-off setup costs stay out."""
    for i, length in enumerate(prompt_lens):
        engine.add(f"warmup-{i}", rng.integers(FIRST_TOKEN_ID, vocab, size=length).tolist(), 4,
                   stop_at_eos=False)
    while engine.has_unfinished():
        engine.step()
    for i in range(len(prompt_lens)):
        engine.output_ids(f"warmup-{i}")
