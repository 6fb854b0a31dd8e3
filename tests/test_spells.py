"""A shared machine's speed spells: fitted apart from its run-to-run drift, drawn per window in
sampled latency, and never spanned by a run of decode iterations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from conftest import REPO
from sim.step_time import registry as step_time
from sim.config import parse_config
from sim.step_time.live_speed import live_over_predicted
from sim.step_time.spells import fit_speed_levels, window_parts
from sim.simulate import simulate
from sim.step_time.spells import SPELL_S, Spells

CAL = REPO / "sim" / "data" / "testbed-large-a1-cpu.calib.json"


def test_the_fit_splits_a_steps_residual_into_its_windows_level_and_its_own_noise():
    """Run b is 1.3x slower than run a throughout; run a has three 1.6x windows; every step
    carries its own noise, 0.9x or 1.1x in turn. The window levels span 1.6x around all steps'
    median (run a's 1.0); each step's own noise is 0.9x or 1.1x of that median, whatever its
    window: the two multiply back to the step's ratio, each part counted once (the levels
    before took the windows' spread over all steps and then again over each run)."""
    t = np.arange(0, 10, 0.01)
    wiggle = np.where(np.arange(t.size) % 2 == 0, 0.9, 1.1)
    ratio_a = np.where((t // SPELL_S == 3) | (t // SPELL_S == 6) | (t // SPELL_S == 7), 1.6, 1.0)
    levels, own = fit_speed_levels(np.array(["a"] * t.size + ["b"] * t.size),
                                   np.concatenate([t, t]),
                                   np.concatenate([ratio_a * wiggle, 1.3 * wiggle]))
    every = np.median(np.log(np.concatenate([ratio_a * wiggle, 1.3 * wiggle])))
    assert math.isclose(math.exp(max(levels) - min(levels)), 1.6, rel_tol=1e-9)
    # a window's median of 0.9 and 1.1 steps is their geometric mean
    assert set(np.round(np.exp(np.asarray(own) - every) * math.sqrt(0.99), 9)) == {0.9, 1.1}
    assert len(own) == 100


def test_spell_levels_do_not_depend_on_when_they_are_asked():
    q = tuple(np.log([0.7, 1.0, 1.5]))
    a, b = Spells(q, np.random.default_rng(5), 1.0), Spells(q, np.random.default_rng(5), 1.0)
    seen = [a.at(t) for t in (0.2, 0.9, 3.5)]
    assert b.at(3.5) == seen[-1] and b.end_s() == 4.0
    assert len({a.at(t) for t in np.arange(0, 50, 1.0)}) == 3


def _calibration(tmp_path, spells, name: str = "spells") -> str:
    d = json.loads(CAL.read_text())
    m = d["step_time_model"]
    m["residual_log_quantiles"] = [0.0, 0.0]  # no per-step noise: a step's ratio is its level
    m["run_log_quantiles"] = [0.0, 0.0]
    m["spell_log_quantiles"] = list(np.log(spells))
    path = tmp_path / f"{name}.calib.json"
    path.write_text(json.dumps(d))
    return str(path)


def _config(cal: str, latency: str):
    return parse_config({"seed": 1, "latency": latency, "workload": {
        "arrival": {"kind": "poisson", "rate_per_s": 6}, "num_requests": 60,
        "prompt_tokens": {"kind": "uniform", "low": 16, "high": 64},
        "output_tokens": {"kind": "uniform", "low": 32, "high": 160}},
        "cluster": {"replicas": [{"calibration": cal}]}})


def test_sampled_steps_run_at_their_windows_level_and_no_run_spans_two(tmp_path):
    cal = _calibration(tmp_path, [0.7, 1.5])
    res = simulate(_config(cal, "sampled"))
    model = step_time.from_json(json.loads(Path(cal).read_text())["step_time_model"])
    ratio, steps = live_over_predicted(model, res.steps.to_pandas().assign(run_id="sim"))
    assert np.all(np.isclose(ratio, 0.7) | np.isclose(ratio, 1.5))
    window = (steps.start_s // SPELL_S).astype(int).to_numpy()
    per_window = {w: set(np.round(ratio[window == w], 6)) for w in np.unique(window)}
    assert all(len(v) == 1 for v in per_window.values()), per_window  # a run ends at the edge
    assert {next(iter(v)) for v in per_window.values()} == {0.7, 1.5}
    # A calibration with a step's own noise apart draws that per step (here none) under the
    # window's level, and keeps its whole residual for the mean run
    d = json.loads(Path(cal).read_text())
    d["step_time_model"].update(residual_log_quantiles=[-0.5, 0.5], step_log_quantiles=[0.0, 0.0])
    own = tmp_path / "own.calib.json"
    own.write_text(json.dumps(d))
    again = simulate(_config(str(own), "sampled"))
    assert again.requests.to_pandas().equals(res.requests.to_pandas())
    assert not simulate(_config(str(own), "mean")).requests.to_pandas().equals(
        simulate(_config(cal, "mean")).requests.to_pandas())
    # Spells are noise: the mean-latency run does not see them.
    flat = _calibration(tmp_path, [1.0, 1.0], "flat")
    assert simulate(_config(cal, "mean")).requests.to_pandas().equals(
        simulate(_config(flat, "mean")).requests.to_pandas())


def test_prefill_steps_draw_their_own_noise_apart_from_every_steps(tmp_path):
    """A fit takes the serving prefill steps' own noise apart (here 0.8x or 1.25x, where decode
    steps wiggle 0.95x or 1.05x), only over enough of them; sampled latency draws a step that
    prefills from it and every other step from the steps' own noise."""
    import pandas as pd

    from sim.step_time.serving_latency import MIN_PREFILL_NOISE_STEPS, prefill_noise_quantiles

    n = 400
    prefill = np.arange(n) % 8 == 0
    wiggle = np.where(np.arange(n) % 16 < 8, 0.95, 1.05)
    ratio = np.where(prefill, np.where(np.arange(n) % 16 == 0, 0.8, 1.25), wiggle)
    steps = pd.DataFrame({"prefill_tokens": np.where(prefill, 64, 0)})
    own = window_parts(np.array(["a"] * n), np.arange(n) * 0.01, ratio)[1]
    q = np.exp(prefill_noise_quantiles(steps, own, 100))
    assert len(q) == 100 and q.min() < 0.85 and q.max() > 1.2
    few = steps.assign(prefill_tokens=np.where(np.arange(n) < MIN_PREFILL_NOISE_STEPS - 1, 64, 0))
    assert prefill_noise_quantiles(few, own, 100) == ()
    # drawn: prefill steps at 2x of their prediction, every other step at 1x
    d = json.loads(Path(_calibration(tmp_path, [1.0, 1.0])).read_text())
    d["step_time_model"].update(step_log_quantiles=[0.0, 0.0],
                                prefill_log_quantiles=[math.log(2.0)] * 2)
    path = tmp_path / "prefill.calib.json"
    path.write_text(json.dumps(d))
    model = step_time.from_json(d["step_time_model"])
    assert model.prefill_log_quantiles == (math.log(2.0),) * 2
    assert step_time.from_json(step_time.to_json(model)).prefill_log_quantiles == \
        (math.log(2.0),) * 2
    steps = simulate(_config(str(path), "sampled")).steps.to_pandas().assign(run_id="sim")
    ratio, steps = live_over_predicted(model, steps)
    pre = steps.prefill_tokens.to_numpy() > 0
    assert pre.any() and (~pre).any()
    assert np.allclose(ratio[pre] / np.median(ratio[~pre]), 2.0)
    assert np.allclose(ratio[~pre], np.median(ratio[~pre]))
