"""Every shipped example simulates to the summary it gave before the program-core rebuild.

`tests/golden/NAME.json` is `reasonsim simulate examples/NAME.yaml --json` as of the commit before
programs became shared objects, 8b85ee2 (wall-clock keys aside). Equal to 1e-9 relative where
float summation order may change; counts exactly. One intentional change since: `demo.yaml`'s
prompt lengths are capped at 768 (was 1024) so that prompt + output fits the traced engine's
max_model_len of 1280, which simulate now enforces; its golden was regenerated then. HELIOS
examples (a `helios:` section), A1 examples (`method: a1`) and ToT examples (`method: tot`)
were added later with their first output as golden. The examples whose replicas share a
device (a1-*, seed-greedy, seed-sampled) were regenerated when such replicas began composing an
iteration at their turn (`sim.engine.cluster.Device`: what arrived meanwhile joins it, as in the
live runner's loop) instead of when they first asked. The HELIOS goldens were regenerated when the
exits traces were re-traced on the machine that replays them (with layer-skipping steps for the
EE-full baseline, added to helios-testbed), the layered fit took midpoint residual quantiles, and
layer-token executions stopped counting each sequence's last output token (no layer runs it);
every HELIOS summary gained `candidates` (with the repository shortlist). They were
regenerated again when a round began spending the serving loop's host time after each step
(`sim.families.helios.profile.fit_step_gap`): throughput 1-4% lower, TPOT 1-3% higher. The A1, search (MCTS,
REBASE) and ToT goldens were regenerated when the prefix cache began keying blocks by content,
as vLLM does: a hit is whole blocks of the request's own prefix (it had been a group's longest
prefix, to the last token), ToT prompts name their text, and a scoring request whose tail is
cached runs uncached (the live engine re-runs it); and the Dynasor (CoT, SC, REBASE) and ToT
goldens again when a block began joining the cache as its prefill is scheduled, as vLLM caches
at allocation (a request admitted in the same step reads it). `seed-mcsd` (multi-candidate
rounds) was added with its first output when the ToT traces gained multi-candidate trees (their
ar and sd trees unchanged, row for row); `seed-greedy-small` (the second draft/target pair)
with its first output when it was added; `spec-k4` (in-engine speculative decoding) with its
first output when speculative replicas were added; `seed-separate` (engines on devices of their
own) when replicas without a shared device began charging their loop's host time per added
request (`sim.step_time.host_time`; before, only shared devices did). Every non-HELIOS golden gained
its `simulator` key when plain workloads began running on the compiled kernel (`sim.kernels.plain`):
`demo` and `replay-small` run there now, their figures unchanged. `llama-8b-h100` (the first
GPU calibration) was added with its first output. Every program workload's golden gained
`kv_usage_mean` (the figure plain runs report) when program runs began reporting it, every
other figure unchanged. `seed-separate-h200` (the same trees on the H200 calibrations) was added
with its first output. The A1 and ToT goldens were regenerated when a scoring request whose
tail is cached began running twice, cached and then uncached, as the live engine runs it (it
had run once, uncached: the live engine's wasted first run was missing). The Dynasor CoT goldens
(baseline-even, certaindex, cot-budget, cot-certaindex, cot-spec-k4) were regenerated when a
reasoning chunk's output began joining the prefix cache as the request finishes (vLLM caches
every full block a request computed; the path's next chunk and its probes send those tokens
back): on the live CoT runs of a full fidelity run, 25,920 prompt tokens hit the cache against
20,128 simulated before and 23,840 after; accuracy unchanged, program latencies shorter (most
under saturation: baseline-even's P50 4.18 -> 2.53 s). `helios-cluster` (two HELIOS replicas
behind a router) was added with its first output when HELIOS became a replica kind of the
cluster model. Every non-HELIOS golden's `kv_usage_mean` rose (+0.1% to +55%, nothing else moved)
when the replica began keeping vLLM's null block out of the pool (`ReplicaConfig.usable_blocks`,
counted as used as the engine reports it), found by the conformance harness
(`validation.conformance`) with vLLM's own scheduler.
`llama-8b-h100`'s `simulator` became `compiled` when the plain kernel learned the serving
step-time model (`sim.kernels.serving`), every figure unchanged. The A1 goldens gained
`takeovers_by_turn` and each pool's `*_kv_peak_blocks` when A1 runs began reporting them (A1's
Figs 9 and 1), every other figure unchanged; every HELIOS policy's summary gained
`exit_shares` (its tokens by model and exit layer, HELIOS's Table 5), every other figure
unchanged. Every program workload's golden gained `cached_prompt_share` (the prompt tokens
found in the prefix cache) when program runs began reporting it, every other figure unchanged.
`dynasor-kv-pressure` (Dynasor's idle-programs-first eviction) was added with its first output.
`a1-async-separate`'s `simulator` became `compiled` when the program kernel learned A1's
scoring re-runs, and `seed-separate`'s and `seed-separate-h200`'s when it learned prefix chains,
every figure unchanged. Every HELIOS policy's summary on traced profiles gained
`full_model_agreement` (its served tokens equal to the full model's at the same position, a
reference-free quality proxy), every other figure unchanged. Every ToT golden gained
`generator_mean_s` and `evaluator_mean_s` (each component's time, SEED's Table 2) when ToT runs
began reporting them, every other figure unchanged; `seed-evaluator` (value prompts written in
speculative rounds) was added with its first output. Every program workload's
`finish_time_fairness` was renamed `latency_over_deadline` (what it is; Dynasor's finish-time
fairness is `reasonsim dynasor fairness`), its figures unchanged. `helios-testbed` gained the
response-time strategy and EE-full on target-small (Table 5's rows), its other policies unchanged.
The Dynasor CoT and SC goldens (baseline-even, certaindex, cot-budget, cot-certaindex,
cot-spec-k4, kv-pressure) were regenerated when reasoning prompts began naming their content by
question and traced text instead of by program (`sim.workloads.reasoning_content`): programs that
draw the same question share its prompt's blocks, and its samples' reasoning as far as their
texts agree, probe suffixes included, as the live engine's cache serves them. On two live
`dynasor replay` runs of configs other than the examples, prompt tokens found cached: CoT 61.3%
simulated before, 74.2% after, 74.3% live (970 requests, 969 with equal cached tokens); SC
78.6% before, 81.9% after, 81.9% live. Accuracy unchanged; cot-certaindex's program P50 1.326 ->
0.997 s. The A1 goldens were regenerated when A1 prompts began naming their content the same
way (`sim.families.a1.driver.content_chain`: the question's prompt, then the path's text turn
by turn): every path of a program shares its question's prompt, and programs of one question
(one seed) send the same prompts. On the live `a1 replay` of a config other than the examples
(16 programs), the draft pool's prompt tokens found cached: 63.3% simulated before, 75.7%
after, 76.4% live. Decisions and accuracy unchanged; path compute time up 3-5% (more scoring
requests find their tail cached and run twice, as the live engine runs them). The HELIOS goldens
were regenerated when a round's prefill step (and EE-full's) began taking the step-time
residual's median instead of its mean (`sim.families.helios.replica.median_scale`: one step's
typical time; the decode runs, sums of many steps, keep the mean): TTFT P50 2-4% lower, span
0.1-0.4% shorter, decisions and tokens unchanged. The search goldens (mcts-certaindex, mcts-even,
rebase-certaindex, rebase-even, sc-branches-certaindex) were regenerated when search prompts
began naming their content by the question and its traced tree
(`sim.workloads.program_driver.TracedSearch`: the question's prompt, then each node's text on
the path, a node's creator caching the output that later prompts repeat; programs of one
question share both) instead of one group per program: on the live MCTS and Rebase runs of a
held-out fidelity run, every request's cached prompt tokens now equal the live engine's (1,566
of 1,566; 1,507 before). Cached prompt shares rose (mcts-certaindex 0.511 -> 0.649,
sc-branches-certaindex 0.559 -> 0.635), accuracy and tokens unchanged. The traced HELIOS goldens
(helios-testbed, helios-cluster) were regenerated when a traced profile's step model began
taking a decode step's tokens as its batch padded to the longest sequence, as the PyTorch
engine attends (`sim.families.helios.attended`): TPOT P50 1-5% lower, throughput 0.3-2% higher,
decisions and tokens unchanged; `helios-opt-whatif` (a what-if serving engine) unchanged.
"""

