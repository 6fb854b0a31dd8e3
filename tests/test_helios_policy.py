"""The HELIOS policy (pure) and the round program: evaluation, greedy depth, CBC, re-assessment."""

from __future__ import annotations

import pytest

from policies.helios import Candidate, EarlyExitFull, Helios, RepositoryEntry, Static, shortlist
from programs.helios import HeliosProgram

BIG = Candidate("big", layers=4, layer_ms=1.0, fixed_ms=0.5, load_ms_per_layer=10.0,
                batch_at_depth=(32, 16, 10, 8))
SMALL = Candidate("small", layers=2, layer_ms=1.2, fixed_ms=0.2, load_ms_per_layer=5.0,
                  batch_at_depth=(16, 12))


def _evaluate(h: Helios, exits: dict[str, list[int]], confident: float = 0.95):
    """Run the evaluation phase; each model's tokens first reach the threshold at `exits`."""
    for _ in range(h.eval_prompts * len(h.order)):
        s = h.next_prompt()
        assert s.evaluating and s.depth == h.candidates[s.model].layers
        for first in exits[s.model]:
            h.observe(s, [confident if d + 1 >= first else 0.2 for d in range(s.depth)])


def test_evaluation_phase_then_greedy_selection_and_reassessment():
    h = Helios([BIG, SMALL], eval_prompts=2, reassess_every=10)
    _evaluate(h, {"big": [1, 1, 1, 4], "small": [2, 2, 2, 2]})
    assert [(i, s.event, s.model) for i, s in h.events] == [(0, "evaluate", "big"),
                                                            (2, "evaluate", "small")]
    # big: 75% of tokens exit at layer 1 -> greedy depth 1 (coverage 0.5); small needs 2.
    assert h.greedy_depth("big") == 1 and h.greedy_depth("small") == 2
    s = h.next_prompt()
    # throughput: big@1 costs (0.5 + 1.0) / 32 per token, small@2 (0.2 + 2.4) / 12.
    assert (s.model, s.depth, s.event) == ("big", 1, "select")
    assert h.same_after() == 10 - 1 - 4  # until the next re-assessment
    for _ in range(5):
        h.next_prompt()
    again = h.next_prompt()
    assert again.evaluating and again.event == "evaluate" and h.prompt_index == 11


def test_breaches_beyond_cbc_max_load_more_or_switch_by_estimated_cost():
    h = Helios([BIG, SMALL], eval_prompts=1, reassess_every=1000, cbc_max=3, window=10,
               horizon_tokens=100)
    _evaluate(h, {"big": [1, 1, 4], "small": [1, 1, 1]})
    s = h.next_prompt()
    assert (s.model, s.depth) == ("big", 1)
    for _ in range(3):  # at the limit: no decision yet
        h.observe(s, [0.1])
    assert h.next_prompt() == type(s)("big", 1)
    h.observe(s, [0.1])  # the 4th breach in the window
    nxt = h.next_prompt()
    # load big to 4: 3 x 10 ms + 100 x (0.5 + 4) / 8 = 86 ms; switch to small@1: 5 + 100 x 1.4 / 16
    assert (nxt.event, nxt.model, nxt.depth) == ("switch", "small", 1)
    assert h.events[-1] == (h.prompt_index - 1, nxt)
    # With small loading slowly, loading big's remaining layers is cheaper.
    slow = Candidate("small", 2, 1.2, 0.2, load_ms_per_layer=500.0, batch_at_depth=(16, 12))
    h = Helios([BIG, slow], eval_prompts=1, reassess_every=1000, cbc_max=3, window=10,
               horizon_tokens=100)
    _evaluate(h, {"big": [1, 1, 4], "small": [1, 1, 1]})
    s = h.next_prompt()
    for _ in range(4):
        h.observe(s, [0.1])
    nxt = h.next_prompt()
    assert (nxt.event, nxt.model, nxt.depth) == ("load", "big", 4)


