"""SEED: speculative acceptance (pure), ToT choices, the tot trace on two real vLLM engines
(greedy speculative trees equal the target's own), the simulator on it, and a live replay."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_cli, speed_figure
from policies.seed import (Leaf, SeedPolicy, ToTSettings, VerifyQueue, candidates, distribution,
                           make_seed_policy, sample, select, verify, verify_tree)
from validation.judge import pool_step_speeds


# -------------------------------------------------------------------- the policy (pure)
def test_greedy_verification_keeps_the_targets_argmax_prefix():
    rows = [{5: -0.1, 6: -2.0}, {7: -0.5, 8: -0.9}, {9: -0.2, 1: -3.0}, {4: -0.1}]
    assert verify([5, 7, 9], [], rows, 0.0, []).accepted == 3      # all kept, bonus 4
    assert verify([5, 7, 9], [], rows, 0.0, []).token == 4
    v = verify([5, 8, 9], [], rows, 0.0, [])
    assert (v.accepted, v.token, v.positions) == (1, 7, (True, False, False))
    with pytest.raises(ValueError, match="3 target rows for 3 drafted"):
        verify([5, 7, 9], [], rows[:3], 0.0, [])


def test_sampled_acceptance_reproduces_the_targets_distribution():
    """Speculative sampling's output is distributed as the target's sampling (any draft)."""
    rng = random.Random(0)
    vocab = range(6)
    for temperature in (0.7, 1.0):
        target = {t: rng.gauss(0, 1.5) for t in vocab}
        draft = {t: rng.gauss(0, 1.5) for t in vocab}
        p, q = distribution(target, temperature), distribution(draft, temperature)
        counts = dict.fromkeys(vocab, 0)
        n = 40_000
        for _ in range(n):
            d = sample(q, rng.random())
            v = verify([d], [draft], [target, target], temperature,
                       [rng.random() for _ in range(3)])
            counts[d if v.accepted else v.token] += 1
        for t in vocab:
            assert abs(counts[t] / n - p[t]) < 0.01, (temperature, t)


def test_multi_candidate_greedy_keeps_the_path_the_target_would_write():
    draft0 = {5: -0.1, 6: -0.5, 3: -2.0}
    assert candidates(draft0, 5, 2, 0.0, []) == [5, 6]
    # the draft's top choice 5 is wrong, its second 6 is the target's argmax, then 7 and 9
    target = [{6: -0.1, 5: -1.0}, {7: -0.2}, {9: -0.3}, {2: -0.1}]
    leaves = [Leaf((0,), (5, 7, 9), (), tuple(target)),
              Leaf((1,), (6, 7, 9), (), tuple(target))]
    v = verify_tree(leaves, 0.0, [], 3)
    assert (v.accepted, v.token, v.leaf, v.positions) == (3, 2, 1, (True,) * 3)
    # one path: the single-candidate rule
    v = verify_tree(leaves[:1], 0.0, [], 2)
    assert (v.accepted, v.token, v.positions) == (0, 6, (False,) * 3)
    with pytest.raises(ValueError, match="2 target rows for 2 drafted"):
        verify_tree([Leaf((0,), (5, 7), (), tuple(target[:2]))], 0.0, [], 2)


def test_multi_candidate_sampling_reproduces_the_targets_distribution():
    """Two or three candidates drawn from the draft, SpecInfer's rule: the kept first token is
    distributed as the target's sampling; with one path it decides exactly as `verify`."""
    rng = random.Random(1)
    vocab = range(5)
    for k in (2, 3):
        target = {t: rng.gauss(0, 1.5) for t in vocab}
        draft = {t: rng.gauss(0, 1.5) for t in vocab}
        p, q = distribution(target, 0.8), distribution(draft, 0.8)
        counts = dict.fromkeys(vocab, 0)
        n = 40_000
        for _ in range(n):
            own = sample(q, rng.random())
            cands = candidates(draft, own, k, 0.8, [rng.random() for _ in range(k - 1)])
            leaves = [Leaf((j,), (c,), (draft,), (target, target)) for j, c in enumerate(cands)]
            v = verify_tree(leaves, 0.8, [rng.random() for _ in range(2 * (k + 1) + 1)], k + 1)
            counts[leaves[v.leaf].tokens[0] if v.accepted else v.token] += 1
        for t in vocab:
            assert abs(counts[t] / n - p[t]) < 0.01, (k, t)
    for _ in range(200):
        rows = [{t: rng.gauss(0, 1) for t in vocab} for _ in range(4)]
        drows = [{t: rng.gauss(0, 1) for t in vocab} for _ in range(3)]
        drafted = [rng.choice(list(vocab)) for _ in range(3)]
        u = [rng.random() for _ in range(7)]
        a = verify(drafted, drows, rows, 0.9, u)
        b = verify_tree([Leaf((), tuple(drafted), tuple(drows), tuple(rows))], 0.9, u, 2)
        assert (a.accepted, a.token, a.positions) == (b.accepted, b.token, b.positions)


