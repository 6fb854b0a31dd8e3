"""Sweeps: the process pool and Ray give the same table; a killed driver or worker loses no
finished point and a re-run completes the sweep; capacity search answers with an interval."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sim.config import read_yaml
from sim.sweep import Backend, load_sweep, run_sweep

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "reasonsim.cli"]
POINTS = 16  # 8 configs x 2 seeds


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    """A sweep of the demo cluster: 4 rates x 2 routers x 2 seeds, ~0.4 s per point."""
    path = tmp_path_factory.mktemp("sweep") / "sweep.yaml"
    path.write_text(f"base: {REPO / 'examples' / 'demo.yaml'}\nseeds: 2\ngrid:\n"
                    "  workload.num_requests: [6000]\n"
                    "  workload.arrival.rate_per_s: [16, 32, 48, 64]\n"
                    "  cluster.router: [round_robin, least_outstanding]\n")
    return path


@pytest.fixture(scope="module")
def reference(spec, tmp_path_factory):
    """The sweep run whole on a 2-worker process pool."""
    out = tmp_path_factory.mktemp("pool")
    run_sweep(load_sweep(spec), out, Backend(2))
    return pq.read_table(out / "results.parquet")


def _complete(table) -> None:
    df = table.to_pandas()
    assert len(df) == POINTS
    assert not df.duplicated(["point_id", "seed"]).any()
    assert df["index"].tolist() == list(range(POINTS))
    # the sweep really varied the config: throughput grows with the arrival rate
    by_rate = df.groupby("workload.arrival.rate_per_s").throughput_tok_s.mean()
    assert by_rate.is_monotonic_increasing and by_rate.iloc[-1] > 3 * by_rate.iloc[0]


def test_pool_and_local_ray_give_identical_tables(spec, reference, tmp_path):
    _complete(reference)
    run_sweep(load_sweep(spec), tmp_path, Backend(2, use_ray=True))
    assert pq.read_table(tmp_path / "results.parquet").equals(reference)


def _points(out: Path) -> dict[str, int]:
    d = out / "points"
    return {p.name: p.stat().st_mtime_ns for p in d.glob("*.parquet")} if d.exists() else {}


def _start(spec: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(CLI + ["sweep", str(spec), "-o", str(out), "--workers", "2",
                                   "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=REPO, start_new_session=True)


def _wait_points(out: Path, n: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while len(_points(out)) < n:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < end, "sweep made no progress"
        time.sleep(0.05)


def test_killed_driver_resumes_without_recomputing(spec, reference, tmp_path):
    proc = _start(spec, tmp_path)
    _wait_points(tmp_path, 3, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # driver and its workers, mid-sweep
    proc.wait()
    before = _points(tmp_path)
    assert 3 <= len(before) < POINTS
    assert not (tmp_path / "results.parquet").exists()
    done = subprocess.run(CLI + ["sweep", str(spec), "-o", str(tmp_path), "--workers", "2",
                                 "--json"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    plot = json.loads(done.stdout)["plot"]  # each metric against the first override
    assert plot and Path(plot).stat().st_size > 0
    after = _points(tmp_path)
    assert {k: after[k] for k in before} == before  # finished points were not recomputed
    table = pq.read_table(tmp_path / "results.parquet")
    _complete(table)
    assert table.equals(reference)


def test_killed_worker_is_replaced_and_the_sweep_finishes(spec, reference, tmp_path):
    import psutil

    proc = _start(spec, tmp_path)
    _wait_points(tmp_path, 2, proc)
    driver = psutil.Process(proc.pid)
    workers = [c for c in driver.children() if c.cmdline() == driver.cmdline()]  # forked
    assert workers, "no pool worker found"
    workers[0].kill()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    assert len(_points(tmp_path)) == POINTS
    assert pq.read_table(tmp_path / "results.parquet").equals(reference)


def test_sweep_refuses_an_override_the_config_lacks(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(f"base: {REPO / 'examples' / 'demo.yaml'}\n"
                    "grid: {workload.arival.rate_per_s: [1, 2]}\n")
    with pytest.raises(ValueError, match="workload.arival"):
        load_sweep(path)
    r = subprocess.run(CLI + ["sweep", str(REPO / "examples" / "demo.yaml"), "-o",
                              str(tmp_path / "o"), "--grid", "cluster.routr=round_robin"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "cluster.routr" in r.stderr


def test_noise_seeds_keep_the_workload_and_draw_step_time_noise(tmp_path):
    """A calibration band as a sweep: the same requests under other step-time noise draws."""
    from sim.config import read_yaml
    from sim.sweep import Sweep
    from sim.sweep.stats import by_point

    base = read_yaml(REPO / "examples" / "demo.yaml")
    base["workload"]["num_requests"] = 2000
    with pytest.raises(ValueError, match="latency: sampled"):
        Sweep(base, REPO / "examples", {}, [], [0, 1], "noise_seed").validate()
    base["latency"] = "sampled"
    df = run_sweep(Sweep(base, REPO / "examples", {}, [], [0, 1, 2], "noise_seed"), tmp_path)
    assert df.point_id.nunique() == 1 and len(df) == 3
    assert df.output_tokens.nunique() == 1  # the same requests
    assert df["e2e_s.p50"].nunique() == 3  # other noise, other latencies
    band = by_point(df, ["e2e_s.p50"]).iloc[0]
    assert band["e2e_s.p50.lo"] < band["e2e_s.p50"] < band["e2e_s.p50.hi"]


def test_capacity_answers_the_readme_question_as_the_readme_says(tmp_path):
    """The README's capacity example, run as written: its answers and intervals."""
    r = subprocess.run(CLI + ["capacity", "examples/dynasor-cot-certaindex.yaml",
                              "examples/dynasor-cot-budget.yaml", "--over", "replicas",
                              "--target", "0.9", "--set", "workload.programs.rate_per_s=8",
                              "-o", str(tmp_path), "--json"],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr
    answers = json.loads(r.stdout)["answers"]
    got = {a["policy"]: (a["answer"], a["interval"]) for a in answers}
    assert got == {"dynasor-cot-certaindex": (3, [2, 3]), "dynasor-cot-budget": (2, [1, 2])}
    # More replicas, more attainment: the answer is the first count whose mean meets the
    # target; the confident bound's whole interval meets it, the optimistic one's partly.
    probes = {p["value"]: p for p in answers[0]["probes"]}
    assert probes[3]["mean"] >= 0.9 > probes[2]["mean"]
    assert probes[3]["lo"] >= 0.9 > probes[2]["lo"]
    assert probes[2]["hi"] >= 0.9 > probes[1]["hi"]
    readme = (REPO / "README.md").read_text()
    assert "certaindex **3 replicas [2, 3]** and budget **2 [1, 2]**" in readme
    assert (tmp_path / "capacity.png").stat().st_size > 0


@pytest.mark.parametrize("text, message", [
    ("seeds: 2.5", "seeds: a count from 1 to 10000 or a list of distinct seeds"),
    ("seeds: 0", "seeds: a count from 1 to 10000"),
    ("noise_seeds: [true]", "noise_seeds: a count from 1 to 10000"),
    ("seeds: [1, 1]", "seeds repeat"),
    ("grid: [1, 2]", "grid: Input should be a valid dictionary"),
    ("grid: {seed: [1, 1]}", "grid.seed: a value repeats"),
    ("grid: {workload.arrival.rate_per_s: [16, 16.0]}", "a value repeats"),  # one number
    ("cases: [{name: a, cluster.router: round_robin}]\ngrid: {cluster.router: [round_robin]}",
     "a case sets cluster.router, which the grid also sweeps"),
    ("grid: {seed: [1, 2]}", "the grid or a case sets seed, which the sweep's seeds set"),
    ("cases: [{name: a, seed: 5}, {name: b, seed: 6}]\nseeds: 2", "the grid or a case sets seed"),
    ("cases: [{name: a, cluster.router: round_robin}, {name: b, cluster.router: round_robin}]",
     "cases a and b set the same values"),
    ("cases: [{name: x}, {name: y}]", "cases x and y set the same values"),
    ("grid: {seed: []}", "grid.seed: List should have at least 1 item"),
    ("seeds: 2\nnoise_seeds: 2", "give seeds or noise_seeds, not both"),
    ("rounds: 3", "sweep file: unknown key 'rounds'"),
])
def test_a_bad_sweep_file_is_one_line_naming_the_key(tmp_path, text, message):
    path = tmp_path / "sweep.yaml"
    path.write_text(f"base: {REPO / 'examples' / 'demo.yaml'}\n{text}\n")
    with pytest.raises(ValueError) as e:
        load_sweep(path).points()
    assert message in str(e.value) and str(path) in str(e.value), str(e.value)
    bad_base = tmp_path / "base.yaml"
    bad_base.write_text("base: 5\n")
    with pytest.raises(ValueError, match="base: Input should be a valid string"):
        load_sweep(bad_base)


@pytest.mark.parametrize("flags, message", [
    (["--grid", "seed=1,2", "--grid", "seed=3"], "--grid seed given twice"),
    (["--grid", "seed=1,1"], "--grid seed=1,1: a value repeats"),
    (["--grid", "workload.arrival.rate_per_s=16,16.0"], "a value repeats"),
    (["--grid", "seed=1,2", "--set", "seed=4"], "--grid seed and --set seed"),
    (["--seeds", "99999999999999999999"], "--seeds 99999999999999999999: between 1 and 10000"),
    (["--seeds", "0"], "--seeds 0: between 1 and 10000"),
    (["--set", "seed=7", "--seeds", "2"], "--set seed: the sweep's seeds ([0, 1]) set it"),
    (["--set", "workload.num_requests=10", "--set", "workload.num_requests=20"],
     "--set workload.num_requests given twice"),
    (["--workers", "100000"], "--workers 100000: more than 4x this machine's"),
])
def test_sweep_flags_that_would_drop_or_repeat_points_are_refused(tmp_path, flags, message):
    r = subprocess.run(CLI + ["sweep", str(REPO / "examples" / "demo.yaml"), "-o",
                              str(tmp_path / "o"), *flags], capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("axis", ["grid: {cluster.router: [round_robin, least_outstanding]}",
                                  "cases: [{name: a, cluster.router: round_robin}]"])
def test_a_set_on_a_key_the_sweep_file_sweeps_is_refused(tmp_path, axis):
    """The file's grid or case would replace the --set value: it would be silently dropped."""
    path = tmp_path / "sweep.yaml"
    path.write_text(f"base: {REPO / 'examples' / 'demo.yaml'}\n{axis}\n")
    r = subprocess.run(CLI + ["sweep", str(path), "-o", str(tmp_path / "o"), "--set",
                              "cluster.router=round_robin"], capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert "--set cluster.router: the sweep file's grid or cases set it" in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_sweep_without_seeds_runs_the_configs_own_seed(tmp_path):
    d = read_yaml(REPO / "examples" / "replay-small.yaml")
    assert d["seed"] == 1
    assert [p.seed for p, _ in load_sweep(REPO / "examples" / "replay-small.yaml").points()] == [1]
    # a --set of the seed replaces the config's own (no seeds given): the one point runs it
    sweep = load_sweep(REPO / "examples" / "replay-small.yaml")
    sweep.set_seed(7)
    assert [p.seed for p, cfg in sweep.points()] == [7]


@pytest.mark.parametrize("flags, message", [
    (["--metric", "e2e_s.p90"], "--metric e2e_s.p90: a fraction that falls as load grows"),
    (["--set", "seed=5"], "--set/--policies seed: capacity simulates every probe at seeds"),
    (["--policies", "seed=1,2"], "--set/--policies seed"),
    (["--policies", "cluster.router=round_robin,round_robin"], "a value repeats"),
])
def test_capacity_refuses_what_it_would_answer_wrongly(tmp_path, flags, message):
    """A metric that grows with load, a seed the probes replace, the same policy twice."""
    r = subprocess.run(CLI + ["capacity", str(REPO / "examples" / "demo.yaml"), "--seeds", "2",
                              "-o", str(tmp_path / "o"), *flags], capture_output=True,
                       text=True, cwd=REPO)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_capacity_names_a_fixed_request_count_that_is_a_burst_at_its_answer(tmp_path):
    """40 requests at the rates the search reaches arrive within a second: the note says the
    probes measured a burst, not sustained load (4 replicas drain any burst of 40 in time)."""
    r = subprocess.run(CLI + ["capacity", "examples/demo.yaml", "-o", str(tmp_path), "--json",
                              "--seeds", "2", "--tolerance", "0.3", "--over", "rate",
                              "--set", "workload.num_requests=40"],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr
    (a,) = json.loads(r.stdout)["answers"]
    assert "workload.num_requests is fixed at 40" in a["note"], a["note"]
    assert "a burst rather than sustained load" in a["note"]


def test_capacity_says_when_it_did_not_bracket_the_target(tmp_path):
    """A target the config meets at every rate the search may probe: no number, but where the
    search stopped; a target no replica count up to the cap meets: the same; zero replicas as a
    cap is refused."""
    base = ["examples/demo.yaml", "-o", str(tmp_path), "--json", "--seeds", "2", "--set",
            "workload.num_requests=40"]
    r = subprocess.run(CLI + ["capacity", *base, "--over", "rate", "--set", "slo.ttft_s=1000",
                              "--set", "slo.tpot_s=1000", "--target", "0.5"],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr
    (a,) = json.loads(r.stdout)["answers"]
    assert a["answer"] is None and "met at every rate probed, up to" in a["note"], a["note"]
    r = subprocess.run(CLI + ["capacity", *base, "--over", "replicas", "--max-replicas", "2",
                              "--set", "slo.ttft_s=0.000001", "--target", "0.99"],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr
    (a,) = json.loads(r.stdout)["answers"]
    assert a["answer"] is None and "missed at 2 replicas (--max-replicas)" in a["note"]
    r = subprocess.run(CLI + ["capacity", *base, "--over", "replicas", "--max-replicas", "0"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2 and "--max-replicas 0: from 1 to 100,000" in r.stderr


def test_a_sweep_refuses_a_directory_holding_another_sweeps_results(tmp_path):
    config = tmp_path / "small.yaml"
    config.write_text((REPO / "examples" / "replay-small.yaml").read_text().replace(
        "../sim/data/", str(REPO / "sim" / "data") + "/"))
    out = tmp_path / "out"
    rates = "workload.arrival.rate_per_s"
    first = run_sweep(load_sweep(config, grid={rates: [1, 2]}), out)
    assert len(first) == 2
    again = run_sweep(load_sweep(config, grid={rates: [1, 2]}), out)  # the same: resumed
    assert again.equals(first)
    with pytest.raises(ValueError, match="holds the results of another sweep"):
        run_sweep(load_sweep(config, grid={rates: [1, 3]}), out)
    assert pq.read_table(out / "results.parquet").num_rows == 2  # left as it was
    # a directory holding anything but a sweep's points is not a sweep's either
    (tmp_path / "trace").mkdir()
    (tmp_path / "trace" / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match="holds 'summary.json', not a sweep's output"):
        run_sweep(load_sweep(config, grid={rates: [1, 2]}), tmp_path / "trace")
    # a refused sweep leaves no directory behind
    with pytest.raises(ValueError, match="sweep point"):
        run_sweep(load_sweep(config, grid={"cluster.replicas.0.count": [1.5]}), tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_numbers_with_an_exponent_are_numbers_in_configs_and_flags(tmp_path):
    """`1e1` is ten, in a config file as in a --grid or --set value (PyYAML's YAML 1.1 would
    read it as text, and a strict key would then refuse a number as not a number)."""
    from sim.config import read_yaml, yaml_value

    config = tmp_path / "c.yaml"
    config.write_text("workload: {duration_s: 1e1, rate: -2.5E-1}\n")
    assert read_yaml(config) == {"workload": {"duration_s": 10.0, "rate": -0.25}}
    assert [yaml_value(v) for v in ("1e1", "3", "1.5", "x1e1")] == [10.0, 3, 1.5, "x1e1"]


def test_a_metric_that_is_not_a_number_is_named_not_averaged():
    import pandas as pd

    from sim.sweep.stats import by_point

    df = pd.DataFrame({"index": [0], "point_id": ["a"], "seed": [0], "simulator": ["compiled"]})
    with pytest.raises(ValueError, match="metric simulator: not a number per run .* compiled"):
        by_point(df, ["simulator"])
