"""The PyTorch engine on the trained testbed models: outputs, exits, loaded depth, layer loading."""

from __future__ import annotations

import pytest
import torch

from conftest import TESTBED
from testbed import lm, tasks
from engines.pytorch.engine import TorchEngine, TorchSpec

TARGET = TESTBED / "target-large"


def _run(engine: TorchEngine, prompts: list[list[int]], max_tokens: int, stagger: int = 0):
    """Submit prompts (every `stagger` steps one more, else all at once); outputs and tokens."""
    tokens, pending, step = [], list(enumerate(prompts)), 0
    while pending or engine.has_unfinished():
        while pending and (not stagger or step % stagger == 0 or not engine.has_unfinished()):
            i, p = pending.pop(0)
            engine.add(f"r{i}", p, max_tokens)
            if stagger:
                break
        res = engine.step()
        tokens += res.tokens
        step += 1
    return [engine.output_ids(f"r{i}") for i in range(len(prompts))], tokens


def _prompts(n: int, seed: int = 5) -> list[list[int]]:
    return [lm.encode(it.prompt) for it in tasks.items(seed, n)]


def test_greedy_outputs_at_full_depth_equal_transformers():
    prompts = _prompts(6)
    model = lm.load_model(TARGET)
    want = []
    with torch.inference_mode():
        for p in prompts:  # one at a time: no padding in the reference
            out = model.generate(input_ids=torch.tensor([p]), do_sample=False, max_new_tokens=40,
                                 eos_token_id=lm.EOS_ID, pad_token_id=lm.PAD_ID)
            want.append(out[0, len(p):].tolist())
    engine = TorchEngine(TorchSpec(model=str(TARGET), max_num_seqs=4, max_model_len=512))
    got, _ = _run(engine, prompts, 40, stagger=3)  # continuous batching, slots reused
    assert got == want
    assert engine.loaded_layers == 4 and not engine.has_unfinished()


def test_exit_under_a_threshold_in_the_trace_equals_the_live_exit():
    prompts = _prompts(4, seed=9)
    full = TorchEngine(TorchSpec(model=str(TARGET), record_exits=True, max_model_len=512))
    _, traced = _run(full, prompts, 48)
    threshold = 0.9
    live = TorchEngine(TorchSpec(model=str(TARGET), exit_threshold=threshold, max_model_len=512))
    _, exited = _run(live, prompts, 48)
    by_key = {(t.request_id, t.token_index): t for t in exited}
    compared = early = 0
    for req in {t.request_id for t in traced}:
        for t in sorted((t for t in traced if t.request_id == req), key=lambda t: t.token_index):
            # The counterfactual exit: the first exit whose max probability reaches the threshold.
            want = next((i + 1 for i, p in enumerate(t.max_probs) if p >= threshold), 4)
            got = by_key[(req, t.token_index)]
            assert got.exit_layer == want and got.token_id == t.argmax_ids[want - 1]
            compared += 1
            early += want < 4
            if t.argmax_ids[want - 1] != t.token_id:
                break  # the live stream now continues from another token than the trace
    assert compared >= 40 and early >= 10  # the testbed exits early on most tokens


def test_loaded_depth_runs_only_its_layers_and_loading_more_restores_full_outputs():
    prompts = _prompts(3, seed=2)
    shallow = TorchEngine(TorchSpec(model=str(TARGET), loaded_layers=2, max_model_len=512))
    assert shallow.loaded_layers == 2 and len(shallow.k_cache) == 2
    _, toks = _run(shallow, prompts, 16)
    assert {t.exit_layer for t in toks} == {2}
    full_ref, _ = _run(TorchEngine(TorchSpec(model=str(TARGET), max_model_len=512)), prompts, 16)
    load_ms = shallow.load_layers(4)
    assert load_ms > 0 and shallow.loaded_layers == 4
    again, toks = _run(shallow, prompts, 16)
    assert again == full_ref and {t.exit_layer for t in toks} == {4}
    assert shallow.layer_weight_bytes() > 0 and shallow.kv_bytes_per_token_layer() == 2 * 4 * 32 * 4


def test_steps_report_prefill_decode_and_per_layer_time():
    engine = TorchEngine(TorchSpec(model=str(TARGET), max_num_seqs=2, max_model_len=512))
    for i, p in enumerate(_prompts(3)):
        engine.add(f"r{i}", p, 5)
    first = engine.step()
    assert (first.prefill_seqs, first.decode_seqs) == (2, 0)  # two slots
    assert first.prefill_tokens == sum(len(p) for p in _prompts(3)[:2])
    assert len(first.layer_ms) == 4 and all(x > 0 for x in first.layer_ms)
    assert sum(first.layer_ms) <= first.duration_ms
    assert first.attended_tokens == first.prefill_tokens == first.context_tokens
    second = engine.step()
    assert (second.prefill_seqs, second.decode_seqs) == (0, 2)
    # one mask for the batch: each of the two attends over the longer's span
    lengths = [len(p) + 1 for p in _prompts(3)[:2]]
    assert second.context_tokens == sum(lengths) and second.attended_tokens == 2 * max(lengths)
    with pytest.raises(ValueError, match="exceeds max_model_len 512"):
        engine.add("long", [5] * 500, 20)
    with pytest.raises(ValueError, match="loaded_layers 9: must be in 1..4"):
        TorchEngine(TorchSpec(model=str(TARGET), loaded_layers=9))