def test_strategies_pick_by_their_own_cost():
    exits = {"big": [1, 1, 1, 1], "small": [1, 1, 1, 1]}
    for strategy, want in (("throughput", "big"), ("response_time", "small"),
                           ("energy", "big")):
        h = Helios([BIG, SMALL], strategy=strategy, eval_prompts=1, reassess_every=100)
        _evaluate(h, exits)
        assert h.next_prompt().model == want, strategy
    h = Helios([BIG, SMALL], strategy="accuracy", eval_prompts=1, reassess_every=100)
    for _ in range(2):  # big's tokens are more confident at depth 1: lower perplexity
        s = h.next_prompt()
        p = 0.99 if s.model == "big" else 0.92
        h.observe(s, [p] * s.depth)
    assert h.next_prompt().model == "big"


@pytest.mark.parametrize("kwargs,message", [
    ({"strategy": "fast"}, "strategy 'fast'"),
    ({"threshold": 0.0}, "threshold and coverage"),
    ({"cbc_max": 100, "window": 100}, "0 <= cbc_max < window"),
    ({"reassess_every": 10, "eval_prompts": 5}, "must exceed the evaluation phase"),
])
def test_bad_parameters_are_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Helios([BIG, SMALL], **kwargs)


def test_rounds_never_mix_decisions_and_respect_the_batch():
    h = Helios([BIG, SMALL], eval_prompts=3, reassess_every=40)
    prog = HeliosProgram(h, 50, lambda s: h.candidates[s.model].batch_at_depth[s.depth - 1])
    sizes = []
    while (r := prog.next_round()) is not None:
        assert len(r.prompts) <= h.candidates[r.serve.model].batch_at_depth[r.serve.depth - 1]
        sizes.append((r.serve.model, r.serve.evaluating, len(r.prompts)))
        prog.finish_round([[[0.95] * r.serve.depth] * 4 for _ in r.prompts])
    # 3 + 3 evaluation prompts, then big@1 in rounds of <= 32 up to prompt 40, then again.
    assert sizes[:4] == [("big", True, 3), ("small", True, 3), ("big", False, 32),
                         ("big", False, 2)]
    assert sum(n for *_, n in sizes) == 50
    with pytest.raises(ValueError, match="round of"):
        prog.finish_round([])


def test_baselines():
    s = Static(SMALL)
    assert s.next_prompt() == s.next_prompt() and s.next_prompt().depth == 2 and not s.events
    e = EarlyExitFull(BIG, threshold=0.8).next_prompt()
    assert (e.depth, e.exit_threshold) == (4, 0.8)


def test_shortlist_takes_the_top_models_that_fit_and_are_accurate_enough():
    repo = [RepositoryEntry("a", memory_mb=10, accuracy=0.9, throughput_tok_s=100, latency_ms=5),
            RepositoryEntry("b", memory_mb=10, accuracy=0.5, throughput_tok_s=300, latency_ms=9),
            RepositoryEntry("c", memory_mb=99, accuracy=0.8, throughput_tok_s=900, latency_ms=1),
            RepositoryEntry("d", memory_mb=10, accuracy=0.2, throughput_tok_s=800, latency_ms=2),
            RepositoryEntry("e", memory_mb=10, accuracy=0.7, throughput_tok_s=200, latency_ms=5)]
    # c does not fit; d is below the accuracy floor; the rest ranked, kept in repository order.
    assert shortlist(repo, "throughput", 2, memory_mb=50, min_accuracy=0.3) == ["b", "e"]
    assert shortlist(repo, "accuracy", 2, memory_mb=50) == ["a", "e"]
    assert shortlist(repo, "response_time", 2, memory_mb=50) == ["a", "d"]  # d first, a ties e
    assert shortlist(repo, "throughput", 9, memory_mb=100) == ["a", "b", "c", "d", "e"]
    with pytest.raises(ValueError, match=r"repository\[0\] \(a\): no energy_per_token"):
        shortlist(repo, "energy", 1, memory_mb=50)


