"""The data contract's checks that relate a table's values to each other: a step's duration,
steps in their order, a verification's accepted positions against its counts (within a part);
probes on their run's stride, exits at the depths of the layers table (a table as read whole,
against the tables of its directory it must agree with)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traces.manifest import parts
from traces.violation import Violation

# A verification's per-position flags and the counts of its row: (list, its length, its trues)
_POSITIONS = {"spec_steps": ("accepted_positions", "proposed_tokens", "accepted_tokens"),
              "tot_requests": ("accepted_positions", "drafted_tokens", "accepted_tokens")}
# The columns the directory-level checks read of a table other than the one being read
_PROBES_COLUMNS = ["run_id", "request_id", "position_tokens"]
_EXITS_COLUMNS = ["loaded_layers", "layer"]


def part_violations(p: str, name: str, data: pa.Table) -> list[Violation]:
    """A part's rows against each other: steps take time and start in step order, accepted
    positions match their row's drafted and accepted counts."""
    if name == "steps":
        return _duration_violations(p, data) + _order_violations(p, data)
    if name in _POSITIONS:
        return _positions_violations(p, data, *_POSITIONS[name])
    return []


def _duration_violations(p: str, data: pa.Table) -> list[Violation]:
    # A traced iteration is timed around work it did (an empty one is not recorded), so 0 ms is
    # a damaged value, which calibration's `duration_ms > 0` filter would drop unsaid; negative
    # and non-finite ones are TIME_COLUMNS' violations already.
    v = data.column("duration_ms").to_numpy(zero_copy_only=False).astype(float)
    bad = np.flatnonzero(v == 0)
    if not bad.size:
        return []
    return [Violation(p, f"a step of zero duration ({bad.size} rows)", column="duration_ms",
                      row=int(bad[0]))]


def _order_violations(p: str, data: pa.Table) -> list[Violation]:
    """A replica's steps start in step order. Within a part only: a unit's part is written in
    one session, while a resumed trace's clock starts again at 0 and its step ids go on."""
    if data.num_rows < 2:
        return []
    order = pc.sort_indices(data, [("run_id", "ascending"), ("replica_id", "ascending"),
                                   ("step_id", "ascending")])
    t = data.select(["run_id", "replica_id", "step_id", "start_s"]).take(order)
    run, replica = t["run_id"], t["replica_id"].to_numpy()
    same = pc.equal(run.slice(1), run.slice(0, t.num_rows - 1)).to_numpy(zero_copy_only=False)
    same &= replica[1:] == replica[:-1]
    start, step = t["start_s"].to_numpy(), t["step_id"].to_numpy()
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(same & (start[1:] < start[:-1] - 1e-9))  # as ORDERED_TIMES
    if not bad.size:
        return []
    i = int(bad[0])
    return [Violation(p, f"step {step[i + 1]} starts at {start[i + 1]}, before step {step[i]} "
                         f"at {start[i]} (replica {replica[i]}; {bad.size} rows)",
                      column="start_s", row=int(order[i + 1].as_py()))]


def _positions_violations(p: str, data: pa.Table, col: str, drafted: str, accepted: str
                          ) -> list[Violation]:
    # acceptance reads a position's rate from the flags and a step's length from the counts:
    # one flag per drafted token (fewer than K where the engine drafted fewer), one True per
    # accepted token
    flags = data.column(col).combine_chunks()
    length = pc.list_value_length(flags).to_numpy(zero_copy_only=False).astype(float)
    parent = pc.list_parent_indices(flags).to_numpy(zero_copy_only=False)
    true = pc.list_flatten(flags).fill_null(False).to_numpy(zero_copy_only=False)
    trues = np.bincount(parent[true], minlength=data.num_rows).astype(float)
    out = []
    for counted, what, label in ((length, drafted, "positions"), (trues, accepted, "accepted")):
        v = data.column(what).to_numpy(zero_copy_only=False).astype(float)  # nulls -> nan
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~np.isnan(length) & ~np.isnan(v) & (counted != v))
        if bad.size:
            r = int(bad[0])
            out.append(Violation(p, f"{counted[r]:g} {label}, {what} {v[r]:g} ({bad.size} rows)",
                                 column=col, row=r))
    return out


def trace_violations(trace_dir: Path, name: str, data: pa.Table) -> list[Violation]:
    """A table as read whole against its directory's other tables: probes on their run's
    stride, exits at the depths the layers table holds."""
    if name == "probes" and data.num_rows:
        return _stride_violations(trace_dir, data)
    if name in ("exits", "layers"):
        exits = data if name == "exits" else _columns(trace_dir, "exits", _EXITS_COLUMNS)
        layers = data if name == "layers" else _columns(trace_dir, "layers", ["layer"])
        if exits is not None and exits.num_rows:
            return _depth_violations(trace_dir, exits, layers)
    return []


