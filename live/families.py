"""The live side of each program family, found by the family's name (`programs.families`): how
its programs are built from their plans with real prompts, for the one-engine live replay
(`live.replay.replay_workload`).

A family registers a `LiveFamily` from its own module (`BUILTIN` lists the built-in ones,
imported on the first lookup); the replay asks for it by name. A1 and SEED run on two engines
(draft and target) and keep their own replays (`live/a1.py`, `live/seed.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from programs.families import Registry

BUILTIN = ("live.dynasor",)
"""modules whose import registers the built-in families' live parts"""


@dataclass(frozen=True)
class LiveFamily:
    """A program family's live parts."""

    name: str
    """the family's name in `programs.families`"""
    build_runs: Callable
    """(ProgramWorkload, bank, plans, the trace's workload parameters, encode: text -> token
    ids) -> (LiveRuns, gold answer by program id)"""
    trace_key: str = "trace"
    """the key naming its trace in a replay's `runs` parameters"""


FAMILIES = Registry("live replay (live.families)", BUILTIN)


def register_live_family(family: LiveFamily) -> LiveFamily:
    """Make a family's live parts findable by its name (the same name is replaced)."""
    return FAMILIES.register(family)


def live_family(name: str) -> LiveFamily:
    """The live parts of family `name`; a clear error where it registered none."""
    return FAMILIES.get(name)
