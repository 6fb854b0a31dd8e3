"""The simulator's prefix cache: blocks by content, whole blocks only, scoring requests uncached."""

from __future__ import annotations

import simpy
from conftest import REPO

from policies.seed import SeedPolicy, ToTSettings
from programs.base import Outcome
from programs.seed import ToTProgram
from sim.step_time.calibration import load_calibration
from sim.engine.cluster import Device
from sim.engine.prefix_cache import PrefixCache
from sim.engine.replica import Replica, ReplicaConfig
from sim.engine.request_state import Req, Results

BS = 16


def _req(prompt: int, chain=None, group: int = 0, prefix: int | None = None,
         score_from: int = 0) -> Req:
    return Req(0, prompt, 4, group=group, prefix_tokens=prompt if prefix is None else prefix,
               chain=chain, score_from=score_from)


def _hit(cache: PrefixCache, r: Req) -> int:
    """What the replica does on admission: look the prompt up, take what was found."""
    found, own, _ = cache.lookup(r)
    return cache.take(r, found, own)


def _prefill(cache: PrefixCache, r: Req) -> None:
    """What the replica does: hit, allocate the prompt's blocks, store, compute."""
    _hit(cache, r)
    r.blocks = -(-r.prompt // BS) - r.shared
    cache.store(r, r.prompt)
    r.computed = r.prompt


def test_prompts_share_the_leading_blocks_of_equal_content_only():
    cache = PrefixCache(BS)
    q = ("q", 40)  # a 40-token question, then two different branches
    a = _req(100, chain=(q, ("a", 100)))
    _prefill(cache, a)
    assert a.shared == 100 // BS and cache.evictable == 0
    # Another branch of the same question: the two whole blocks inside the question, not the
    # third (it ends at 48, past the question, in other content).
    b = _req(90, chain=(q, ("b", 90)))
    _hit(cache, b)
    assert b.computed == 32 and b.shared == 2
    # The same content again: every whole block but the one holding the last token.
    c = _req(100, chain=(q, ("a", 100)))
    _hit(cache, c)
    assert c.computed == (100 - 1) // BS * BS == 96
    # A group's request without a chain shares up to its own prefix, never past it.
    g1, g2 = _req(80, group=7, prefix=64), _req(200, group=7, prefix=40)
    _prefill(cache, g1)
    _hit(cache, g2)
    assert g1.shared == 4 and g2.computed == 32


def test_a_scoring_request_whose_tail_is_cached_is_marked_for_a_rerun():
    # vLLM has no prompt log-probabilities for cached positions: the live engine runs it with
    # the cache, then again without.
    cache = PrefixCache(BS)
    first = _req(70, chain=(("ctx", 50), ("draft", 70)), score_from=50)
    _prefill(cache, first)
    same = _req(70, chain=(("ctx", 50), ("draft", 70)), score_from=50)
    _hit(cache, same)
    assert same.computed == 64 and same.shared == 4 and same.rescore
    other = _req(70, chain=(("ctx", 50), ("other draft", 70)), score_from=50)
    _hit(cache, other)  # only the context's blocks: 48 tokens, short of the scored tail
    assert other.computed == 48 and not other.rescore


def test_freed_blocks_are_evicted_tail_first_and_counted():
    cache = PrefixCache(BS)
    r = _req(64, chain=(("x", 64),))
    _prefill(cache, r)
    assert cache.evictable == 0 and r.shared == 4 and r.blocks == 0
    cache.unref(r)
    assert cache.evictable == 4 and r.shared == 0
    assert cache.evict(1) == 1 and cache.evictable == 3
    again = _req(64, chain=(("x", 64),))
    _hit(cache, again)  # the head survived: three blocks, not one missing at the front
    assert again.computed == 48 and cache.evictable == 0
    assert cache.evict(10) == 0  # all held


def test_a_request_finds_its_own_blocks_again_after_a_preemption():
    # vLLM caches every full block, a request's own content too: a preempted request's
    # recompute reads what it computed before, unless the pool evicted it (its tail first).
    cache = PrefixCache(BS)
    r = Req(5, 100, 60, group=0, prefix_tokens=32)  # 2 shared blocks, then its own
    _prefill(cache, r)
    r.computed, r.blocks = 130, r.blocks + 2  # decoded 30 tokens: 9 blocks, 8 full
    cache.release(r)
    assert cache.evictable == 8 and r.shared == 0 and r.blocks == 1  # the partial one
    r.blocks, r.computed, r.target = 0, 0, 130  # the replica frees it; recompute 130 tokens
    assert cache.evict(2) == 2  # the own run's last two blocks go first
    assert _hit(cache, r) == 0 and r.computed == 6 * BS and r.shared == 2 and r.blocks == 4
    other = Req(6, 100, 4, group=0, prefix_tokens=32)
    _hit(cache, other)  # another request shares the group's blocks, never r's own
    assert other.computed == 32


def _tot(policy: SeedPolicy) -> ToTProgram:
    return ToTProgram("q-1", policy, 40, 0, 5)


def test_identical_tot_siblings_name_the_same_content():
    # Greedy siblings write the same line: their verifications carry equal chains, so the
    # second finds the first's drafted tail cached; a sibling that wrote other text does not.
    prog = _tot(SeedPolicy("sd", ToTSettings(depth=2)))
    specs = []
    draft = prog.start()[0]
    for text in ("ab", "ab", "cd"):
        verify = prog.on_done(draft, Outcome(3, text=text))[0]
        specs.append(verify)
        # sd: the thought ends and is evaluated, then the next thought's draft goes
        ev = prog.on_done(verify, Outcome(4, text=text + "!", ended=True,
                                          step=(3, 3, (1, 1, 1))))[0]
        draft = prog.on_done(ev, Outcome(1, score=0.5, answer="1"))[0]
    a, b, c = specs
    assert a.prefix_chain == b.prefix_chain and a.prefix_chain != c.prefix_chain
    assert a.prefix_chain[0] == c.prefix_chain[0] == (a.prefix_chain[0][0], 40)
    assert a.prefix_chain[-1][1] == a.prompt_tokens and a.sampling.prompt_logprobs == 3


def test_a_request_admitted_in_the_same_step_reads_the_blocks_being_computed():
    # vLLM caches a block when it allocates it: siblings submitted together (a batched ToT
    # level, on the live runner's shared device) compute their shared prompt once, in one step.
    cal = load_calibration(REPO / "sim" / "data" / "testbed-large-cpu.calib.json")
    env = simpy.Environment()
    res = Results(3)
    rep = Replica(env, 0, cal, ReplicaConfig(8, 2048, BS, 1000, enable_prefix_caching=True),
                  res, None, device=Device())
    chain = (("q", 64), ("a", 100))
    for i in range(2):
        rep.submit(Req(i, 100, 4, group=0, prefix_tokens=100, chain=chain))
    rep.submit(Req(2, 100, 4, group=0, prefix_tokens=100, chain=(("q", 64), ("b", 100))))
    env.run()
    assert res.cached_tokens.tolist() == [0, 96, 64]
    assert res.scheduled_s[0] == res.scheduled_s[1] == res.scheduled_s[2]



def _same_sample_programs() -> tuple[dict, int, int]:
    """A Dynasor CoT config of programs far apart in time (each runs alone), two of which, i
    and j, draw the same question and sample: (config, i, j)."""
    from conftest import example_config
    from programs.workload import draw_seed, load_bank, plan_programs
    from sim.config import parse_config

    # 40 programs: the draw goes through the 32 questions before it repeats one
    d = example_config("dynasor-cot-certaindex.yaml", count=40, rate_per_s=0.02)
    cfg = parse_config(d, REPO / "examples")
    bank = load_bank(cfg.programs)
    for seed in range(200):
        seen = {}
        for p in plan_programs(cfg.programs, bank, draw_seed(seed, 1)):
            i = seen.setdefault((p.question_id, p.sample_ids), p.index)
            if i != p.index:
                return {**d, "seed": seed}, i, p.index
    raise AssertionError("no seed draws one question and sample twice")


def test_programs_of_one_traced_sample_share_its_cached_blocks():
    # The engine caches by content: a program that draws the question and sample another one
    # ran (the same seed, so the same tokens) finds every whole block of each prompt cached,
    # its probes' suffixes included, as vLLM's prefix cache serves them (`dynasor replay`).
    from sim.config import parse_config
    from sim.engine.cluster import build_replicas
    from sim.simulate import simulate
    from traces import ids

    d, i, j = _same_sample_programs()
    cfg = parse_config(d, REPO / "examples")
    bs = build_replicas(cfg)[0][1].block_size
    tables = []
    for compiled in (True, False):
        req = simulate(cfg, compiled=compiled).requests.to_pandas()
        tables.append(req)
        first, again = (req[req.program_id == ids.program_id(k)] for k in (i, j))
        assert len(first) == len(again) and (again.role == "probe").any()
        assert (again.prompt_tokens.to_numpy() == first.prompt_tokens.to_numpy()).all()
        assert (again.cached_prompt_tokens == (again.prompt_tokens - 1) // bs * bs).all()
        # the first shares only within itself: its first chunk finds nothing, its probes only
        # the text they continue (their suffix blocks are new)
        assert first.cached_prompt_tokens.iloc[0] == 0
        probes = first[first.role == "probe"]
        assert (probes.cached_prompt_tokens < (probes.prompt_tokens - 1) // bs * bs).any()
    assert tables[0].cached_prompt_tokens.tolist() == tables[1].cached_prompt_tokens.tolist()


def test_samples_share_their_text_as_far_as_it_agrees():
    # The testbed target writes some samples' first tokens alike (the shipped probes trace):
    # a sample's prompts name its reasoning by the lowest sample whose text equals it so far,
    # so the cache serves one sample's blocks to another up to where their texts part.
    from programs.traced import load_trajectories
    from sim.workloads.reasoning_content import PathContent

    trajs, _ = load_trajectories(REPO / "traces" / "data" / "testbed-probes-cpu")
    q = [t for t in trajs if t.question_id == trajs[0].question_id]
    # two samples whose texts agree through their second probe and part after it
    a, b = next((x, y) for x in q for y in q if x.sample_id < y.sample_id
                and x.same_text_as[:2] == y.same_text_as[:2] and len(x.probes) > 3
                and len(y.probes) > 3 and x.same_text_as[2] != y.same_text_as[2])
    assert a.same_text_as[0] == b.same_text_as[0] == min(t.sample_id for t in q)
    pa, pb = (PathContent(t.question_id, 40, t) for t in (a, b))
    agree, parted = a.probes[1].position_tokens, a.probes[2].position_tokens
    assert pa.text_key(agree) == pb.text_key(agree) and pa.text_key(parted) != pb.text_key(parted)
    cache = PrefixCache(BS)
    first = _req(40 + parted, chain=pa.text(parted))
    _prefill(cache, first)
    again = _req(40 + parted, chain=pb.text(parted))
    _hit(cache, again)
    assert again.computed == (40 + agree) // BS * BS  # the whole blocks of the text they share
    probe = _req(40 + agree + 30, chain=pa.probe(agree, 40 + agree + 30))
    _prefill(cache, probe)
    other = _req(40 + agree + 30, chain=pb.probe(agree, 40 + agree + 30))
    _hit(cache, other)  # a probe after equal text is an equal prompt: all but its last block
    assert other.computed == (40 + agree + 30 - 1) // BS * BS


def test_a1_programs_of_one_question_share_its_cached_blocks():
    # A1 programs of one question sample with one seed (`a1_program_seed`): the same prompts,
    # so a later program finds every whole block of its draft and target prompts cached (the
    # draft's on the draft pool, the target's and the scores' on the target's), as the live
    # engines serve them; every path of a program shares its question's prompt.
    from conftest import example_config
    from programs.workload import draw_seed, load_bank, plan_programs
    from sim.config import parse_config
    from sim.engine.cluster import build_replicas
    from sim.simulate import simulate
    from traces import ids

    d = example_config("a1-async.yaml", count=40, rate_per_s=0.02)
    cfg = parse_config(d, REPO / "examples")
    bank = load_bank(cfg.programs)
    seen, pair = {}, None
    for p in plan_programs(cfg.programs, bank, draw_seed(cfg.seed, 2)):
        k = seen.setdefault(p.question_id, p.index)
        if k != p.index:
            pair = (k, p.index)
            break
    assert pair, "no question drawn twice"
    bs = build_replicas(cfg)[0][1].block_size
    tables = []
    for compiled in (True, False):
        req = simulate(cfg, compiled=compiled).requests.to_pandas()
        tables.append(req)
        a, b = (req[req.program_id == ids.program_id(k)] for k in pair)
        # the same requests (their paths interleave as their own timing has them)
        assert sorted(a.prompt_tokens) == sorted(b.prompt_tokens)
        steps = b[b.output_tokens > 1]  # draft and target steps (a score generates one token)
        assert (steps.cached_prompt_tokens == (steps.prompt_tokens - 1) // bs * bs).all()
        # the first program's paths share the question's prompt among themselves
        assert (a.cached_prompt_tokens.iloc[1:] > 0).any()
    assert tables[0].cached_prompt_tokens.tolist() == tables[1].cached_prompt_tokens.tolist()
