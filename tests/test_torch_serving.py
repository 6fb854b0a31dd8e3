"""The PyTorch engine's serving mode (`engines.pytorch.packed`): one packed forward per step,
composed as vLLM's scheduler (and the simulator's replica) composes it.

Outputs are checked against transformers' own greedy decoding, exits against the per-prompt
mode's, and step compositions against the simulator's reference replica on random workloads:
none of it depends on the machine's speed.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conftest import REPO, TESTBED
from engines.pytorch.engine import TorchEngine, TorchSpec
from sim.engine.replica_config import ReplicaConfig
from sim.step_time.calibration import load_calibration
from testbed import lm, tasks
from validation.conformance import compare_steps, random_workload, replica_steps, torch_steps

TARGET = TESTBED / "target-large"
CAL = load_calibration(REPO / "sim" / "data" / "testbed-large-cpu.calib.json")


def _prompts(n: int, seed: int = 5) -> list[list[int]]:
    return [lm.encode(it.prompt) for it in tasks.items(seed, n)]


def _serve(engine: TorchEngine, prompts, max_tokens: int, stagger: int):
    """Submit prompts (one more every `stagger` steps; 0: all at once); outputs and steps."""
    pending, steps = list(enumerate(prompts)), []
    while pending or engine.has_unfinished():
        while pending and (not stagger or len(steps) % stagger == 0
                           or not engine.has_unfinished()):
            i, p = pending.pop(0)
            engine.add(f"r{i}", p, max_tokens)
            if stagger:
                break
        steps.append(engine.step())
    return [engine.output_ids(f"r{i}") for i in range(len(prompts))], steps


@pytest.fixture(scope="module")
def reference():
    """transformers' greedy outputs, one prompt at a time (no padding)."""
    prompts = _prompts(6)
    model = lm.load_model(TARGET)
    with torch.inference_mode():
        return prompts, [model.generate(input_ids=torch.tensor([p]), do_sample=False,
                                        max_new_tokens=30, eos_token_id=lm.EOS_ID,
                                        pad_token_id=lm.PAD_ID)[0, len(p):].tolist()
                         for p in prompts]


@pytest.mark.parametrize("budget,seqs,stagger,graphs", [
    (5, 3, 0, False), (5, 6, 2, True), (16, 3, 2, False), (16, 6, 5, True), (40, 1, 0, False),
    (2048, 6, 2, False), (2048, 5, 3, True)])
def test_packed_steps_decode_as_transformers_does_at_every_composition(reference, budget, seqs,
                                                                       stagger, graphs):
    """Prompt chunks of every size beside decodes, slots reused: the tokens transformers
    generates, and no step computes more tokens than the budget. With `graphs`, decode-only
    steps run the static-shape code CUDA graphs capture (padded batch and span, a scratch
    slot), eagerly here."""
    prompts, want = reference
    engine = TorchEngine(TorchSpec(model=str(TARGET), max_num_seqs=seqs, max_model_len=512,
                                   max_num_batched_tokens=budget, serving=True, graphs=graphs))
    got, steps = _serve(engine, prompts, 30, stagger)
    assert got == want
    static = [s for s in steps if not s.layer_ms]  # a graph step reports no layer times
    assert bool(static) == graphs
    if graphs:
        assert engine._graphs.buckets(3, 300) == (4 if seqs >= 4 else seqs, 512)
    assert all(sum(s.scheduled.values()) == s.prefill_tokens + s.decode_seqs <= budget
               for s in steps)
    assert sum(s.prefill_tokens for s in steps) == sum(len(p) for p in prompts)
    if budget < max(len(p) for p in prompts):  # chunked: a prompt over several steps
        assert sum(s.prefill_seqs for s in steps) > len(prompts)
    if seqs > 1:  # prompt chunks beside decodes
        assert any(s.prefill_seqs and s.decode_seqs for s in steps)


def test_packed_steps_exit_where_the_per_prompt_mode_exits():
    """With an exit threshold, every token's exit layer and id equal the per-prompt mode's."""
    spec = TorchSpec(model=str(TARGET), max_num_seqs=4, max_model_len=512, exit_threshold=0.6,
                     record_exits=True)
    prompts = _prompts(5, seed=9)
    tokens = {}
    for serving in (False, True):
        engine = TorchEngine(replace(spec, serving=serving, max_num_batched_tokens=24
                                     if serving else 2048))
        _, steps = _serve(engine, prompts, 12, 2)
        tokens[serving] = sorted((t.request_id, t.token_index, t.token_id, t.exit_layer)
                                 for s in steps for t in s.tokens)
    assert tokens[True] == tokens[False]
    assert {t[3] for t in tokens[True]} != {4}  # some tokens exit early


