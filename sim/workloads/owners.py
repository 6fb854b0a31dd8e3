"""Who sent each simulated request (`ProgramDriver.owner`), by request idx: columns, not an object
per request, for the tables and the families' folds."""

from __future__ import annotations

from array import array

from programs.base import RequestSpec


class Owners:
    """Whose each simulated request is, by request idx, for the tables: columns, not an object
    per request (the specs are dropped once done: a million programs' would hold gigabytes)."""

    __slots__ = ("program", "index", "path", "role", "roles", "codes", "base")

    def __init__(self):
        self.base = 0  # the request idx of the columns' first entry (`forget`)
        self.program = array("q")  # the program's index in the workload
        self.index = array("q")    # the spec's request order within its program
        self.path = array("q")     # the spec's path
        self.role = bytearray()    # its (model role, requests-table role), a code into `roles`
        self.roles: list[tuple[str, str]] = []
        self.codes: dict[tuple[str, str], int] = {}

    def __len__(self) -> int:
        return self.base + len(self.program)

    def forget(self, upto: int) -> None:
        """Let the entries of requests below `upto` go (a run that folds its requests)."""
        k = upto - self.base
        for column in (self.program, self.index, self.path, self.role):
            del column[:k]
        self.base = upto

    def code(self, spec: RequestSpec) -> int:
        """The code of the spec's (model role, requests-table role), numbered as first seen
        (`ProgramDriver._submit` appends each request's columns)."""
        key = (spec.role, spec.table_role)
        if key not in self.codes:
            self.codes[key] = len(self.roles)
            self.roles.append(key)
        return self.codes[key]

    def role_names(self) -> list[str]:
        """Each request's model role, in idx order."""
        # list(): mypyc (benchmarks/compiled_python.py) cannot iterate a bytearray here
        return [self.roles[c][0] for c in list(self.role)]
