"""A method family is a plug-in: registered from its own module, found through the registries.

The toy family here (a policy, a program, an oracle, a live builder) is registered from this
file alone and runs in `simulate` and in live replay on the in-process engine with no shared
file naming it; the built-in families are found the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

import pytest
from pydantic import Field

from conftest import REPO
from conftest import example_config as _config
from policies import registry as policies
from policies.params import Params
from programs import families
from programs.base import Outcome, RequestSpec, Sampling
from programs.traced import load_questions
from programs.workload import draw_seed, load_bank, plan_programs, program_workload
from sim.config import parse_config
from sim.families import registry as sim_families
from sim.simulate import simulate
from sim.workloads.program_driver import SimProgram


@dataclass(frozen=True)
class OneShot:
    """The toy policy: how many of a question's traced reasoning tokens to ask for."""

    fraction: float = 1.0


class OneShotParams(Params):
    """The toy policy's parameters, declared as every policy type declares them."""

    fraction: Annotated[float, Field(gt=0, le=1)] = 1.0


class OneShotProgram:
    """The toy program: one request for part of the drawn sample's reasoning, then done."""

    def __init__(self, policy: OneShot, prompt_tokens: int, traced_tokens: int,
                 prompt_ids: list | None = None):
        self.max_tokens = max(1, int(policy.fraction * traced_tokens))
        self.prompt_tokens, self.prompt_ids = prompt_tokens, prompt_ids
        self.done, self.tokens, self.answer = False, 0, None
        self.paths_used, self.probe_tokens, self.stop_at = 1, 0, None

    @property
    def reasoning(self) -> int:
        return self.tokens

    def start(self) -> list:
        return [RequestSpec("chunk", 0, self.prompt_tokens, Sampling(self.max_tokens),
                            prompt_ids=self.prompt_ids)]

    def on_done(self, spec: RequestSpec, outcome: Outcome) -> list:
        self.tokens, self.answer, self.done = outcome.tokens, outcome.answer, True
        return []

    def interpret(self, spec: RequestSpec, raw: Outcome, answer_of) -> Outcome:
        """A live outcome in the program's terms: the answer read from the text."""
        return Outcome(raw.tokens, aborted=raw.aborted, ended=True, text=raw.text,
                       answer=answer_of(raw.text))


class OneShotOracle:
    """Answers the toy program's request from the probes trace's drawn sample."""

    def request(self, run: SimProgram, spec: RequestSpec) -> tuple[int, int, int, int]:
        return spec.prompt_tokens, 0, 0, spec.sampling.max_tokens

    def outcome(self, run: SimProgram, spec: RequestSpec, tokens: int, aborted: bool) -> Outcome:
        return Outcome(tokens, aborted=aborted, ended=True, answer=self._sample(run).final_answer)

    @staticmethod
    def _sample(run: SimProgram):
        return next(t for t in run.question.samples if t.sample_id == run.plan.sample_ids[0])


def _build_runs(wl, bank, plans):
    by_id = {q.question_id: q for q in bank.questions}
    runs = []
    for p in plans:
        q = by_id[p.question_id]
        traced = next(t for t in q.samples if t.sample_id == p.sample_ids[0])
        runs.append(SimProgram(p, OneShotProgram(wl.policy, q.prompt_tokens,
                                                 traced.reasoning_tokens), q))
    return runs, len(runs), OneShotOracle()


def _live_runs(wl, bank, plans, twl, encode):
    """The toy programs with the testbed questions' prompts (as the probes trace asked them)."""
    from live.runner import LiveRun
    from testbed import tasks
    from traces import ids

    items = tasks.items(int(twl["seed"]), int(twl["questions_per_cell"]) * len(tasks.FAMILIES)
                        * len(tasks.LEVELS))
    by_id = {q.question_id: q for q in bank.questions}
    runs, gold = [], {}
    for p in plans:
        item = items[ids.question_index(p.question_id)]
        traced = next(t for t in by_id[p.question_id].samples if t.sample_id == p.sample_ids[0])
        prompt = encode(item.prompt)
        runs.append(LiveRun(p, OneShotProgram(wl.policy, len(prompt), traced.reasoning_tokens,
                                              prompt), p.program_id))
        gold[p.program_id] = item.answer
    return runs, gold


