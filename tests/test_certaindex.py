"""Certaindex policies: probe consistency (agreement required), answer entropy, rewards."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.certaindex import (Certaindex, Probe, ProbeConsistency, answer_certainty,
                                 is_hesitant, probe_from_text, reward_certainty)


def _probes(answers, hesitant=()):
    return [Probe(32 * (i + 1), a, i in hesitant) for i, a in enumerate(answers)]


def test_hesitation_matches_words_not_substrings():
    assert is_hesitant("7} wait") and is_hesitant("Hmm, 3") and is_hesitant("no}")
    assert not is_hesitant("7} not known") and not is_hesitant("3} nothing, button")


def test_agreeing_window_stops_and_hesitation_blocks():
    policy = ProbeConsistency(window=3)
    assert not policy.should_stop(_probes(["4", "4"]))
    assert policy.should_stop(_probes(["1", "4", "4", "4"]))
    assert not policy.should_stop(_probes(["4", "4", "4"], hesitant={1}))
    assert not policy.should_stop(_probes(["", "", ""]))
    assert policy.stop_index(_probes(["1", "2", "2", "2", "2"])) == 3
    assert probe_from_text(64, "12} hmm").hesitant and probe_from_text(64, "12}").answer == "12"


@given(st.lists(st.sampled_from(["1", "2", "3", ""]), min_size=0, max_size=12),
       st.integers(1, 5))
def test_disagreeing_answers_never_stop(answers, window):
    # The public reference's server path stops once it holds `window` answers; ours must not.
    policy = ProbeConsistency(window=window)
    stops = policy.should_stop(_probes(answers))
    last = answers[-window:]
    assert stops == (len(answers) >= window and last[0] != "" and len(set(last)) == 1)


def test_presets_and_bad_input():
    assert ProbeConsistency.preset("crazy") == ProbeConsistency(window=2, every_tokens=32)
    with pytest.raises(ValueError, match="unknown effort"):
        ProbeConsistency.preset("extreme")
    with pytest.raises(ValueError, match="window"):
        ProbeConsistency(window=0)


def test_entropy_and_reward_certainty():
    assert answer_certainty(["3"] * 8) == 1.0
    assert answer_certainty([str(i) for i in range(8)]) == pytest.approx(0.0)
    assert 0 < answer_certainty(["3", "3", "3", "5"]) < 1
    assert answer_certainty([None, None]) == 1.0  # all missing: one group
    assert answer_certainty([None, "", "3", "3"]) == answer_certainty(["", "", "3", "3"]) == \
        answer_certainty(["5", "5", "3", "3"])  # None and "" are the same missing group
    assert reward_certainty([0.2, 0.8], "mean") == pytest.approx(0.5)
    assert reward_certainty([0.2, 0.8], "max") == 0.8
    both = Certaindex(entropy_threshold=0.5, reward_threshold=0.6, reward_aggregate="max")
    assert both.is_certain(["3"] * 4, [0.1, 0.7])
    assert not both.is_certain(["3"] * 4, [0.1, 0.5])
    assert not both.is_certain(["1", "2", "3", "4"], [0.9])
    with pytest.raises(ValueError):
        Certaindex()
    with pytest.raises(ValueError):
        reward_certainty([], "mean")