from __future__ import annotations

import json
import math

import pytest

from conftest import REPO
from sim.config import load_config, read_yaml
from sim.families.registry import section_of
from sim.simulate import simulate

WALL_CLOCK = {"wall_s", "event_loop_s"}
EXAMPLES = sorted(p.stem for p in (REPO / "tests" / "golden").glob("*.json"))


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif k not in WALL_CLOCK:
            out[prefix + k] = v
    return out


def test_every_example_has_a_golden_summary():
    assert EXAMPLES == sorted(p.stem for p in (REPO / "examples").glob("*.yaml"))


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_matches_its_golden_summary(name):
    want = _flat(json.loads((REPO / "tests" / "golden" / f"{name}.json").read_text()))
    path = REPO / "examples" / f"{name}.yaml"
    if (section := section_of(read_yaml(path))) is not None:
        exp = section.load(read_yaml(path), path.parent)
        summary = {"devices": exp.devices(),
                   "policies": {k: r.summary() for k, r in exp.simulate().items()}}
    else:
        summary = simulate(load_config(path)).summary
    got = _flat(json.loads(json.dumps(summary)))
    assert set(got) == set(want)
    bad = {k: (got[k], want[k]) for k in want
           if not (got[k] == want[k] or (isinstance(want[k], float) and
                                         math.isclose(got[k], want[k], rel_tol=1e-9)))}
    assert not bad, bad