def directory_violations(trace_dir: Path) -> list[Violation]:
    """`trace_violations` of a directory's tables that have them (`traces check`)."""
    out = []
    for name, columns in (("probes", _PROBES_COLUMNS), ("exits", _EXITS_COLUMNS)):
        data = _columns(trace_dir, name, columns)
        if data is not None:
            out += trace_violations(trace_dir, name, data)
    return out


def _columns(trace_dir: Path, name: str, columns: list[str]) -> pa.Table | None:
    """Columns of a table of the directory (None: it has no parts, or they do not read: that
    table's own read refuses it)."""
    files = parts(trace_dir, name)
    try:  # a small part reads faster as a file than through the dataset layer
        return pa.concat_tables([pq.ParquetFile(f).read(columns, use_threads=False)
                                 for f in files]) if files else None
    except Exception:  # unreadable or of another schema: its own checks say so
        return None


def _stride_violations(trace_dir: Path, data: pa.Table) -> list[Violation]:
    """Probes at multiples of their run's stride: the tracer probes after every chunk of stride
    tokens, and last at the end of the reasoning (an end the stride need not divide)."""
    strides = _strides(trace_dir)
    if not strides:  # not a probes run, or no stride: RUN_PARAMS' violation
        return []
    at = pc.index_in(data["run_id"], value_set=pa.array(list(strides), pa.string()))
    stride = np.append(np.array(list(strides.values())), 0)[
        at.fill_null(-1).to_numpy(zero_copy_only=False)]  # 0: a run without a stride
    pos = data["position_tokens"].to_numpy(zero_copy_only=False).astype(np.int64)
    end = _reasoning_end(trace_dir, data)
    bad = np.flatnonzero((stride > 0) & (pos % np.maximum(stride, 1) != 0) & (pos != end))
    if not bad.size:
        return []
    r = int(bad[0])
    return [Violation(str(trace_dir / "probes"), f"request {data['request_id'][r].as_py()!r} "
                      f"probed at {pos[r]} tokens: off its run's {stride[r]}-token stride and not "
                      f"at the end of its reasoning ({end[r]} tokens) ({bad.size} probes)",
                      column="position_tokens")]


def _strides(trace_dir: Path) -> dict[str, int]:
    """run id -> probe stride of the directory's probes runs that hold a valid one."""
    runs = _columns(trace_dir, "runs", ["run_id", "kind", "params_json"])
    out = {}
    for row in runs.to_pylist() if runs is not None else ():
        try:
            stride = json.loads(row["params_json"] or "{}")["workload"]["stride_tokens"]
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        if row["kind"] == "probes" and type(stride) is int and stride >= 1:
            out[row["run_id"]] = stride
    return out


def _reasoning_end(trace_dir: Path, data: pa.Table) -> np.ndarray:
    """Per probe, the reasoning tokens of its request's trajectory (where the trajectories table
    has none: the request's last probe position, which the loader then refuses)."""
    last = data.group_by("request_id").aggregate([("position_tokens", "max")])
    at = pc.index_in(data["request_id"], value_set=last["request_id"].combine_chunks())
    end = last["position_tokens_max"].to_numpy().astype(np.int64)[at.to_numpy()]
    traj = _columns(trace_dir, "trajectories", ["request_id", "reasoning_tokens"])
    if traj is not None and traj.num_rows:
        at = pc.index_in(data["request_id"], value_set=traj["request_id"].combine_chunks())
        known = at.is_valid().to_numpy(zero_copy_only=False)
        reasoning = traj["reasoning_tokens"].to_numpy().astype(np.int64)
        end[known] = reasoning[at.drop_null().to_numpy()]
    return end


def _depth_violations(trace_dir: Path, exits: pa.Table, layers: pa.Table | None
                      ) -> list[Violation]:
    # The loader takes the model's depth from the layers table and reads the exits of every
    # depth 1..N, the deepest as the full model's reference: a depth traced past N would go
    # unread (a shallower stream taken for the full model's), a layer short of it misread.
    held = set() if layers is None else set(pc.unique(layers["layer"]).to_pylist())
    depths = set(pc.unique(exits["loaded_layers"]).to_pylist())
    exit_layers = set(pc.unique(exits["layer"]).to_pylist())
    if held == set(range(1, len(held) + 1)) and depths == held and exit_layers <= held:
        return []
    return [Violation(str(trace_dir / "exits"), f"tokens traced at loaded depths "
                      f"{_listed(depths)} with exits at layers {_listed(exit_layers)}, but the "
                      f"layers table holds layers {_listed(held)} (an exits trace runs every "
                      "depth of its model's layers 1..N)", column="loaded_layers")]


def _listed(values: set) -> str:
    """Values in order, the first 8 written out."""
    ordered = sorted(values)
    text = ", ".join(map(str, ordered[:8])) + (", ..." if len(ordered) > 8 else "")
    return text or "none"
