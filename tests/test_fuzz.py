"""Fuzzing configs, calibrations, sweep files and trace parts: a one-line ValueError naming the
problem, or a valid run.

Random configs mix valid and invalid values (wrong types, NaN, zero, negative, huge, strings,
booleans) in every cluster, SLO and workload key; random calibrations break one field of the
shipped artifact; random sweep files put such values in seeds, grids and cases; trace parts are
cut short (bit flips: `test_manifest`). Nothing may raise anything but ValueError, a run's
tables must pass `traces check`, and a damaged part is a violation naming its file.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import REPO
from sim.step_time.calibration import load_calibration
from sim.config import parse_config
from sim.simulate import simulate
from traces import check_trace, write_tables

CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
KEYS = ("workload", "cluster", "seed", "slo", "latency", "output", "router", "calibration",
        "replicas", "arrival", "prompt_tokens", "output_tokens", "prefix", "num_requests",
        "KV blocks", "config")

ODD_VALUES = [0, -1, 1.5, 3_000_000_000, math.nan, math.inf, "2", "no", True, None, [], {}]
ODD = st.sampled_from(ODD_VALUES)


GROUP = st.fixed_dictionaries(
    {"calibration": st.just(str(CAL))},
    optional={"count": st.integers(1, 3), "max_num_seqs": st.integers(1, 64),
              "max_num_batched_tokens": st.integers(16, 4096),
              "kv_blocks": st.integers(1, 4000), "enable_prefix_caching": st.booleans()})
LENGTH = st.one_of(st.integers(1, 300), st.builds(
    lambda lo, span: {"kind": "uniform", "low": lo, "high": lo + span},
    st.integers(1, 50), st.integers(0, 250)))
WORKLOAD = st.fixed_dictionaries(
    {"arrival": st.fixed_dictionaries({"kind": st.sampled_from(["poisson", "gamma", "constant"]),
                                       "rate_per_s": st.floats(0.5, 50)}),
     "num_requests": st.integers(1, 30), "prompt_tokens": LENGTH, "output_tokens": LENGTH},
    optional={"prefix": st.fixed_dictionaries({"groups": st.integers(1, 4),
                                               "tokens": st.integers(1, 64)})})
CONFIG = st.fixed_dictionaries(
    {"workload": WORKLOAD,
     "cluster": st.fixed_dictionaries({"replicas": st.lists(GROUP, min_size=1, max_size=2)},
                                      optional={"router": st.sampled_from(
                                          ["round_robin", "least_outstanding"])})},
    optional={"seed": st.integers(0, 5), "latency": st.sampled_from(["mean", "sampled"]),
              "slo": st.fixed_dictionaries({}, optional={"ttft_s": st.floats(0.01, 5),
                                                         "tpot_s": st.floats(0.01, 1)}),
              "output": st.just({"steps": True})})
# Where one bad value may land (missing levels are created).
PATHS = [("cluster", "replicas", 0, k) for k in (
    "count", "max_num_seqs", "max_num_batched_tokens", "kv_blocks", "enable_prefix_caching",
    "pool", "gpu_memory_utilization", "memory_gb", "calibration", "bogus")] + [
    ("cluster", "router"), ("cluster", "replicas"), ("cluster", "scheduler"), ("seed",),
    ("latency",), ("slo", "ttft_s"), ("slo", "tpot_s"), ("output", "steps"), ("workload",),
    ("workload", "num_requests"), ("workload", "prompt_tokens"), ("workload", "output_tokens"),
    ("workload", "arrival", "rate_per_s"), ("workload", "arrival", "kind"),
    ("workload", "arrival", "cv"), ("workload", "prefix"), ("bogus",)]


def _corrupt(d: dict, path: tuple, value) -> dict:
    node = d
    for key in path[:-1]:
        if isinstance(key, int):
            node = node[key]
        else:
            if not isinstance(node.get(key), (dict, list)):
                node[key] = {}
            node = node[key]
    node[path[-1]] = value
    return d


@given(CONFIG, st.one_of(st.none(), st.tuples(st.sampled_from(PATHS), ODD)))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_configs_fail_in_one_line_or_run_validly(tmp_path_factory, d, bad):
    if bad is not None:
        d = _corrupt(d, *bad)
    try:
        result = simulate(parse_config(d))
    except ValueError as e:
        text = str(e)
        assert text and "\n" not in text, text
        assert any(k in text for k in KEYS), text  # it names what is wrong
        event("refused")
        return
    event("ran")
    out = tmp_path_factory.mktemp("run")
    tables = {"requests": result.requests, "steps": result.steps}
    write_tables(out, {"kind": "sim", "engine": "fuzz", "engine_version": "0", "device": "x",
                       "device_count": 1, "model_id": "m", "model_config_hash": "h",
                       "dtype": "f", "load_format": "x", "seed": 0, "git_rev": "x",
                       "command": "c", "created_at": __import__("datetime").datetime.now(
                           __import__("datetime").timezone.utc), "params_json": "{}"}, tables)
    assert check_trace(out) == []


FIELDS = [("engine_limits",), ("engine_limits", "block_size"), ("engine_limits", "max_num_seqs"),
          ("provenance",), ("heldout",), ("step_time_model",), ("step_time_model", "coef_ms"),
          ("step_time_model", "residual_log_quantiles"), ("step_time_model", "kind"),
          ("step_time_model", "version"), ("version",), ("kind",)]


@given(st.sampled_from(FIELDS), st.sampled_from([None, "x", -1, 0, 1.5, math.nan, [], {},
                                                 [1, 2], [0.0] * 5, "__delete__"]))
@settings(max_examples=60, deadline=None)
def test_random_broken_calibrations_fail_in_one_line(tmp_path_factory, field, value):
    d = json.loads(CAL.read_text())
    node = d
    for key in field[:-1]:
        node = node[key]
    if value == "__delete__":
        node.pop(field[-1], None)
    else:
        node[field[-1]] = value
    path = tmp_path_factory.mktemp("cal") / "c.json"
    path.write_text(json.dumps(d))
    try:
        load_calibration(path)
    except ValueError as e:
        text = str(e)
        assert text.startswith(str(path)) and "\n" not in text, text


# Arrival files: a valid header and rows mixing valid and broken cells, or arbitrary bytes.
CELL = st.one_of(st.integers(-5, 5000).map(str), st.floats(allow_nan=True).map(repr),
                 st.sampled_from(["", "x", "1e3", "nan", "inf", "-0", "2023-11-16 18:15:46",
                                  "2023-11-16 18:15:46+01:00", "\"1,2\"", "\u00e9"]))
HEADERS = {"azure": "TIMESTAMP,ContextTokens,GeneratedTokens",
           "vidur": "arrived_at,num_prefill_tokens,num_decode_tokens",
           "burstgpt": "Timestamp,Request tokens,Response tokens"}
STAMP = st.builds(lambda s: f"2023-11-16 18:{s // 60:02d}:{s % 60:02d}", st.integers(0, 3599))


LENGTH_CELL = st.one_of(st.integers(1, 2000).map(str), st.integers(1, 2000).map(str), CELL)
TIME_CELL = {"azure": st.one_of(STAMP, STAMP, CELL),
             "vidur": st.one_of(st.floats(0, 1e4).map(repr), st.floats(0, 1e4).map(repr), CELL),
             "burstgpt": st.one_of(st.integers(0, 10**5).map(str), CELL)}


@given(st.data())
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_arrival_files_fail_in_one_line_or_give_a_valid_workload(tmp_path_factory, data):
    fmt = data.draw(st.sampled_from(sorted(HEADERS)))
    rows = data.draw(st.lists(st.tuples(TIME_CELL[fmt], LENGTH_CELL, LENGTH_CELL), max_size=6))
    raw = data.draw(st.one_of(st.none(), st.none(), st.binary(max_size=40)))
    from sim.workloads.requests import workload_from_config

    d = tmp_path_factory.mktemp("arr")
    path = d / "trace.csv"
    if raw is not None:
        path.write_bytes(HEADERS[fmt].encode() + b"\n" + raw)
    else:
        path.write_text(HEADERS[fmt] + "\n" + "".join(",".join(r) + "\n" for r in rows),
                        encoding="utf-8")
    try:
        wl = workload_from_config({"trace": {"format": fmt, "path": "trace.csv"}}, 0, d)
    except ValueError as e:
        text = str(e)
        assert "\n" not in text and ("trace.csv" in text or "workload.trace" in text), text
        event("refused")
        return
    event("ran")
    assert len(wl) >= 1
    assert np.all(np.isfinite(wl.arrival_s)) and np.all(np.diff(wl.arrival_s) >= 0)
    assert wl.arrival_s.min() >= 0
    assert np.all(wl.prompt_tokens >= 1) and np.all(wl.output_tokens >= 1)


@given(st.lists(st.one_of(
    st.fixed_dictionaries({"timestamp": st.one_of(st.integers(-1, 10**6), st.floats()),
                           "input_length": st.one_of(st.integers(-1, 5000), st.text(max_size=3)),
                           "output_length": st.integers(-1, 500),
                           "hash_ids": st.lists(st.integers(0, 9), max_size=4)}).map(json.dumps),
    st.text(max_size=20)), max_size=5))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_mooncake_files_fail_in_one_line_or_give_a_valid_workload(tmp_path_factory,
                                                                         lines):
    from sim.workloads.requests import workload_from_config

    d = tmp_path_factory.mktemp("moon")
    (d / "m.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        wl = workload_from_config({"trace": {"format": "mooncake", "path": "m.jsonl"}}, 0, d)
    except ValueError as e:
        assert "\n" not in str(e) and "m.jsonl" in str(e), str(e)
        return
    assert np.all(np.diff(wl.arrival_s) >= 0) and np.all(wl.prompt_tokens >= 1)


SWEEP_KEYS = ("seed", "workload.num_requests", "workload.arrival.rate_per_s",
              "cluster.replicas.0.count", "cluster.router", "bogus.key", "")
SWEEP_VALUE = st.one_of(ODD, st.integers(1, 20), st.lists(ODD, max_size=3),
                        st.lists(st.integers(1, 20), min_size=1, max_size=3))


@given(st.fixed_dictionaries(
    {"base": st.sampled_from(["base.yaml"] * 6 + ["missing.yaml", "", 5])},
    optional={"seeds": SWEEP_VALUE, "noise_seeds": SWEEP_VALUE,
              "grid": st.one_of(ODD, st.dictionaries(st.sampled_from(SWEEP_KEYS), SWEEP_VALUE,
                                                     max_size=2)),
              "cases": st.one_of(ODD, st.lists(st.one_of(ODD, st.dictionaries(
                  st.sampled_from(SWEEP_KEYS), ODD, max_size=2)), max_size=2))}))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
def test_random_sweep_files_fail_in_one_line_naming_the_file_or_expand_validly(tmp_path, d):
    import yaml

    from sim.sweep.spec import load_sweep

    (tmp_path / "base.yaml").write_text(yaml.safe_dump({
        "seed": 0, "workload": {"arrival": {"kind": "poisson", "rate_per_s": 5},
                                "num_requests": 5, "prompt_tokens": 16, "output_tokens": 8},
        "cluster": {"replicas": [{"calibration": str(CAL)}]}}))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(d))
    try:
        sweep = load_sweep(path)
        sweep.validate()
    except ValueError as e:
        text = str(e)
        assert text and "\n" not in text, text
        assert "sweep" in text or "base.yaml" in text or "missing.yaml" in text, text
        event("refused")
        return
    event("expanded")
    points = sweep.points()
    assert points and len({(p.point_id, p.seed) for p, _ in points}) == len(points)
    assert all(isinstance(p.seed, int) and not isinstance(p.seed, bool) for p, _ in points)


@given(st.integers(0, 10_000), st.integers(1, 400))
@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture])
def test_truncated_trace_parts_fail_naming_the_file(tmp_path, seed, cut):
    """A part cut short anywhere (a copy interrupted): a violation naming that file, never a
    traceback."""
    d = tmp_path / f"t{seed}"
    if not d.exists():
        from test_contract import _write_sample

        _write_sample(d)
    files = sorted(d.glob("*/part-*.parquet"))
    f = files[seed % len(files)]
    original = f.read_bytes()
    f.write_bytes(original[:max(0, len(original) - cut)])
    try:
        got = check_trace(d)
        assert got and all(v.path == str(f) for v in got), got
    finally:
        f.write_bytes(original)


PROGRAM_EXAMPLES = ["a1-sync.yaml", "a1-target-only.yaml", "dynasor-certaindex.yaml",
                    "dynasor-cot-budget.yaml", "dynasor-cot-certaindex.yaml",
                    "dynasor-mcts-certaindex.yaml", "dynasor-rebase-even.yaml",
                    "dynasor-sc-branches-certaindex.yaml", "seed-greedy-small.yaml",
                    "seed-mcsd.yaml"]
PROGRAM_KEYS = ["count", "rate_per_s", "method", "trace", "policy", "bogus",
                ("deadline", "base_s"), ("deadline", "slo_scale"), ("deadline", "bogus")]
PROGRAM_VALUE_LIST = ODD_VALUES + [1, 2, 3, 0.5, 2000, "mid", "reward", [[0.5, 2]], [2, 1]]
PROGRAM_VALUES = st.sampled_from(PROGRAM_VALUE_LIST)


def program_keys(example: str) -> list:
    """Where one value may land in an example's program workload: its keys, its policy's
    declared parameters, its policy's `type`."""
    from policies.registry import PARAMS
    from sim.config import read_yaml

    programs = read_yaml(REPO / "examples" / example)["workload"]["programs"]
    params = sorted(PARAMS[programs["method"]][programs["policy"]["type"]].model_fields)
    return PROGRAM_KEYS + [("policy", k) for k in params + ["type"]]


