"""HELIOS read a round of tokens at a time: the policy's observations, a profile's per-prompt
sums and the replicas' plain loops give what token-by-token reading and SimPy give."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from conftest import REPO
from policies.exit_tokens import Rows, neg_log
from policies.helios import Candidate, Helios, Serve
from sim.families.helios.blocks import prompt_sums, token_index


def _candidates() -> list[Candidate]:
    return [Candidate("a", 4, 1.0, 0.5, 2.0, (8, 8, 6, 4)),
            Candidate("b", 3, 0.7, 0.5, 1.0, (8, 6, 4))]


def _reference_pht(tokens: list[list[float]], threshold: float) -> tuple[list, list]:
    """An evaluation's exit counts and -log sums, token by token as the paper's loop adds."""
    depth = len(tokens[0])
    counts, nll = [0] * depth, [0.0] * depth
    for max_probs in tokens:
        counts[next((d for d, p in enumerate(max_probs) if p >= threshold), depth - 1)] += 1
        for d, p in enumerate(max_probs):
            nll[d] += -math.log(max(p, 1e-12))
    return counts, nll


def test_an_evaluated_block_sums_as_the_token_loop_does():
    """Exit counts equal and every depth's -log sum equal to the last bit, whatever the split
    of the tokens into blocks (probabilities of exactly 0 and 1 included)."""
    rng = np.random.default_rng(11)
    for _ in range(40):
        n = int(rng.integers(1, 300))
        tokens = rng.choice([0.0, 1.0, 0.3, 0.95], size=(n, 4)) if rng.random() < 0.3 else \
            rng.random((n, 4))
        cuts = sorted(rng.integers(0, n, int(rng.integers(0, 4))).tolist())
        policy = Helios(_candidates(), threshold=float(rng.choice([0.5, 0.9, 1.0])))
        serve = Serve("a", 4, evaluating=True)
        for part in np.split(tokens, cuts):
            policy.observe_tokens(serve, part.tolist())
        counts, nll = _reference_pht(tokens.tolist(), policy.threshold)
        row = policy.pht["a"]
        assert (row.tokens, row.exit_counts) == (n, counts)
        assert [x.hex() for x in row.nll_at_depth] == [x.hex() for x in nll]


def test_breaches_in_a_block_decide_as_token_by_token():
    """A round's tokens observed at once leave the policy where one token at a time does: the
    pending decision and the breach window."""
    rng, decided = np.random.default_rng(5), 0
    for _ in range(60):
        window = int(rng.integers(2, 30))
        kwargs = dict(threshold=0.9, cbc_max=int(rng.integers(0, window)), window=window,
                      reassess_every=1000, eval_prompts=1)
        one, block = Helios(_candidates(), **kwargs), Helios(_candidates(), **kwargs)
        evaluated = {"a": rng.random((5, 4)), "b": rng.random((5, 3))}
        for p in (one, block):  # evaluate both candidates, then select
            for name, depth in (("a", 4), ("b", 3)):
                p.next_prompt()
                p.observe_tokens(Serve(name, depth, evaluating=True), evaluated[name])
            serve = p.next_prompt()
        for _round in range(int(rng.integers(1, 4))):
            probs = rng.random((int(rng.integers(0, 80)), serve.depth)) ** 0.2
            for token in probs.tolist():
                one.observe(serve, token)
            block.observe_tokens(serve, probs)
            assert one.pending == block.pending
            assert one.breaches.flags.tolist() == block.breaches.flags.tolist()
            decided += one.pending is not None
    assert decided > 20

def test_a_block_refuses_tokens_of_unequal_exits():
    with pytest.raises(ValueError, match="one max probability per loaded exit"):
        Rows([[0.5, 0.6], [0.7]])
    assert Rows([]).rows().shape == (0, 0)


def test_per_prompt_sums_are_pythons_sum_bit_for_bit():
    """Each prompt's -log probabilities added in token order from the first, as
    `float(-sum(math.log(...)))` gives (-0.0 where every token is certain, 0.0 where none)."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(0, 40, 300)
    lengths[:3] = (0, 5, 1)
    values = rng.choice([1.0, 0.5, 0.25, 1e-15], size=int(lengths.sum()))
    values[lengths[0]:lengths[0] + 5] = 1.0
    starts = np.r_[0, np.cumsum(lengths)]
    got = prompt_sums(neg_log(values), starts)
    want = [float(-sum(math.log(max(x, 1e-12)) for x in values[a:b].tolist()))
            for a, b in zip(starts[:-1], starts[1:])]
    assert [x.hex() for x in got.tolist()] == [x.hex() for x in want]
    assert math.copysign(1, got[1]) == -1 and math.copysign(1, got[0]) == 1
    same = np.r_[0:5 * 7 + 1:7]  # prompts of one length: no padding
    assert prompt_sums(neg_log(values[:35]), same).tolist() == \
        [float(-sum(math.log(max(x, 1e-12)) for x in values[a:a + 7].tolist())) for a in same[:-1]]


