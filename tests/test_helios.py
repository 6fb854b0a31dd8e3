"""HELIOS end to end: the exits tracer, counterfactual exits, simulate, live replay on the
PyTorch engine, and config errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import REPO, TESTBED, run_cli
from sim.config import read_yaml
from sim.families.helios.exits import load_exits
from sim.families.helios.profile import traced_steps
from sim.families.helios.config import Experiment
from sim.step_time.layered import LayeredModel, fit_layered
from traces import check_trace, read_run, read_table

EXAMPLE = REPO / "examples" / "helios-testbed.yaml"
SHIPPED = [REPO / "traces" / "data" / f"testbed-exits-{m}-cpu"
           for m in ("target-large", "target-small")]


def test_trace_exits_records_every_exit_at_every_depth(tmp_path):
    out = tmp_path / "exits"
    summary = json.loads(run_cli(
        "trace", "exits", "--model", str(TESTBED / "target-small"), "-o", str(out),
        "--phases", "count,mod", "--prompts-per-phase", "3", "--max-tokens", "12", "--json",
        "-q").stdout)
    assert check_trace(out) == [] and read_run(out)["kind"] == "exits"
    assert read_run(out)["engine"] == "torch"
    exits = read_table(out, "exits").to_pandas()
    reqs = read_table(out, "requests").to_pandas()
    # 6 prompts x (2 depths + a layer-skipping pass); a token at depth d has exits 1..d.
    assert len(reqs) == 18 == summary["requests"]
    per_depth = reqs.assign(depth=reqs.request_id.map(
        exits.groupby("request_id").loaded_layers.first()))
    tokens = per_depth.groupby("depth").output_tokens.sum()
    assert len(exits) == tokens[1] * 1 + tokens[2] * 2
    layers = read_table(out, "layers").to_pandas()
    assert list(layers.layer) == [1, 2] and (layers.load_ms > 0).all()
    assert (layers.kv_bytes_per_token == 2 * 3 * 32 * 4).all()  # K and V x 3 heads x 32 x fp32
    times = read_table(out, "layer_times").to_pandas()
    steps = read_table(out, "steps").to_pandas()
    assert set(times.step_id) == set(steps.step_id)
    # The layer-skipping pass: one sequence; a decode step runs layers 1..its exit.
    ee = steps[steps.cell_id == "ee0.9"].assign(
        layers_run=lambda d: d.step_id.map(times.groupby("step_id").layer.count()))
    assert len(ee) > 0 and (ee.prefill_seqs + ee.decode_seqs == 1).all()
    assert set(ee[ee.decode_seqs == 1].layers_run) == {1, 2}
    assert (ee[ee.prefill_seqs == 1].layers_run == 2).all()
    ee_requests = set(reqs.request_id[reqs.request_id.str.startswith("ee0.9-")])
    assert len(ee_requests) == 6 and not ee_requests & set(exits.request_id)
    proc = run_cli("trace", "exits", "--model", str(TESTBED / "draft"), "-o", str(tmp_path / "x"),
                   "--phases", "poetry", check=False)
    assert proc.returncode == 2 and "--phases: unknown family 'poetry'" in proc.stderr


def test_trace_exits_prefills_each_wave_in_one_step(tmp_path):
    # Waves of 2 then 3 prompts on 4 slots: the 3-wave waits until 1 slot is taken at most,
    # so every depth's prefill steps admit 2 and 3 prompts (not 2, 2, 1), as a HELIOS round does.
    out = tmp_path / "exits"
    run_cli("trace", "exits", "--model", str(TESTBED / "target-small"), "-o", str(out),
            "--phases", "count", "--prompts-per-phase", "5", "--max-tokens", "10",
            "--max-num-seqs", "4", "--waves", "2,3", "--ee-thresholds", "", "-q")
    steps = read_table(out, "steps").to_pandas()
    for depth in (1, 2):
        cell = steps[steps.cell_id == f"depth{depth}"]
        assert list(cell.prefill_seqs[cell.prefill_seqs > 0]) == [2, 3]
    assert read_run(out)["params"]["workload"]["waves"] == [2, 3]
    proc = run_cli("trace", "exits", "--model", str(TESTBED / "draft"), "-o", str(tmp_path / "x"),
                   "--waves", "2,0", check=False)
    assert proc.returncode == 2 and "--waves: expected positive integers" in proc.stderr


def test_models_traced_together_take_turns_phase_by_phase(tmp_path):
    # Two models' exits traces with their phases interleaved (what `helios replay --retrace`
    # records): each trace is whole, and on their shared clock model B's phase 0 ran after
    # model A's and before A's phase 1, so a slow spell of the machine lands on both models.
    from testbed.streams import ExitsWorkload
    from tracers.exits import ExitsJob, trace_exits_together

    wl = ExitsWorkload(phases=("count", "mod"), prompts_per_phase=3, max_tokens=8,
                       load_repeats=1)
    jobs = [ExitsJob(str(TESTBED / m), tmp_path / m, wl, ee_thresholds=()) for m in
            ("target-small", "draft")]
    summaries = trace_exits_together(jobs, progress=False)
    spans = {}
    for job, summary in zip(jobs, summaries):
        assert check_trace(job.out_dir) == [] and summary["model"] == job.model
        reqs = read_table(job.out_dir, "requests").to_pandas()
        assert len(reqs) == 6 * summary["layers"] == summary["requests"]
        phase = reqs.request_id.str.extract(r"-q(\d+)$")[0].astype(int) // 3
        spans[job.model] = [(reqs.arrival_s[phase == k].min(), reqs.finish_s[phase == k].max())
                            for k in (0, 1)]
    a, b = (spans[job.model] for job in jobs)
    assert a[0][1] <= b[0][0] and b[0][1] <= a[1][0] and a[1][1] <= b[1][0]


def test_shipped_exits_traces_and_the_offline_analysis():
    for trace in SHIPPED:
        assert check_trace(trace) == []
    result = json.loads(run_cli("helios", "offline", *map(str, SHIPPED), "--thresholds",
                                "0.5,0.9", "--json").stdout)
    large = result["target-large"]
    for row in large["thresholds"]:
        assert abs(sum(row["exit_share"]) - 1) < 1e-9 and len(row["exit_share"]) == 4
    # The testbed's insight #1: most tokens leave early, and early tokens equal the final ones.
    at_09 = large["thresholds"][1]
    assert at_09["early_share"] > 0.5 and at_09["early_equals_final"] > 0.95
    depths = large["depths"]
    assert depths[0]["breach_rate"] >= depths[-1]["breach_rate"]
    m = load_exits(SHIPPED[0], depth=2)
    assert m.layers == 2 and (m.exit_layers(0.9) <= 2).all()
    proc = run_cli("helios", "offline", str(REPO / "traces" / "data" / "testbed-large-cpu"),
                   check=False)
    assert proc.returncode == 2 and "expected an exits trace" in proc.stderr
    proc = run_cli("calibrate", str(SHIPPED[0]), "-o", "/nonexistent/c.json", check=False)
    assert proc.returncode == 2 and "an exits trace (steps at several loaded depths)" in \
        proc.stderr


def test_layered_step_time_is_linear_in_depth_and_validated():
    rng = np.random.default_rng(0)
    n = 400
    p, d, c = rng.integers(0, 200, n), rng.integers(1, 32, n), rng.integers(0, 4000, n)
    depth = rng.integers(1, 5, n)
    seqs = np.where(p > 0, rng.integers(1, 12, n), 0)  # prompts prefilled in the step
    y = 0.3 + 0.01 * d + depth * (0.5 + 0.002 * p + 0.02 * d + 1e-4 * c) \
        + seqs * (0.2 + 0.1 * depth)
    m = fit_layered(p, d, c, depth, y, layers=4, prefill_seqs=seqs)
    assert abs(m.at_depth(3).step_ms(100, 8, 1000) - (0.3 + 0.08 + 3 * (0.5 + 0.2 + 0.16 + 0.1))) \
        < 1e-6
    assert abs(m.prefill_seqs_ms(3, 5) - 5 * (0.2 + 0.3)) < 1e-6
    # every step at once, each at its own depth: the generating function back
    assert np.allclose(m.steps_ms(p, d, c, depth, seqs), y, rtol=1e-6)
    again = LayeredModel.from_json(json.loads(json.dumps(m.to_json())))
    assert again == m
    with pytest.raises(ValueError, match="two or more loaded depths"):
        fit_layered(p, d, c, np.ones(n), y, layers=4)
    with pytest.raises(ValueError, match="depth 5: the model has 4 layers"):
        m.at_depth(5)
    bad = dict(m.to_json(), layer_ms=[0.0] * 5)
    with pytest.raises(ValueError, match="layers that take no time"):
        LayeredModel.from_json(bad)
    # Priced by prefill alone: a decode step at depth 1 would be free, fitted or loaded.
    free = dict(m.to_json(), fixed_ms=[0.0] * 5, layer_ms=[0.0, 0.002, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="makes iterations free"):
        LayeredModel.from_json(free)
    only_prefill = depth * 0.002 * np.maximum(p, 1)
    with pytest.raises(ValueError, match="makes iterations free"):
        fit_layered(np.maximum(p, 1), np.zeros(n), np.zeros(n), depth, only_prefill, layers=4)


def test_simulate_routes_a_helios_config_and_writes_figures(tmp_path):
    out = tmp_path / "sim"
    summary = json.loads(run_cli("simulate", str(EXAMPLE), "-o", str(out), "--json").stdout)
    pol = summary["policies"]
    assert set(pol) >= {"static:target-large", "static:target-small", "helios:throughput"}
    # Partial loading buys larger batches than the full model's.
    assert pol["helios:throughput"]["mean_batch"] > pol["static:target-large"]["mean_batch"]
    assert pol["helios:throughput"]["throughput_tok_s"] > \
        pol["static:target-large"]["throughput_tok_s"]
    assert any(":switch:" in e or ":load:" in e for e in pol["helios:throughput:cbc20"]["events"])
    for name in ("helios_policies.png", "helios_timeline.png", "helios_exit_shares.png",
                 "summary.json"):
        assert (out / name).stat().st_size > 0
    # Table 5: every policy's tokens by model and exit layer; a static model never exits early
    for name, s in pol.items():
        assert sum(s["exit_shares"].values()) == pytest.approx(1.0), name
    assert pol["static:target-large"]["exit_shares"] == {"target-large@4": 1.0}
    assert set(pol["helios:accuracy"]["exit_shares"]) > {"target-small@1"}
    assert set(pol["ee_full:target-large"]["exit_shares"]) >= {"target-large@1",
                                                               "target-large@2"}


@pytest.mark.parametrize("edit,message", [
    (lambda h: h.update(bogus=1), "helios: unknown key 'bogus'"),
    (lambda h: h.update(memory_mb=-1), "helios.memory_mb: Input should be greater than 0"),
    (lambda h: h.update(memory_mb=0.5), "cannot hold one layer"),
    (lambda h: h["policies"].append({"type": "static", "model": "gpt"}),
     "helios.policies[10].model: 'gpt' is not one of target-large, target-small"),
    (lambda h: h["policies"].append({"type": "helios", "strategy": "speed"}),
     "helios.policies[10].helios.strategy"),
    (lambda h: h["policies"].append({"type": "helios", "shortlist": 2}),
     "helios.policies[10].shortlist: 'draft' was shortlisted but has no exits trace"),
    (lambda h: h["policies"].append({"type": "helios", "shortlist": 1,
                                     "strategy": "response_time"}),
     "helios.repository[0] (target-large): no latency_ms to rank by for response_time"),
    (lambda h: (h.pop("repository"), h["policies"].append({"type": "helios", "shortlist": 1})),
     "helios.policies[6].shortlist: needs a helios.repository table"),
    (lambda h: h["policies"].append({"type": "helios", "shortlist": 1, "min_accuracy": 0.9}),
     "no repository model fits memory_mb 8.0 with accuracy >= 0.9"),
    (lambda h: h["policies"].append({"type": "ee_full", "model": "gpt"}),
     "helios.policies[10].model: 'gpt' is not one of"),
    (lambda h: h["policies"].append({"type": "ee_full", "model": "target-small",
                                     "threshold": 1.5}),
     "helios.policies[10].ee_full.threshold: Input should be less than or equal to 1"),
    (lambda h: h["policies"].append({"type": "static", "model": "target-small"}),
     "two policies with one name"),
    (lambda h: h["models"].append({"exits": "missing-dir"}), "helios.models[2].exits"),
    (lambda h: h["policies"].append({"type": "helios", "reassess_every": "often"}),
     "helios.policies[10].helios.reassess_every"),
])
def test_config_errors_name_the_key(edit, message):
    d = read_yaml(EXAMPLE)
    edit(d["helios"])
    with pytest.raises(ValueError) as e:
        Experiment(d, EXAMPLE.parent)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.engine
def test_live_replay_makes_the_simulated_decisions(tmp_path):
    # --retrace: profiles traced on this machine first (a CI machine may be another CPU: the
    # shipped profiles' machine and one session's VM differed 3.5x in speed); a stream of half
    # the trace's length (60 prompts, a minute less of the suite) still re-assesses and switches;
    # --waves: the retrace's arrival waves, the largest first (the prefill sizes the fit sees).
    proc = run_cli("helios", "replay", str(EXAMPLE), "--policies",
                   "static:target-small,helios:throughput:cbc20,ee_full:target-large",
                   "--repeats", "1", "--retrace", str(tmp_path / "exits"),
                   "--prompts-per-phase", "15", "--waves", "9,1,4", "--json")
    report = json.loads(proc.stdout)
    for name in ("target-large", "target-small"):
        assert check_trace(tmp_path / "exits" / name) == []
        assert read_run(tmp_path / "exits" / name)["params"]["workload"]["waves"] == [9, 1, 4]
        assert traced_steps(tmp_path / "exits" / name).prefill_seqs.max() == 9
    for name, r in report.items():
        d = r["decisions"]
        assert d["prompts"] == 1.0 and d["events_equal"], (name, d)
        # a machine far from its profiles' speed is named, not failed
        assert r["speed_warning"] is None or r["speed_warning"] in proc.stderr
        assert d["same_output_tokens"] >= 0.95 and d["same_exit_layers"] >= 0.95, (name, d)
        m = r["metrics"]
        assert m["mean_batch"]["error"] == 0 and abs(m["perplexity"]["error"]) < 0.01
        # the live tokens counted against the traced full-model stream, as the simulator counts
        assert 0 < m["full_model_agreement"]["live"] <= 1.0, (name, m["full_model_agreement"])
        assert abs(m["full_model_agreement"]["error"]) < 0.05, (name, m["full_model_agreement"])
        # Timing errors, even at the live run's own step speed, move with whatever else the
        # machine runs (beside a CPU-bound process TPOT P50 of helios:throughput:cbc20 came out
        # +66% at live speed, +23% to +40% on a quiet 2-core VM): figures for `reasonsim helios
        # replay` and the benchmark to show, never bounds here.
        for key in ("throughput_tok_s", "tpot_p50_s"):
            assert math.isfinite(m[key]["error_at_live_speed"]), (name, key, m[key])
            assert math.isfinite(m[key]["error_at_local_speed"]), (name, key, m[key])
    assert report["helios:throughput:cbc20"]["decisions"]["events"] >= 3
    proc = run_cli("helios", "replay", str(REPO / "examples" / "helios-opt-whatif.yaml"),
                   "--retrace", str(tmp_path / "x"), check=False)
    # a what-if config's models are stated, not traced: nothing to retrace or run live
    assert proc.returncode == 2 and "a what-if config (helios.what_if)" in proc.stderr
    proc = run_cli("helios", "replay", str(EXAMPLE), "--waves", "4,8", check=False)
    assert proc.returncode == 2 and "--waves needs --retrace" in proc.stderr


def test_a_live_round_logs_its_first_step_and_every_step():
    """Per live round, the first step (the one that gives every prompt its first token: all the
    round's prompts prefilled together) is kept apart, as the simulator keeps its price, and the
    step log adds up to the rounds' steps and busy time: what the per-round comparison of
    `benchmarks/helios_time_parts.py` reads, checked without timing the machine."""
    import pandas as pd

    from live.helios import run_live, stream_prompts
    from sim.families.helios.serving import simulate_stream

    exp = Experiment(read_yaml(EXAMPLE), EXAMPLE.parent)
    spec = next(p for p in exp.spec.helios.policies
                if exp.policy_name(p) == "static:target-small")
    first = next(iter(exp.profiles.values()))
    prompts = stream_prompts(first.workload, first.prompt_tokens)
    dirs = {name: p.model_dir for name, p in exp.profiles.items()}
    small = exp.profiles["target-small"]
    served = list(range(exp.memory.batch(small, small.layers) + 4))  # two rounds
    log: list[dict] = []
    _, rounds, _ = run_live(exp.program(spec, served), dirs, prompts,
                            exp.memory.seq_tokens, int(first.workload.get("max_tokens", 96)),
                            steps=log)
    sim = simulate_stream(exp.program(spec, served), exp.profiles).rounds
    assert rounds.batch.tolist() == sim.batch.tolist() and len(rounds) >= 2
    steps = pd.DataFrame(log)
    per_round = steps.groupby("round")
    assert per_round.size().tolist() == rounds.steps.tolist()
    assert per_round.duration_ms.sum().to_numpy() == pytest.approx(rounds.busy_ms.to_numpy())
    firsts = steps[steps.step == 1].reset_index(drop=True)
    assert firsts.prefill_seqs.tolist() == rounds.batch.tolist()
    assert (firsts.decode_seqs == 0).all() and (steps[steps.step > 1].prefill_seqs == 0).all()
    assert firsts.duration_ms.to_numpy() == pytest.approx(rounds.first_step_ms.to_numpy())
    assert set(steps.model) == {"target-small"} and set(steps.depth) == {small.layers}
    assert ((sim.first_step_ms > 0) & (sim.first_step_ms < sim.busy_ms)).all()


def test_a_simulation_re_timed_at_the_live_speed_around_each_round():
    """`at_local_speed`: each simulated round re-timed by the live step speed of the rounds
    around it (itself left out), the time between rounds kept: a live run alike round by round
    gives the simulation back; one whose steps all took twice as long doubles every latency and
    leaves the loads; a live run whose speed doubles midway re-times each round by the speed
    of its own neighbours; other rounds are refused."""
    from sim.families.helios.serving import HeliosResult
    from validation.helios import at_local_speed, local_levels

    exp = Experiment(read_yaml(EXAMPLE), EXAMPLE.parent)
    sim = exp.simulate()["helios:throughput"]
    same = at_local_speed(sim, sim).summary()
    for key in ("throughput_tok_s", "ttft_p50_s", "tpot_p50_s", "span_s"):
        assert same[key] == pytest.approx(sim.summary()[key]), key
    slow = HeliosResult(sim.requests, sim.rounds.assign(busy_ms=2 * sim.rounds.busy_ms),
                        sim.events)
    twice = at_local_speed(sim, slow).summary()
    assert twice["ttft_p50_s"] == pytest.approx(2 * sim.summary()["ttft_p50_s"])
    assert twice["tpot_p50_s"] == pytest.approx(2 * sim.summary()["tpot_p50_s"])
    between_s = sim.rounds.load_ms.sum() / 1e3
    assert 2 * sim.summary()["span_s"] - twice["span_s"] >= between_s > 0
    assert local_levels([1, 1, 1, 1, 1, 1], [1, 1, 1, 2, 2, 2], window=1).tolist() == \
        [1, 1, 1.5, 1.5, 2, 2]
    other = HeliosResult(sim.requests, sim.rounds.iloc[1:], sim.events)
    with pytest.raises(ValueError, match="other rounds"):
        at_local_speed(sim, other)


def test_real_shapes_what_if_reproduce_the_papers_direction():
    d = read_yaml(REPO / "examples" / "helios-opt-whatif.yaml")
    d["helios"]["policies"] = d["helios"]["policies"][:3]  # both static models and HELIOS
    exp = Experiment(d, REPO / "examples")
    small = exp.profiles["opt-1.3b"]
    # Shapes from config.json: OPT-1.3B layer = 4h^2 + 2 h ffn fp16 parameters; KV 2 h fp16.
    assert small.weight_bytes == (4 * 2048**2 + 2 * 2048 * 8192) * 2
    assert small.kv_bytes_per_token == 2 * 2048 * 2 and small.device == "what-if"
    res = {name: r.summary() for name, r in exp.simulate().items()}
    helios, s13, s67 = (res[k] for k in ("helios:throughput", "static:opt-1.3b",
                                         "static:opt-6.7b"))
    # Partial loading buys larger batches, and HELIOS out-serves either static model.
    depth = exp.candidates["opt-1.3b"].batch_at_depth
    assert depth[5] > 3 * depth[-1]
    assert helios["throughput_tok_s"] > s13["throughput_tok_s"] > s67["throughput_tok_s"]
    assert helios["layer_token_executions"] < s13["layer_token_executions"]
    bad = read_yaml(REPO / "examples" / "helios-opt-whatif.yaml")
    bad["helios"]["models"][0]["exit_shares"][0] = [0.5, 0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match=r"helios.models\[0\].config: exit_shares\[0\]: 4 "
                                         r"non-negative shares summing to 1"):
        Experiment(bad, REPO / "examples")
    del bad["helios"]["what_if"]
    bad["helios"]["models"][0]["exit_shares"][0] = [0.7, 0.1, 0.1, 0.1]
    with pytest.raises(ValueError, match="needs name, config, exit_layers, exit_shares and the "
                                         "helios.what_if section"):
        Experiment(bad, REPO / "examples")


def test_the_ee_full_baseline_simulates_layer_skipping():
    from dataclasses import replace

    from policies.helios import EarlyExitFull
    from programs.helios import HeliosProgram
    from sim.families.helios.replica import ee_times, median_scale, round_times
    from sim.families.helios.serving import simulate_stream

    # Known answer: exits [4, 1, 1, 4, 2] of 4 layers; decode steps j = 1..4 run layers 1..exit
    # over the new token and the pending ones (0, 1, 2, 0: fed since the last full-depth step).
    m = LayeredModel(fixed_ms=(1.0, 0, 0, 0, 0), layer_ms=(0.5, 0.01, 0, 0, 0), layers=4)
    t = ee_times(m, 10, [4, 1, 1, 4, 2], 4)
    decode = [(1 + d * (0.5 + 0.01 * p)) for d, p in ((1, 0), (1, 1), (4, 2), (2, 0))]
    assert t["end_s"] == pytest.approx((1 + 4 * (0.5 + 0.1) + sum(decode)) / 1e3)
    assert t["layer_tokens"] == 4 * 10 + 1 * 1 + 1 * 2 + 4 * 3 + 2 * 1 and t["steps"] == 5
    # the loop's host time after each of the 5 steps: the sequence finishes as its last returns
    g = ee_times(m, 10, [4, 1, 1, 4, 2], 4, gap_ms=0.25)
    assert g["busy_s"] == pytest.approx(t["end_s"]) and g["first_s"] == t["first_s"]
    assert g["end_s"] == pytest.approx(t["end_s"] + 5 * 0.25e-3)
    assert g["finish_s"][0] == pytest.approx(t["end_s"] + 4 * 0.25e-3)
    # Skewed residuals (median 1, mean 2): the prefill, one step, at the median; the decode
    # steps, a sum, at the mean; a round's first token likewise.
    skew = replace(m, residual_log_quantiles=(0.0, 0.0, math.log(4)))
    k = ee_times(skew, 10, [4, 1, 1, 4, 2], 4)
    assert k["first_s"] == pytest.approx(t["first_s"])
    assert k["end_s"] == pytest.approx(t["first_s"] + 2 * (t["end_s"] - t["first_s"]))
    lm = skew.at_depth(4)
    r = round_times(lm, [10, 10], [3, 3], scale=2.0, first_scale=median_scale(lm))
    one = round_times(lm, [10, 10], [3, 3])
    assert r["first_s"] == pytest.approx(one["first_s"])
    assert r["end_s"] == pytest.approx(one["first_s"] + 2 * (one["end_s"] - one["first_s"]))
    exp = Experiment(read_yaml(EXAMPLE), EXAMPLE.parent)
    res = {k: r.summary() for k, r in exp.simulate().items()}
    ee, full = res["ee_full:target-large"], res["static:target-large"]
    assert ee["mean_batch"] == 1 and ee["tokens"] == full["tokens"]
    # Most tokens leave early, so a token costs less than at full depth at batch 1 ...
    assert ee["tpot_p50_s"] < full["tpot_p50_s"]
    # ... but one sequence at a time serves fewer tokens per second than a batch of 8.
    assert ee["throughput_tok_s"] < full["throughput_tok_s"]
    untraced = dict(exp.profiles, **{"target-large": replace(exp.profiles["target-large"],
                                                             ee_step=None)})
    prog = HeliosProgram(EarlyExitFull(exp.candidates["target-large"]), exp.num_prompts,
                         lambda s: 1)
    with pytest.raises(ValueError, match="needs an exits trace with layer-skipping steps"):
        simulate_stream(prog, untraced)


def test_agreement_with_the_full_model_is_counted_per_token():
    """The reference-free quality proxy: the served tokens equal to the full model's greedy
    token at the same position. The full-depth static baseline serves the reference itself;
    EE-full's early tokens agree exactly as often as the exits trace's own count says; a
    truncated model agrees less; a what-if profile (no tokens) reports none."""
    from sim.families.helios.exits import exit_summary, load_exits

    d = read_yaml(EXAMPLE)
    exp = Experiment(d, EXAMPLE.parent)
    res = {k: r.summary() for k, r in exp.simulate().items()}
    assert res["static:target-large"]["full_model_agreement"] == 1.0
    m = load_exits(EXAMPLE.parent / d["helios"]["models"][0]["exits"])  # target-large's
    ee = next(p for p in d["helios"]["policies"]
              if p.get("type") == "ee_full" and p["model"] == "target-large")
    want = exit_summary(m, [ee["threshold"]])[0]["agree_with_final"]
    assert res["ee_full:target-large"]["full_model_agreement"] == pytest.approx(want)
    assert 0.0 < res["helios:throughput:cbc20"]["full_model_agreement"] < 1.0
    whatif = read_yaml(REPO / "examples" / "helios-opt-whatif.yaml")
    whatif["helios"]["policies"] = whatif["helios"]["policies"][:1]
    (only,) = Experiment(whatif, REPO / "examples").simulate().values()
    assert "full_model_agreement" not in only.summary()


CLUSTER = REPO / "examples" / "helios-cluster.yaml"


def test_helios_runs_on_several_replicas_behind_a_router():
    one = read_yaml(CLUSTER)
    one["helios"]["replicas"] = 1
    single = Experiment(one, CLUSTER.parent).simulate()
    exp = Experiment(read_yaml(CLUSTER), CLUSTER.parent)
    two = exp.simulate()
    for name, r in two.items():
        req = r.requests
        # every prompt served once; round robin alternates the stream between the replicas
        assert sorted(req.prompt) == list(range(exp.num_prompts)), name
        assert (req.replica_id == req.prompt % 2).all(), name
        assert set(r.rounds.replica_id) == {0, 1}
        # each replica serves its share at most as fast as one device serves all of it
        assert r.summary()["span_s"] < single[name].summary()["span_s"], name
    # the static policy serves the same tokens wherever a prompt goes
    assert two["static:target-large"].summary()["tokens"] == \
        single["static:target-large"].summary()["tokens"]
    # each replica runs its own policy: both evaluate the candidates, at their first prompts
    events = two["helios:throughput"].summary()["events"]
    assert events[:2] == ["0:evaluate:target-large@4", "1:evaluate:target-large@4"], events


def test_least_outstanding_routing_balances_tokens():
    d = read_yaml(CLUSTER)
    d["helios"]["router"] = "least_outstanding"
    exp = Experiment(d, CLUSTER.parent)
    req = exp.simulate()["static:target-large"].requests
    load = req.groupby("replica_id").prompt_tokens.sum() + \
        req.groupby("replica_id").size() * exp.max_tokens
    assert len(load) == 2 and abs(load[0] - load[1]) <= max(req.prompt_tokens) + exp.max_tokens


@pytest.mark.parametrize("edit, message", [
    (lambda h: h.update(router="nearest"), "helios.router: router 'nearest' unknown"),
    (lambda h: h.update(replicas=0), "helios.replicas"),
])
def test_cluster_errors_name_the_key(edit, message):
    d = read_yaml(CLUSTER)
    edit(d["helios"])
    with pytest.raises(ValueError, match=message):
        Experiment(d, CLUSTER.parent)


def test_helios_replay_refuses_several_replicas():
    proc = run_cli("helios", "replay", str(CLUSTER), check=False)
    assert proc.returncode != 0 and "helios.replicas is 2" in proc.stderr


def test_a_sweep_takes_a_helios_config(tmp_path):
    from sim.sweep import load_sweep, run_sweep
    from sim.sweep.stats import by_point

    df = run_sweep(load_sweep(CLUSTER, grid={"helios.replicas": [1, 2]}), tmp_path / "sw")
    # a row per point and policy; each equals the policy simulated alone
    assert len(df) == 2 * 3 and list(df.policy[:3]) == list(Experiment(
        read_yaml(CLUSTER), CLUSTER.parent).simulate())
    exp = Experiment(read_yaml(CLUSTER), CLUSTER.parent)
    want = {k: r.summary()["throughput_tok_s"] for k, r in exp.simulate().items()}
    two = df[df["helios.replicas"] == 2].set_index("policy").throughput_tok_s
    assert two.to_dict() == pytest.approx(want)
    table = by_point(df, ["throughput_tok_s"])
    assert len(table) == 6 and set(table.policy) == set(want)
    # every policy keeps its own exit shares, columns the first policy's row lacks included
    shares = {k: r.summary()["exit_shares"] for k, r in exp.simulate().items()}
    for policy, got in shares.items():
        row = df[(df["helios.replicas"] == 2) & (df.policy == policy)].iloc[0]
        assert {k: row[f"exit_shares.{k}"] for k in got} == pytest.approx(got), policy


def test_reassessment_interval_sensitivity_is_a_sweep(tmp_path):
    """HELIOS Fig 17(a): the re-assessment interval of one policy swept; the others stay."""
    from sim.sweep import load_sweep, run_sweep

    key = "helios.policies.2.reassess_every"
    df = run_sweep(load_sweep(EXAMPLE, grid={key: [30, 120, "auto"]}), tmp_path / "ri")
    df[key] = df[key].astype(str)
    tput = df.pivot_table(index=key, columns="policy", values="throughput_tok_s")
    # fewer re-evaluations at full depth: more of the stream at the selected depth
    assert tput.loc["120", "helios:throughput"] > tput.loc["30", "helios:throughput"]
    for static in ("static:target-large", "static:target-small", "helios:accuracy"):
        assert tput.loc["120", static] == tput.loc["30", static]
    # auto: the testbed's loads are cheap against serving its evaluation prompts at full depth,
    # so the interval outlasts the 120-prompt stream: no re-assessment, as at 120
    events = df[(df[key] == "auto") & (df.policy == "helios:throughput")].events.iloc[0]
    assert sum(":evaluate:" in e for e in json.loads(events)) == 2  # one phase, two models
    assert tput.loc["auto", "helios:throughput"] == tput.loc["120", "helios:throughput"]
    # the figure of Fig 17(a): a line per policy against the interval
    from sim.sweep.plots import plot_points
    from sim.sweep.stats import by_point

    png = plot_points(by_point(df, ["throughput_tok_s"]), ["throughput_tok_s"], tmp_path / "f.png")
    assert png.stat().st_size > 0


def test_a_threshold_past_the_testbeds_confidence_deepens_exits_and_slows_the_stream(tmp_path):
    """HELIOS Fig 17(b): the exit threshold of one policy swept. Up to 0.99 most of the
    testbed's tokens clear it at the first exit and nothing moves; at 0.9999 the greedy depth
    deepens: slower, closer to the full model."""
    from sim.sweep import load_sweep, run_sweep

    key = "helios.policies.2.threshold"
    df = run_sweep(load_sweep(EXAMPLE, grid={key: [0.9, 0.9999]}), tmp_path / "t")
    h = df[df.policy == "helios:throughput"].set_index(key)
    assert h.loc[0.9999, "throughput_tok_s"] < 0.9 * h.loc[0.9, "throughput_tok_s"]
    assert h.loc[0.9999, "full_model_agreement"] > h.loc[0.9, "full_model_agreement"]
    assert h.loc[0.9, "exit_shares.target-large@1"] > 0.5
    assert not h.loc[0.9999, "exit_shares.target-large@1"] > 0  # NaN: nothing exits there
    other = df[df.policy == "static:target-large"].set_index(key)
    assert other.loc[0.9, "throughput_tok_s"] == other.loc[0.9999, "throughput_tok_s"]


def test_an_automatic_interval_on_the_what_if_trades_quality_for_fewer_evaluations():
    """`reassess_every: auto` where loads and full-depth serving are costly (the OPT what-if):
    an interval longer than the stream (one evaluation; the CBC alone answers the phase shift)
    against RI 1200's second evaluation at the shift: more throughput, worse perplexity."""
    from sim.families.helios.serving import simulate_stream

    d = read_yaml(REPO / "examples" / "helios-opt-whatif.yaml")
    fixed = d["helios"]["policies"][2]
    d["helios"]["policies"] = [dict(fixed, reassess_every="auto", label="auto"), fixed]
    exp = Experiment(d, REPO / "examples")
    runs = {}
    for spec in exp.spec.helios.policies:
        program = exp.program(spec)
        result = simulate_stream(program, exp.profiles)
        evaluations = sum(serve.event == "evaluate" for _, serve in result.events)
        runs[spec.label or "fixed"] = (program.policy.intervals, evaluations, result.summary())
    (auto_iv, auto_evals, auto), (_, fixed_evals, ri) = runs["auto"], runs["fixed"]
    assert auto_iv[0] > 2400 and auto_evals == 2 and fixed_evals == 4
    assert auto["throughput_tok_s"] > 1.5 * ri["throughput_tok_s"]
    assert auto["perplexity"] > ri["perplexity"]


def test_overlapped_loading_hides_loads_and_keeps_every_decision(tmp_path):
    """`overlap_loading`: a standby server loads the next round's model while the current one
    serves, where the decision is known early; the same decisions and tokens, less time
    waiting for layers, no slower anywhere. Simulated only: the live replay refuses it."""
    d = read_yaml(EXAMPLE)
    base = Experiment(d, EXAMPLE.parent).simulate()
    d["helios"]["overlap_loading"] = True
    over = Experiment(d, EXAMPLE.parent).simulate()
    for name, r in base.items():
        o = over[name]
        assert o.events == r.events, name
        assert o.requests[["prompt", "model", "depth", "output_tokens"]].equals(
            r.requests[["prompt", "model", "depth", "output_tokens"]]), name
        assert o.rounds.load_ms.sum() <= r.rounds.load_ms.sum(), name
        assert o.summary()["span_s"] <= r.summary()["span_s"] + 1e-12, name
    # HELIOS re-assesses: its evaluation's loads go to the standby server
    h = "helios:throughput"
    assert over[h].rounds.load_ms.sum() < 0.6 * base[h].rounds.load_ms.sum()
    for m in d["helios"]["models"]:
        m["exits"] = str((EXAMPLE.parent / m["exits"]).resolve())
    (tmp_path / "over.yaml").write_text(json.dumps(d))
    proc = run_cli("helios", "replay", str(tmp_path / "over.yaml"), check=False)
    assert proc.returncode != 0 and "overlap_loading is simulated only" in proc.stderr


def test_the_loops_host_time_between_steps_is_fitted_and_spent():
    from sim.families.helios.serving import simulate_stream

    exp = Experiment(read_yaml(EXAMPLE), EXAMPLE.parent)
    gaps = {name: p.step_gap_ms for name, p in exp.profiles.items()}
    # the shipped traces' loops: tens of microseconds a step on the CPU testbed, well under a step
    assert all(0.01 < g < 0.5 for g in gaps.values()), gaps
    static = next(p for p in exp.spec.helios.policies if exp.policy_name(p) == "static:target-large")
    res = simulate_stream(exp.program(static), exp.profiles)
    rounds, span_s = res.rounds, float(res.requests.finish_s.max())
    # rounds run back to back: the stream lasts their steps' compute, their loads and one host
    # gap after every step but the last (the last sequence finishes as its step returns)
    spent_s = (rounds.busy_ms.sum() + rounds.load_ms.sum()
               + (rounds.steps.sum() - 1) * gaps["target-large"]) / 1e3
    assert span_s == pytest.approx(spent_s, rel=1e-9)