def program_case(example: str, key, value) -> str:
    """Run `example` (4 programs) with `key` set to `value`: "refused" (one line naming the
    key's section) or "ran" (every program finished, finite latencies); anything else fails."""
    from sim.config import read_yaml

    d = read_yaml(REPO / "examples" / example)
    programs = d["workload"]["programs"]
    programs["count"] = 4
    if key == "count" and value == 2000:
        value = 3_000_000  # past the cap on programs (a valid large count would not be quick)
    path = key if isinstance(key, tuple) else (key,)
    target = programs
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    try:
        result = simulate(parse_config(d, REPO / "examples"))
    except ValueError as e:
        text = str(e)
        assert text and "\n" not in text, text
        assert "programs" in text or "policy" in text, text
        return "refused"
    progs = result.programs.to_pandas()
    assert len(progs) == programs["count"]
    assert np.isfinite(progs["finish_s"] - progs["arrival_s"]).all()
    assert (progs["finish_s"] >= progs["arrival_s"]).all()
    assert np.isfinite(result.summary["makespan_s"])
    return "ran"


@given(st.sampled_from(PROGRAM_EXAMPLES), st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_program_workloads_fail_in_one_line_or_run_validly(example, data):
    """One key of a program workload or of its policy (each declared parameter, `type`, an
    unknown one) set to an odd or a plausible value: a one-line error naming
    `workload.programs` or `programs.policy`, or a run whose every program finished with
    finite latencies (`python tests/test_fuzz.py programs` runs every combination)."""
    key = data.draw(st.sampled_from(program_keys(example)))
    event(program_case(example, key, data.draw(PROGRAM_VALUES)))


if __name__ == "__main__" and sys.argv[1:] == ["programs"]:
    from collections import Counter

    counts = Counter()
    for example in PROGRAM_EXAMPLES:
        for key in program_keys(example):
            for value in PROGRAM_VALUE_LIST:
                counts[example, program_case(example, key, value)] += 1
    for (example, outcome), n in sorted(counts.items()):
        print(f"{example:40s} {outcome:8s} {n}")
    print(f"cases: {sum(counts.values())}")