def register_toy_family() -> None:
    """Register the toy family's policy and its three halves, from this module alone."""
    from live import families as live_families

    policies.register("oneshot", "oneshot", lambda method, **a: OneShot(**a), OneShotParams)
    families.register_family(families.ProgramFamily(
        "oneshot", ("oneshot",), lambda wl: load_questions(wl.trace),
        samples=lambda wl, q, drawn: (q.samples[drawn].sample_id,)))
    sim_families.register_sim_family(sim_families.SimFamily("oneshot", _build_runs))
    live_families.register_live_family(live_families.LiveFamily("oneshot", _live_runs))


@pytest.fixture
def toy_family(monkeypatch):
    """The toy family registered for one test (every registry restored after)."""
    from live import families as live_families

    # the built-ins in before the copies (registries load them on the first lookup)
    families.methods(), sim_families.sim_family("reasoning"), live_families.live_family("reasoning")
    monkeypatch.setitem(policies.POLICIES, "oneshot", {})
    monkeypatch.setitem(policies.PARAMS, "oneshot", {})
    for registry in (families.FAMILIES, sim_families.FAMILIES, live_families.FAMILIES):
        monkeypatch.setattr(registry, "records", dict(registry.records))
    register_toy_family()


def _toy_config(count: int) -> dict:
    d = _config("dynasor-cot-certaindex.yaml", count=count)
    d["workload"]["programs"] |= {"method": "oneshot", "policy": {"type": "oneshot",
                                                                  "fraction": 0.5}}
    return d


def test_a_toy_family_registered_from_its_own_module_runs_in_simulate(toy_family):
    cfg = parse_config(_toy_config(24), REPO / "examples")
    result = simulate(cfg)
    progs = result.programs.to_pandas()
    assert len(progs) == 24 and (progs.method == "oneshot").all() and (progs.paths == 1).all()
    wl = program_workload(cfg.workload["programs"], cfg.base_dir)
    bank = load_bank(wl)
    plans = plan_programs(wl, bank, draw_seed(cfg.seed, 1))
    by_id = {q.question_id: q for q in bank.questions}
    # each program asked for half of its drawn sample's reasoning and got it, in one request
    want = [max(1, int(0.5 * next(t.reasoning_tokens for t in by_id[p.question_id].samples
                                  if t.sample_id == p.sample_ids[0]))) for p in plans]
    assert progs.sort_values("program_id").tokens_generated.tolist() == want
    req = result.requests.to_pandas()
    assert len(req) == 24 and req.output_tokens.sum() == sum(want)
    assert result.summary["simulator"] == "simpy"  # a plug-in family compiles only if it says so


def test_methods_and_families_come_from_the_registries(toy_family):
    assert set(families.methods()) == {"cot", "sc", "mcts", "rebase", "a1", "tot", "oneshot"}
    assert families.family_of("sc", OneShot()).name == "reasoning"
    cfg = parse_config(_config("dynasor-sc-branches-certaindex.yaml", count=2), REPO / "examples")
    wl = program_workload(cfg.workload["programs"], cfg.base_dir)
    assert wl.method == "sc" and families.family_of(wl.method, wl.policy).name == "search"
    with pytest.raises(ValueError, match="'nonesuch'; expected one of"):
        program_workload({**cfg.workload["programs"], "method": "nonesuch"}, cfg.base_dir)
    sim_families.FAMILIES.records.pop("oneshot")  # the fixture restores the registry
    with pytest.raises(ValueError, match="program family 'oneshot' has no simulator parts"):
        sim_families.sim_family("oneshot")


# The live replay in its own process, as every engine test here runs (the toy family registered
# there from this module, as a family's own module would register it).
_LIVE = """
import json, sys
sys.path.insert(0, "tests")
from test_families import REPO, _toy_config, register_toy_family
from live.replay import replay_workload
from sim.config import parse_config

register_toy_family()
cfg = parse_config(_toy_config(4), REPO / "examples")
rows = replay_workload(cfg.programs, "fcfs", sys.argv[1], seed=cfg.seed, max_num_seqs=4)
print(json.dumps(rows))
"""


