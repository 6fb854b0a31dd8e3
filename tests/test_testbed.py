"""The testbed: task generator, committed trained models (transformers and vLLM), eval bounds."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from conftest import REPO, TESTBED, run_cli
from testbed import tasks

MODELS = ("target-large", "target-small", "draft")


def _recompute(item: tasks.Item) -> str:
    words = item.prompt.split()
    if item.family == "mod":
        value = int(words[1])
        for w in words[2:]:
            op, x = w[1], int(w[2:])
            value = {"+": value + x, "-": value - x, "*": value * x}[op] % 10
        return str(value)
    target = words[1]
    return str(sum(w[1:] == target for w in words[3:]))


def test_generator_is_deterministic_and_its_answers_are_right():
    a, b = tasks.items(3, 400), tasks.items(3, 400)
    assert a == b and a != tasks.items(4, 400)
    assert {(it.family, it.level) for it in a} == {(f, lv) for f in tasks.FAMILIES
                                                   for lv in tasks.LEVELS}
    for it in a:
        assert _recompute(it) == it.answer == tasks.extract_boxed(it.text)
        assert it.prompt.endswith("\n") and "\\boxed" not in it.cot
        steps = tasks.MOD_OPS_BY_LEVEL if it.family == "mod" else tasks.COUNT_ITEMS_BY_LEVEL
        chain = it.cot[: it.solved_at]
        assert chain.count("\n") == steps[it.level]
        # The answer is stated at the end of the chain, not before it is worked out.
        assert chain.rstrip("\n").rsplit(" ", 1)[-1].endswith(it.answer)
    # Harder levels have longer reasoning.
    mean_len = {lv: sum(len(it.cot) for it in a if it.level == lv) for lv in tasks.LEVELS}
    assert mean_len[1] < mean_len[2] < mean_len[3] < mean_len[4]


def test_training_never_draws_an_evaluation_question():
    held = {it.prompt for it in tasks.items(0, 800)}
    assert all(tasks.is_held_out(p) for p in held)
    rng = random.Random(5)
    train = {tasks.draw(rng, f, lv, held_out=False).prompt
             for _ in range(300) for f in tasks.FAMILIES for lv in tasks.LEVELS}
    assert not held & train
    share = sum(tasks.is_held_out(it.prompt) for it in
                (tasks.make_item(rng, "mod", 4) for _ in range(5000))) / 5000
    assert 0.07 < share < 0.13


def test_answer_extraction_rules():
    assert tasks.probe_answer("7} and more") == "7"
    assert tasks.probe_answer("{1,2}} x") == "{1,2}"
    assert tasks.probe_answer(" 12 ") == "12"
    assert tasks.extract_boxed("a \\boxed{3} b \\boxed{4}") == "4"
    assert tasks.extract_boxed("\\boxed{4") is None and tasks.extract_boxed("none") is None
    with pytest.raises(ValueError, match="unknown task family"):
        tasks.make_item(random.Random(0), "sort", 1)
    with pytest.raises(ValueError, match="difficulty level"):
        tasks.make_item(random.Random(0), "mod", 9)


def test_transformers_loads_every_model_and_the_target_solves_easy_items():
    from testbed import lm

    easy = tasks.items(11, 16, levels=(1,))
    for name in MODELS:
        model = lm.load_model(TESTBED / name)
        assert model.config.model_type == "llama" and model.config.vocab_size == 128
        assert (TESTBED / name / "tokenizer.json").is_file()
        if name == "target-large":
            outs = lm.generate(model, [it.prompt for it in easy], max_new_tokens=120)
            solved = sum(tasks.extract_boxed(o) == it.answer for it, o in zip(easy, outs))
            assert solved >= 12, outs[:3]


def test_committed_weights_stay_small():
    size_mb = sum(p.stat().st_size for p in TESTBED.rglob("*.safetensors")) / 2**20
    assert 0 < size_mb < 40


@pytest.fixture(scope="module")
def eval_result() -> dict:
    proc = run_cli("testbed", "eval", "--items", "8", "--samples", "6", "--json", timeout=900)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_bounds(r: dict, margin: float) -> None:
    """The issue's loose bounds; `margin` loosens the ones a small sample makes noisy."""
    for name, easiest in (("target-large", 0.8), ("target-small", 0.4)):
        acc = r["accuracy_by_difficulty"][name]
        assert acc["1"] >= easiest - margin and acc["4"] <= acc["1"] - 0.15 + margin, (name, acc)
        probes = r["probe_agreement_by_fraction"][name]
        assert probes["1.0"] >= 0.8 - margin, (name, probes)
        assert probes["0.2"] <= probes["1.0"] - 0.3, (name, probes)
        assert r["probe_stable_before_end"][name] >= 0.5 - margin
        ent = r["answer_entropy_by_difficulty"][name]
        assert ent["4"] > ent["1"] + 0.05 - margin, (name, ent)
        assert 0.1 <= r["exit_share_before_last"][name] < 1.0
        assert r["early_token_matches_final"][name] > 0.5
        accept = r["acceptance_rate"][name]
        assert 0.3 <= accept["all"] <= 0.95, (name, accept)
        assert accept["1"] > accept["4"] - margin, (name, accept)
    # The two targets exit differently.
    large, small = (r["exit_layer_distribution"][n] for n in ("target-large", "target-small"))
    assert large != small and abs(r["exit_share_before_last"]["target-large"]
                                  - r["exit_share_before_last"]["target-small"]) > 0.02