def test_layer_skipping_recomputes_the_skipped_kv_exactly():
    prompts = _prompts(4, seed=9)
    full = TorchEngine(TorchSpec(model=str(TARGET), record_exits=True, max_num_seqs=1,
                                 max_model_len=512))
    _, traced = _run(full, prompts, 48)
    ee = TorchEngine(TorchSpec(model=str(TARGET), record_exits=True, max_num_seqs=1,
                               max_model_len=512, exit_threshold=0.9, skip_layers=True))
    exited, steps = [], []
    for i, p in enumerate(prompts):
        ee.add(f"r{i}", p, 48)
    while ee.has_unfinished():
        res = ee.step()
        steps.append(res)
        exited += res.tokens
    by_key = {(t.request_id, t.token_index): t for t in exited}
    compared = early = deep_after_early = 0
    for req in {t.request_id for t in traced}:
        pending = 0
        for t in sorted((t for t in traced if t.request_id == req), key=lambda t: t.token_index):
            want = next((i + 1 for i, p in enumerate(t.max_probs) if p >= 0.9), 4)
            got = by_key[(req, t.token_index)]
            assert got.exit_layer == want and got.token_id == t.argmax_ids[want - 1]
            # A decode step runs layers 1..exit (the prefill runs all); layers after an early exit
            # saw KV recomputed for the skipped tokens: the full model's probabilities at each.
            assert len(got.max_probs) == (4 if t.token_index == 0 else want)
            assert got.max_probs[:want] == pytest.approx(t.max_probs[:want], abs=1e-4)
            compared += 1
            early += want < 4
            deep_after_early += want == 4 and pending > 0
            pending = 0 if want == 4 else pending + 1
            if t.argmax_ids[want - 1] != t.token_id:
                break
    assert compared >= 40 and early >= 10 and deep_after_early >= 3
    decode = [s for s in steps if s.decode_seqs]
    assert all(len(s.layer_ms) == s.tokens[0].exit_layer for s in decode)
    assert max(s.recomputed_tokens for s in decode) >= 2
    assert all(s.prefill_tokens == s.recomputed_tokens for s in decode)
    with pytest.raises(ValueError, match="skip_layers .* needs an exit_threshold and "
                                         "max_num_seqs 1"):
        TorchEngine(TorchSpec(model=str(TARGET), max_num_seqs=2, exit_threshold=0.9,
                              skip_layers=True))


