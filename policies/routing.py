"""Routers: which replica gets an arriving request. Pure: plain views in, a replica index out."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class RequestView(NamedTuple):
    """What a router may know about an arriving request (a named tuple: one is made per routed
    request or program, at a third of a frozen dataclass's cost)."""

    request_index: int
    """position of the request in the workload"""
    prompt_tokens: int
    """prompt length"""
    output_tokens: int
    """output length (known to simulators and replay; a live router would estimate it)"""


@dataclass(frozen=True)
class ClusterView:
    """Per-replica load, as arrays indexed by replica id (read-only to the router)."""

    outstanding_tokens: np.ndarray
    """prompt + output tokens of requests routed and not finished"""
    num_requests: np.ndarray
    """requests routed and not finished"""


class RoundRobin:
    """Replica i, i+1, ... in turn."""

    def __init__(self) -> None:
        self.next = 0

    def route(self, request: RequestView, cluster: ClusterView) -> int:
        """Return the next replica in turn."""
        n = len(cluster.num_requests)
        choice = self.next % n
        self.next = choice + 1
        return choice


class LeastOutstanding:
    """The replica with the fewest outstanding tokens; ties go to the lowest replica id."""

    def route(self, request: RequestView, cluster: ClusterView) -> int:
        """Return the least loaded replica (argmin takes the first minimum: explicit tie-break)."""
        return int(cluster.outstanding_tokens.argmin())  # the method: np.argmin's wrapper costs more


ROUTERS = {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding}


def make_router(name: str):
    """A router by name (policies.routing) or a user policy given as module:Class."""
    if name in ROUTERS:
        return ROUTERS[name]()
    if ":" in name:  # a user policy: "package.module:Class"
        module, cls = name.split(":", 1)
        try:
            factory = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError, TypeError, ValueError) as e:  # "", ".rel"
            raise ValueError(f"router {name!r}: cannot load ({e})") from None
        try:
            router = factory() if isinstance(factory, type) else None
        except TypeError as e:  # a constructor that needs arguments
            raise ValueError(f"cluster.router {name!r}: a router class is built with no "
                             f"arguments ({e})") from None
        if not callable(getattr(router, "route", None)):
            raise ValueError(f"cluster.router {name!r}: not a class with route(request, "
                             "cluster)")
        return router
    raise ValueError(f"router {name!r} unknown; known: {sorted(ROUTERS)} or module:Class")
