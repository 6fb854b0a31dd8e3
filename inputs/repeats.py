"""When two values given in a list name the same thing, and which repeat: a repeated
grid value, seed, case, flag value or name would run (and print) one row twice or let one of
two settings silently win, so every list an input gives is checked with `repeated`."""

from __future__ import annotations

from typing import Any, Callable, Iterable


def value_key(v: Any) -> str:
    """What makes two values the same point: 16 and 16.0 are (a config reads both as the same
    number), true and 1 are not."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return repr(float(v))
    return repr(v)


def repeated(values: Iterable, key: Callable[[Any], Any] = value_key) -> list:
    """The values whose key an earlier value has, in order (empty when none repeats)."""
    seen, out = set(), []
    for v in values:
        k = key(v)
        if k in seen:
            out.append(v)
        seen.add(k)
    return out
