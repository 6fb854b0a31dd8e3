"""Greedy speculative decoding on two PyTorch engines (`tracers/torch_spec_trace.py`): the
output is the target's own greedy output, and the trace reads as vLLM's spec trace does."""

from __future__ import annotations

import json

from conftest import TESTBED, run_cli
from testbed import lm, tasks
from engines.pytorch.engine import TorchEngine, TorchSpec
from tracers.torch_spec_trace import SpecPair, _Request

TARGET, DRAFT = str(TESTBED / "target-large"), str(TESTBED / "draft")


def test_greedy_speculative_output_equals_the_targets_greedy_output():
    items = tasks.items(7, 5)
    prompts = [lm.encode(it.prompt) for it in items]
    ref = TorchEngine(TorchSpec(model=TARGET, max_num_seqs=5, max_model_len=256))
    for i, p in enumerate(prompts):
        ref.add(f"q{i}", p, 40)
    want = {}
    while ref.has_unfinished():
        for rid in ref.step().finished:
            want[rid] = ref.output_ids(rid)
    for k in (1, 3, 5):
        engines = [TorchEngine(TorchSpec(model=m, max_num_seqs=5, max_model_len=256))
                   for m in (TARGET, DRAFT)]
        pair = SpecPair(*engines, max_tokens=40)
        reqs = [_Request(f"q{i}", it, len(p), 0.0) for i, (it, p) in enumerate(zip(items, prompts))]
        got, accepted = {}, 0
        _, done = pair.start(reqs, prompts)
        got |= {r.rid: r.out for r in done}
        while pair.live:
            _, _, acc, done = pair.round(k)
            accepted += sum(acc.values())
            got |= {r.rid: r.out for r in done}
        assert got == want, k
        assert accepted > 0  # the draft is trained on the same task: proposals do land
        assert not engines[0].running and not engines[1].running  # every slot released


def test_torch_spec_trace_is_a_spec_trace_for_calibrate_and_seed_offline(tmp_path):
    from traces import check_trace, read_run, read_table

    out = tmp_path / "spec"
    proc = run_cli("trace", "spec", "--engine", "torch", "--k", "2", "--batch-sizes", "1,3",
                   "--questions", "3", "--max-tokens", "24", "--temperatures", "0",
                   "-o", str(out), "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    assert check_trace(out) == []
    run = read_run(out)
    assert (run["kind"], run["engine"]) == ("spec", "torch")
    spec = read_table(out, "spec_steps").to_pandas()
    assert (spec.accepted_tokens <= spec.proposed_tokens).all()
    assert spec.accepted_tokens.sum() / spec.proposed_tokens.sum() > 0.3
    assert (spec.draft_ms > 0).all() and (spec.verify_ms > 0).all()
    reqs = read_table(out, "requests").to_pandas()
    assert len(reqs) == 2 * 3 and (reqs.output_tokens <= 24).all()
    cal = tmp_path / "spec.calib.json"
    proc = run_cli("calibrate", str(out), "--spec-k", "2", "-o", str(cal), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(cal.read_text())["provenance"]["speculative"]["k"] == 2
    proc = run_cli("seed", "offline", str(out))
    assert proc.returncode == 0 and "Speculative decoding" in proc.stdout, proc.stderr
    bad = run_cli("trace", "spec", "--engine", "torch", "--temperatures", "0.8",
                  "-o", str(tmp_path / "bad"), check=False)
    assert bad.returncode != 0 and "greedy acceptance only" in bad.stderr
    one = run_cli("trace", "spec", "--engine", "torch", "--k", "2", "--batch-sizes", "1",
                  "--questions", "1", "--max-tokens", "8", "--temperatures", "0",
                  "-o", str(tmp_path / "one"), "--json", "-q", check=False)
    assert one.returncode == 0, one.stderr  # a batch-1 grid warms up on its one slot