def test_a_rounds_tokens_are_its_prompts_in_turn():
    starts = np.array([0, 3, 3, 7, 9])
    assert token_index(starts, (1, 2, 3)) == slice(3, 9)
    assert token_index(starts, (0, 3)).tolist() == [0, 1, 2, 7, 8]
    assert token_index(starts, (1, 3)).tolist() == [7, 8]


@pytest.mark.parametrize("example", ["helios-testbed.yaml", "helios-opt-whatif.yaml"])
def test_the_replicas_plain_loops_give_simpys_rows(example):
    """Replicas serving their shares each on its own clock give the rows, rounds and events
    one SimPy environment interleaving them gives."""
    from sim.config import read_yaml
    from sim.families.helios.config import Experiment
    from sim.families.helios.serving import simulate_cluster

    d = read_yaml(REPO / "examples" / example)
    d = copy.deepcopy(d)
    d["helios"].update(replicas=3, overlap_loading=True)
    if example == "helios-opt-whatif.yaml":
        for phase in d["helios"]["what_if"]["phases"]:
            phase["prompts"] = 200
    exp = Experiment(d, REPO / "examples")
    h = exp.spec.helios
    for spec in h.policies:
        runs = [simulate_cluster(lambda prompts: exp.program(spec, prompts), exp.profiles,
                                 exp.num_prompts, h.replicas, h.router, exp.max_tokens,
                                 h.overlap_loading, simpy_events=events)
                for events in (False, True)]
        assert runs[0].requests.equals(runs[1].requests)
        assert runs[0].rounds.equals(runs[1].rounds)
        assert runs[0].events == runs[1].events and len(runs[0].requests) == exp.num_prompts


def test_a_what_if_draws_its_exits_as_numpys_choice_does():
    """`draw_exits` gives `Generator.choice`'s values (the same uniforms against the same
    cumulative shares), draw after draw from one generator."""
    from sim.families.helios.whatif import draw_exits

    rng = np.random.default_rng(8)
    for _ in range(50):
        k = int(rng.integers(1, 6)) if rng.random() < 0.8 else int(rng.integers(6, 39))
        layers = sorted(rng.choice(np.arange(1, 40), size=k, replace=False).tolist())
        shares = rng.dirichlet(np.ones(k))
        shares[rng.random(k) < 0.2] = 0.0  # layers no token exits at first
        shares = (shares / shares.sum()).tolist() if shares.sum() else [1.0] + [0.0] * (k - 1)
        shape = (int(rng.integers(0, 30)), int(rng.integers(0, 40)))
        seed = int(rng.integers(0, 1 << 30))
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        for _draw in range(2):
            want = a.choice(layers, size=shape, p=shares)
            got = draw_exits(b, layers, shares, shape)
            assert got.dtype == np.int16 and np.array_equal(got, want)
    a, b = np.random.default_rng(2), np.random.default_rng(2)
    for shape in ((3, 70_000), (2, 32_768)):  # past a stretch of uniforms, and exactly one
        assert np.array_equal(draw_exits(b, [4, 9, 16], [0.2, 0.5, 0.3], shape),
                              a.choice([4, 9, 16], size=shape, p=[0.2, 0.5, 0.3]))


def test_a_what_if_stream_reads_a_round_as_its_token_rows_do():
    """A what-if stream's compiled reads of a round (breach flags, per-prompt -log sums,
    evaluation exit counts and per-exit sums) equal the array reads of the same tokens' rows,
    value for value and bit for bit: at exit and non-exit depths, past the deepest first exit,
    for rounds of any prompts (empty ones included) and thresholds."""
    from sim.families.helios.blocks import DepthStream, RoundBlock
    from sim.families.helios.whatif import SyntheticStreams

    rng = np.random.default_rng(21)
    for _ in range(60):
        layers = int(rng.integers(2, 12))
        inner = int(rng.integers(0, layers - 1))
        inner = rng.choice(np.arange(1, layers), size=inner, replace=False)
        exit_layers = sorted(inner.tolist()) + [layers]
        lengths = rng.integers(0, 40, int(rng.integers(1, 30)))
        starts = np.r_[0, np.cumsum(lengths)]
        deepest = exit_layers[int(rng.integers(0, len(exit_layers)))]
        first = rng.choice([x for x in exit_layers if x <= deepest], size=int(starts[-1]))
        streams = SyntheticStreams(first.astype(rng.choice([np.int16, np.uint8])), starts,
                                   exit_layers, layers)
        depth = int(rng.integers(1, layers + 1))
        fast = streams[depth]
        rows = DepthStream(fast.rows(slice(None)), None, starts)
        prompts = rng.choice(len(lengths), size=int(rng.integers(1, len(lengths) + 1)),
                             replace=False)
        a, b = RoundBlock(fast, prompts), RoundBlock(rows, prompts)
        for threshold in (0.2, 0.3, 0.5, 0.95, 1.0):
            assert np.array_equal(a.below(threshold), b.below(threshold))
            assert np.array_equal(a.exit_counts(threshold), b.exit_counts(threshold))
        assert [x.hex() for x in a.prompt_nll()] == [x.hex() for x in b.prompt_nll()]
        start = rng.random(depth) * 10
        assert [x.hex() for x in a.exit_neglog_sums(start)] == \
            [x.hex() for x in b.exit_neglog_sums(start)]