def _drive(prog, answer) -> list:
    """Run a program to the end, every request answered at once by `answer(spec)`; the specs."""
    sent, todo = [], prog.start()
    while todo:
        spec = todo.pop(0)
        sent.append(spec)
        todo += prog.on_done(spec, prog.interpret(spec, answer(spec), None))
    assert prog.done
    return sent


def test_a_multi_candidate_round_keeps_the_second_candidate_the_target_writes():
    """The program's side of MCSD (engine-free): the draft's top two first tokens are drafted
    further, both paths are verified at once, and the path the target agrees with is kept."""
    from programs.base import Outcome
    from programs.seed import ToTProgram

    policy = SeedPolicy("sd", ToTSettings(breadth=1, thoughts=1, depth=1, k_config=(2,),
                                          temperature=0.0))
    prog = ToTProgram("q", policy, 3, 0, 2, prompt_ids=[1, 2, 3], probe_ids=[9, 9],
                      decode=lambda ids: "".join(chr(97 + i) for i in ids), newline_id=10,
                      eos_id=11, vocab=20)
    target = {(): 6, (6,): 7, (6, 7): 8, (6, 7, 8): 12, (6, 7, 8, 12): 10}  # path -> argmax

    def answer(spec):
        drafted = spec.prompt_ids[3:]
        if spec.kind == "draft":
            return Outcome(1, token_ids=(5,), top_logprobs=({5: -0.1, 6: -0.9, 4: -2.0},))
        if spec.kind.startswith("draft@"):
            return Outcome(3, token_ids=(7, 8, 12), text="hi!", top_logprobs=({},) * 3)
        if spec.kind.startswith("verify"):
            tail = drafted[-spec.sampling.prompt_logprobs:]
            rows = [{target.get(tuple(tail[:i]), 0): -0.1} for i in range(len(tail) + 1)]
            return Outcome(1, top_logprobs=tuple(rows))
        return Outcome(1, text="4", logprobs=(-0.2,))

    sent = _drive(prog, answer)
    assert [s.kind for s in sent] == ["draft", "draft@0", "draft@1", "verify", "verify@1",
                                      "eval"]
    assert sent[3].prompt_ids[3:] == [5, 7, 8, 12] and sent[4].prompt_ids[3:] == [6, 7, 8, 12]
    assert sent[1].sampling.max_tokens == 3 and sent[0].sampling.top_logprobs == 2
    row = next(r for r in prog.rows if r["kind"] == "verify")
    assert (row["accepted_tokens"], row["drafted_tokens"], row["output_tokens"]) == (4, 4, 5)
    assert prog.accepted_tokens == 4 and prog.rounds == 1 and prog.reasoning == 5


