"""Routers: which replica gets an arriving request. Pure: plain views in, a replica index out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RequestView:
    """What a router may know about an arriving request."""

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
        """Return the least loaded replica (np.argmin takes the first minimum: explicit tie-break)."""
        return int(np.argmin(cluster.outstanding_tokens))


ROUTERS = {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding}
