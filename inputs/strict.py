"""The base of every input model (configs, program workloads, policy parameters, sweep files,
calibrations) and the one line a refused input prints.

Strict: unknown keys, wrong types (`count: "2"`, `count: true`, `seed: 1.7`), NaN/inf and
non-boolean flags (`sync: "no"`) are errors; nothing is converted on the way in.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class Strict(BaseModel):
    """Strict types, unknown keys refused, finite numbers, frozen."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True,
                              protected_namespaces=())


def one_line(e: ValidationError, root: str = "config", prefix: str = "", data=None) -> str:
    """The first problem of a validation error as `path.to.key: problem` (`prefix`: the path
    of the validated mapping; `root`: what a top-level problem names without one; `data`: the
    input, whose keys tell a path from the union members pydantic names on the way)."""
    errors = e.errors()
    # An unknown key is usually the typo behind a "required" one: name it first.
    err = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = [p for p in err["loc"] if not _type_tag(p)]
    if data is not None:
        loc = _keys_of(loc, data, keep_last=err["type"] == "missing")
    path = prefix
    for p in loc[:-1] if err["type"] == "extra_forbidden" else loc:
        path += f"[{p}]" if isinstance(p, int) else (f".{p}" if path else str(p))
    where = path or prefix or root
    if err["type"] == "extra_forbidden":
        return f"{where}: unknown key {loc[-1]!r}"
    if err["type"] == "missing":
        return f"{where}: required"
    if err["type"] == "value_error":  # a model's own check: its words say what is wrong
        return f"{where}: {err['ctx']['error']}"
    return f"{where}: {err['msg']} (got {err.get('input')!r})"


def _keys_of(loc: list, data, keep_last: bool) -> list:
    """The parts of `loc` that index `data` (a tagged union's tag does not; a missing key is
    the last part, kept)."""
    keys, node = [], data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node or \
                isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            keys.append(part)
            node = node[part]
        elif keep_last and i == len(loc) - 1:
            keys.append(part)
    return keys


def _type_tag(part) -> bool:
    """A location part naming a union member or validator (`str`, `function-after[...]`,
    `tuple[...]`), not a key."""
    return isinstance(part, str) and (part in ("str", "dict") or part.startswith("function-")
                                      or "[" in part)
