"""Speculative decoding on vLLM (draft-model, in-engine): the spec trace, and the correctness
property of speculative decoding: greedy output equals the target's own greedy output."""

from __future__ import annotations

import pytest

from conftest import TESTBED, run_cli

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def spec_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("spec") / "trace"
    run_cli("trace", "spec", "-o", str(out), "--k", "3", "--batch-sizes", "1,4",
            "--questions", "4", "--max-tokens", "96", "--temperatures", "0,0.8",
            "--prompt-tokens", "0,160", "-q")
    return out


def test_spec_trace_validates_and_records_acceptance(spec_trace):
    from traces.store import read_table

    run_cli("traces", "check", str(spec_trace))
    s = read_table(spec_trace, "spec_steps").to_pandas()
    steps = read_table(spec_trace, "steps").to_pandas()
    assert set(s.num_speculative_tokens) == {3} and set(s.temperature) == {0.0, 0.8}
    assert (s.accepted_tokens <= s.proposed_tokens).all() and (s.proposed_tokens <= 3).all()
    # accepted positions are a prefix: the first rejection ends the accepted run
    for pos, n in zip(s.accepted_positions, s.accepted_tokens):
        assert list(pos) == [i < n for i in range(len(pos))]
    greedy = s[s.temperature == 0]
    assert 0.3 < greedy.accepted_tokens.sum() / greedy.proposed_tokens.sum() <= 1.0
    assert (s.draft_ms > 0).all() and set(s.step_id) <= set(steps.step_id)
    assert steps.cell_id.str.startswith("k3-t").all()  # every step names its K and wave
    # a second pass of the waves at 160-token prompts cut from the testbed's questions
    req = read_table(spec_trace, "requests").to_pandas()
    long = req.request_id.str.contains("-p160-")
    assert long.sum() == (~long).sum() and (req[long].prompt_tokens == 160).all()
    assert (req[~long].prompt_tokens < 160).all()


def test_greedy_speculative_output_equals_the_targets_greedy_output():
    """Token for token, over held-out questions, with K = 3 and batches of 4."""
    import os
    import subprocess
    import sys

    code = f"""
from vllm import SamplingParams
from engines.vllm_engine import reasoning_engine
from tracers.spec import spec_engine
from testbed import tasks
def run(engine, prompts):
    for i, p in enumerate(prompts):
        engine.add(str(i), p, SamplingParams(max_tokens=96, temperature=0))
    out = {{}}
    while engine.has_unfinished():
        for o in engine.step()[0]:
            if o.finished:
                out[o.request_id] = list(o.outputs[0].token_ids)
    return [out[str(i)] for i in range(len(prompts))]
plain = reasoning_engine("{TESTBED / 'target-large'}", 0, 0.25)
tok = plain.engine.get_tokenizer()
prompts = [tok.encode(it.prompt, add_special_tokens=False) for it in tasks.items(3, 8)]
want = run(plain, prompts)
spec = spec_engine("{TESTBED / 'target-large'}", "{TESTBED / 'draft'}", 3, 0, 0.25)
got = run(spec, prompts)
same = sum(a == b for a, b in zip(got, want))
print("SAME", same, len(want), sum(map(len, want)))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=1200, env=os.environ)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("SAME")), None)
    assert line is not None, proc.stderr[-3000:]
    same, n, tokens = map(int, line.split()[1:])
    assert same == n and tokens > 8 * 20


def test_seed_offline_reports_acceptance_and_step_costs(spec_trace, tmp_path):
    import json

    proc = run_cli("seed", "offline", str(spec_trace), "--json", "-o", str(tmp_path))
    result = json.loads(proc.stdout)
    acc = {(r["k"], r["temperature"]): r for r in result["acceptance"]}
    assert set(acc) == {(3, 0.0), (3, 0.8)}
    for r in acc.values():
        assert abs(sum(r["accepted_length_share"]) - 1) < 1e-9
        assert len(r["position_acceptance"]) == 3
        # acceptance can only fall along the draft: position i needs every earlier one
        assert all(a >= b - 1e-12 for a, b in zip(r["position_acceptance"],
                                                  r["position_acceptance"][1:]))
    assert all(c["step_ms"] >= c["draft_ms"] for c in result["step_costs"])
    assert (tmp_path / "acceptance.png").stat().st_size > 0
    bad = run_cli("seed", "offline", str(TESTBED.parent.parent / "traces" / "data" /
                                          "testbed-probes-cpu"), check=False)
    assert bad.returncode == 2 and "without verify steps" in bad.stderr


def test_a_speculative_replica_replays_live_and_simulates_its_iterations(spec_trace, tmp_path):
    """Calibrate the trace's K = 3 steps, replay a workload live on a speculative engine (which
    records its own acceptance), then simulate it with that acceptance: the simulated replica
    runs its requests through as many decode iterations as the live engine did."""
    import json

    import numpy as np
    import yaml

    from traces.store import read_run, read_table

    cal = tmp_path / "k3.json"
    run_cli("calibrate", str(spec_trace), "--spec-k", "3", "-o", str(cal))
    config = {"seed": 2, "workload": {
        "arrival": {"kind": "poisson", "rate_per_s": 1.0}, "num_requests": 8,
        "prompt_tokens": {"kind": "uniform", "low": 32, "high": 128},
        "output_tokens": {"kind": "uniform", "low": 32, "high": 96}},
        "cluster": {"replicas": [{"calibration": str(cal),
                                  "speculative": {"acceptance_trace": str(spec_trace)}}]}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(config))
    live = tmp_path / "live"
    run_cli("replay", str(path), "-o", str(live), "--json")
    run_cli("traces", "check", str(live))
    assert read_run(live)["params"]["engine"]["speculative"]["k"] == 3
    s = read_table(live, "spec_steps").to_pandas()
    req = read_table(live, "requests").to_pandas().set_index("request_id")
    assert len(s) > 50 and (s.accepted_tokens <= 3).all() and (s.proposed_tokens == 3).all()
    # a verified step yields accepted + 1 tokens; with the prefill's token and the last
    # (unrecorded) step, that makes each request's output
    gained = s.groupby("request_id").accepted_tokens.sum() + s.groupby("request_id").size()
    assert (gained + 1 <= req.output_tokens.loc[gained.index]).all()
    assert (req.output_tokens.loc[gained.index] - gained - 1 <= 4).all()
    # the live run is a calibration source of its own K, and nothing else's
    run_cli("calibrate", str(live), "--spec-k", "3", "-o", str(tmp_path / "here.json"))
    assert run_cli("calibrate", str(live), "-o", str(tmp_path / "x.json"),
                   check=False).returncode != 0
    config["cluster"]["replicas"][0]["speculative"] = {"acceptance_trace": str(live)}
    path.write_text(yaml.safe_dump(config))
    sim = tmp_path / "sim"
    summary = json.loads(run_cli("simulate", str(path), "-o", str(sim), "--json").stdout)
    # Sequence-iterations (a step's decode sequences, summed over steps): each request's count
    # is set by its tokens and its acceptance, not by what it was batched with, so it does not
    # move with the machine's speed as the number of steps does (331 live against 266
    # simulated on a busy machine: slower steps batch more requests together).
    live_seq_its = int(read_table(live, "steps").to_pandas().decode_seqs.sum())
    sim_seq_its = int(read_table(sim, "steps").to_pandas().decode_seqs.sum())
    assert abs(sim_seq_its / live_seq_its - 1) < 0.15, (sim_seq_its, live_seq_its)
    assert summary["output_tokens"] == int(np.sum(req.output_tokens))
