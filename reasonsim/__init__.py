"""The `reasonsim` command line; importing it makes every replica kind available to simulations."""

from __future__ import annotations


def register_replica_kinds() -> None:
    """Register `scheduler: vllm` (`validation.vllm_replica`): vLLM is imported only when such a
    replica is built."""
    from sim.engine.replica_kinds import register

    def vllm_replica(*args, **kw):
        from validation.vllm_replica import VllmReplica

        return VllmReplica(*args, **kw)

    register("vllm", vllm_replica)


register_replica_kinds()
