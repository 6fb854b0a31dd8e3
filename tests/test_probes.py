"""`reasonsim trace probes` on real vLLM with the testbed target, and offline certaindex replay."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from policies.certaindex import ProbeConsistency
from programs.traced import load_trajectories
from sim.families.dynasor.reasoning import budget_outcome, certaindex_outcome
from traces import check_trace, read_table

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def probes_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("probes") / "t"
    run_cli("trace", "probes", "-o", str(out), "--questions", "1", "--samples", "2",
            "--stride", "16", "--budget", "192", "-q")
    return out


def test_probe_trace_is_complete_and_incremental(probes_trace):
    assert check_trace(probes_trace) == []
    trajs = read_table(probes_trace, "trajectories").to_pandas()
    probes = read_table(probes_trace, "probes").to_pandas()
    assert len(trajs) == 8 * 2  # 2 families x 4 levels x 1 question x 2 samples
    assert set(trajs.request_id) == set(probes.request_id)
    for rid, g in probes.groupby("request_id"):
        t = trajs[trajs.request_id == rid].iloc[0]
        g = g.sort_values("position_tokens")
        # One probe per chunk, never stopped early: the last probe sits at the trajectory's end.
        assert g.position_tokens.iloc[-1] == t.reasoning_tokens
        assert (g.position_tokens.diff().dropna() <= 16).all()
        # Chunks are stored once each; together they are the reasoning, with its final answer.
        text = "".join(g.chunk_text)
        if t.final_answer is not None:
            assert f"\\boxed{{{t.final_answer}}}" in text
    # Probes re-send the reasoning prefix: prefix caching serves most of it.
    assert (probes.cached_prompt_tokens > 0).mean() > 0.5
    # The trained target answers probes with digits, and late probes agree with the gold answer
    # more often than early ones.
    assert (~probes.is_empty).mean() > 0.8
    late = probes[probes.position_tokens >= probes.groupby("request_id").position_tokens
                  .transform("max")]
    early = probes[probes.position_tokens <= 16]
    assert late.is_correct.mean() > early.is_correct.mean()


def test_offline_certaindex_and_budgets(probes_trace, tmp_path):
    trajs, stride = load_trajectories(probes_trace)
    assert stride == 16
    for t in trajs:
        full = certaindex_outcome(t, ProbeConsistency(window=50, every_tokens=16), stride)
        assert not full.stopped_early and full.reasoning_tokens == t.reasoning_tokens
        eager = certaindex_outcome(t, ProbeConsistency(window=2, every_tokens=16), stride)
        assert eager.reasoning_tokens <= t.reasoning_tokens
        assert budget_outcome(t, 10_000).answer == t.final_answer
    with pytest.raises(ValueError, match="multiple of the traced stride"):
        certaindex_outcome(trajs[0], ProbeConsistency(window=2, every_tokens=24), stride)
    proc = run_cli("dynasor", "offline", str(probes_trace), "-o", str(tmp_path), "--json")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (tmp_path / "tokens_to_accuracy.png").stat().st_size > 0
    budgets = [r for r in rows if r["policy"] == "budget"]
    assert budgets[0]["tokens_mean"] < budgets[-1]["tokens_mean"]
