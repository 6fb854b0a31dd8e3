"""The trace contract: schemas, crash-safe writer, resume, and validation naming file/column/row."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import REPO
from traces import SCHEMAS, TraceError, TraceWriter, check_trace, read_table, write_tables
from traces.manifest import MANIFEST
from traces.schema import META_VERSION, SCHEMA_VERSION, table_version

RUN = {"kind": "steps", "engine": "test", "engine_version": "0", "device": "cpu",
       "device_count": 1, "model_id": "m", "model_config_hash": "h", "dtype": "float32",
       "load_format": "dummy", "seed": 0, "git_rev": "x", "command": "c",
       "created_at": datetime.now(timezone.utc), "params_json": "{}"}


def _request(i: int, **over) -> dict:
    row = dict(request_id=f"r{i}", replica_id=0, priority=0, arrival_s=float(i),
               scheduled_s=i + 0.1, first_token_s=i + 0.2, finish_s=i + 1.0, prompt_tokens=10,
               output_tokens=5, cached_prompt_tokens=0, finish_reason="length")
    row.update(over)
    return row


def _write_sample(path):
    w = TraceWriter(path, RUN)
    for unit in range(3):
        for i in range(unit * 4, unit * 4 + 4):
            w.add("requests", **_request(i))
            w.add("steps", replica_id=0, step_id=i, start_s=float(i), duration_ms=5.0,
                  prefill_tokens=0, prefill_seqs=0, decode_seqs=1, num_running=1, num_waiting=0,
                  context_tokens=10, kv_blocks_used=1, kv_blocks_total=10, preemptions=0,
                  is_warmup=False)
        w.flush(f"u{unit}")
    w.seal()
    return w


def test_every_table_has_a_versioned_schema():
    assert {"runs", "steps", "requests", "token_times", "probes", "branches", "exits",
            "spec_steps", "conformity"} <= set(SCHEMAS)
    for name, schema in SCHEMAS.items():
        assert schema.metadata[META_VERSION] == str(table_version(name)).encode()
        assert "run_id" in schema.names, name
        for field in schema:
            assert field.metadata[b"doc"], f"{name}.{field.name} has no doc"


def test_roundtrip_and_check(tmp_path):
    _write_sample(tmp_path / "t")
    assert check_trace(tmp_path / "t") == []
    reqs = read_table(tmp_path / "t", "requests")
    assert reqs.num_rows == 12 and reqs.schema.equals(SCHEMAS["requests"], check_metadata=False)
    # Simulator-style whole-table writes produce the same schema.
    cols = {k: [v] for k, v in _request(0).items()}
    write_tables(tmp_path / "sim", {**RUN, "kind": "sim"}, {"requests": cols})
    assert check_trace(tmp_path / "sim") == []


def test_existing_dir_needs_resume(tmp_path):
    _write_sample(tmp_path / "t")
    with pytest.raises(TraceError, match="not empty"):
        TraceWriter(tmp_path / "t", RUN)


def test_resume_refuses_different_run(tmp_path):
    _write_sample(tmp_path / "t")
    with pytest.raises(TraceError, match="cannot resume: model_config_hash differs"):
        TraceWriter(tmp_path / "t", {**RUN, "model_config_hash": "other"}, resume=True)
    # other parameters are named by key, not printed whole
    params = {"grid": {"batch_sizes": [1, 4], "repeats": 2}, "seed": 0, "workload": {"n": 8}}
    TraceWriter(tmp_path / "p", {**RUN, "params_json": json.dumps(params)}).seal()
    other = {**params, "grid": {"batch_sizes": [1, 8], "repeats": 2}, "workload": {"m": 8}}
    with pytest.raises(TraceError, match=r"params_json differs \(grid\.batch_sizes: trace has "
                       r"\[1, 4\], now \[1, 8\]; workload\.m: trace has '\(none\)', now 8; "
                       r"workload\.n: trace has 8, now '\(none\)'\)$"):
        TraceWriter(tmp_path / "p", {**RUN, "params_json": json.dumps(other)}, resume=True)


def test_resume_rewrites_unfinished_units_without_duplicates(tmp_path):
    w = _write_sample(tmp_path / "t")
    w2 = TraceWriter(tmp_path / "t", RUN, resume=True)
    assert w2.run_id == w.run_id and w2.done_units() == {"u0", "u1", "u2"}
    # Redo a unit (as a resumed tracer does for an unfinished one): same part name, no dupes.
    for i in range(4):
        w2.add("requests", **_request(i))
    w2.flush("u0")
    ids = read_table(tmp_path / "t", "requests").column("request_id").to_pylist()
    assert len(ids) == len(set(ids)) == 12


KILL_SCRIPT = r"""
import sys, time
sys.path.insert(0, {repo!r})
from test_contract import RUN, _request
from traces import TraceWriter
w = TraceWriter(sys.argv[1], RUN)
i = 0
while True:
    for _ in range(50):
        w.add("requests", **_request(i)); i += 1
    w.flush(f"u{{i // 50:05d}}")
    print(i, flush=True)
