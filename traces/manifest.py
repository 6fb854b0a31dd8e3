"""A trace or result directory's manifest: what it must hold, written last, checked by `traces check`.

`_manifest.json` lists every table's part files with their row counts and sha256 content hashes,
the units marked done, the nested runs (one engine each of a two-engine trace, each sealed on its
own), the run id and the workload's fingerprint. A writer seals its directory once every part is
written (`TraceWriter.seal`), so a directory without a manifest is one whose writer never reached
its end. Parquet writes no page checksums: a flipped bit in a part can decode as another value,
and only the hash sees it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from traces.schema import SCHEMAS

MANIFEST = "_manifest.json"
VERSION = 1
_KEYS = {"version", "run_id", "tables", "units", "nested", "workload_fingerprint"}


def parts(trace_dir: str | Path, table: str) -> list[Path]:
    """Part files of one table in a trace directory, in name order."""
    d = Path(trace_dir) / table
    return sorted(d.glob("part-*.parquet")) if d.is_dir() else []


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def workload_fingerprint(trace_dir: Path) -> str | None:
    """A hash of the workload the run served: each request's id, arrival time (1 us), prompt
    length and program, in id order; None without a requests table. Two runs of one workload
    (simulated and live) share it."""
    files = parts(trace_dir, "requests")
    if not files:
        return None
    cols = ["request_id", "arrival_s", "prompt_tokens", "program_id"]
    rows = sorted(
        (r["request_id"], round(r["arrival_s"] * 1e6), r["prompt_tokens"], r["program_id"] or "")
        for f in files for r in pq.read_table(f, columns=cols).to_pylist())
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def build(trace_dir: str | Path, run_id: str, files: tuple[str, ...] = ()) -> dict[str, Any]:
    """The manifest of a directory as it stands: every table's parts, done units, nested runs,
    and the sha256 of the top-level `files` named (a simulation's summary and bands)."""
    d = Path(trace_dir)
    tables, nested = {}, []
    for sub in sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        if sub.name in SCHEMAS:
            tables[sub.name] = {f.name: {"rows": pq.ParquetFile(f).metadata.num_rows,
                                         "sha256": file_sha256(f)} for f in parts(d, sub.name)}
        elif parts(sub, "runs"):
            nested.append(sub.name)
    units = sorted(p.name[:-5] for p in (d / "_units").glob("*.done"))
    return {"version": VERSION, "run_id": run_id, "tables": tables, "units": units,
            "nested": nested, "workload_fingerprint": workload_fingerprint(d),
            **({"files": {f: file_sha256(d / f) for f in files}} if files else {})}


def seal(trace_dir: str | Path, run_id: str, files: tuple[str, ...] = ()) -> dict[str, Any]:
    """Write the directory's manifest (atomically, last; `files`: top-level files it hashes
    too); returns it."""
    d = Path(trace_dir)
    manifest = build(d, run_id, files)
    tmp = d / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, d / MANIFEST)
    return manifest


def unseal(trace_dir: str | Path) -> None:
    """Remove the manifest of a directory about to be written again (a resumed trace)."""
    (Path(trace_dir) / MANIFEST).unlink(missing_ok=True)


def read(trace_dir: str | Path) -> dict[str, Any] | None:
    """The directory's manifest, None where it has none; ValueError where it is malformed."""
    path = Path(trace_dir) / MANIFEST
    if not path.exists():
        return None
    try:
        m = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(m, dict) or set(m) - {"files"} != _KEYS or m["version"] != VERSION or \
            not isinstance(m.get("files", {}), dict) or not all(
            isinstance(m[k], t) for k, t in (("tables", dict), ("units", list),
                                             ("nested", list), ("run_id", str))):
        raise ValueError(f"{path}: not a version-{VERSION} manifest (keys {sorted(_KEYS)})")
    return m


def check_sealed(trace_dir: str | Path) -> None:
    """Refuse (ValueError, one line naming the file) a sealed directory that differs from its
    manifest: a reader must not compute from bytes changed since it was written. A directory
    without a manifest (written before manifests) is `traces check`'s to judge."""
    bad = verify(trace_dir) if (Path(trace_dir) / MANIFEST).exists() else []
    if bad:
        raise ValueError(f"{bad[0][0]}: {bad[0][1]} (`reasonsim traces check "
                         f"{trace_dir}` lists all)")


def verify_part(part: str | Path) -> list[tuple[str, str]]:
    """(path, message) where a part file of a sealed directory differs from its manifest's
    entry (`traces check FILE`); none where its directory has no manifest."""
    part = Path(part)
    d, table = part.parent.parent, part.parent.name
    if not (d / MANIFEST).exists():
        return []
    try:
        m = read(d)
    except ValueError as e:
        return [(str(d / MANIFEST), str(e).split(": ", 1)[1])]
    entry = (m or {}).get("tables", {}).get(table, {}).get(part.name)
    if not isinstance(entry, dict):
        return [(str(part), "not in the manifest: added after the directory was sealed")]
    if file_sha256(part) != entry.get("sha256"):
        return [(str(part), "its bytes changed since the directory was sealed (sha256 "
                            "differs from the manifest's)")]
    return []


def verify(trace_dir: str | Path) -> list[tuple[str, str]]:
    """(path, message) of each way a directory differs from its manifest: a missing or malformed
    manifest, a listed part missing or changed (sha256), a part not listed, a listed done marker
    or nested run missing."""
    d = Path(trace_dir)
    try:
        m = read(d)
    except ValueError as e:
        return [(str(d / MANIFEST), str(e).split(": ", 1)[1])]
    if m is None:
        return [(str(d / MANIFEST), "missing: its writer never finished (killed, or still "
                 "writing), or the directory predates manifests (check it, then `reasonsim "
                 "traces seal DIR`)")]
    listed = [(d / name, sha) for name, sha in m.get("files", {}).items()] + [
        (d / table / name, entry.get("sha256") if isinstance(entry, dict) else None)
        for table, parts_ in m["tables"].items() for name, entry in parts_.items()]
    out = []
    for f, sha in listed:
        if not f.is_file():
            out.append((str(f), "listed in the manifest but missing"))
        elif file_sha256(f) != sha:
            out.append((str(f), "its bytes changed since the directory was sealed (sha256 "
                                "differs from the manifest's)"))
    for table in SCHEMAS:
        out.extend((str(f), "not in the manifest: added after the directory was sealed")
                   for f in parts(d, table) if f.name not in m["tables"].get(table, {}))
    out.extend((str(d / "_units" / f"{u}.done"), "a done marker the manifest lists is missing")
               for u in m["units"] if not (d / "_units" / f"{u}.done").is_file())
    out.extend((str(d / n), "a nested run the manifest lists is missing")
               for n in m["nested"] if not (d / n).is_dir())
    return out
