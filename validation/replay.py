"""Live replay of a simulate config on vLLM, and engine jobs each in a process of its own."""

from __future__ import annotations

import json
from pathlib import Path

from sim.model_shape import model_dir_of
from traces.store import check_out_dir

REPO = Path(__file__).resolve().parent.parent
"""the checkout: `models/` and `examples/` under it"""
DEFAULT_MODEL = REPO / "models" / "testbed" / "target-large"
"""the trained testbed target: real latency and behaviour"""


PRELOAD = ("torch", "transformers", "vllm.entrypoints.llm")
"""imported once, by the process every engine job is forked from: importing vLLM's engine takes
about 20 s of a 35 s engine job on a 2-core VM, the same in every job"""


def fresh_process(fn, *args, **kwargs):
    """Run one engine job in a new Python process; what it returns (pickled back). CPU kernels
    are built per shape and cached for the life of a process, whatever engine asks (vLLM's and
    the PyTorch engine's alike): a replay after others in the same process would meet fewer
    never-run shapes than a fresh server, which is what the simulator models. Jobs fork from a
    server process that has imported the engine's modules and never run an engine (`PRELOAD`),
    so each starts with empty kernel caches without importing them again."""
    import multiprocessing
    import os
    import pickle
    import tempfile

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    with tempfile.TemporaryDirectory(prefix="reasonsim-job-") as tmp:
        result = Path(tmp) / "result.pickle"
        proc = ctx.Process(target=_in_environment,
                           args=(dict(os.environ), fn, args, kwargs, str(result)))
        proc.start()
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"{fn.__name__} failed in its own process (exit "
                               f"{proc.exitcode}); its error is printed above")
        kind, value = pickle.loads(result.read_bytes())
        if kind == "refused":  # bad input: the one-line error it would raise in this process
            raise ValueError(value)
        return value


def _in_environment(environ: dict, fn, args: tuple, kwargs: dict, result_path: str) -> None:
    """Call fn in the caller's environment of the moment (the fork server keeps the one it
    started with); its result (or the message of the ValueError it raised) pickled to
    result_path."""
    import os
    import pickle

    os.environ.clear()
    os.environ.update(environ)
    try:
        result = ("returned", fn(*args, **kwargs))
    except ValueError as e:
        if os.environ.get("REASONSIM_DEBUG"):  # where it was raised, as `cli.main` shows it
            raise
        result = ("refused", str(e))
    Path(result_path).write_bytes(pickle.dumps(result))


def resolve_model(model_id: str) -> str:
    """A calibration's model path, found again in this checkout if it was traced in another."""
    found = model_dir_of(model_id)
    if found is not None:
        return model_id if found == Path(model_id) else str(found)
    raise ValueError(f"model {model_id} of the calibration is not here; pass --model DIR")


def replay_config(cfg, out_dir, model: str | None = None, progress: bool = False,
                  engine: str | None = None, device: str = "auto") -> dict:
    """Serve a one-replica config's workload live on the engine its calibration was traced on
    (vLLM, or the PyTorch engine's serving mode on `device`), with the engine limits (and KV
    space) it was traced with; the replay's summary."""
    from sim.step_time.calibration import load_calibration
    from sim.workloads.requests import workload_from_config
    from tracers.replay import replay_live

    group = cfg.replicas[0]
    cal = load_calibration(group.calibration)
    traced = cal.provenance.get("engine", "vllm")
    if engine is not None and engine != traced:
        raise ValueError(f"--engine {engine}: {group.calibration} was fitted on the {traced} "
                         f"engine's traces; calibrate on {engine}'s to simulate it")
    w = workload_from_config(cfg.workload, cfg.seed, cfg.base_dir)
    check_lengths(w, cal.max_model_len, f"max_model_len {cal.max_model_len} of "
                  f"{group.calibration}, the engine it was traced on")
    check_out_dir(out_dir, resume=False, can_resume=False)  # before the engine starts
    if model is not None:
        from engines.model_dir import check_same_model

        check_same_model(model, cal.provenance.get("model_config_hash"),
                         f"{group.calibration} was fitted on")
    model = model or resolve_model(cal.provenance["model_id"])
    if traced == "torch":
        return _replay_torch(cfg, cal, w, out_dir, model, device, progress)
    kv_gb = cal.provenance.get("kv_cache_gb") or 1.0  # same KV space as when traced
    return replay_live(model, out_dir, w.arrival_s, w.prompt_tokens, w.output_tokens,
                       seed=cfg.seed, max_num_seqs=group.max_num_seqs or cal.max_num_seqs,
                       max_num_batched_tokens=group.max_num_batched_tokens
                       or cal.max_num_batched_tokens, kv_cache_gb=kv_gb,
                       params={"config": json.loads(cfg.to_json())}, progress=progress,
                       prefix_group=w.prefix_group, prefix_tokens=w.prefix_tokens,
                       enable_prefix_caching=group.enable_prefix_caching,
                       speculative=live_speculative(group, cal, cfg.base_dir),
                       prompt_text=cfg.workload.get("prompt_text", "random"))