def test_selection_queue_and_config_errors():
    assert select([0.2, 0.9, 0.9, 0.1], 2) == [1, 2]
    assert select([0.5, 0.5, 0.5], 2) == [0, 1]             # ties: the earlier
    q = VerifyQueue(1)
    for item in "abc":
        q.push(item)
    assert q.ready() == ["a"] and q.ready() == []          # one at a time, first come first
    q.done()
    assert q.ready() == ["b"]
    assert SeedPolicy("seed", ToTSettings()).thought_limit > 1
    assert SeedPolicy("seed", ToTSettings()).target_limit == 1
    assert SeedPolicy("sd", ToTSettings()).thought_limit == 1
    assert {SeedPolicy(m, ToTSettings()).tree for m in ("sd", "seed", "seed_batched")} == {"sd"}
    mcsd = ToTSettings(k_config=[2, 1, 1, 1])
    assert mcsd.k_config == (2,) and mcsd.branching(1) == (2,) and ToTSettings().branching(4) == ()
    assert SeedPolicy("seed", mcsd).tree == "sd-k2" and SeedPolicy("ar", mcsd).tree == "ar"
    with pytest.raises(ValueError, match="k_config must be"):
        make_seed_policy("sd", k_config=[2, 2, 1, 1, 1])
    with pytest.raises(ValueError, match="mode 'fast'"):
        make_seed_policy("fast")
    with pytest.raises(ValueError, match="unknown key 'width'"):
        make_seed_policy("seed", width=2)
    with pytest.raises(ValueError, match="breadth must be >= 1"):
        make_seed_policy("seed", breadth=0)


# -------------------------------------------------------------------- two real engines
@pytest.fixture(scope="module")
def greedy_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("tot") / "tot"
    run_cli("trace", "tot", "-o", str(out), "--questions", "1", "--depth", "2",
            "--temperature", "0", "--k-config", "1,2", "--eval-tokens", "4",
            "--speculative-eval", "-q", "--json")
    return out


def _trees(table):
    """question -> {thought key: its text} per tree (ar: one request; sd: its verifications)."""
    out = {}
    for tree, kind in (("totar", "ar"), ("totsd", "verify"), ("totsd-k1.2", "verify"),
                       ("totsd-se", "verify")):
        t = table[table.program_id.str.endswith(tree) & (table.kind == kind)]
        t = t.sort_values("round").groupby(["question_id", "node"]).text.apply("".join)
        out[tree] = t.to_dict()
    return out


@pytest.mark.engine
def test_greedy_speculative_tree_equals_the_targets_own(greedy_trace):
    """Program-level speculative decoding over two engines writes, under greedy acceptance,
    every thought token for token as the target alone does: the same tree."""
    from traces.store import read_table

    run_cli("traces", "check", str(greedy_trace))
    t = read_table(greedy_trace, "tot_requests").to_pandas()
    trees = _trees(t)
    assert len(trees["totar"]) == 8 * (3 + 2 * 3)          # 8 questions, 3 + 6 thoughts
    assert trees["totsd"] == trees["totar"]
    # multi-candidate rounds (two second tokens): the same tree, every path verified at once
    assert trees["totsd-k1.2"] == trees["totar"]
    mc = t[t.program_id.str.endswith("totsd-k1.2")]
    rounds = mc[mc.kind == "verify"]
    assert set(mc.kind.str.split("@").str[0]) == {"draft", "verify", "eval"}
    assert (mc.kind == "verify@0.1").sum() > 0.5 * len(rounds)
    v = t[t.kind == "verify"]
    assert 0.3 < v.accepted_tokens.sum() / v.drafted_tokens.sum() <= 1.0
    assert (v.output_tokens <= v.accepted_tokens + 1).all()
    ev = t[t.kind == "eval"]
    assert ev.value.between(0, 1).all() and ev.answer.notna().all()
    # speculative evaluations (sd-se): the same thoughts, and each state's value and answer
    # the target's own evaluation's (greedy acceptance keeps its tokens)
    assert trees["totsd-se"] == trees["totar"]
    from programs.seed_eval import answer_of

    se = t[t.program_id.str.endswith("totsd-se") & (t.kind == "eval-verify")].sort_values("round")
    own = ev[ev.program_id.str.endswith("totar")].set_index(["question_id", "node"])
    got = se.groupby(["question_id", "node"]).agg(value=("value", "first"), text=("text", "sum"))
    assert len(got) == len(own) and (got.value == own.value.reindex(got.index)).all()
    assert (got.text.map(lambda x: answer_of(x, 4)) == own.answer.reindex(got.index)).all()
    assert 0.0 < se.accepted_tokens.sum() / se.drafted_tokens.sum() <= 1.0
    for role in ("draft", "target"):
        assert len(read_table(greedy_trace / role, "steps")) > 0


