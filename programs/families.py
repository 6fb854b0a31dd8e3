"""Program families as plug-ins: one record per family, registered once, found by a workload's
method and policy wherever a program workload is read (`programs.workload`, the simulator's
harness, live replay).

A family registers its engine-free parts here (`register_family`): the methods it serves, how its
traced questions load, which traced samples a program replays. Its policies register in
`policies.registry`; the simulator's parts (program builder, oracle, extra tables) in
`sim.families.registry`. The built-in families register from their own modules (`BUILTIN`),
imported on the first lookup; no parser or harness names a family.

A family out of this tree is an installed package naming its registering module under the entry
point group `reasonsim.families` (in its pyproject.toml: `[project.entry-points."reasonsim.families"]
myfamily = "mypackage.family"`); every registry imports those modules after the built-in ones.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Callable

BUILTIN = ("programs.traced", "programs.a1_traced", "programs.seed_traced")
"""modules whose import registers the built-in families (Dynasor reasoning and search, A1,
SEED)"""
PLUGINS = "reasonsim.families"
"""the entry-point group whose modules register families installed out of this tree"""


@functools.lru_cache(maxsize=1)
def plugin_modules() -> tuple[str, ...]:
    """The modules installed packages name under `PLUGINS`, by entry-point name."""
    return tuple(ep.value for ep in sorted(entry_points(group=PLUGINS), key=lambda e: e.name))


def import_plugins() -> None:
    """Import every installed family module (each registers its parts); a clear error naming
    one that fails."""
    for module in plugin_modules():
        try:
            importlib.import_module(module)
        except Exception as e:  # a broken plug-in names itself, whatever it raised
            raise ValueError(f"family plug-in {module!r} (entry point group {PLUGINS}) failed "
                             f"to import: {type(e).__name__}: {e}") from None


@dataclass(frozen=True)
class ProgramFamily:
    """A method family's engine-free parts."""

    name: str
    """its one name (the simulator's family record has the same)"""
    methods: tuple[str, ...]
    """the `workload.programs.method` values it serves"""
    load_bank: Callable
    """(ProgramWorkload) -> the traced questions it draws from, its policy checked against them"""
    accepts: Callable = lambda policy: True
    """whether a policy of one of its methods is this family's: sc is the reasoning family's on
    a probes trace and the search family's on a branches trace, told apart by its policy"""
    samples: Callable | None = None
    """(ProgramWorkload, question, drawn sample index) -> the traced samples a program's paths
    replay, in launch order; None: none (the program decides its own requests)"""
    roles: Callable = lambda policy: ("target",)
    """(policy) -> the model roles its programs send requests to (each needs a pool serving
    it: a pool of that name, or the only pool for the target)"""


class Registry:
    """Records of families by name (simulator and live parts use one each); the built-in ones
    register when their modules are imported, on the first lookup."""

    def __init__(self, where: str, builtin: tuple[str, ...]):
        self.where, self.builtin = where, builtin
        self.records: dict[str, object] = {}

    def register(self, record):
        """Make a record findable by its `name` (a record of the same name is replaced)."""
        self.records[record.name] = record
        return record

    def all(self) -> dict[str, object]:
        """Every record, the built-in ones loaded."""
        for module in self.builtin:
            importlib.import_module(module)
        import_plugins()
        return self.records

    def get(self, name: str):
        """The record of family `name`; a clear error where it registered none."""
        if name not in self.all():
            raise ValueError(f"program family {name!r} has no {self.where} registered; "
                             f"registered: {sorted(self.records)}")
        return self.records[name]


FAMILIES = Registry("engine-free parts (programs.families)", BUILTIN)


def register_family(family: ProgramFamily) -> ProgramFamily:
    """Make a family findable by its methods (a family of the same name is replaced)."""
    return FAMILIES.register(family)


def methods() -> tuple[str, ...]:
    """Every method some registered family serves, in registration order."""
    return tuple(dict.fromkeys(m for f in FAMILIES.all().values() for m in f.methods))


def family_of(method: str, policy) -> ProgramFamily:
    """The family serving `method` under `policy`; a clear error where none does."""
    for family in FAMILIES.all().values():
        if method in family.methods and family.accepts(policy):
            return family
    raise ValueError(f"workload.programs.method: {method!r} with policy {policy!r} is served by "
                     f"no registered family; methods: {methods()}")
