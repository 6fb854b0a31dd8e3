"""Inter-program scheduling (Dynasor and its baselines) as request priorities. Pure.

Every request of a program gets an integer priority when it is submitted; the engine runs the
lowest first and breaks ties by arrival (vLLM's `scheduling_policy="priority"`):

- `fcfs`: everything equal, so requests run in arrival order and a program's later requests queue
  behind newer programs (vLLM's default);
- `lpm`: longest prefix match first (SGLang-like): the request with the most reasoning behind it,
  which has the longest cached prefix;
- `app_fifo`: gang by program in program arrival order (Parrot-like);
- `dynasor`: gang by program, shortest estimated remaining work first (estimated from the
  lengths of programs that already finished), and starvation prevention: a program older than
  `escalate_after_s` jumps ahead of every non-escalated program, oldest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

_RANKS = 100_000  # program ranks below this stay ordered inside one priority class


@dataclass(frozen=True)
class ProgramView:
    """What a scheduler may know about a program when one of its requests is submitted."""

    arrival_rank: int
    """0-based order of the program's arrival"""
    age_s: float
    """time since the program arrived"""
    tokens_done: int
    """tokens the program has generated so far"""


@dataclass(frozen=True)
class Fcfs:
    """First come, first served per request (vLLM's default)."""

    name = "fcfs"

    def priority(self, view: ProgramView, finished_tokens: Sequence[int]) -> int:
        """Priority of the program's next request (lower runs first)."""
        return 0


@dataclass(frozen=True)
class LongestPrefixMatch:
    """Longest cached prefix first: the program with the most reasoning so far."""

    name = "lpm"

    def priority(self, view: ProgramView, finished_tokens: Sequence[int]) -> int:
        """Priority of the program's next request (lower runs first)."""
        return -view.tokens_done


@dataclass(frozen=True)
class AppFifo:
    """Gang scheduling in program arrival order."""

    name = "app_fifo"

    def priority(self, view: ProgramView, finished_tokens: Sequence[int]) -> int:
        """Priority of the program's next request (lower runs first)."""
        return view.arrival_rank


@dataclass(frozen=True)
class DynasorGang:
    """Gang + approximate shortest-job-first + starvation escalation."""

    escalate_after_s: float = 10.0
    """programs older than this run before all others, oldest first"""
    default_remaining_tokens: int = 128
    """estimate before any program has finished (or beyond every finished one)"""
    name = "dynasor"

    def __post_init__(self) -> None:
        if self.escalate_after_s <= 0:
            raise ValueError(f"escalate_after_s must be > 0, got {self.escalate_after_s}")

    def remaining_tokens(self, tokens_done: int, finished_tokens: Sequence[int]) -> int:
        """Median remaining tokens of finished programs that were at least this long."""
        longer = sorted(t - tokens_done for t in finished_tokens if t > tokens_done)
        if not longer:
            return self.default_remaining_tokens
        return longer[len(longer) // 2]

    def priority(self, view: ProgramView, finished_tokens: Sequence[int]) -> int:
        """Priority of the program's next request (lower runs first)."""
        rank = view.arrival_rank % _RANKS
        if view.age_s > self.escalate_after_s:
            return -_RANKS + rank
        return self.remaining_tokens(view.tokens_done, finished_tokens) * _RANKS + rank


SCHEDULERS = {"fcfs": Fcfs, "lpm": LongestPrefixMatch, "app_fifo": AppFifo,
              "dynasor": DynasorGang}


def make_scheduler(spec: str | dict):
    """A scheduler from its name or a mapping {type: name, ...parameters}."""
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict) or "type" not in spec:
        raise ValueError(f"scheduler: expected a name or a mapping with 'type', got {spec!r}")
    args = dict(spec)
    kind = args.pop("type")
    if kind not in SCHEDULERS:
        raise ValueError(f"scheduler {kind!r} unknown; known: {sorted(SCHEDULERS)}")
    try:
        return SCHEDULERS[kind](**args)
    except TypeError as e:
        raise ValueError(f"scheduler {kind!r}: {e}") from None