def _config(tmp_path, trace, mode: str, count: int = 4, speculative_eval: bool = False) -> str:
    cfg = yaml.safe_load((REPO / "examples" / "seed-greedy.yaml").read_text())
    progs = cfg["workload"]["programs"]
    progs.update(trace=str(trace), count=count)
    progs["policy"] = {"type": mode, "depth": 2, "temperature": 0.0, "eval_tokens": 4,
                       "speculative_eval": speculative_eval}
    for g in cfg["cluster"]["replicas"]:
        g["calibration"] = str((REPO / "examples" / g["calibration"]).resolve())
    path = tmp_path / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.mark.engine
def test_simulated_trees_replay_the_trace_and_live_agrees(greedy_trace, tmp_path):
    """Every mode simulates the traced tree; live SEED makes the same requests and decisions."""
    from traces.store import read_table

    for mode in ("ar", "sd", "seed", "seed_batched"):
        run_cli("simulate", _config(tmp_path, greedy_trace, mode), "-o", str(tmp_path / mode),
                "--json")
    sim = read_table(tmp_path / "seed", "tot_requests").to_pandas()
    assert set(sim.kind) == {"draft", "verify", "eval"}
    sd = read_table(tmp_path / "sd", "tot_requests").to_pandas()
    key = ["program_id", "node", "kind", "round"]
    # the schedule changes the timing, never the tree
    assert sim.set_index(key).accepted_tokens.sort_index().equals(
        sd.set_index(key).accepted_tokens.sort_index())
    # MCSD: the simulator sends the traced draft tree's requests and keeps its decisions
    mcsd = yaml.safe_load(Path(_config(tmp_path, greedy_trace, "seed")).read_text())
    mcsd["workload"]["programs"]["policy"]["k_config"] = [1, 2]
    (tmp_path / "mcsd.yaml").write_text(yaml.safe_dump(mcsd))
    run_cli("simulate", str(tmp_path / "mcsd.yaml"), "-o", str(tmp_path / "mcsd"), "--json")
    got = read_table(tmp_path / "mcsd", "tot_requests").to_pandas()
    traced = read_table(greedy_trace, "tot_requests").to_pandas()
    traced = traced[traced.program_id.isin({f"{q}-totsd-k1.2" for q in got.question_id})]
    key = ["question_id", "node", "kind", "round"]
    assert got.set_index(key).accepted_tokens.sort_index().fillna(-1).equals(
        traced.set_index(key).accepted_tokens.sort_index().fillna(-1))
    mcsd["workload"]["programs"]["policy"]["k_config"] = [2, 2]  # a tree the trace lacks
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(mcsd))
    bad = run_cli("simulate", str(tmp_path / "bad.yaml"), "-o", str(tmp_path / "bad"), check=False)
    assert bad.returncode != 0 and "trace tot --k-config" in bad.stderr
    # live: SEED with the State Evaluator speculative too (value prompts drafted and verified)
    se = _config(tmp_path, greedy_trace, "seed", speculative_eval=True)
    proc = run_cli("seed", "replay", se, "--modes", "seed", "--repeats", "1", "-o",
                   str(tmp_path / "rep"), "--calibrate-here", "--speed-checks", "--json")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    result = report["modes"]["seed"]
    run_cli("traces", "check", str(tmp_path / "rep" / "seed" / "live0"))
    # --calibrate-here: other programs served live just before, each pool calibrated on them
    assert set(report["calibrations"]) == {"draft", "target"}
    for pool, path in report["calibrations"].items():
        cal = json.loads(Path(path).read_text())
        # the two-engine loop's host time per added request (measured 0.16-0.37 ms here)
        assert cal["provenance"]["traces"] and speed_figure(cal["host"]["add_request_ms"]), pool
        assert cal["provenance"]["logprob_cost"], pool
    # the target's scoring steps return log-probabilities; the recorder counted them
    cal_target = tmp_path / "rep" / "calibration" / "seed" / "live0" / "target"
    assert read_table(cal_target, "step_logprobs").num_rows > 0
    assert (tmp_path / "rep" / "calibration" / "seed" / "live0" / "target").is_dir()
    assert result["decision_agreement"] >= 0.95
    # each pool whose engine ran decode-only steps (SEED's target may only verify)
    assert set(report["machine_speed"]["seed"]["runs"][0]) <= {"draft", "target"}
    assert "draft" in report["machine_speed"]["seed"]["runs"][0]
    # --speed-checks: the calibration's programs again after the live run, which is judged at
    # each pool's mean level of the runs either side, over the calibration runs' own
    cal = tmp_path / "rep" / "calibration" / "seed"
    level = {d: pool_step_speeds(tmp_path / "rep" / "seed" / "sim", cal / d)
             for d in ("live0", "check0")}
    judged = result["judged"]
    assert judged["levels"][0] == pytest.approx({
        p: (level["live0"][p] + level["check0"][p]) / 2 / level["live0"][p]
        for p in level["live0"]})
    (v,) = judged["metrics"].values()
    assert v["live"] == result["live_mean_s"] and v["ok"] == (abs(v["error"]) <= 0.05)
    # a verification whose drafted tail the prefix cache covered runs twice live (cached, then
    # uncached: vLLM returns no log-probabilities for cached positions), and so in the simulator
    key = ["program_id", "node", "kind", "round"]
    rescored = [set(map(tuple, t[t.rescored.astype(bool)][key].values)) for t in (
        read_table(tmp_path / "rep" / "seed" / run, "tot_requests").to_pandas()
        for run in ("sim", "live0"))]
    assert rescored[0] and rescored[0] == rescored[1]
    live = read_table(tmp_path / "rep" / "seed" / "live0", "tot_requests").to_pandas()
    assert {"eval-draft", "eval-verify"} <= set(live.kind) and "eval" not in set(live.kind)
    # --rejudge: the same live run judged again (after a simulator change), nothing run live
    again = json.loads(run_cli("seed", "replay", se,
                               "--modes", "seed", "--repeats", "1", "-o", str(tmp_path / "rep"),
                               "--calibrate-here", "--rejudge", "--json").stdout.strip()
                       .splitlines()[-1])
    assert again["modes"]["seed"]["live_mean_s"] == result["live_mean_s"]
    assert again["modes"]["seed"]["sim_mean_s"] == pytest.approx(result["sim_mean_s"])
    missing = run_cli("seed", "replay", se, "--modes", "seed",
                      "--repeats", "2", "-o", str(tmp_path / "rep"), "--rejudge", check=False)
    assert missing.returncode != 0 and "holds no live run" in missing.stderr
    other = run_cli("seed", "replay", se, "--modes", "seed", "--repeats", "1", "--count", "3",
                    "-o", str(tmp_path / "rep"), "--rejudge", check=False)  # not what was served
    assert other.returncode == 2 and "was served from another config" in other.stderr
    assert result["sim_mean_s"] > 0 and result["live_mean_s"][0] > 0
    assert result["error"] == pytest.approx(result["sim_mean_s"] / result["live_mean_s"][0] - 1)
    # the errors move with what else the machine runs, at the live run's own step speed too
    # (+268% beside the suite and a CPU-bound process, the calibration traffic minutes apart):
    # the replay reports them; the suite checks they are figures
    (speed,) = result["at_live_speed"]["step_speed"]
    assert set(speed) == {"draft", "target"} and all(speed_figure(f) for f in speed.values())
    assert math.isfinite(result["at_live_speed"]["error"])
    # benchmarks/seed_step_speed.py: the same steps against the same calibrations, by shape
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from seed_step_speed import table

    rows = {(r["pool"], r["runs"]): r for r in table(tmp_path / "rep",
                                                     tmp_path / "rep" / "calibration")}
    assert set(rows) == {(p, k) for p in ("draft", "target")
                         for k in ("calibration", "validation")}
    for (pool, _), r in rows.items():
        assert r["mode"] == "seed" and r["steps"] > 0 and speed_figure(r["ratio"]), pool
    # validation: the step speed the replay reported, over the same steps
    assert rows[("target", "validation")]["ratio"] == pytest.approx(speed["target"])


