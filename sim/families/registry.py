"""The simulator's side of each program family, found by the family's name
(`programs.families`): how its programs are built and answered, and what tables it adds.

A family registers a `SimFamily` from its own module (`BUILTIN` lists the built-in ones,
imported on the first lookup); the harness (`sim.workloads.programs`) asks for it by name.

A family whose experiments are a config section of their own (HELIOS: `helios:`, a prompt stream
served by every policy in turn) registers a `ConfigSection`; `reasonsim simulate` and `sweep`
find it by the section's key (`section_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from programs.families import Registry

BUILTIN = ("sim.families.dynasor.driver", "sim.families.a1.driver", "sim.families.seed.driver")
"""modules whose import registers the built-in families' simulator parts"""


@dataclass(frozen=True)
class SimFamily:
    """A program family's simulator parts."""

    name: str
    """the family's name in `programs.families`"""
    build_runs: Callable
    """(ProgramWorkload, bank, plans) -> (SimPrograms, a bound on their requests, the oracle
    that answers their requests from the trace: `request` and `outcome`)"""
    results: Callable | None = None
    """(runs, driver, cluster, makespan_s) -> (extra tables by name, extra summary); None: none"""
    folds: Callable | None = None
    """(runs, driver) -> what `results` reads of each request where a run keeps no requests
    table (`output.requests: false`): an object whose `fold(first_idx, columns)` takes the
    requests as they fold (`sim.engine.folded_requests`), found by `results` as
    `cluster.res.folded.family`; None where `results` reads no request's columns"""
    releases_programs: bool = False
    """a program gives its row when it closes and is let go (nothing reads it after: a million
    programs' paths need not stay)"""
    compiles: bool = False
    """the program kernel may run its replicas (`why_not_compiled_programs` decides the rest)"""
    templated: bool = False
    """every program of one question sends the same requests whatever the timing: in rounds,
    none before its round returned and none aborted, or (a program that says
    `sends_on_own_outcome`) each after the request whose outcome it follows: each question's
    decided once (`sim.workloads.program_templates`)"""
    template_rows: bool = False
    """its tables read each templated request's number in its template (`ProgramDriver.trows`:
    the rows of ToT's templated programs are their recording's)"""


FAMILIES = Registry("simulator parts (sim.families.registry)", BUILTIN)


def register_sim_family(family: SimFamily) -> SimFamily:
    """Make a family's simulator parts findable by its name (the same name is replaced)."""
    return FAMILIES.register(family)


def sim_family(name: str) -> SimFamily:
    """The simulator parts of family `name`; a clear error where it registered none."""
    return FAMILIES.get(name)


@dataclass(frozen=True)
class ConfigSection:
    """A family simulated from a top-level config section of its own."""

    name: str
    """the section's key in a config"""
    load: Callable
    """(config mapping, base directory) -> the experiment, validated and its inputs loaded
    (ValueError naming the key otherwise); its `simulate()` gives {policy name: result with
    `summary()`}, and `devices()` the devices its inputs were measured on"""


SECTIONS = Registry("config section (sim.families.registry)", ("sim.families.helios.config",))


def register_section(section: ConfigSection) -> ConfigSection:
    """Make a config section findable by its key."""
    return SECTIONS.register(section)


def section_of(config) -> ConfigSection | None:
    """The family section a config mapping has (None: a plain simulate config)."""
    if not isinstance(config, dict):
        return None
    return next((s for key, s in SECTIONS.all().items() if key in config), None)
