"""The engine a reasoning trace (probes, branches) runs on, speaking `LiveEngine`: vLLM with
prefix caching, or the PyTorch engine's serving mode (`engines.torch_live`)."""

from __future__ import annotations

import time
from pathlib import Path

from traces.store import TraceWriter


def open_reasoning_engine(engine: str, model_dir, seed: int, kind: str, params: dict,
                          out_dir: Path, resume: bool, kv_cache_gb: float = 1.0,
                          device: str = "auto") -> tuple:
    """(live engine, its trace writer, its tokenizer) for a `kind` trace with `params` (the
    engine's own parameters are added under "engine")."""
    if engine == "torch":
        from transformers import AutoTokenizer

        from engines.torch_live import (TorchLiveEngine, reasoning_torch_engine, torch_params,
                                        torch_run_row)

        eng = reasoning_torch_engine(model_dir, seed, device)
        run = torch_run_row(eng, kind, seed, {**params, "engine": torch_params(eng)})
        writer = TraceWriter(out_dir, run, resume=resume)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        return TorchLiveEngine(eng, writer, tokenizer), writer, tokenizer
    if engine != "vllm":
        raise ValueError(f"engine {engine!r}: vllm or torch")
    from engines.live_engine import VllmEngine
    from engines.vllm_engine import reasoning_engine

    eng = reasoning_engine(model_dir, seed, kv_cache_gb)
    writer = TraceWriter(out_dir, eng.run_row(kind, seed, {**params, "engine": eng.params()}),
                         resume=resume)
    return VllmEngine(eng, writer, time.perf_counter()), writer, eng.engine.get_tokenizer()