@pytest.mark.engine
def test_the_targets_own_thoughts_serve_later_prompts_from_the_cache(tmp_path):
    """ar: a thought the target writes is cached as it decodes; its value prompt and its
    children find those blocks, in the simulator as on the live engine, request by request."""
    from traces.store import read_table

    run_cli("seed", "replay", "examples/seed-greedy.yaml", "--modes", "ar", "--repeats", "1",
            "--count", "3", "-o", str(tmp_path / "rep"), "--json")
    live, sim = (read_table(tmp_path / "rep" / "ar" / d, "requests").to_pandas()
                 for d in ("live0/target", "sim"))
    assert len(live) == len(sim) and live.prompt_tokens.sum() == sim.prompt_tokens.sum()
    assert (live.cached_prompt_tokens > 0).any()
    assert (live.groupby("program_id").cached_prompt_tokens.sum().sort_index().to_dict() ==
            sim.groupby("program_id").cached_prompt_tokens.sum().sort_index().to_dict())


def test_a_calibration_scaled_to_a_live_runs_step_speed(tmp_path):
    """The speed of steps against the calibration fitted on them is ~1; scaled steps follow."""
    from sim.step_time.live_speed import scaled_calibration, step_speed_ratio

    cal = REPO / "sim" / "data" / "testbed-large-tot-cpu.calib.json"
    steps = REPO / "traces" / "data" / "testbed-tot-cpu" / "target"
    ratio = step_speed_ratio(cal, steps)
    assert 0.8 < ratio < 1.25
    doubled = scaled_calibration(cal, 2.0, tmp_path / "doubled.calib.json")
    assert step_speed_ratio(doubled, steps) == pytest.approx(ratio / 2)
    bad = json.loads(cal.read_text())
    bad["step_time_model"] = {"kind": "other"}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="no millisecond coefficients"):
        scaled_calibration(tmp_path / "bad.json", 2.0, tmp_path / "out.json")


