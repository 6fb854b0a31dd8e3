"""Manifests: a directory proves it is whole (every part's sha256, written last by its writer).

A changed byte that still decodes, an added or a removed part, a missing done marker or nested
run, an unsealed (killed) writer's output: each fails `traces check` naming the file. Shipped
traces carry manifests (`reasonsim traces seal`), and a simulation's output is sealed by its
writer.
"""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import REPO, run_cli
from test_contract import RUN, _request, _write_sample
from traces import TraceWriter, check_trace
from traces.manifest import MANIFEST, read, workload_fingerprint

SHIPPED = sorted(p for p in (REPO / "traces" / "data").iterdir() if (p / "runs").is_dir())


def _messages(path) -> list[str]:
    return [str(v) for v in check_trace(path)]


def test_a_sealed_directory_lists_every_part_with_rows_and_hash(tmp_path):
    _write_sample(tmp_path / "t")
    m = read(tmp_path / "t")
    assert set(m["tables"]) == {"runs", "requests", "steps"}
    assert sorted(m["tables"]["requests"]) == ["part-u0.parquet", "part-u1.parquet",
                                               "part-u2.parquet"]
    assert all(e["rows"] == 4 and len(e["sha256"]) == 64
               for e in m["tables"]["requests"].values())
    assert m["units"] == ["u0", "u1", "u2"] and m["workload_fingerprint"]
    assert check_trace(tmp_path / "t") == []


def test_a_changed_value_that_still_decodes_is_caught(tmp_path):
    _write_sample(tmp_path / "t")
    part = tmp_path / "t" / "requests" / "part-u1.parquet"
    t = pq.read_table(part)
    t = t.set_column(t.schema.get_field_index("prompt_tokens"), t.schema.field("prompt_tokens"),
                     pc.add(t.column("prompt_tokens"), pa.scalar(1, t.column("prompt_tokens").type)))
    pq.write_table(t, part)  # a valid Parquet part of the right schema, one value changed
    assert _messages(tmp_path / "t") == [
        f"{part}: its bytes changed since the directory was sealed (sha256 differs from the "
        "manifest's)"]


@pytest.mark.parametrize("fault", ["extra part", "missing part", "missing marker",
                                   "missing table", "bad manifest"])
def test_parts_markers_and_manifest_faults_name_the_file(tmp_path, fault):
    d = tmp_path / "t"
    _write_sample(d)
    part = d / "requests" / "part-u1.parquet"
    if fault == "extra part":
        shutil.copy(d / "steps" / "part-u1.parquet", d / "steps" / "part-u9.parquet")
        want = (d / "steps" / "part-u9.parquet", "not in the manifest")
    elif fault == "missing part":
        part.unlink()
        want = (part, "listed in the manifest but missing")
    elif fault == "missing marker":
        (d / "_units" / "u2.done").unlink()
        want = (d / "_units" / "u2.done", "done marker the manifest lists is missing")
    elif fault == "missing table":
        shutil.rmtree(d / "steps")
        want = (d / "steps" / "part-u0.parquet", "listed in the manifest but missing")
    else:
        (d / MANIFEST).write_text(json.dumps({"version": 1, "tables": {}}))
        want = (d / MANIFEST, "not a version-1 manifest")
    got = check_trace(d)
    assert any(v.path == str(want[0]) and want[1] in v.message for v in got), got


def test_a_resumed_directory_is_unsealed_until_its_writer_ends(tmp_path):
    _write_sample(tmp_path / "t")
    w = TraceWriter(tmp_path / "t", RUN, resume=True)
    assert not (tmp_path / "t" / MANIFEST).exists()
    w.add("requests", **_request(99))
    w.flush("u3")
    assert "missing" in _messages(tmp_path / "t")[-1]
    w.seal()
    assert check_trace(tmp_path / "t") == []
    with pytest.raises(RuntimeError, match="flush before sealing"):
        w.add("requests", **_request(100))
        w.seal()


def _config(path, replicas: int, seed: int):
    cal = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
    path.write_text(json.dumps({
        "seed": seed, "workload": {"arrival": {"kind": "poisson", "rate_per_s": 20},
                                   "num_requests": 200, "prompt_tokens": 100,
                                   "output_tokens": 50},
        "cluster": {"replicas": [{"calibration": str(cal), "count": replicas}]}}))
    return str(path)


def test_simulate_output_is_sealed_with_its_workload_fingerprint(tmp_path):
    run_cli("simulate", _config(tmp_path / "a.yaml", 1, 0), "-o", str(tmp_path / "a"))
    run_cli("simulate", _config(tmp_path / "b.yaml", 2, 0), "-o", str(tmp_path / "b"))
    run_cli("simulate", _config(tmp_path / "c.yaml", 1, 5), "-o", str(tmp_path / "c"))
    a, b, c = (read(tmp_path / n) for n in "abc")
    assert check_trace(tmp_path / "a") == [] and a["run_id"]
    # the same workload served two ways shares one fingerprint; another seed's does not
    assert a["workload_fingerprint"] == b["workload_fingerprint"] == \
        workload_fingerprint(tmp_path / "a") != c["workload_fingerprint"]
    # its summary is hashed too: an edited figure is caught, naming the file
    assert set(a["files"]) == {"summary.json"}
    summary = tmp_path / "a" / "summary.json"
    summary.write_text(summary.read_text().replace('"requests": ', '"requests": 1', 1))
    assert _messages(tmp_path / "a") == [
        f"{summary}: its bytes changed since the directory was sealed (sha256 differs from the "
        "manifest's)"]


def test_every_shipped_trace_is_sealed_and_whole():
    for d in SHIPPED:
        assert (d / MANIFEST).exists(), d
        assert check_trace(d) == [], d