@pytest.mark.engine
def test_the_toy_family_replays_live_on_the_in_process_engine(toy_family, tmp_path):
    """The same plans live: one request per program, at most what the program asked for."""
    import subprocess
    import sys

    from traces.store import read_run, read_table

    proc = subprocess.run([sys.executable, "-c", _LIVE, str(tmp_path / "live")], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    cfg = parse_config(_toy_config(4), REPO / "examples")
    sim = simulate(cfg).programs.to_pandas().sort_values("program_id")
    live = sorted(rows, key=lambda r: r["program_id"])
    assert [r["program_id"] for r in live] == sim.program_id.tolist()
    assert [r["question_id"] for r in live] == sim.question_id.tolist()
    assert all(r["method"] == "oneshot" and r["paths"] == 1 for r in live)
    req = read_table(tmp_path / "live", "requests").to_pandas().sort_values("program_id")
    assert req.program_id.tolist() == sim.program_id.tolist()  # one request each
    asked = sim.tokens_generated.tolist()  # the simulator answers each in full
    assert all(0 < got <= want for got, want in zip(req.output_tokens, asked))
    assert [r["tokens_generated"] for r in live] == req.output_tokens.tolist()
    assert '"probes_trace"' not in read_run(tmp_path / "live")["params_json"]



def test_a_program_workload_is_parsed_once_and_its_file_read_strictly(tmp_path):
    """The config holds the parsed program workload; a family's command reads the file with the
    duplicate-key loader that `simulate` uses."""
    from reasonsim.common import program_config

    cfg = parse_config(_config("dynasor-cot-certaindex.yaml", count=3), REPO / "examples")
    assert cfg.programs == program_workload(cfg.workload["programs"], cfg.base_dir)
    assert cfg.programs.count == 3 and cfg.programs.method == "cot"
    text = (REPO / "examples" / "dynasor-cot-certaindex.yaml").read_text()
    bad = tmp_path / "dup.yaml"
    bad.write_text(text.replace("    count: 256\n", "    count: 256\n    count: 8\n")
                   .replace("../", str(REPO) + "/"))
    with pytest.raises(ValueError, match="duplicate"):
        program_config(bad, "cot")
    good = tmp_path / "good.yaml"
    good.write_text(text.replace("../", str(REPO) + "/"))
    assert program_config(good, "cot", count=2)[1].count == 2


# An installed package naming its family module under the `reasonsim.families` entry-point
# group: found by every registry with nothing registering it by hand (a fresh process, with the
# package's dist-info on its path as pip would leave it).
_PLUGGED = """
import json, sys
from sim.config import parse_config
from sim.simulate import simulate
from programs.families import methods
sys.path.insert(0, "tests")
from test_families import REPO, _toy_config

progs = simulate(parse_config(_toy_config(6), REPO / "examples")).programs.to_pandas()
print(json.dumps({"methods": list(methods()), "programs": len(progs),
                  "method": sorted(set(progs.method))}))
"""


def _install_plugin(site, module: str, body: str) -> None:
    (site / f"{module}.py").write_text(body)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[reasonsim.families]\noneshot = {module}\n")


def _run_with(site, code: str):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=1200, env=env)


def test_an_installed_family_is_found_through_its_entry_point(tmp_path):
    _install_plugin(tmp_path, "oneshot_family", "import sys\nsys.path.insert(0, 'tests')\n"
                    "from test_families import register_toy_family\nregister_toy_family()\n")
    proc = _run_with(tmp_path, _PLUGGED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "oneshot" in out["methods"] and out["programs"] == 6 and out["method"] == ["oneshot"]


def test_a_broken_plugin_names_itself(tmp_path):
    _install_plugin(tmp_path, "broken_family", "raise ImportError('no such dependency')\n")
    proc = _run_with(tmp_path, _PLUGGED)
    assert proc.returncode != 0
    assert "family plug-in 'broken_family' (entry point group reasonsim.families) failed to " \
           "import: ImportError: no such dependency" in proc.stderr
