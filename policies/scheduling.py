"""Inter-program scheduling (Dynasor and its baselines) as request priorities. Pure.

Every request of a program gets an integer priority when it is submitted; the engine runs the
lowest first and breaks ties by arrival (vLLM's `scheduling_policy="priority"`):

- `fcfs`: everything equal, so requests run in arrival order and a program's later requests queue
  behind newer programs (vLLM's default);
- `lpm`: longest prefix match first (SGLang-like): the request with the most reasoning behind it,
  which has the longest cached prefix;
- `app_fifo`: gang by program in program arrival order (Parrot-like);
- `dynasor`: gang by program, shortest estimated remaining work first, and starvation
  prevention: a program older than `escalate_after_s` jumps ahead of every non-escalated
  program, oldest first. The remaining work is estimated from the lengths of programs that
  already finished (`estimate: finished`), or, as the paper's approximate SJF, by the program
  itself from its own history times what its knob leaves (`estimate: program`; programs
  without their own estimate fall back to the finished ones'); `dynasor_sjf` names the latter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple
_RANKS = 100_000  # program ranks below this stay ordered inside one priority class
MAX_ESTIMATE_TOKENS = (2**31 - 1) // _RANKS - 1
"""a remaining-work estimate given in a config at most this: its priority (x `_RANKS`) fits
the requests table's int32"""


class ProgramView(NamedTuple):
    """What a scheduler may know about a program when one of its requests is submitted."""

    arrival_rank: int
    """0-based order of the program's arrival"""
    age_s: float
    """time since the program arrived"""
    tokens_done: int
    """tokens the program has generated so far"""
    remaining_tokens: int | None = None
    """the program's own estimate of the tokens it may still generate, where the scheduler
    asks for it (`wants_program_estimate`) and the program has one"""


def fenwick(counts: list[int]) -> list[int]:
    """The Fenwick tree (1-based, one longer) over `counts`, built in linear time."""
    tree = [0] + counts[:]
    size = len(counts)
    for i in range(1, size + 1):
        j = i + (i & -i)
        if j <= size:
            tree[j] += tree[i]
    return tree


class FinishedLengths:
    """Token counts of the programs finished so far: add one, or ask for the median of those
    longer than a count, each in O(log T) (a Fenwick tree over counts 0..T), so an SJF estimate
    per request stays cheap however many programs have finished."""

    def __init__(self, tokens=()):
        self._counts = [0] * 1024   # programs per token count
        self._tree = [0] * 1025     # Fenwick tree over _counts (1-based)
        self._n = 0
        self._medians: dict[int, int | None] = {}  # tokens done -> answer, until the next add
        for t in tokens:
            self.add(t)

    def __len__(self) -> int:
        return self._n

    def add(self, tokens: int) -> None:
        """One more finished program of `tokens` tokens."""
        if tokens < 0:
            raise ValueError(f"a program's token count must be >= 0, got {tokens}")
        self._medians.clear()
        if tokens >= len(self._counts):
            self._grow(tokens)
        self._counts[tokens] += 1
        i, tree = tokens + 1, self._tree
        while i < len(tree):
            tree[i] += 1
            i += i & -i
        self._n += 1

    def _grow(self, tokens: int) -> None:
        size = len(self._counts)
        while size <= tokens:
            size *= 2
        self._counts += [0] * (size - len(self._counts))
        self._tree = fenwick(self._counts)

    def median_remaining(self, tokens_done: int) -> int | None:
        """Median of (t - tokens_done) over finished counts t > tokens_done (the upper median,
        as sorted(...)[n // 2]); None when none is longer."""
        m = self._medians.get(tokens_done, -1)  # a program's requests of one instant ask alike
        if m == -1:  # (an answer is > 0 or None)
            m = self._medians[tokens_done] = self._median_remaining(tokens_done)
        return m

    def _median_remaining(self, tokens_done: int) -> int | None:
        # one pass for the count <= tokens_done, one descent for the k-th smallest; the tree in
        # a local: this runs for most requests of a program workload
        tree, size = self._tree, len(self._counts)  # size: a power of two
        i, below = min(tokens_done + 1, size), 0
        while i:
            below += tree[i]
            i &= i - 1
        longer = self._n - below
        if longer == 0:
            return None
        k, pos = below + longer // 2, 0
        while size:  # the k-th smallest (0-based) sits at 1-based index pos + 1: count = pos
            if tree[pos + size] <= k:
                pos += size
                k -= tree[pos]
            size //= 2
        return pos - tokens_done


