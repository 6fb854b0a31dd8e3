"""What a reader of a shipped trace refuses when the trace was changed: values outside their
physical range, counts above their bound, keys that repeat across parts, rows of another run,
run parameters a kind's readers need, steps of no time or out of order, probes off their stride,
exits the layers table contradicts, accepted positions their counts contradict, and bytes changed
since the directory was sealed. Each corrupted copy is sealed again (but the last case), so the
content checks are what refuses it."""

from __future__ import annotations

import json
import re
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import REPO
from traces import TraceError, check_trace, read_table
from traces.manifest import seal
from traces.store import read_run

DATA = REPO / "traces" / "data"


def _copy(tmp_path, name: str):
    d = tmp_path / name
    shutil.copytree(DATA / name, d)
    return d


def _edit(d, table: str, fn, reseal: bool = True):
    """Rewrite the first part of `table` through `fn` (its schema and metadata kept)."""
    part = sorted((d / table).glob("part-*.parquet"))[0]
    t = pq.read_table(part)
    pq.write_table(fn(t).replace_schema_metadata(t.schema.metadata), part)
    if reseal:
        seal(d, read_table(d, "runs", validate=False).column("run_id")[0].as_py())
    return part


def _set(col: str, row: int, value):
    def fn(t: pa.Table) -> pa.Table:
        values = t.column(col).to_pylist()
        values[row] = value
        i = t.schema.get_field_index(col)
        return t.set_column(i, t.schema.field(i), pa.array(values, t.schema.field(i).type))

    return fn


def _params(change):
    def fn(t: pa.Table) -> pa.Table:
        params = json.loads(t.column("params_json")[0].as_py())
        change(params)
        return _set("params_json", 0, json.dumps(params))(t)

    return fn