def test_traces_seal_writes_a_manifest_only_for_a_whole_valid_directory(tmp_path):
    d = tmp_path / "old"
    shutil.copytree(REPO / "traces" / "data" / "testbed-tot-small-cpu", d)
    for m in d.rglob(MANIFEST):
        m.unlink()  # as written before manifests
    assert "missing" in _messages(d)[-1]
    out = run_cli("traces", "seal", str(d)).stdout
    assert out.count("seal ") == 3  # the two nested engines' runs and the one holding them
    assert check_trace(d) == [] and check_trace(d / "draft") == []
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    for m in bad.rglob(MANIFEST):
        m.unlink()
    (bad / "programs" / "part-sd-tot.parquet").write_bytes(b"garbage")
    proc = run_cli("traces", "seal", str(bad), check=False)
    assert proc.returncode == 2 and "not sealed" in proc.stderr
    assert not (bad / MANIFEST).exists()


@pytest.mark.parametrize("loss", ["requests", "steps", "_units/*.done"])
def test_traces_seal_refuses_a_directory_that_lost_a_table_or_its_done_markers(tmp_path, loss):
    """A steps trace always holds requests, steps and done markers: without one it is not
    whole, whatever its parts say."""
    d = tmp_path / "old"
    shutil.copytree(REPO / "traces" / "data" / "testbed-large-cpu", d)
    (d / MANIFEST).unlink()
    for path in d.glob(loss):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    proc = run_cli("traces", "seal", str(d), check=False)
    assert proc.returncode == 2 and "not sealed" in proc.stderr, proc.stderr
    assert str(d / loss.split("/")[0]) in proc.stderr and not (d / MANIFEST).exists()


def test_every_single_bit_flip_in_a_part_is_caught_naming_the_file(tmp_path):
    import numpy as np

    d = tmp_path / "t"
    _write_sample(d)
    files = sorted(d.glob("*/part-*.parquet"))
    rng = np.random.default_rng(0)
    for _ in range(60):
        f = files[int(rng.integers(len(files)))]
        original = f.read_bytes()
        data = bytearray(original)
        data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
        f.write_bytes(bytes(data))
        got = check_trace(d)
        assert got and all(v.path == str(f) for v in got), got  # only that file is named
        assert any("sha256" in v.message for v in got)
        f.write_bytes(original)
    assert check_trace(d) == []


def test_calibrate_and_validate_refuse_a_directory_changed_since_it_was_sealed(tmp_path):
    """A reader computes from what the writer wrote or not at all: a part whose bytes changed
    (durations x10, finish times x3) is named, no calibration or verdict is given."""
    from sim.step_time.calibration import calibrate
    from validation.judge import compare

    def scaled(part, column, factor):
        t = pq.read_table(part)
        i = t.schema.get_field_index(column)
        pq.write_table(t.set_column(i, t.schema.field(column),
                                    pc.multiply(t.column(column), factor)), part)

    d = tmp_path / "grid"
    shutil.copytree(REPO / "traces" / "data" / "testbed-large-cpu", d)
    part = sorted((d / "steps").glob("part-*.parquet"))[0]
    scaled(part, "duration_ms", 10.0)
    with pytest.raises(ValueError, match=f"{part}: its bytes changed since"):
        calibrate([d])
    cfg = tmp_path / "c.yaml"
    cfg.write_text((REPO / "examples" / "replay-small.yaml").read_text().replace(
        "../sim/data/", f"{REPO / 'sim' / 'data'}/"))
    for name in ("a", "b"):
        run_cli("simulate", str(cfg), "-o", str(tmp_path / name), "--json")
    part = sorted((tmp_path / "b" / "requests").glob("part-*.parquet"))[0]
    scaled(part, "finish_s", 3.0)
    with pytest.raises(ValueError, match=f"{part}: its bytes changed since"):
        compare(tmp_path / "a", tmp_path / "b")


def _flip(part, offset: int = 2140) -> None:
    data = bytearray(part.read_bytes())
    data[offset] ^= 0x02
    part.write_bytes(bytes(data))


def test_replays_refuse_a_sealed_trace_whose_bytes_changed(tmp_path):
    """A program workload's trace and a `requests` replay are verified against their manifest
    before anything is read from them: a flipped byte (which here still decodes, as reasoning
    lengths of 4.7M tokens) is refused naming the part, not replayed."""
    from sim.config import parse_config, read_yaml
    from sim.simulate import simulate

    trace = tmp_path / "probes"
    shutil.copytree(REPO / "traces" / "data" / "testbed-probes-cpu", trace)
    part = trace / "trajectories" / "part-q0000-mod-1.parquet"
    _flip(part)
    d = read_yaml(REPO / "examples" / "dynasor-cot-certaindex.yaml")
    d["workload"]["programs"] |= {"trace": str(trace), "count": 4}
    with pytest.raises(ValueError, match=f"{part}: its bytes changed since the directory was "
                                         "sealed"):
        simulate(parse_config(d, REPO / "examples"))

    run_cli("simulate", _config(tmp_path / "a.yaml", 1, 0), "-o", str(tmp_path / "a"))
    req = next((tmp_path / "a" / "requests").glob("*.parquet"))
    _flip(req, 2052)
    replay = {"workload": {"trace": {"format": "requests", "path": str(tmp_path / "a")}},
              "cluster": read_yaml(_config(tmp_path / "b.yaml", 1, 0))["cluster"]}
    with pytest.raises(ValueError, match=f"{req}: its bytes changed"):
        simulate(parse_config(replay))
    # checked alone, the part is held to its directory's manifest too
    assert [v.message for v in check_trace(req)][-1] == \
        "its bytes changed since the directory was sealed (sha256 differs from the manifest's)"
