"""Trace replay workloads: reasonsim `requests` tables, Azure, Mooncake, BurstGPT and Vidur CSV.

Arrival times come from the file, shifted so the first is 0. A row that cannot be read raises
naming the file and the row; rows are never dropped or clipped silently (the one filter,
BurstGPT's failed requests, is the explicit `drop_failed`). pandas and the trace store are
imported by the readers only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import numpy as np

from sim.workloads.base import NO_PREFIX_GROUP, Workload, first_index
from sim.workloads.schema import TraceFile

MOONCAKE_BLOCK_TOKENS = 512
"""tokens per Mooncake `hash_ids` block (fixed by the Mooncake trace format)"""
_MAX_TOKENS = 2**31 - 1
"""token counts are int32 in the requests table"""


def _trace_path(path: str, base_dir: Path, fmt: str) -> Path:
    resolved = Path(path) if Path(path).is_absolute() else base_dir / path
    if not resolved.exists():
        raise ValueError(f"workload.trace.path: {resolved} does not exist ({fmt} trace)")
    want_dir = fmt == "requests"
    if want_dir != resolved.is_dir():
        raise ValueError(f"workload.trace.path: {resolved} must be a "
                         f"{'trace directory' if want_dir else 'file'} for format {fmt}")
    return resolved


def _read_csv(path: Path, columns: tuple[str, ...]):
    """Read a CSV as text (so every cell can be checked), requiring the named columns."""
    import pandas as pd

    try:
        # utf-8-sig: a byte-order mark would otherwise glue itself to the first column name.
        df = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True,
                         encoding="utf-8-sig")
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path}: empty file, expected a header with {', '.join(columns)}") \
            from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: malformed CSV: {e}") from None
    df.columns = [str(c).strip() for c in df.columns]
    for col in columns:
        if col not in df.columns:
            raise ValueError(f"{path}: missing column {col!r} (has {', '.join(df.columns)})")
    return df


def _csv_numbers(df, col: str, path: Path, whole: bool) -> np.ndarray:
    """A CSV column as float64; a blank, non-numeric, fractional (if whole) or negative cell
    raises naming the file, the row (1-based, after the header) and the column."""
    import pandas as pd

    text = df[col].astype(str).str.strip()
    values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    checks = [(~np.isfinite(values), "is not a number")]
    if whole:
        with np.errstate(invalid="ignore"):
            checks.append((values != np.round(values), "is not a whole number"))
    checks.append((values < 0, "is negative"))
    for bad, why in checks:
        with np.errstate(invalid="ignore"):
            if np.any(bad):
                r = first_index(bad)
                raise ValueError(f"{path}: row {r + 1} (after the header): column {col!r} value "
                                 f"{text.iloc[r]!r} {why}")
    return values


def _check_lengths(prompt: np.ndarray, output: np.ndarray, names: tuple[str, str], path: Path,
                   row_of: Callable[[int], str]) -> None:
    """Lengths must be >= 1 (a 0-token prompt or output cannot be served) and fit the tables'
    32-bit token counts; raise naming the row."""
    for values, name in zip((prompt, output), names):
        bad = values < 1
        if np.any(bad):
            r = first_index(bad)
            raise ValueError(f"{path}: {row_of(r)}: {name} is {values[r]:g}, must be >= 1")
        bad = values > _MAX_TOKENS
        if np.any(bad):
            r = first_index(bad)
            raise ValueError(f"{path}: {row_of(r)}: {name} is {values[r]:g}, more than "
                             f"{_MAX_TOKENS} tokens")


def _csv_lengths(df, path: Path, prompt_col: str, output_col: str) -> tuple:
    """(prompt, output) lengths from two CSV columns, every cell checked."""
    prompt = _csv_numbers(df, prompt_col, path, whole=True)
    output = _csv_numbers(df, output_col, path, whole=True)
    _check_lengths(prompt, output, (prompt_col, output_col), path, _csv_row)
    return prompt, output


def _csv_row(r: int) -> str:
    return f"row {r + 1} (after the header)"


def _read_azure(path: Path, opts: TraceFile) -> tuple:
    """Azure LLM inference trace: TIMESTAMP (datetime), ContextTokens, GeneratedTokens."""
    import pandas as pd

    df = _read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    # ISO8601 mode reads the trace's 7 fractional digits (pandas keeps nanoseconds).
    text = df["TIMESTAMP"].astype(str).str.strip()
    # Zoned stamps (Z, +01:00, +0100) are read as UTC instants, whatever their offsets; a stamp
    # without a zone among zoned ones names no instant (local time of which zone?).
    zoned = text.str.contains(r"(?:Z|[+-]\d\d:?\d\d)$", regex=True).to_numpy()
    if len(zoned) and zoned.any() and not zoned.all():
        r = first_index(zoned != zoned[0])
        raise ValueError(f"{path}: {_csv_row(r)}: column 'TIMESTAMP' value "
                         f"{df['TIMESTAMP'].iloc[r]!r} has {'no' if zoned[0] else 'a'} timezone "
                         f"and row 1 {'has' if zoned[0] else 'none'}: give every row one or none")
    stamps = pd.to_datetime(text, format="ISO8601", errors="coerce", utc=bool(zoned.any()))
    bad = stamps.isna().to_numpy()
    if np.any(bad):
        r = first_index(bad)
        raise ValueError(f"{path}: {_csv_row(r)}: column 'TIMESTAMP' value "
                         f"{df['TIMESTAMP'].iloc[r]!r} is not a datetime")
    arrival = ((stamps - stamps.min()) / pd.Timedelta(seconds=1)).to_numpy(dtype=np.float64)
    return (arrival, *_csv_lengths(df, path, "ContextTokens", "GeneratedTokens"), None)


def _read_vidur(path: Path, opts: TraceFile) -> tuple:
    """Vidur trace CSV: arrived_at (s), num_prefill_tokens, num_decode_tokens."""
    df = _read_csv(path, ("arrived_at", "num_prefill_tokens", "num_decode_tokens"))
    arrival = _csv_numbers(df, "arrived_at", path, whole=False)
    return (arrival, *_csv_lengths(df, path, "num_prefill_tokens", "num_decode_tokens"), None)


def _read_burstgpt(path: Path, opts: TraceFile) -> tuple:
    """BurstGPT CSV: Timestamp (s), Request tokens, Response tokens (Model, Log Type unused)."""
    df = _read_csv(path, ("Timestamp", "Request tokens", "Response tokens"))
    arrival = _csv_numbers(df, "Timestamp", path, whole=False)
    prompt = _csv_numbers(df, "Request tokens", path, whole=True)
    output = _csv_numbers(df, "Response tokens", path, whole=True)
    # BurstGPT logs a failed request with 0 response tokens. Dropping those rows is the one
    # filter a replay does, and only with drop_failed (default true); with drop_failed: false
    # such a row is an error like any other 0-token length, since it cannot be served as is.
    drop = opts.drop_failed is not False
    rows = np.arange(len(df))
    if drop:
        keep = output != 0
        arrival, prompt, output, rows = arrival[keep], prompt[keep], output[keep], rows[keep]
    _check_lengths(prompt, output, ("Request tokens", "Response tokens"), path,
                   lambda r: _csv_row(int(rows[r])))
    return arrival, prompt, output, None


def _read_requests(path: Path, opts: TraceFile) -> tuple:
    """A reasonsim trace directory's `requests` table (validated by the trace store)."""
    from traces import read_table
    from traces.manifest import check_sealed

    check_sealed(path)  # a changed byte is refused, not replayed
    table = read_table(path, "requests")
    cols = [table.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
            for c in ("arrival_s", "prompt_tokens", "output_tokens")]
    _check_lengths(cols[1], cols[2], ("prompt_tokens", "output_tokens"), path / "requests",
                   lambda r: f"row {r} (0-based, as the trace checker counts)")
    return cols[0], cols[1], cols[2], None