CASES = {
    "reward NaN": ("testbed-branches-cpu", "branches", _set("reward", 3, float("nan")),
                   r"column 'reward' row 3: nan outside \[0, 1\]"),
    "p-value above 1": ("testbed-conformity-cpu", "conformity",
                        _set("p_value_marginal", 5, 7.5),
                        r"column 'p_value_marginal' row 5: 7.5 outside \[0, 1\]"),
    "exit layer 0": ("testbed-exits-target-small-cpu", "exits", _set("layer", 0, 0),
                     r"column 'layer' row 0: 0 outside \[1, inf\]"),
    "max_prob above 1": ("testbed-exits-target-small-cpu", "exits", _set("max_prob", 1, 1.5),
                         r"column 'max_prob' row 1: 1.5 outside \[0, 1\]"),
    "accepted above proposed": ("testbed-spec-cpu", "spec_steps", _set("accepted_tokens", 0, 99),
                                r"row 0: accepted_tokens 99 > proposed_tokens"),
    "no probe stride": ("testbed-probes-cpu", "runs",
                        _params(lambda p: p["workload"].pop("stride_tokens")),
                        r"workload.stride_tokens missing \(a probes run's readers need it\)"),
    "iterations as text": ("testbed-branches-cpu", "runs",
                           _params(lambda p: p["workload"].update(mcts_iterations="16")),
                           r"workload.mcts_iterations is \"16\", expected a whole number >= 1"),
    "params a list": ("testbed-large-cpu", "runs", _set("params_json", 0, "[1, 2]"),
                      r"column 'params_json' row 0: not a JSON object \(list\)"),
    "step of no time": ("testbed-large-cpu", "steps", _set("duration_ms", 4, 0.0),
                        r"column 'duration_ms' row 4: a step of zero duration \(1 rows\)"),
    "decode seqs above context": ("testbed-large-cpu", "steps", _set("decode_seqs", 3, 5000),
                                  r"row 3: decode_seqs 5000 > context_tokens 1027"),
    "step starts before the last": ("testbed-large-cpu", "steps", _set("start_s", 5, 9.7),
                                    r"column 'start_s' row 5: step 1477 starts at 9.7, before "
                                    r"step 1476 at 9.78"),
    "probe off the stride": ("testbed-probes-cpu", "probes", _set("position_tokens", 0, 17),
                             r"probes: column 'position_tokens': request 'q0000-mod-1-s0' probed "
                             r"at 17 tokens: off its run's 16-token stride and not at the end of "
                             r"its reasoning \(79 tokens\)"),
    "a layer short of the exits": ("testbed-exits-target-small-cpu", "layers",
                                   lambda t: t.slice(0, 1),
                                   r"tokens traced at loaded depths 1, 2 with exits at layers 1, "
                                   r"2, but the layers table holds layers 1 "),
    "positions past the drafted": ("testbed-spec-cpu", "spec_steps",
                                   _set("accepted_positions", 0, [True, True, False]),
                                   r"column 'accepted_positions' row 0: 3 positions, "
                                   r"proposed_tokens 2"),
    "positions against accepted": ("testbed-spec-cpu", "spec_steps",
                                   _set("accepted_positions", 1, [True, False]),
                                   r"column 'accepted_positions' row 1: 1 accepted, "
                                   r"accepted_tokens 2"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_changed_trace_is_refused_by_its_readers_and_its_check(tmp_path, case):
    name, table, fn, pattern = CASES[case]
    d = _copy(tmp_path, name)
    _edit(d, table, fn)
    with pytest.raises(TraceError, match=pattern):
        read_table(d, table)
    assert re.search(pattern, "\n".join(map(str, check_trace(d))))


def test_a_violation_in_a_later_part_names_that_part_and_its_row(tmp_path):
    """A table's values are checked over all its parts at once (`checked_parts`); a violation
    found is reported as the part's own check reports it: its file, its row there."""
    d = _copy(tmp_path, "testbed-probes-cpu")
    last = sorted((d / "requests").glob("part-*.parquet"))[-1]
    t = pq.read_table(last)
    pq.write_table(_set("output_tokens", 2, -3)(t).replace_schema_metadata(t.schema.metadata),
                   last)
    seal(d, read_table(d, "runs", validate=False).column("run_id")[0].as_py())
    pattern = re.escape(str(last)) + r".*column 'output_tokens' row 2: negative count -3"
    with pytest.raises(TraceError, match=pattern):
        read_table(d, "requests")
    assert re.search(pattern, "\n".join(map(str, check_trace(d))))


def test_steps_start_in_order_within_a_part_and_a_resumed_clock_starts_again(tmp_path):
    """A resumed trace's clock starts again at 0 while its step ids go on: a later part's steps
    start before an earlier part's, and that is no violation."""
    d = _copy(tmp_path, "testbed-large-cpu")

    def restarted(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index("start_s")
        return t.set_column(i, t.schema.field(i), pc.subtract(t["start_s"], pc.min(t["start_s"])))

    _edit(d, "steps", restarted)  # the first part by name: its step ids are not the lowest
    assert check_trace(d) == [] and read_table(d, "steps").num_rows


def test_a_verification_with_more_positions_than_it_drafted_is_refused(tmp_path):
    d = _copy(tmp_path, "testbed-tot-small-cpu")
    run_id, part = read_run(d)["run_id"], d / "tot_requests" / "part-sd-tot.parquet"
    t = pq.read_table(part)
    row = [p is not None for p in t["accepted_positions"].to_pylist()].index(True)
    drafted = t["drafted_tokens"][row].as_py()
    pq.write_table(_set("accepted_positions", row, [False] * (drafted + 1))(t), part)
    seal(d, run_id)
    pattern = (f"column 'accepted_positions' row {row}: {drafted + 1} positions, drafted_tokens "
               f"{drafted} ")
    with pytest.raises(TraceError, match=re.escape(pattern)):
        read_table(d, "tot_requests")
    assert pattern in "\n".join(map(str, check_trace(d)))


def test_an_exits_trace_whose_layers_table_stops_short_is_refused_by_helios(tmp_path):
    """One layer of two left in the layers table: HELIOS read the depth-1 stream as the full
    model's; now its profile is refused."""
    from sim.families.helios.profile import load_profile

    d = _copy(tmp_path, "testbed-exits-target-small-cpu")
    _edit(d, "layers", lambda t: t.slice(0, 1))
    with pytest.raises(TraceError, match=r"loaded depths 1, 2 .+ the layers table holds "
                                         r"layers 1 "):
        load_profile(d)


def test_repeated_keys_and_rows_of_another_run_are_refused_where_the_table_is_read(tmp_path):
    d = _copy(tmp_path, "testbed-branches-cpu")
    run_id = read_run(d)["run_id"]
    part = sorted((d / "branches").glob("part-*.parquet"))[0]
    shutil.copy(part, part.with_name("part-again.parquet"))  # a part copied twice
    seal(d, run_id)
    with pytest.raises(TraceError, match=r"duplicate program_id='.+', branch_id=\d+ \(\d+ keys "
                                         r"repeat in branches\)"):
        read_table(d, "branches")
    part.with_name("part-again.parquet").unlink()
    seal(d, run_id)
    _edit(d, "branches", _set("run_id", 0, "another-run"))  # a row of another run
    with pytest.raises(TraceError, match="run_id 'another-run' not in runs"):
        read_table(d, "branches")


def test_a_sealed_trace_changed_since_is_refused_by_its_readers(tmp_path):
    from programs.traced import load_search

    d = _copy(tmp_path, "testbed-branches-cpu")
    assert load_search(d, "sc", 16).questions  # as shipped
    part = _edit(d, "branches", _set("output_tokens", 2, 7), reseal=False)
    with pytest.raises(TraceError, match=f"{re.escape(str(part))}: its bytes changed since the "
                                         "directory was sealed"):
        load_search(d, "sc", 16)


def test_conformity_without_evaluation_questions_or_their_difficulty_is_refused(tmp_path):
    import pyarrow.compute as pc

    from programs.a1_traced import load_conformity

    d = _copy(tmp_path, "testbed-conformity-cpu")
    t = pq.read_table(sorted((d / "conformity").glob("part-*"))[0])
    roots = pc.and_(pc.equal(t["path"], ""), pc.ends_with(t["program_id"], "eva"))
    _edit(d, "conformity", _set("difficulty", roots.to_pylist().index(True), None))
    with pytest.raises(ValueError, match=r"question .+ has no root node \(path ''\) with a "
                                         "difficulty"):
        load_conformity(d, 4)


def test_probes_and_branches_that_describe_no_tree_or_trajectory_are_refused(tmp_path):
    """A probe past the reasoning it probed, or twice at one position; a branch extending one
    its tree does not hold before it: refused by the loaders every Dynasor command reads."""
    from programs.traced import load_search, load_trajectories

    d = _copy(tmp_path, "testbed-probes-cpu")
    _edit(d, "probes", _set("position_tokens", 0, 100_000))
    with pytest.raises(ValueError, match=r"is probed at 100000 tokens, past its \d+ reasoning"):
        load_trajectories(d)
    b = _copy(tmp_path, "testbed-branches-cpu")
    t = pq.read_table(sorted((b / "branches").glob("part-*"))[0])
    row = t["parent_branch_id"].to_pylist().index(next(
        p for p in t["parent_branch_id"].to_pylist() if p))
    _edit(b, "branches", _set("parent_branch_id", row, 999))
    method, cap = t["method"][row].as_py(), t["cap"][row].as_py()
    with pytest.raises(ValueError, match=r"extends branch 999, which its tree does not hold"):
        load_search(b, method, cap)

