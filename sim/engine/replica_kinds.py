"""Replica kinds by the code that composes their steps: the simulator's own, or one registered.

A replica group's `scheduler` names it. `reasonsim` is the simulator's replica
(`sim.engine.replica`, its lazy variant and the compiled kernels). Others are registered by
the layers above the simulator, which may import an engine (the simulator may not): the
command line registers `vllm` (`validation.vllm_replica`, the installed vLLM's `Scheduler`).
A kind is a class built as `Replica` is, which runs one event per iteration.
"""

from __future__ import annotations

from typing import Callable

OWN = "reasonsim"
_KINDS: dict[str, Callable] = {}


def register(name: str, factory: Callable) -> None:
    """Make replica kind `name` available: `factory(env, id, cal, rc, res, rng, **kw)` builds one
    replica, as `Replica(...)` does."""
    _KINDS[name] = factory


def replica_factory(name: str) -> Callable:
    """The registered factory of kind `name` (not the simulator's own)."""
    try:
        return _KINDS[name]
    except KeyError:
        raise ValueError(
            f"scheduler {name!r} is not available here: the `reasonsim` command registers it "
            f"(from Python: import reasonsim, then reasonsim.register_replica_kinds())"
        ) from None