def _read_mooncake(path: Path, opts: TraceFile) -> tuple:
    """Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (512-token blocks)."""
    fields = ("timestamp", "input_length", "output_length", "hash_ids")
    arrival, prompt, output, hashes = [], [], [], []
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            where = f"{path}: line {line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{where}: not UTF-8 text (byte {e.start})") from None
            if not line.strip():
                continue  # a blank (e.g. trailing) line holds no request
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            for key in fields:
                if key not in row:
                    raise ValueError(f"{where}: missing field {key!r}")
            for key, whole in (("timestamp", False), ("input_length", True),
                               ("output_length", True)):
                v = row[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ValueError(f"{where}: field {key!r} value {v!r} is not a number")
                if v < 0:
                    raise ValueError(f"{where}: field {key!r} value {v!r} is negative")
                if whole and v != int(v):
                    raise ValueError(f"{where}: field {key!r} value {v!r} is not a whole number")
            ids = row["hash_ids"]
            if not isinstance(ids, list) or not all(
                    isinstance(h, int) and not isinstance(h, bool) for h in ids):
                raise ValueError(f"{where}: field 'hash_ids' must be a list of ints, got {ids!r}")
            if any(not 0 <= h < 2**62 for h in ids):  # a group id: >= 0 (-1 is no prefix), int64
                raise ValueError(f"{where}: field 'hash_ids' holds {min(ids)}..{max(ids)}; block "
                                 "ids are integers from 0 to 2^62")
            for key in ("input_length", "output_length"):
                if row[key] < 1:
                    raise ValueError(f"{where}: {key} is {row[key]}, must be >= 1")
                if row[key] > _MAX_TOKENS:
                    raise ValueError(f"{where}: {key} is {row[key]}, more than {_MAX_TOKENS} "
                                     "tokens")
            arrival.append(row["timestamp"] / 1000.0)
            prompt.append(row["input_length"])
            output.append(row["output_length"])
            hashes.append(tuple(ids))
    # Sharing is computed after sorting and `limit`, over the requests actually replayed.
    return (np.array(arrival, dtype=np.float64), np.array(prompt, dtype=np.float64),
            np.array(output, dtype=np.float64), hashes)


def mooncake_prefixes(hash_ids: list[tuple[int, ...]], prompt_tokens: np.ndarray,
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Prefix group and shared-prefix length of each Mooncake request, from its hash_ids."""
    # Rule: prefix_group = the request's first hash_id (NO_PREFIX_GROUP when it has none);
    # prefix_tokens = 512 * (the longest run of leading hash_ids the request shares with any
    # other request of the workload), capped at its prompt length. A request whose first block
    # nobody else has gets prefix_tokens 0. Every member of a group counts its shared prefix,
    # the first arrival included (as with synthetic `prefix`): whether it hits the cache is the
    # simulator's business. Computed exactly with a trie of the hash_id sequences: walk each
    # sequence while the node below was reached by >= 2 requests.
    root: dict = {}
    counts: dict[int, int] = {}
    for ids in hash_ids:
        node = root
        for h in ids:
            node = node.setdefault(h, {})
            counts[id(node)] = counts.get(id(node), 0) + 1
    group = np.empty(len(hash_ids), dtype=np.int64)
    shared = np.empty(len(hash_ids), dtype=np.int64)
    for i, ids in enumerate(hash_ids):
        group[i] = ids[0] if ids else NO_PREFIX_GROUP
        node, depth = root, 0
        for h in ids:
            node = node[h]
            if counts[id(node)] < 2:
                break
            depth += 1
        shared[i] = min(depth * MOONCAKE_BLOCK_TOKENS, int(prompt_tokens[i]))
    return group, shared


_READERS = {"requests": _read_requests, "azure": _read_azure, "mooncake": _read_mooncake,
            "burstgpt": _read_burstgpt, "vidur": _read_vidur}


def replay(spec: TraceFile, base_dir: Path) -> Workload:
    """A workload replayed from a trace file: its arrivals (shifted to start at 0) and lengths."""
    fmt = spec.format
    path = _trace_path(spec.path, base_dir, fmt)
    time_scale, limit = spec.time_scale, spec.limit
    arrival, prompt, output, hashes = _READERS[fmt](path, spec)
    if not len(arrival):
        raise ValueError(f"{path}: no requests in the {fmt} trace")
    # Traces are meant to be in time order, but sorting (stably: ties keep file order) costs
    # nothing and makes `limit` mean "the earliest N" whatever the file order.
    order = np.argsort(arrival, kind="stable")[:limit]
    arrival, prompt, output = arrival[order], prompt[order], output[order]
    group = shared = None
    if hashes is not None:
        group, shared = mooncake_prefixes([hashes[i] for i in order], prompt)
    # Shift so the first request arrives at 0, then stretch inter-arrival times by time_scale.
    try:
        return Workload((arrival - arrival[0]) * time_scale, prompt, output, group, shared)
    except ValueError as e:  # arrivals spread past the clock's precision, say
        raise ValueError(f"{path} (time_scale {time_scale:g}): {e}") from None
