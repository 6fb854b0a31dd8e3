"""Engine limits of one replica."""

from __future__ import annotations

from dataclasses import dataclass

from sim.engine.spec_decode import SpecDecoding


@dataclass(frozen=True)
class ReplicaConfig:
    """Engine limits of one replica (defaults come from the calibration's traced engine)."""

    max_num_seqs: int
    """max sequences per iteration"""
    max_num_batched_tokens: int
    """token budget per iteration (chunked prefill splits longer prompts)"""
    block_size: int
    """KV block size in tokens"""
    kv_blocks: int
    """KV blocks available"""
    enable_prefix_caching: bool = False
    """reuse KV blocks of a shared prompt prefix (request prefix_group / prefix_tokens)"""
    priority_scheduling: bool = False
    """vLLM's scheduling_policy="priority": waiting by (priority, arrival); preempt the lowest"""
    spec: SpecDecoding | None = None
    """in-engine speculative decoding: each decode iteration verifies K drafted tokens"""

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "kv_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"replica {name} must be >= 1, got {getattr(self, name)}")
