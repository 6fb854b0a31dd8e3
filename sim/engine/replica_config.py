"""Engine limits of one replica."""

from __future__ import annotations

from dataclasses import dataclass

from sim.engine.spec_decode import SpecDecoding


NULL_BLOCKS = 1
"""blocks of the pool no request holds: vLLM's block pool keeps one as its null block (the
engine reports it among its `num_gpu_blocks`, and as used)"""


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
    """KV blocks of the pool, as the engine reports them (`num_gpu_blocks`: its null block
    included; `usable_blocks` are what requests hold)"""
    enable_prefix_caching: bool = False
    """reuse KV blocks of a shared prompt prefix (request prefix_group / prefix_tokens)"""
    priority_scheduling: bool = False
    """vLLM's scheduling_policy="priority": waiting by (priority, arrival); preempt the lowest"""
    spec: SpecDecoding | None = None
    """in-engine speculative decoding: each decode iteration verifies K drafted tokens"""
    scheduler: str = "reasonsim"
    """whose code composes each step (`sim.engine.replica_kinds`)"""

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "kv_blocks"):
            least = 1 + NULL_BLOCKS if name == "kv_blocks" else 1
            if getattr(self, name) < least:
                raise ValueError(f"replica {name} must be >= {least}, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:  # vLLM's SchedulerConfig refuses it
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                             f">= max_num_seqs ({self.max_num_seqs}), as vLLM requires")

    @property
    def usable_blocks(self) -> int:
        """KV blocks requests can hold: the pool less its null block."""
        return self.kv_blocks - NULL_BLOCKS
