"""The tokens a PyTorch engine decode step attends over (its batch padded to the longest
sequence): recovered from an exits trace's requests, and priced so in a HELIOS round."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO
from sim.families.helios.attended import attended_tokens
from sim.families.helios.profile import traced_steps
from sim.families.helios.replica import round_times
from sim.step_time.latency import LatencyModel
from traces import read_table

TRACE = REPO / "traces" / "data" / "testbed-exits-target-small-cpu"


def test_a_traced_decode_batch_attends_over_its_longest_sequence_for_each():
    steps = traced_steps(TRACE)
    depth = steps[steps.cell_id.str.startswith("depth")]
    # every loaded depth's step accounted for by its requests (`attended_tokens` checks the
    # batch sizes): padding adds to the summed context, never takes from it
    assert (depth.attended_tokens >= depth.context_tokens).all()
    one = depth[(depth.decode_seqs == 1) & (depth.prefill_seqs == 0)]
    assert len(one) and (one.attended_tokens == one.context_tokens).all()  # nothing to pad
    mixed = depth[depth.decode_seqs > 1]
    assert (mixed.attended_tokens > mixed.context_tokens).mean() > 0.5  # the stream mixes ages
    # the layer-skipping cells serve one sequence: their context as it is
    ee = steps[steps.cell_id.str.startswith("ee")]
    assert (ee.attended_tokens == ee.context_tokens).all()


def test_requests_that_do_not_account_for_the_batches_are_refused():
    steps = read_table(TRACE, "steps").to_pandas()
    steps = steps[steps.cell_id == "depth1"].sort_values("step_id")
    requests = read_table(TRACE, "requests").to_pandas()
    mine = requests[requests.request_id.str.startswith("d1-")]
    attended_tokens(steps, mine)  # its own engine's requests: accounted for
    with pytest.raises(ValueError, match="do not account"):
        attended_tokens(steps, mine.iloc[1:])


def test_a_round_decodes_over_its_longest_prompt_when_padded():
    lm = LatencyModel((1.0, 0.0, 0.1, 0.01, 0.0))  # const, prefill, decode seqs, context, p x c
    summed, padded = round_times(lm, [10, 30], [3, 3]), round_times(lm, [10, 30], [3, 3],
                                                                  padded=True)
    assert padded["first_s"] == summed["first_s"]  # each prompt prefills over its own tokens
    # two decode steps of two sequences: contexts 42, 44 summed; 62, 64 padded to the longest
    decode = padded["end_s"] - summed["end_s"]
    assert decode == pytest.approx(2 * 0.01 * 20 / 1e3)
    same = round_times(lm, [30, 30], [3, 3])  # one length: nothing to pad
    assert round_times(lm, [30, 30], [3, 3], padded=True)["end_s"] == pytest.approx(same["end_s"])
    # the longest prompt finishes with the prefill: the one left pads to its own length only
    assert round_times(lm, [10, 30], [3, 1], padded=True)["end_s"] == \
        pytest.approx(round_times(lm, [10, 30], [3, 1])["end_s"])


@pytest.mark.parametrize("padded", [False, True])
def test_a_rounds_closed_form_is_its_steps_one_by_one(padded):
    """`round_times` (a closed-form run between finishes, sequences finishing together taken
    at once) against pricing every decode step of the round in turn."""
    rng = np.random.default_rng(4)
    lm = LatencyModel((1.0, 0.002, 0.1, 0.01, 0.0))
    for _ in range(60):
        n = int(rng.integers(1, 12))
        prompts = rng.integers(1, 200, n).tolist()
        outputs = rng.integers(0, 9, n).tolist()
        got = round_times(lm, prompts, outputs, scale=1.3, gap_ms=0.5, padded=padded)
        t_ms, finish = got["first_s"] * 1e3, [0.0] * n
        running, step = set(range(n)), 1
        while True:
            for i in [i for i in running if outputs[i] <= step]:
                finish[i] = (t_ms + (step - 1) * 0.5) / 1e3
                running.discard(i)
            if not running:
                break
            longest = max(prompts[i] for i in running) + step
            context = len(running) * longest if padded else \
                sum(prompts[i] + step for i in running)
            t_ms += lm.step_ms(0, len(running), context) * 1.3
            step += 1
        assert got["steps"] == step
        assert got["finish_s"] == pytest.approx(finish, rel=1e-9)
        assert got["end_s"] == pytest.approx((t_ms + step * 0.5) / 1e3, rel=1e-9)