def test_torch_step_grid_traces_calibrate_and_time_every_layer(tmp_path):
    from conftest import run_cli
    from sim.step_time.calibration import load_calibration
    from traces import check_trace, read_run, read_table

    out = tmp_path / "grid"
    proc = run_cli("trace", "steps", "--engine", "torch", "--model", str(TARGET), "-o", str(out),
                   "--batch-sizes", "1,3", "--prompt-tokens", "8,40", "--output-tokens", "6",
                   "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    assert check_trace(out) == []
    run = read_run(out)
    assert (run["kind"], run["engine"], run["dtype"]) == ("steps", "torch", "float32")
    assert run["params"]["grid"]["warm_s"] == 0  # the long-prefill warm-up is vLLM's grid's
    steps = read_table(out, "steps").to_pandas()
    reqs = read_table(out, "requests").to_pandas()
    assert len(reqs) == 2 * (1 + 3) * 2 and (reqs.output_tokens == 6).all()  # 2 repeats
    layers = read_table(out, "layer_times").to_pandas()
    assert len(layers) == 4 * len(steps)  # every step ran the 4 layers
    per_step = layers.groupby("step_id").duration_ms.sum()
    step_ms = steps.set_index("step_id").duration_ms.loc[per_step.index]
    assert (per_step <= step_ms + 1e-6).all()
    assert steps.decode_seqs.max() == 3 and steps.prefill_seqs.max() == 3
    cal_path = tmp_path / "grid.calib.json"
    proc = run_cli("calibrate", str(out), "-o", str(cal_path), "--json")
    assert proc.returncode == 0, proc.stderr
    cal = load_calibration(cal_path)
    assert cal.provenance["engine"] == "torch" and cal.max_num_seqs == 3


GPU_TRACES = {"NVIDIA H100 80GB HBM3": ["testbed-large-h100", "llama-3.1-8b-h100",
                                         "testbed-exits-target-large-h100"],
              "NVIDIA H200": ["testbed-large-h200", "testbed-draft-h200", "llama-3.1-8b-h200",
                              "qwen2.5-7b-h200", "testbed-exits-target-large-h200",
                              "testbed-exits-target-small-h200", "testbed-spec-h200",
                              "llama-3.1-8b-spec-3.2-1b-h200", "llama-3.1-8b-wide-h200",
                              "qwen2.5-7b-wide-h200", "testbed-draft-wide-h200",
                              "llama-3.1-8b-long-h200", "testbed-spec-small-h200",
                              "llama-3.1-8b-spec-3.2-1b-b16-h200"]}


@pytest.mark.parametrize("device,name", [(d, n) for d, names in GPU_TRACES.items()
                                         for n in names])
def test_shipped_gpu_traces_are_valid_and_say_their_device(device, name):
    import json

    from conftest import REPO
    from traces import check_trace, read_run

    trace = REPO / "traces" / "data" / name
    assert check_trace(trace) == []
    run = read_run(trace)
    assert run["engine"] == "torch" and run["device"] == device
    assert run["dtype"] == "bfloat16" and run["engine_version"].endswith("+cu130")
    for cal in (REPO / "sim" / "data").glob("*.calib.json"):  # each calibration fitted on it
        prov = json.loads(cal.read_text())["provenance"]
        if prov["traces"] == [f"traces/data/{name}"]:
            assert prov["device"] == device and prov["run_ids"] == [run["run_id"]], cal


def test_h100_calibration_simulates_at_the_traced_step_time():
    from conftest import REPO
    from sim.config import load_config
    from sim.simulate import simulate
    from traces import read_table

    steps = read_table(REPO / "traces" / "data" / "llama-3.1-8b-h100", "steps").to_pandas()
    decode_ms = float(steps[steps.prefill_tokens == 0].duration_ms.median())
    res = simulate(load_config(REPO / "examples" / "llama-8b-h100.yaml"))
    tpot_ms = res.summary["tpot_s"]["p50"] * 1e3
    assert res.summary["requests"] == 400
    assert 0.8 * decode_ms < tpot_ms < 1.25 * decode_ms, (tpot_ms, decode_ms)


def test_qwen2_models_decode_as_transformers_does_and_other_kinds_are_refused(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from conftest import REPO

    torch.manual_seed(3)  # a tiny Qwen2 (biased q/k/v, grouped KV heads) with random weights
    cfg = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, eos_token_id=lm.EOS_ID,
                      pad_token_id=lm.PAD_ID, use_sliding_window=False)
    model = Qwen2ForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "qwen2")
    prompts = _prompts(5, seed=11)
    want = []
    with torch.inference_mode():
        for p in prompts:
            out = model.generate(input_ids=torch.tensor([p]), do_sample=False, max_new_tokens=24,
                                 eos_token_id=lm.EOS_ID, pad_token_id=lm.PAD_ID)
            want.append(out[0, len(p):].tolist())
    engine = TorchEngine(TorchSpec(model=str(tmp_path / "qwen2"), max_num_seqs=3,
                                   max_model_len=512))
    got, _ = _run(engine, prompts, 24, stagger=2)
    assert got == want
    with pytest.raises(ValueError, match="model_type 'opt'"):
        TorchEngine(TorchSpec(model=str(REPO / "models" / "configs" / "opt-1.3b"),
                              load_format="dummy"))


def test_h200_shape_pair_beats_its_target_only_at_high_acceptance():
    import copy

    import yaml

    from conftest import REPO
    from sim.config import parse_config
    from sim.simulate import simulate

    base = yaml.safe_load((REPO / "examples" / "spec-k4.yaml").read_text())

    def tpot_ms(group: dict) -> float:
        cfg = copy.deepcopy(base)
        cfg["cluster"]["replicas"][0] = group
        return simulate(parse_config(cfg, REPO / "examples")).summary["tpot_s"]["p50"] * 1e3

    def spec(a: float) -> float:  # K = 4, each position accepted with conditional rate a
        return tpot_ms({"calibration": "../sim/data/llama-3.1-8b-spec-3.2-1b-k4-h200.calib.json",
                        "speculative": {"acceptance_rates": [a ** (i + 1) for i in range(4)]}})

    plain = tpot_ms({"calibration": "../sim/data/llama-3.1-8b-h200.calib.json"})
    # the README's reading of the H200 lease: an eager 1B draft costs half a target step, so
    # K = 4 pays only when nearly every proposal lands
    assert spec(0.6) > 1.3 * plain and spec(0.8) > plain > spec(0.95), (plain, spec(0.95))
