"""The PyTorch engine as a live engine (`engines.torch_live`): per-request sampling (seeded, with
a nucleus), the sampled tokens' log-probabilities, priority order, aborts and stop strings, each
checked against what does not depend on the machine's speed (tokens, orders, rows)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from conftest import REPO, TESTBED, run_cli
from engines.pytorch.engine import TorchEngine, TorchSpec
from engines.torch_live import TorchLiveEngine
from programs.base import Sampling
from testbed import lm, tasks
from traces.provenance import run_row
from traces import check_trace, read_run
from traces.store import TraceWriter, read_table

TARGET = TESTBED / "target-large"


def _engine(**kw) -> TorchEngine:
    return TorchEngine(TorchSpec(model=str(TARGET), serving=True, max_num_seqs=4,
                                 max_model_len=256, max_num_batched_tokens=64, **kw))


def _prompts(n: int) -> list[list[int]]:
    return [lm.encode(it.prompt) for it in tasks.items(3, n)]


def _run(engine: TorchEngine, requests: dict) -> dict:
    """Add every request ({id: (prompt, add's keywords)}) and step to the end; outputs by id."""
    for rid, (prompt, kw) in requests.items():
        engine.add(rid, prompt, **kw)
    while engine.has_unfinished():
        engine.step()
    return {rid: engine.finished_seq(rid) for rid in requests}


def test_seeded_sampling_is_the_requests_own_whatever_runs_beside_it():
    p = _prompts(3)
    kw = {"max_tokens": 24, "temperature": 2.0, "seed": 11, "top_p": 0.99}  # the testbed
    # model is confident: a hot temperature makes the seed matter
    alone = _run(_engine(), {"a": (p[0], kw)})["a"].output_ids
    crowd = _run(_engine(), {"x": (p[1], {"max_tokens": 30}), "a": (p[0], kw),
                             "y": (p[2], {**kw, "seed": 12})})
    assert crowd["a"].output_ids == alone
    assert crowd["y"].output_ids != alone
    other = _run(_engine(), {"a": (p[0], {**kw, "seed": 12})})["a"].output_ids
    assert other != alone  # the seed decides


def test_a_tiny_nucleus_is_greedy_and_log_probabilities_are_the_models():
    p = _prompts(2)
    out = _run(_engine(), {"g": (p[0], {"max_tokens": 16, "logprobs": True}),
                           "n": (p[0], {"max_tokens": 16, "temperature": 1.0, "seed": 3,
                                        "top_p": 1e-6}),
                           "o": (p[1], {"max_tokens": 9})})
    assert out["n"].output_ids == out["g"].output_ids
    ids = p[0] + out["g"].output_ids
    model = lm.load_model(TARGET)
    with torch.inference_mode():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    want = [float(lp[len(p[0]) - 1 + i, t]) for i, t in enumerate(out["g"].output_ids)]
    assert out["g"].output_logprobs == pytest.approx(want, abs=1e-4)
    assert out["o"].output_logprobs == []


def test_priority_order_admits_the_lowest_priority_value_first_then_by_arrival():
    engine = _engine(scheduling_policy="priority")
    engine.set_max_num_seqs(1)
    prompts = _prompts(5)
    order = []
    for rid, prio in [("a", 0), ("b", 2), ("c", 1), ("d", 1), ("e", -1)]:
        engine.add(rid, prompts[len(order)], 2, priority=prio)
        order.append(rid)
    finished = []
    while engine.has_unfinished():
        finished += engine.step().finished
    assert finished == ["e", "a", "c", "d", "b"]
    fcfs = _engine()
    fcfs.set_max_num_seqs(1)
    for rid, prio in [("a", 0), ("b", 2), ("c", -1)]:
        fcfs.add(rid, prompts[0], 2, priority=prio)
    done = []
    while fcfs.has_unfinished():
        done += fcfs.step().finished
    assert done == ["a", "b", "c"]
    with pytest.raises(ValueError, match="scheduling_policy"):
        _engine(scheduling_policy="lifo")


def _live(tmp_path, **kw) -> TorchLiveEngine:
    engine = _engine(**kw)
    writer = TraceWriter(tmp_path, run_row("live", "torch", torch.__version__, "cpu", 1,
                                           str(TARGET), "x", "float32", "auto", 0, {}))
    return TorchLiveEngine(engine, writer, AutoTokenizer.from_pretrained(str(TARGET)))


def _drain(live: TorchLiveEngine) -> dict:
    done = {}
    while live.has_unfinished():
        done.update(live.step())
    return done


def test_the_live_engine_aborts_stops_at_stop_strings_and_records_every_request(tmp_path):
    live = _live(tmp_path)
    p = _prompts(3)
    live.add("free", p[0], Sampling(40), 0, "prog", "main")
    free = _drain(live)["free"]
    assert free.text and free.tokens == len(free.token_ids) > 6
    stop = free.text[len(free.text) // 3:len(free.text) // 3 + 2]
    assert len(stop) == 2 and stop.strip()
    at = free.text.find(stop) + len(stop)
    live.add("stopped", p[0], Sampling(40, stop=(stop,)), 0, "prog", "main")
    live.add("waiting", p[1], Sampling(8), 0, "prog", "probe")
    live.add("running", p[2], Sampling(40, logprobs=True), 0, "prog", "main")
    while not any(s.request_id == "running" and s.output_ids  # prompts are chunked
                  for s in live.engine.running.values()):
        live.step()
    live.abort("running")
    done = _drain(live)
    stopped = done["stopped"]
    assert stopped.text == free.text[:at] and not stopped.eos
    assert stopped.token_ids == free.token_ids[:stopped.tokens] and stopped.tokens < free.tokens
    assert "running" not in done and done["waiting"].tokens == 8
    live.add("late", p[1], Sampling(3), 0, "prog", "main")
    live.abort("late")  # still waiting: nothing generated
    assert not live.has_unfinished()
    live.rows.writer.flush("all")
    req = {r["request_id"]: r for r in read_table(tmp_path, "requests").to_pylist()}
    assert req["stopped"]["finish_reason"] == "stop"
    assert req["running"]["finish_reason"] == "abort" and req["running"]["output_tokens"] >= 1
    assert req["late"]["output_tokens"] == 0 and req["late"]["first_token_s"] is None
    assert req["waiting"]["role"] == "probe" and req["waiting"]["program_id"] == "prog"
    with pytest.raises(ValueError, match="prompt or top-k"):
        live.add("scored", p[0], Sampling(1, prompt_logprobs=2), 0, "prog", "main")


def _program_config(path: Path, trace: Path, method: str, policy: str, count: int,
                    rate_per_s: float, base_s: float) -> Path:
    """A one-replica program workload config on `trace` (the dynasor scheduler: priorities)."""
    path.write_text(f"""seed: 0
workload:
  programs:
    trace: {trace}
    method: {method}
    policy: {policy}
    count: {count}
    rate_per_s: {rate_per_s}
    deadline: {{base_s: {base_s}, slo_scale: 3.0}}
cluster:
  scheduler: dynasor
  replicas:
    - {{calibration: {REPO}/sim/data/testbed-large-programs-cpu.calib.json, count: 1,
        max_num_seqs: 8}}
""")
    return path


def test_dynasor_programs_trace_and_replay_on_the_torch_engine_as_simulated(tmp_path):
    # a probes trace recorded on the torch engine, then its programs live on the same engine
    # (priority scheduling: the dynasor scheduler), against the simulator's decisions
    trace = tmp_path / "probes"
    run_cli("trace", "probes", "--engine", "torch", "--device", "cpu", "-o", str(trace),
            "--questions", "1", "--samples", "4", "--stride", "16", "--budget", "128", "-q")
    assert check_trace(trace) == [] and read_run(trace)["engine"] == "torch"
    config = _program_config(tmp_path / "cot.yaml", trace, "cot", "{type: certaindex, window: 3, "
                             "interval_tokens: 32}", 6, 6, 1.0)
    out = tmp_path / "rp"
    proc = run_cli("dynasor", "replay", str(config), "--engine", "torch", "--device", "cpu",
                   "-o", str(out), "--calibrate-here", "--json")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert check_trace(out / "live") == [] and read_run(out / "live")["engine"] == "torch"
    assert json.loads(Path(result["calibration"]).read_text())["provenance"]["engine"] == "torch"
    # the torch engine's seeded sampling reproduces its own trace: the same policy decides
    # the same, token for token
    assert result["decision_agreement"] == 1.0 and result["answer_agreement"] == 1.0
    assert result["error"]["tokens_per_program"] == 0
    live = read_table(out / "live", "programs").to_pandas()
    req = read_table(out / "live", "requests").to_pandas()
    assert (req.groupby("program_id").output_tokens.sum().sort_index().to_numpy() ==
            live.set_index("program_id").tokens_generated.sort_index().to_numpy()).all()
    if live.stop_position_tokens.notna().any():
        assert (req.finish_reason == "abort").any()
    bad = run_cli("dynasor", "replay", str(config), "--engine", "vllm", "-o",
                  str(tmp_path / "x"), check=False)
    assert bad.returncode == 2 and "was recorded on torch" in bad.stderr


def test_search_programs_trace_and_replay_on_the_torch_engine_as_simulated(tmp_path):
    # MCTS steps end at a newline (a stop string) and are scored by their tokens'
    # log-probabilities: both come from the torch live engine here
    trace = tmp_path / "branches"
    run_cli("trace", "branches", "--engine", "torch", "--device", "cpu", "-o", str(trace),
            "--questions", "1", "--methods", "mcts", "--iterations", "8", "-q")
    assert check_trace(trace) == [] and read_run(trace)["engine"] == "torch"
    config = _program_config(tmp_path / "mcts.yaml", trace, "mcts", "{type: certaindex, cap: 8, "
                             "entropy_threshold: 0.5}", 4, 2, 5.0)
    out = tmp_path / "rp"
    proc = run_cli("dynasor", "replay", str(config), "-o", str(out), "--json")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert read_run(out / "live")["engine"] == "torch"
    assert result["decision_agreement"] == 1.0 and result["answer_agreement"] == 1.0
    assert result["error"]["tokens_per_program"] == 0
    req = read_table(out / "live", "requests").to_pandas()
    assert (req.finish_reason == "stop").any()  # steps cut at their newline


def test_fidelity_runs_the_whole_loop_on_the_torch_engine(tmp_path):
    out = tmp_path / "fid"
    proc = run_cli("fidelity", "--engine", "torch", "--device", "cpu", "--quick", "--suite",
                   str(REPO / "tests" / "data" / "torch_fidelity_suite.yaml"), "-o", str(out),
                   "--json")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["engine"] == "torch"
    # --quick traces its calibration once by default, noisy or not (the report says which)
    assert len(result["calibration_attempts"]) == 1 and result["calibration_noisy"] == (
        result["calibration_heldout"]["p90_ape"] > result["noisy_p90_ape"])
    assert result["skipped"] == {"prefix_sharing": "prefix caching: the PyTorch engine has none"}
    assert [r["workload"] for r in result["workloads"]] == ["poisson", "cot_probes"]
    cal = json.loads(Path(result["calibration"]).read_text())["provenance"]
    assert cal["engine"] == "torch" and cal["engine_mode"] == "serving"
    assert sorted(Path(t).name for t in cal["traces"]) == ["calibration_traffic_mixed", "grid"]
    for live in ("live1", "live2"):
        for w in ("poisson", "cot_probes"):
            assert check_trace(out / w / live) == [] and read_run(out / w / live)["engine"] == \
                "torch"
    assert read_run(out / "cot_probes" / "trace")["engine"] == "torch"
    poisson, cot = result["workloads"]
    assert all(math.isfinite(v["sim"]) and v["sim"] > 0 for v in poisson["metrics"].values())
    # seeded sampling on the engine its trace was recorded on: the simulator's decisions
    assert cot["decision_agreement"] == 1.0 and cot["live_agreement"] == 1.0
    assert cot["metrics"]["tokens_per_program"]["error"] == 0
    assert "Not run: prefix_sharing" in (out / "report.md").read_text()