def test_step_speed_counts_the_log_probability_term(tmp_path):
    """A step's predicted time includes the log-probability rows it returned, as simulated: a
    calibration fitted on the steps with that term finds them at their own speed (~1), the same
    one without it finds the scoring steps slower, and scaling scales the term too."""
    from sim.step_time.calibration import calibrate
    from sim.step_time.live_speed import scaled_calibration, step_speed_ratio

    steps = REPO / "traces" / "data" / "testbed-tot-cpu" / "target"
    cal = calibrate([steps]).to_json()
    assert cal["host"]["logprob_token_ms"] + cal["host"]["logprob_top_k_ms"] > 0
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal))
    cal["host"].update(logprob_token_ms=0.0, logprob_top_k_ms=0.0)
    (tmp_path / "no_lp.json").write_text(json.dumps(cal))
    ratio = step_speed_ratio(path, steps)
    assert 0.9 < ratio < 1.1
    assert step_speed_ratio(tmp_path / "no_lp.json", steps) > ratio * 1.05
    doubled = scaled_calibration(path, 2.0, tmp_path / "doubled.json")
    assert step_speed_ratio(doubled, steps) == pytest.approx(ratio / 2)


def test_seed_modes_on_the_shipped_trace(tmp_path):
    """Every mode simulates the shipped tree; a shallower tree is the deeper trace's top."""
    proc = run_cli("seed", "modes", str(REPO / "examples" / "seed-greedy.yaml"), "--depths",
                   "2,3", "--modes", "ar,sd,seed", "--count", "6", "-o", str(tmp_path), "--json")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [(r["depth"], r["mode"]) for r in rows] == [(d, m) for d in (2, 3)
                                                       for m in ("ar", "sd", "seed")]
    by = {(r["depth"], r["mode"]): r for r in rows}
    for d in (2, 3):
        assert by[(d, "ar")]["speedup_vs_ar"] == 1.0
        assert 0.5 < by[(d, "sd")]["acceptance_rate"] < 1.0
        # the same tree: the schedule never changes acceptance
        assert by[(d, "sd")]["acceptance_rate"] == by[(d, "seed")]["acceptance_rate"]
        assert by[(d, "seed")]["verify_queue_wait_p90_s"] > 0.0   # one verifier, many drafts
    assert by[(3, "ar")]["latency_mean_s"] > by[(2, "ar")]["latency_mean_s"]
    assert (tmp_path / "seed_speedup_vs_depth.png").stat().st_size > 0
    assert (tmp_path / "seed_timeline.png").stat().st_size > 0
    bad = run_cli("seed", "modes", str(REPO / "examples" / "seed-greedy.yaml"), "--depths", "9",
                  check=False)
    assert bad.returncode == 2 and "not in the trace" in bad.stderr