def test_eval_prints_every_figure(eval_result):
    for key in ("accuracy_by_difficulty", "probe_agreement_by_fraction",
                "answer_entropy_by_difficulty", "exit_share_before_last",
                "early_token_matches_final", "acceptance_rate"):
        assert set(eval_result[key]) >= {"target-large", "target-small"}, key
    assert set(eval_result["accuracy_by_difficulty"]["target-large"]) == {"1", "2", "3", "4"}
    assert "0.5" in eval_result["probe_agreement_by_fraction"]["target-large"]


def test_committed_eval_holds_the_bounds():
    # The committed figures: 24 held-out items per family x level, 8 samples each.
    _check_bounds(json.loads((TESTBED / "eval.json").read_text()), margin=0.0)


def test_fresh_eval_holds_the_bounds_and_matches_the_committed_one(eval_result):
    _check_bounds(eval_result, margin=0.1)
    committed = json.loads((TESTBED / "eval.json").read_text())
    for name in ("target-large", "target-small"):
        fresh = eval_result["acceptance_rate"][name]["all"]
        assert abs(fresh - committed["acceptance_rate"][name]["all"]) < 0.05
        assert abs(eval_result["exit_share_before_last"][name]
                   - committed["exit_share_before_last"][name]) < 0.05


_VLLM_GREEDY = """
import json, sys
from engines.vllm_engine import prepare_env, vllm_memory_args
prepare_env()
from vllm import LLM, SamplingParams
from testbed import tasks
held = tasks.items(21, 16)
llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=512, seed=0,
          **vllm_memory_args(kv_cache_gb=0.5))
outs = llm.generate([it.prompt for it in held], SamplingParams(temperature=0, max_tokens=256))
print(json.dumps([o.outputs[0].text for o in outs]))
"""


@pytest.mark.engine
@pytest.mark.parametrize("name", ["target-large", "draft"])
def test_vllm_serves_the_model_and_agrees_with_transformers(name):
    from testbed import lm

    # prepare_env runs the engine core in-process: a `python -c` script cannot be re-imported by
    # a spawned process.
    proc = subprocess.run([sys.executable, "-c", _VLLM_GREEDY, str(TESTBED / name)], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    vllm_out = json.loads(proc.stdout.strip().splitlines()[-1])
    held = tasks.items(21, 16)
    hf_out = lm.generate(lm.load_model(TESTBED / name), [it.prompt for it in held], 256)
    same = sum(tasks.extract_boxed(a) == tasks.extract_boxed(b) for a, b in zip(vllm_out, hf_out))
    assert same >= 14, list(zip(vllm_out, hf_out))[:3]
    if name == "target-large":
        assert sum(tasks.extract_boxed(o) == it.answer for it, o in zip(held, vllm_out)) >= 6


def test_build_smoke_run_writes_a_loadable_model(tmp_path):
    run_cli("testbed", "build", "-o", str(tmp_path), "--models", "draft", "--steps-scale", "0.005",
            "--quiet")
    history = json.loads((tmp_path / "draft" / "training.json").read_text())["history"]
    assert history[-1]["step"] == 10
    from testbed import lm

    assert lm.load_model(tmp_path / "draft").config.num_hidden_layers == 1
    proc = run_cli("testbed", "build", "-o", str(tmp_path), "--models", "huge", check=False)
    assert proc.returncode == 2 and "unknown testbed model" in proc.stderr
