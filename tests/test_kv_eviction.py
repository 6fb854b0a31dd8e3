"""Dynasor's program-aware KV eviction: an idle program's cached blocks go first, in the
simulator's prefix cache and in vLLM's free block queue alike.

The same scenario runs on the simulator's replica and on the real vLLM engine (CPU build): two
programs' prompts are cached (A's freed first), a long request then needs room for four of
their blocks, and A's prompt comes again. In vLLM's free order A's blocks are the oldest and
go; with B marked idle, B's go and A's prompt finds its blocks. Cached tokens are counted, not
timed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import simpy

from conftest import REPO, TARGET_MODEL, run_cli
from sim.config import parse_config, read_yaml
from sim.engine.cluster import Device
from sim.engine.prefix_cache import OWN, PrefixCache
from sim.engine.replica import Replica, ReplicaConfig
from sim.engine.request_state import Req, Results
from sim.simulate import simulate
from sim.step_time.calibration import load_calibration

BLOCK, KV_BLOCKS = 32, 20  # 19 blocks requests can hold: vLLM keeps one as its null block
# (name, program/group, prompt tokens): two programs' prompts, a long request, A's prompt again
SCENARIO = (("a", 0, 128), ("b", 1, 128), ("c", 2, 480), ("a2", 0, 128))
EXPECTED = {"free_order": 0, "idle_programs_first": 96}
"""A's prompt again: tokens found cached (3 of its 4 blocks: the last one holds the token the
engine computes to sample)"""


def _sim_scenario(mode: str) -> int:
    cal = load_calibration(REPO / "sim" / "data" / "testbed-large-cpu.calib.json")
    env, res = simpy.Environment(), Results(len(SCENARIO))
    rep = Replica(env, 0, cal, ReplicaConfig(8, 2048, BLOCK, KV_BLOCKS,
                                             enable_prefix_caching=True),
                  res, None, device=Device())
    for i, (name, group, prompt) in enumerate(SCENARIO):
        shared = name != "c"  # the long request's content is its own
        rep.submit(Req(i, prompt, 1, group=group if shared else -1,
                       prefix_tokens=prompt if shared else 0))
        env.run()
        if name == "b" and mode == "idle_programs_first":
            rep.prefix_cache.demote(lambda key: key[0] == 1)  # program B: nothing in flight
    return int(res.cached_tokens[len(SCENARIO) - 1])


def test_the_simulators_replica_evicts_an_idle_programs_blocks_first():
    assert {mode: _sim_scenario(mode) for mode in EXPECTED} == EXPECTED


def test_demote_moves_only_unreferenced_owned_blocks_and_keeps_their_order():
    cache = PrefixCache(16)
    cache.refs = {(1, 16): 0, (2, 16): 0, (1, 32): 1, (OWN, 5): 0, (2, 32): 0, (1, 48): 0}
    assert cache.demote(lambda key: key[0] == 1) == 2  # (1, 32) is held: it stays
    assert list(cache.refs) == [(1, 16), (1, 48), (2, 16), (1, 32), (OWN, 5), (2, 32)]
    assert cache.demote(lambda key: key[0] == 9) == 0


_VLLM = """
import json, sys
from vllm import SamplingParams
from engines.vllm_engine import reasoning_engine
import numpy as np
e = reasoning_engine(sys.argv[1], 0, 0.1, max_num_seqs=8, max_model_len=512,
                     block_size=%(block)d, kv_blocks=%(kv)d)
e.hint_idle_programs()
scenario = %(scenario)r
out = {}
for mode in ("free_order", "idle_programs_first"):
    e.engine.reset_prefix_cache()
    for i, (name, group, prompt) in enumerate(scenario):
        # a program's prompt: the same ids each time (the testbed's vocabulary is small)
        ids = np.random.default_rng([1, group]).integers(4, 120, prompt).tolist()
        e.add(mode + name, ids, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True),
              program_id=str(group))
        while e.has_unfinished():
            for o in e.step()[0]:
                if o.finished:
                    out[mode + name] = o.num_cached_tokens or 0
        e.forget(mode + name)
        if name == "b" and mode == "idle_programs_first":
            out["moved"] = e.demote("1")
print(json.dumps(out))
"""


@pytest.mark.engine
def test_vllm_evicts_an_idle_programs_blocks_first_as_the_simulator_does():
    code = _VLLM % {"block": BLOCK, "kv": KV_BLOCKS, "scenario": SCENARIO}
    proc = subprocess.run([sys.executable, "-c", code, str(TARGET_MODEL)], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["moved"] == 4  # B's four prompt blocks
    assert {mode: out[mode + "a2"] for mode in EXPECTED} == EXPECTED
    assert {mode: _sim_scenario(mode) for mode in EXPECTED} == EXPECTED


def _pressured(eviction: str):
    d = read_yaml(REPO / "examples" / "dynasor-kv-pressure.yaml")
    d["workload"]["programs"]["count"] = 48
    d["cluster"]["kv_eviction"] = eviction
    return parse_config(d, REPO / "examples")


def test_idle_programs_first_runs_on_the_lazy_and_the_reference_replica_alike():
    import pandas as pd

    cfg = _pressured("idle_programs_first")
    lazy, ref = simulate(cfg), simulate(cfg, lazy=False)
    assert lazy.summary["simulator"] == "simpy" and "KV eviction" in lazy.why_simpy
    for name in ("requests", "programs", "steps"):
        pd.testing.assert_frame_equal(getattr(lazy, name).to_pandas(),
                                      getattr(ref, name).to_pandas(), check_exact=True)
    free = simulate(_pressured("free_order"), compiled=False)
    cached = [r.requests.column("cached_prompt_tokens").to_numpy().sum() for r in (lazy, free)]
    assert cached[0] != cached[1]  # the order matters under this pressure


@pytest.mark.parametrize("change, error", [
    ({"workload": {"requests": {"count": 4, "rate_per_s": 1, "prompt_tokens": 16,
                                "output_tokens": 4}}}, "needs a program workload"),
    ({"enable_prefix_caching": False}, "no replica group sets enable_prefix_caching"),
    ({"kv_eviction": "lru"}, "kv_eviction"),
])
def test_bad_eviction_settings_are_refused(change, error):
    d = read_yaml(REPO / "examples" / "dynasor-certaindex.yaml")
    d["cluster"]["kv_eviction"] = change.pop("kv_eviction", "idle_programs_first")
    if "workload" in change:
        d["workload"] = change.pop("workload")
        d["cluster"].pop("scheduler")
    d["cluster"]["replicas"][0].update(change)
    with pytest.raises(ValueError, match=error):
        parse_config(d, REPO / "examples")


def test_a_replay_refuses_a_pool_or_eviction_order_its_engine_cannot_take(tmp_path):
    bad = run_cli("dynasor", "replay", "examples/dynasor-kv-pressure.yaml", "--url",
                  "http://127.0.0.1:9", "-o", str(tmp_path / "x"), check=False)
    assert bad.returncode == 2 and "--url's server takes neither" in bad.stderr