@pytest.mark.parametrize("seed", range(8))
def test_serving_steps_are_composed_as_the_simulators_replica_composes_them(seed):
    """Random workloads (chunked budgets of 32-512, 2-16 slots, staggered arrivals) with room
    for every slot's KV, FCFS, no prefix caching: every step identical, request by request."""
    limits, reqs = random_workload(seed)
    limits.update(enable_prefix_caching=False, priority_scheduling=False,
                  kv_blocks=limits["max_num_seqs"] * -(-400 // limits["block_size"]) + 1)
    reqs = [replace(r, priority=0) for r in reqs]
    cfg = ReplicaConfig(**limits)
    ours, arrived = replica_steps(cfg, CAL, reqs)
    c = compare_steps(ours, torch_steps(cfg, TARGET, reqs, arrived, 400))
    assert c["first_difference"] is None, (seed, limits, c.get("at_first"))
    assert c["steps"] == c["vllm_steps"]


def test_serving_mode_refuses_layer_skipping_and_graphs_need_it():
    with pytest.raises(ValueError, match="serving mode packs"):
        TorchEngine(TorchSpec(model=str(TARGET), max_num_seqs=1, exit_threshold=0.5,
                              skip_layers=True, serving=True))
    with pytest.raises(ValueError, match="serving mode's"):
        TorchEngine(TorchSpec(model=str(TARGET), graphs=True))


def test_torch_loop_traces_calibrates_replays_and_validates_on_the_serving_mode(tmp_path):
    """`trace steps --engine torch --serving`, `calibrate`, `replay` (on the engine the
    calibration names), `simulate` and `validate`: the same workload live and simulated, every
    prompt token prefilled once and every other token decoded, no step over the budget."""
    import json
    import math

    from conftest import run_cli
    from traces import check_trace, read_run, read_table

    grid, cal = tmp_path / "grid", tmp_path / "t.calib.json"
    run_cli("trace", "steps", "--engine", "torch", "--serving", "--model", str(TARGET),
            "-o", str(grid), "--batch-sizes", "1,3", "--prompt-tokens", "8,60",
            "--output-tokens", "6", "--max-num-batched-tokens", "48", "--max-model-len", "256",
            "-q", "--json")
    assert read_run(grid)["params"]["engine"]["serving"] is True
    run_cli("calibrate", str(grid), "-o", str(cal), "--json")
    assert json.loads(cal.read_text())["provenance"]["engine_mode"] == "serving"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""seed: 3
workload:
  arrival: {{kind: poisson, rate_per_s: 8}}
  num_requests: 16
  prompt_tokens: {{kind: uniform, low: 8, high: 120}}
  output_tokens: {{kind: uniform, low: 4, high: 24}}
cluster:
  replicas:
    - {{calibration: {cal}, count: 1}}
""")
    refused = run_cli("replay", str(cfg), "-o", str(tmp_path / "x"), "--engine", "vllm",
                      check=False)
    assert refused.returncode == 2 and "fitted on the torch engine" in refused.stderr
    live, sim = tmp_path / "live", tmp_path / "sim"
    run_cli("replay", str(cfg), "-o", str(live), "--device", "cpu", "-q", "--json")
    run_cli("simulate", str(cfg), "-o", str(sim), "--json")
    assert check_trace(live) == []
    run = read_run(live)
    assert (run["kind"], run["engine"], run["params"]["engine"]["serving"]) == \
        ("replay", "torch", True)
    lr, sr = read_table(live, "requests").to_pandas(), read_table(sim, "requests").to_pandas()
    m = lr.merge(sr, on="request_id", suffixes=("_live", "_sim"))
    assert len(m) == 16 and (m.prompt_tokens_live == m.prompt_tokens_sim).all()
    assert (m.output_tokens_live == m.output_tokens_sim).all()
    assert (m.arrival_s_live - m.arrival_s_sim).abs().max() < 1e-6
    steps = read_table(live, "steps").to_pandas()
    assert steps.prefill_tokens.sum() == lr.prompt_tokens.sum()
    assert steps.decode_seqs.sum() == lr.output_tokens.sum() - len(lr)
    assert (steps.prefill_tokens + steps.decode_seqs <= 48).all()
    tokens = read_table(live, "token_times").to_pandas()
    assert len(tokens) == lr.output_tokens.sum()
    result = json.loads(run_cli("validate", str(sim), str(live), "-o", str(tmp_path / "v"),
                                "--json").stdout)
    assert {"ttft_s.p50", "tpot_s.p50", "e2e_s.p50"} <= set(result["metrics"])
    assert all(math.isfinite(v["live"]) and v["live"] > 0 for v in result["metrics"].values())
    assert result["verdict"]["status"] in ("pass", "fail", "refused")


def test_torch_replay_refuses_what_its_engine_cannot_serve(tmp_path):
    """A per-prompt-mode calibration, and `--serving` without the torch engine: each refused
    with the reason."""
    from conftest import run_cli

    grid, cal = tmp_path / "grid", tmp_path / "t.calib.json"
    run_cli("trace", "steps", "--engine", "torch", "--model", str(TARGET), "-o", str(grid),
            "--batch-sizes", "1,2", "--prompt-tokens", "8,24", "--output-tokens", "4", "-q")
    run_cli("calibrate", str(grid), "-o", str(cal))
    cfg = tmp_path / "c.yaml"
    body = ("seed: 0\nworkload: {arrival: {kind: poisson, rate_per_s: 4}, num_requests: 4, "
            "prompt_tokens: 16, output_tokens: 4}\ncluster:\n  replicas:\n"
            f"    - {{calibration: {cal}, count: 1}}\n")
    cfg.write_text(body)
    proc = run_cli("replay", str(cfg), "-o", str(tmp_path / "a"), check=False)
    assert proc.returncode == 2 and "per-prompt mode" in proc.stderr
    assert "--serving" in proc.stderr
    proc = run_cli("trace", "steps", "--serving", "--model", str(TARGET), "-o",
                   str(tmp_path / "b"), check=False)
    assert proc.returncode == 2 and "--engine torch" in proc.stderr