@dataclass(frozen=True)
class Fcfs:
    """First come, first served per request (vLLM's default)."""

    name = "fcfs"

    def priority(self, view: ProgramView, finished: FinishedLengths) -> int:
        """Priority of the program's next request (lower runs first)."""
        return 0


@dataclass(frozen=True)
class LongestPrefixMatch:
    """Longest cached prefix first: the program with the most reasoning so far."""

    name = "lpm"

    def priority(self, view: ProgramView, finished: FinishedLengths) -> int:
        """Priority of the program's next request (lower runs first)."""
        return -view.tokens_done


@dataclass(frozen=True)
class AppFifo:
    """Gang scheduling in program arrival order."""

    name = "app_fifo"

    def priority(self, view: ProgramView, finished: FinishedLengths) -> int:
        """Priority of the program's next request (lower runs first)."""
        return view.arrival_rank


@dataclass(frozen=True)
class DynasorGang:
    """Gang + approximate shortest-job-first + starvation escalation."""

    escalate_after_s: float = 10.0
    """programs older than this run before all others, oldest first"""
    default_remaining_tokens: int = 128
    """estimate before any program has finished (or beyond every finished one)"""
    estimate: str = "finished"
    """remaining work from finished programs' lengths, or from the program's own history
    (`program`: the paper's approximate SJF)"""
    name = "dynasor"

    def __post_init__(self) -> None:
        e, d = self.escalate_after_s, self.default_remaining_tokens
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0 < e < math.inf:
            raise ValueError(f"escalate_after_s must be a number > 0, got {e!r}")
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= MAX_ESTIMATE_TOKENS:
            raise ValueError(f"default_remaining_tokens must be a whole number from 0 to "
                             f"{MAX_ESTIMATE_TOKENS}, got {d!r}")
        if self.estimate not in ("finished", "program"):
            raise ValueError(f"estimate must be finished or program, got {self.estimate!r}")

    @property
    def wants_program_estimate(self) -> bool:
        """The driver asks each program for its own remaining-work estimate."""
        return self.estimate == "program"

    def remaining_tokens(self, tokens_done: int, finished: FinishedLengths) -> int:
        """Median remaining tokens of finished programs that were longer than this one so far."""
        median = finished.median_remaining(tokens_done)
        return self.default_remaining_tokens if median is None else median

    def priority(self, view: ProgramView, finished: FinishedLengths) -> int:
        """Priority of the program's next request (lower runs first)."""
        rank = view.arrival_rank % _RANKS
        if view.age_s > self.escalate_after_s:
            return -_RANKS + rank
        if view.remaining_tokens is not None and self.estimate == "program":
            return view.remaining_tokens * _RANKS + rank
        # remaining_tokens, inlined, and median_remaining's memo read here: once a request
        median = finished._medians.get(view.tokens_done, -1)
        if median == -1:
            median = finished.median_remaining(view.tokens_done)
        return (self.default_remaining_tokens if median is None else median) * _RANKS + rank


@dataclass(frozen=True)
class DynasorOwnSjf(DynasorGang):
    """Dynasor's gang scheduling ordered by the paper's approximate SJF: each program's own
    remaining-work estimate (`dynasor` with `estimate: program`, by a name of its own so that
    sweeps and the ablation can list it beside the finished-programs estimate)."""

    estimate: str = "program"
    name = "dynasor_sjf"


def program_estimate(scheduler, program) -> int | None:
    """The program's own remaining-work estimate where the scheduler wants it and the program
    has one (`remaining_tokens`); else None."""
    if not getattr(scheduler, "wants_program_estimate", False):
        return None
    estimate = getattr(program, "remaining_tokens", None)
    return None if estimate is None else estimate()


SCHEDULERS = {"fcfs": Fcfs, "lpm": LongestPrefixMatch, "app_fifo": AppFifo,
              "dynasor": DynasorGang, "dynasor_sjf": DynasorOwnSjf}


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
    except (TypeError, ValueError) as e:
        raise ValueError(f"cluster.scheduler {kind!r}: {e}") from None