def check_lengths(w, limit: int | None, what: str) -> None:
    """A request longer than `limit` tokens (prompt + output) is one the simulation refuses and
    the engine would reject: refused before an engine sized otherwise serves it (`what`: the
    limit, named for the message)."""
    import numpy as np

    total = np.asarray(w.prompt_tokens) + np.asarray(w.output_tokens)
    if limit is not None and len(total) and total.max() > limit:
        i = int(np.argmax(total))
        raise ValueError(f"request {i} (prompt {int(w.prompt_tokens[i])} + output "
                         f"{int(w.output_tokens[i])} tokens) exceeds {what}")


def _replay_torch(cfg, cal, w, out_dir, model: str, device: str, progress: bool) -> dict:
    """`replay_config` on the PyTorch engine's serving mode, sized as the calibration's engine."""
    from tracers.torch_replay import replay_live_torch

    group = cfg.replicas[0]
    mode = cal.provenance.get("engine_mode")
    if mode not in ("serving", "serving-graphs"):
        raise ValueError(f"{group.calibration}: fitted on the PyTorch engine's per-prompt mode, "
                         "which composes steps unlike the simulated replica; trace its grid "
                         "with `trace steps --engine torch --serving`")
    if group.enable_prefix_caching or group.speculative is not None:
        raise ValueError("the PyTorch engine's serving mode has no prefix caching or "
                         "speculative decoding; the config's replica asks for "
                         + ("prefix caching" if group.enable_prefix_caching else "speculation"))
    if cfg.workload.get("prompt_text", "random") != "random":
        raise ValueError("the PyTorch engine replays random token-id prompts (prompt_text: "
                         "random)")
    return replay_live_torch(model, out_dir, w.arrival_s, w.prompt_tokens, w.output_tokens,
                             seed=cfg.seed, max_num_seqs=group.max_num_seqs or cal.max_num_seqs,
                             max_num_batched_tokens=group.max_num_batched_tokens
                             or cal.max_num_batched_tokens, max_model_len=cal.max_model_len,
                             params={"config": json.loads(cfg.to_json())}, device=device,
                             dtype=cal.provenance.get("dtype") or "auto",
                             load_format=cal.provenance.get("load_format") or "auto",
                             prefix_group=w.prefix_group, prefix_tokens=w.prefix_tokens,
                             graphs=mode == "serving-graphs", progress=progress)


def live_speculative(group, cal, base_dir: Path) -> dict | None:
    """The speculative decoding a replay's engine runs: the K and draft its calibration was
    fitted on (the group must ask for speculation, as the simulator checks)."""
    from sim.engine.cluster import speculative

    spec = speculative(group, cal, base_dir)
    if spec is None:
        return None
    drafts = cal.provenance["speculative"]["draft_model_id"]
    if len(drafts) != 1:
        raise ValueError(f"{group.calibration}: fitted on several draft models {drafts}")
    return {"k": spec.k, "draft": resolve_model(drafts[0])}
