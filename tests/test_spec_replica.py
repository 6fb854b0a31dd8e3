"""The simulator's in-engine speculative decoding (`sim.engine.spec_decode`): accepted-length draws,
iterations per request, the fast path against one event per iteration, and the guards that keep
a speculative calibration and a plain one apart."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from conftest import REPO, run_cli
from sim.config import parse_config
from sim.simulate import simulate
from sim.engine.spec_decode import from_rates, from_trace

SPEC_CAL = REPO / "sim" / "data" / "testbed-large-spec-k4-cpu.calib.json"
PLAIN_CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
SPEC_TRACE = REPO / "traces" / "data" / "testbed-spec-cpu"


def _config(rates=None, trace=None, rate_per_s=0.01, n=12, cal=SPEC_CAL, seed=3) -> dict:
    spec = {"acceptance_rates": rates} if rates is not None else \
        {"acceptance_trace": str(trace)} if trace is not None else None
    group = {"calibration": str(cal)} | ({"speculative": spec} if spec else {})
    return {"seed": seed, "workload": {
        "arrival": {"kind": "poisson", "rate_per_s": rate_per_s}, "num_requests": n,
        "prompt_tokens": {"kind": "uniform", "low": 32, "high": 200},
        "output_tokens": {"kind": "uniform", "low": 20, "high": 150}},
        "cluster": {"replicas": [group]}}


def test_synthetic_rates_give_vllms_accepted_length_distribution():
    s = from_rates([0.8, 0.6, 0.3])  # P(A >= 1) = 0.8, P(A >= 2) = 0.6, P(A >= 3) = 0.3
    assert s.k == 3 and np.allclose(s.accepted_share, [0.2, 0.2, 0.3, 0.3])
    assert s.tokens_per_iteration == pytest.approx(1 + 0.8 + 0.6 + 0.3)
    cum = s.cumulative_tokens(np.random.default_rng(0), 10_000)
    steps = np.diff(np.concatenate([[0], cum]))
    assert cum[-1] == 10_000 and steps.min() >= 1 and steps.max() <= 4
    assert steps[:-1].mean() == pytest.approx(2.7, rel=0.03)
    for bad in ([0.5, 0.7], [1.2], []):  # increasing, out of range, empty
        with pytest.raises(ValueError, match="non-increasing"):
            from_rates(bad)


def test_a_traced_distribution_is_drawn_request_by_request():
    s = from_trace(SPEC_TRACE, 4)
    assert s.k == 4 and len(s.per_request) > 10
    means = [np.dot(np.arange(5), p) for p in s.per_request]
    assert np.ptp(means) > 0.5  # requests differ: that spread is what each request keeps
    with pytest.raises(ValueError, match="no verify steps for K = 3"):
        from_trace(SPEC_TRACE, 3)


def test_iterations_follow_acceptance_one_request_at_a_time():
    """Requests never overlap at this rate: a request takes 1 prefill iteration plus one per
    decoded token when nothing is accepted, and ceil((output - 1) / (K + 1)) when all is."""
    none = simulate(parse_config(_config(rates=[0.0] * 4), "."))
    every = simulate(parse_config(_config(rates=[1.0] * 4), "."))
    out = none.requests.column("output_tokens").to_numpy()
    assert np.array_equal(out, every.requests.column("output_tokens").to_numpy())
    assert none.summary["iterations"] == len(out) + int((out - 1).sum())
    assert every.summary["iterations"] == len(out) + int(np.ceil((out - 1) / 5).sum())
    # five tokens a verify step
    assert every.summary["tpot_s"]["p50"] < none.summary["tpot_s"]["p50"] / 3


def test_fast_path_equals_one_event_per_iteration_under_speculation():
    cfg = parse_config(_config(trace=SPEC_TRACE, rate_per_s=6.0, n=60), ".")
    fast, slow = simulate(cfg), simulate(cfg, fast_forward=False)
    assert fast.summary["events"] < slow.summary["events"] / 3
    assert fast.summary["iterations"] == slow.summary["iterations"]
    for col in ("first_token_s", "finish_s"):
        f = fast.requests.column(col).to_numpy()
        s = slow.requests.column(col).to_numpy()
        # the fast path grows the context by the mean tokens an iteration yields
        assert np.allclose(f, s, rtol=0.01), col


def test_a_calibration_and_its_group_must_agree_on_speculation(tmp_path):
    with pytest.raises(ValueError, match="fitted on speculative steps"):
        simulate(parse_config(_config(), "."))
    with pytest.raises(ValueError, match="fitted on plain decode steps"):
        simulate(parse_config(_config(rates=[0.5] * 4, cal=PLAIN_CAL), "."))
    with pytest.raises(ValueError, match="3 acceptance rates for a calibration fitted at K = 4"):
        simulate(parse_config(_config(rates=[0.5] * 3), "."))
    both = _config(rates=[0.5] * 4)
    both["cluster"]["replicas"][0]["speculative"]["acceptance_trace"] = str(SPEC_TRACE)
    with pytest.raises(ValueError, match="exactly one of"):
        simulate(parse_config(both, "."))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_config(rates=[0.5] * 4) | {"seed": 1}))
    bad = yaml.safe_load(path.read_text())
    bad["cluster"]["replicas"][0]["speculative"]["acceptance_rate"] = 0.5  # a typo: refused
    path.write_text(yaml.safe_dump(bad))
    proc = run_cli("simulate", str(path), check=False)
    assert proc.returncode != 0 and "acceptance_rate" in proc.stderr


def test_calibrate_fits_one_k_of_a_spec_trace(tmp_path):
    proc = run_cli("calibrate", str(SPEC_TRACE), "-o", str(tmp_path / "x.json"), check=False)
    assert proc.returncode != 0 and "--spec-k" in proc.stderr
    run_cli("calibrate", str(SPEC_TRACE), "--spec-k", "2", "-o", str(tmp_path / "k2.json"))
    prov = json.loads((tmp_path / "k2.json").read_text())["provenance"]
    assert prov["speculative"]["k"] == 2 and prov["speculative"]["draft_model_id"]
    proc = run_cli("calibrate", str(REPO / "traces" / "data" / "testbed-large-cpu"),
                   "--spec-k", "2", "-o", str(tmp_path / "y.json"), check=False)
    assert proc.returncode != 0 and "without speculation" in proc.stderr


def test_testbed_prompts_have_the_workload_lengths_and_the_testbeds_text():
    from transformers import AutoTokenizer

    from testbed.tasks import testbed_prompts
    from testbed import tasks

    tok = AutoTokenizer.from_pretrained(str(REPO / "models" / "testbed" / "target-large"))
    lengths = [5, 40, 300]
    prompts = testbed_prompts(tok, lengths, seed=1)
    assert [len(p) for p in prompts] == lengths
    first = tasks.items(1, 64)[1].prompt  # request i starts at question i
    assert tok.decode(prompts[1]).startswith(first[:20])
    cfg = _config(rates=[0.5] * 4)
    cfg["workload"]["prompt_text"] = "lorem"
    with pytest.raises(ValueError, match="workload.prompt_text: Input should be 'random' or 'testbed'"):
        simulate(parse_config(cfg, "."))


def test_programs_on_speculative_replicas_answer_the_same_in_less_time():
    """Dynasor CoT with probes on K = 4 speculative replicas (`examples/dynasor-cot-spec-k4.yaml`):
    with the spec trace's acceptance the programs answer exactly as with none accepted (the
    same questions right, tokens within 1%: only the reasoning decoded while a probe runs
    depends on time), and their latency falls (more tokens per verify step)."""
    d = yaml.safe_load((REPO / "examples" / "dynasor-cot-spec-k4.yaml").read_text())
    d["workload"]["programs"]["count"] = 64
    summaries = {}
    for name, spec in (("trace", d["cluster"]["replicas"][0]["speculative"]),
                       ("none", {"acceptance_rates": [0.0] * 4})):
        d["cluster"]["replicas"][0]["speculative"] = spec
        summaries[name] = simulate(parse_config(d, REPO / "examples")).summary
    got, none = summaries["trace"], summaries["none"]
    assert got["accuracy"] == none["accuracy"]
    assert got["tokens_per_program"] == pytest.approx(none["tokens_per_program"], rel=0.01)
    assert got["program_latency_s"]["p50"] < 0.7 * none["program_latency_s"]["p50"]


def test_a_tot_trace_gives_program_level_acceptance_to_offline_and_to_replicas():
    """A ToT trace's full chain-draft rounds are verify steps of K with the exact acceptance rule
    (sampled too, which this CPU build's engine gets wrong); tree drafts and rounds cut at a
    thought's end are left out; a trace with no verifications is refused by name."""
    from sim.engine.speculative import acceptance, spec_rows
    from traces.store import read_table

    tot = REPO / "traces" / "data" / "testbed-tot-sampled-cpu"
    rows = spec_rows(tot)
    t = read_table(tot, "tot_requests").to_pandas()
    verify = t[t.kind == "verify"]
    assert 0 < len(rows) < len(verify)  # partial rounds and tree programs are not K-rounds
    assert (rows.proposed_tokens == 4).all() and not rows.request_id.str.contains("-k").any()
    (acc,) = acceptance(rows)
    assert acc["k"] == 4 and acc["temperature"] == 0.7
    assert acc["acceptance_rate"] == pytest.approx(rows.accepted_tokens.sum() / (4 * len(rows)))
    spec = from_trace(tot, 4, 0.7)
    assert spec.tokens_per_iteration == pytest.approx(acc["tokens_per_step"])
    assert len(spec.per_request) == rows.request_id.nunique()
    with pytest.raises(ValueError, match="without verify steps"):
        spec_rows(REPO / "traces" / "data" / "testbed-large-cpu")
    out = run_cli("seed", "offline", str(tot), "--json")
    assert json.loads(out.stdout)["acceptance"][0]["steps"] == len(rows)