def test_an_automatic_interval_keeps_the_evaluation_within_its_share_of_serving():
    h = Helios([BIG, SMALL], eval_prompts=2, reassess_every="auto", overhead_share=0.5)
    _evaluate(h, {"big": [1, 1, 1, 4], "small": [2, 2, 2, 2]})
    s = h.next_prompt()
    assert (s.model, s.depth, s.event) == ("big", 1, "select")
    # 4 tokens a prompt; big@1 serves a token in 1.5 / 32 ms. The evaluation: big loaded whole
    # (40 ms) and small (10), their 2 prompts each at full depth over big@1 ((4.5 / 8 - 1.5 / 32)
    # and (2.6 / 12 - 1.5 / 32) ms a token), big@1 loaded back (10): 65.48 ms, at most half of
    # the other prompts' 0.1875 ms each: 699 prompts after the 4 evaluated.
    assert h.interval == 4 + 699 and h.intervals == [703]
    assert h.same_after() == 703 - 1 - 4
    for _ in range(703 - 5):
        assert not h.next_prompt().evaluating
    again = h.next_prompt()
    assert again.evaluating and again.event == "evaluate" and h.interval is None
    # Loading costs more: the same share allows a longer interval.
    slow = Candidate("small", 2, 1.2, 0.2, load_ms_per_layer=500.0, batch_at_depth=(16, 12))
    h2 = Helios([BIG, slow], eval_prompts=2, reassess_every="auto", overhead_share=0.5)
    _evaluate(h2, {"big": [1, 1, 1, 4], "small": [2, 2, 2, 2]})
    h2.next_prompt()
    assert h2.interval > h.intervals[0]


@pytest.mark.parametrize("kwargs", [{"reassess_every": "often"}, {"overhead_share": 0.0}])
def test_bad_automatic_interval_settings_are_refused(kwargs):
    with pytest.raises(ValueError, match="reassess_every|overhead_share"):
        Helios([BIG, SMALL], **kwargs)


def test_the_next_decision_is_known_early_where_tokens_cannot_change_it():
    """`planned_next` (what a standby server may load early) is the decision the next prompt
    gets whenever it names one: the evaluation's candidates and the next interval's first; the
    selection after an evaluation is the tokens' (None)."""
    h = Helios([BIG, SMALL], eval_prompts=2, reassess_every=10)
    exits = {"big": [1, 1, 1, 4], "small": [2, 2, 2, 2]}
    known = 0
    for _ in range(30):
        planned = h.planned_next()
        s = h.next_prompt()
        if planned is None:
            assert s.event == "select"
        else:
            known += 1
            assert (planned.model, planned.depth) == (s.model, s.depth)
        for first in exits[s.model]:
            h.observe(s, [0.95 if d + 1 >= first else 0.2 for d in range(s.depth)])
    assert known == 27  # 3 selections in 30 prompts
    assert Static(SMALL).planned_next() == Static(SMALL).next_prompt()


def test_the_breach_window_finds_the_token_a_per_token_count_would():
    """A prompt's flags taken at once (`BreachWindow.first_over`, in stretches from four
    windows long) stop at the token where appending one flag at a time to a window of `window`
    first holds more than `limit` breaches, and keep the window that loop keeps."""
    import random
    from collections import deque

    from policies.helios import BreachWindow

    rng = random.Random(3)
    for _ in range(400):
        window, limit = rng.randint(1, 12), 0
        limit = rng.randint(0, window - 1)
        old = [rng.random() < 0.5 for _ in range(rng.randint(0, window))]
        new = [rng.random() < rng.random() for _ in range(rng.randint(0, 200))]
        ref, want = deque(old, maxlen=window), -1
        for t, flag in enumerate(new):
            ref.append(flag)
            if sum(ref) > limit:
                want = t
                break
        b = BreachWindow(window)
        b.extend(old)
        assert b.first_over(new, limit) == want
        assert list(b.flags) == list(ref)

