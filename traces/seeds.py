"""Sampling seeds of traced requests: a request is a deterministic function of its seed.

Part of the data contract (traces record them): tracers, programs and the live runner derive
seeds here so that a replay reproduces a trace request for request.
"""

from __future__ import annotations


def request_seed(seed: int, question_index: int, sample_id: int) -> int:
    """The per-request sampling seed of one question x sample."""
    return (seed * 1_000_003 + question_index) * 1_009 + sample_id


def chunk_seed(req_seed: int, chunk_index: int) -> int:
    """The sampling seed of one chunk of a request (probes use the negative chunk index)."""
    return (req_seed * 7_919 + chunk_index) % (2**63 - 1)