@pytest.mark.parametrize("k", [3, 5])
def test_draft_length_variants_are_traced_and_simulate(k):
    """Table 1's K = 3 and K = 5 rows: the shipped traces hold their draft length, base and
    tree drafts, and validate; each mode simulates on them, greedy acceptance keeping the
    target's own tree (the same thought tokens under ar as under seed)."""
    from programs.seed_traced import load_tot
    from traces.checks import check_trace

    trace = REPO / "traces" / "data" / f"testbed-tot-k{k}-cpu"
    assert check_trace(trace) == []
    bank = load_tot(trace)
    assert bank.settings.draft_tokens == k
    proc = run_cli("seed", "modes", str(REPO / "examples" / f"seed-k{k}.yaml"), "--modes",
                   "ar,sd,seed", "--count", "4", "--json")
    by = {r["mode"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert by["ar"]["speedup_vs_ar"] == 1.0 and 0.0 < by["sd"]["acceptance_rate"] < 1.0
    assert by["sd"]["acceptance_rate"] == by["seed"]["acceptance_rate"]


def test_a_bank_of_one_tree_holds_that_trees_requests_as_the_whole_bank_does():
    """A program reads only its mode's tree, so a workload loads that one (`load_tot(trees=)`):
    its rows equal the whole bank's, every question keeps its facts, the bank still knows
    every traced tree, and a policy whose tree is not in the trace is refused."""
    from programs.seed_traced import ROW_COLUMNS, load_tot

    trace = REPO / "traces" / "data" / "testbed-tot-se-cpu"
    whole, one = load_tot(trace), load_tot(trace, trees=("sd-se",))
    assert one.trees == whole.trees == {"ar", "sd", "sd-se"}
    assert one.difficulty_factor == whole.difficulty_factor and one.settings == whole.settings
    for a, b in zip(whole.questions, one.questions):
        assert (a.question_id, a.prompt_tokens, a.gold_answer, a.expected_tokens) == \
            (b.question_id, b.prompt_tokens, b.gold_answer, b.expected_tokens)
        assert set(b.requests) == {"sd-se"} and b.requests["sd-se"] == a.requests["sd-se"]
        assert all(set(r) == set(ROW_COLUMNS) for r in b.requests["sd-se"].values())
    assert sum(q.expected_tokens for q in whole.questions) == sum(
        r["output_tokens"] for q in whole.questions for r in q.requests["ar"].values())
    policy = SeedPolicy("sd", ToTSettings(**{**vars(whole.settings), "k_config": (3, 1)}))
    with pytest.raises(ValueError, match="not in the trace"):
        one.check(policy)


def test_the_state_evaluator_under_speculative_execution(tmp_path):
    """SEED's Table 2: with speculative_eval the value prompts' answers are drafted and verified
    too (the shipped trace's sd-se tree); `seed modes` gives each component's time over ar's
    and the evaluator's acceptance; the ar modes evaluate with the target. A policy asking for
    it in an ar mode, or on a trace without that tree, is refused."""
    from programs.seed_traced import load_tot
    from traces.checks import check_trace

    trace = REPO / "traces" / "data" / "testbed-tot-se-cpu"
    assert check_trace(trace) == []
    bank = load_tot(trace)
    assert bank.settings.eval_tokens == 8 and set(bank.questions[0].requests) == \
        {"ar", "sd", "sd-se"}
    example = REPO / "examples" / "seed-evaluator.yaml"
    proc = run_cli("seed", "modes", str(example), "--modes", "ar,sd,seed", "--count", "4",
                   "--json")
    by = {r["mode"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert by["ar"]["evaluator_speedup_vs_ar"] == by["ar"]["generator_speedup_vs_ar"] == 1.0
    assert by["ar"]["eval_acceptance_rate"] is None
    for mode in ("sd", "seed"):
        assert 0.0 < by[mode]["eval_acceptance_rate"] < 1.0
        assert by[mode]["evaluator_mean_s"] > 0 and by[mode]["generator_mean_s"] > 0
        assert by[mode]["accuracy"] == by["ar"]["accuracy"]  # greedy: the target's own tree
    assert by["sd"]["eval_acceptance_rate"] == by["seed"]["eval_acceptance_rate"]
    cfg = yaml.safe_load(example.read_text())
    cfg["workload"]["programs"]["trace"] = str(trace)
    for g in cfg["cluster"]["replicas"]:
        g["calibration"] = str((example.parent / g["calibration"]).resolve())
    cfg["workload"]["programs"]["policy"]["type"] = "ar"
    (tmp_path / "ar.yaml").write_text(yaml.safe_dump(cfg))
    bad = run_cli("simulate", str(tmp_path / "ar.yaml"), check=False)
    assert bad.returncode != 0 and "speculative_eval needs a speculative mode" in bad.stderr
    cfg["workload"]["programs"]["policy"].update(type="seed", eval_tokens=1)
    cfg["workload"]["programs"]["trace"] = str(REPO / "traces" / "data" / "testbed-tot-cpu")
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(cfg))
    bad = run_cli("simulate", str(tmp_path / "other.yaml"), check=False)
    assert bad.returncode != 0 and "trace tot --speculative-eval" in bad.stderr


def test_speedups_are_judged_against_each_repeats_own_ratio():
    """A simulated speedup passes within 10% of live, or within the spread of the live repeats'
    own speedups (each repeat's modes ran minutes apart on a drifting machine); else it fails."""
    import pandas as pd

    from validation.seed import compare_modes

    tot = pd.DataFrame({"program_id": ["p"], "node": [0], "kind": ["eval"], "round": [0],
                        "accepted_tokens": [None]})

    def programs(latency_s):
        return pd.DataFrame({"arrival_s": [0.0], "finish_s": [latency_s]}), tot

    def result(sim_s, live_s):
        return (programs(sim_s), [programs(v) for v in live_s])

    # sd live 1.0 s twice; seed live 0.5 s then 0.8 s: speedups 2.0x and 1.25x (spread 46%)
    r = compare_modes({"sd": result(1.0, [1.0, 1.0]), "seed": result(0.6, [0.5, 0.8])})
    j = r["modes"]["seed"]["speedup_vs_sd"]["judged"]
    assert j["live"] == [2.0, 1.25] and j["spread"] == pytest.approx(0.75 / 1.625)
    assert j["ok"] and j["error"] == pytest.approx((1 / 0.6) / 1.625 - 1)  # +2.6%
    # repeats that agree leave only the tolerance: a 1.67x against 1.25x twice fails
    r = compare_modes({"sd": result(1.0, [1.0, 1.0]), "seed": result(0.6, [0.8, 0.8])})
    j = r["modes"]["seed"]["speedup_vs_sd"]["judged"]
    assert j["spread"] == 0 and not j["ok"] and j["error"] == pytest.approx(1 / 0.6 / 1.25 - 1)
    assert "judged" not in r["modes"]["sd"]["speedup_vs_sd"]  # no speedup of a mode over itself


def test_component_time_is_each_programs_union_of_request_intervals():
    """A component's time is the mean over programs of the union of their requests' [sent,
    finish] intervals: overlaps counted once, gaps not at all, rows in any order, programs
    interleaved, the other component's requests left out."""
    import pandas as pd

    from sim.families.seed.metrics import component_s

    t = pd.DataFrame({
        "program_id": ["b", "a", "a", "b", "a", "a", "b"],
        "kind": ["ar", "draft", "verify", "ar", "draft", "eval", "eval"],
        "sent_s": [5.0, 2.0, 0.0, 1.0, 6.0, 0.0, 0.0],
        "finish_s": [6.0, 3.0, 2.5, 4.0, 7.0, 9.0, 2.0]})
    # a: [0, 2.5] u [2, 3] u [6, 7] = 4; b: [1, 4] u [5, 6] = 4
    assert component_s(t, evaluator=False) == pytest.approx(4.0)
    assert component_s(t, evaluator=True) == pytest.approx((9.0 + 2.0) / 2)
    assert component_s(t[t.kind == "nothing"], evaluator=False) == 0.0
