"""`reasonsim trace steps --engine torch`: the step grid on the PyTorch engine, CPU or CUDA.

vLLM does not run on the GPU machines we reach; the PyTorch engine (`engines.pytorch.engine`) does.
The grid, the tables (`steps`, `requests`) and the warm-up flags are the vLLM profiler's, so
`reasonsim calibrate` fits a GPU's step time the same way; each step's per-layer time
(`layer_times`) comes too. The engine differs from vLLM where it says so: fixed KV slots (one per
running sequence, no preemption), eager kernels (no CUDA graphs), and, unless `serving`, each
admitted prompt prefilled whole in its own forward. A calibration from it is the PyTorch
engine's, in that mode, on that device.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from engines.vllm_engine import device_info
from tracers.step_profile import FIRST_TOKEN_ID, StepGrid, WarmupFlagger, summarize_steps
from engines.pytorch.engine import TorchEngine
from engines.pytorch.rows import BLOCK_SIZE, TorchStepWriter, kv_blocks_total
from engines.pytorch.spec import TorchSpec
from traces import ids
from traces.provenance import config_hash, run_row
from traces.store import TraceWriter, check_out_dir


def profile_torch_steps(model: str, out_dir: str | Path, grid: StepGrid,
                        load_format: str = "auto", dtype: str = "auto", seed: int = 0,
                        max_num_seqs: int | None = None,
                        max_num_batched_tokens: int | None = None,
                        max_model_len: int | None = None, serving: bool = False,
                        graphs: bool = False, progress: bool = True,
                        device: str = "auto") -> dict:
    """Profile every grid cell on the PyTorch engine on `device` (`serving`: its serving mode,
    `graphs`: with decode graphs), flushing each; return a summary."""
    import torch

    max_len = max(grid.prompt_tokens) + max(grid.output_tokens)
    if max_model_len is not None and max_model_len < max_len:
        raise ValueError(f"max_model_len {max_model_len} < the grid's longest request "
                         f"({max_len} tokens)")
    if grid.regimes != ("greedy",):
        raise ValueError(f"grid regimes {list(grid.regimes)}: the torch engine's grid is greedy")
    out_dir = check_out_dir(out_dir, resume=False, can_resume=False)
    spec = TorchSpec(model=model, load_format=load_format, dtype=dtype, device=device, seed=seed,
                     max_num_seqs=max_num_seqs or max(grid.batch_sizes),
                     max_model_len=max_model_len or max(max_len, 256),
                     max_num_batched_tokens=max_num_batched_tokens or max(
                         2048, max(grid.prompt_tokens)), serving=serving, graphs=graphs)
    engine = TorchEngine(spec)
    vocab = int(engine.config.vocab_size)
    # The long-prefill warm-up is the vLLM grid's (`Engine.warm_prefills`); not run here.
    params = {"grid": asdict(replace(grid, warm_s=0.0)),
              "engine": {**asdict(spec), "block_size": BLOCK_SIZE,
                         "kv_blocks_total": kv_blocks_total(engine),
                         "resolved_device": str(engine.device)},
              "sampling": {"temperature": 0.0, "logprobs": None, "ignore_eos": True}}
    device, count = device_info()
    run = run_row("steps", "torch", torch.__version__, device, count, model, config_hash(model),
                  str(engine.dtype).removeprefix("torch."), load_format, seed, params)
    writer = TraceWriter(out_dir, run)
    t0 = wall0 = time.perf_counter()
    rows = TorchStepWriter(engine, writer, t0)
    warmup = WarmupFlagger(grid.warmup_steps)
    cells = grid.cells()
    for cell_index, (cell_id, batch, prompt, output, _) in enumerate(cells):
        rng = np.random.default_rng([seed, cell_index])
        time.sleep(grid.idle_ms[cell_index % len(grid.idle_ms)] / 1e3)
        for i in range(batch):
            prompt_ids = rng.integers(FIRST_TOKEN_ID, vocab, size=prompt).tolist()
            rows.add(ids.cell_request_id(cell_id, i), prompt_ids, output, cell_id,
                     stop_at_eos=False)
        while engine.has_unfinished():
            rows.step(cell_id, warmup=warmup)
        writer.flush(cell_id)
        if progress:
            print(f"torch steps: cell {cell_index + 1}/{len(cells)} {cell_id}: "
                  f"{rows.step_id} steps", flush=True)
    writer.seal()
    return summarize_steps(out_dir) | {"cells_run": len(cells), "device": device,
                                       "wall_s": round(time.perf_counter() - wall0, 2)}