"""


def test_sigkilled_writer_leaves_readable_rows(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(KILL_SCRIPT.format(repo=str(REPO / "tests")))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "t")],
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    flushed = 0
    while flushed < 2000:  # let it write many parts, then kill it mid-flight
        flushed = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # Every flushed row reads back, but the directory never passes a check: it was not sealed.
    assert [v.path for v in check_trace(tmp_path / "t")] == [str(tmp_path / "t" / MANIFEST)]
    n = read_table(tmp_path / "t", "requests").num_rows
    assert n >= flushed and n % 50 == 0
    leftovers = [p for p in (tmp_path / "t" / "requests").iterdir() if p.name.startswith(".")]
    # A killed write may leave one hidden temporary file; readers never see it.
    assert len(leftovers) <= 1


# ----------------------------------------------------------------- corrupted copies are rejected

def _corrupt(path, table, fn, metadata=None):
    part = sorted((path / table).glob("part-*.parquet"))[0]
    t = pq.read_table(part)
    t = fn(t)
    if metadata is not None:
        t = t.replace_schema_metadata(metadata)
    pq.write_table(t, part)
    return part


def _set(t: pa.Table, col: str, row: int, value):
    values = t.column(col).to_pylist()
    values[row] = value
    i = t.schema.get_field_index(col)
    return t.set_column(i, t.schema.field(i), pa.array(values, t.schema.field(i).type))


CASES = {
    "nan time": ("steps", lambda t: _set(t, "duration_ms", 2, float("nan")), None,
                 r"column 'duration_ms' row 2: non-finite time nan"),
    "negative time": ("requests", lambda t: _set(t, "arrival_s", 1, -1.0), None,
                      r"column 'arrival_s' row 1: negative time"),
    "finish before arrival": ("requests", lambda t: _set(t, "finish_s", 3, 0.5), None,
                              r"column 'finish_s' row 3: finish_s=0.5 before first_token_s"),
    "finish before arrival, nulls between": (
        "requests", lambda t: _set(_set(_set(t, "scheduled_s", 3, None), "first_token_s", 3, None),
                                   "finish_s", 3, 2.5), None,
        r"column 'finish_s' row 3: finish_s=2.5 before arrival_s=3.0"),
    "negative count": ("requests", lambda t: _set(t, "prompt_tokens", 1, -3), None,
                       r"column 'prompt_tokens' row 1: negative count -3"),
    "cached over prompt": ("requests", lambda t: _set(t, "cached_prompt_tokens", 2, 50), None,
                           r"row 2: cached_prompt_tokens 50 > prompt_tokens 10"),
    "unknown column": ("requests", lambda t: t.append_column("bogus", pa.array([1] * t.num_rows)),
                       None, r"column 'bogus': unknown column"),
    "missing column": ("steps", lambda t: t.drop_columns(["kv_blocks_used"]), None,
                       r"column 'kv_blocks_used': missing column"),
    "wrong version": ("requests", lambda t: t,
                      {META_VERSION: b"0", b"reasonsim.table": b"requests"},
                      r"schema version '0', expected 1"),
    "unknown finish reason": ("requests", lambda t: _set(t, "finish_reason", 1, "bogus"), None,
                              r"column 'finish_reason' row 1: 'bogus' is not one of length, "
                              r"stop, abort"),
    "negative replica": ("requests", lambda t: _set(t, "replica_id", 2, -7), None,
                         r"column 'replica_id' row 2: negative count -7"),
    "wrong type": ("steps", lambda t: t.set_column(
        t.schema.get_field_index("prefill_tokens"), "prefill_tokens",
        t.column("prefill_tokens").cast(pa.float64())), None,
        r"column 'prefill_tokens': type double, expected int32"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_corrupted_copy_is_rejected_naming_the_problem(tmp_path, case):
    _write_sample(tmp_path / "t")
    table, fn, meta, pattern = CASES[case]
    part = _corrupt(tmp_path / "t", table, fn, meta)
    violations = check_trace(tmp_path / "t")
    text = "\n".join(map(str, violations))
    assert str(part) in text
    import re
    assert re.search(pattern, text), text
    with pytest.raises(TraceError):
        read_table(tmp_path / "t", table)


def test_duplicated_rows_across_parts_are_rejected(tmp_path):
    import shutil

    _write_sample(tmp_path / "t")
    assert check_trace(tmp_path / "t") == []
    part = sorted((tmp_path / "t" / "requests").glob("part-*.parquet"))[0]
    shutil.copy(part, part.with_name("part-copy.parquet"))
    text = "\n".join(map(str, check_trace(tmp_path / "t")))
    assert "duplicate request_id='r0' (4 duplicate rows in requests)" in text


def test_garbage_file_is_rejected(tmp_path):
    _write_sample(tmp_path / "t")
    part = sorted((tmp_path / "t" / "steps").glob("part-*.parquet"))[0]
    part.write_bytes(b"not parquet at all")
    assert "not a readable Parquet file" in str(check_trace(tmp_path / "t")[0])


def test_an_empty_requests_table_and_a_partial_output_are_rejected(tmp_path):
    _write_sample(tmp_path / "t")
    for part in sorted((tmp_path / "t" / "requests").glob("part-*.parquet")):
        pq.write_table(pq.read_table(part).slice(0, 0), part)
    assert "the requests table is empty" in "\n".join(map(str, check_trace(tmp_path / "t")))
    partial = tmp_path / ".sim.partial-99999999"
    _write_sample(partial)
    (v,) = check_trace(partial)
    assert "a partial output its writer left when it was killed" in str(v)
