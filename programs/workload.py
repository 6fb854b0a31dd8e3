"""A program workload: which traced questions arrive, how fast, under which policy, by when.

Parsed once from a config's `workload.programs`; drawn into plain `ProgramPlan`s (arrival,
question, traced samples, deadline) that the simulator and the live runner both run, so the
same config and seed give the same programs in both.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field, ValidationError

from inputs.limits import MAX_PROGRAMS, MIN_RATE_PER_S
from inputs.strict import Strict, one_line
from policies.registry import make_policy
from programs.families import family_of, methods
from programs.traced import QuestionBank
from traces.manifest import check_sealed
from traces import ids


@dataclass(frozen=True)
class ProgramWorkload:
    """Which traced questions arrive, how fast, how they are reasoned about, and deadlines."""

    trace: Path
    """probes trace (reasonsim trace probes), branches trace (reasonsim trace branches) or
    conformity trace (reasonsim trace conformity, method a1) or tot trace (reasonsim trace tot,
    method tot)"""
    method: str
    """cot, sc, mcts, rebase, a1 or tot"""
    policy: object
    """ProbeConsistency | TokenBudget | FullReasoning (cot), SelfConsistency (sc on a probes
    trace) or SearchBudget (sc, mcts, rebase on a branches trace)"""
    count: int
    """programs to simulate"""
    rate_per_s: float
    """Poisson program arrival rate"""
    base_deadline_s: float
    """deadline of a program of average difficulty at SLO scale 1"""
    slo_scale: float = 1.0


class DeadlineSpec(Strict):
    """`deadline:` a program's deadline at average difficulty, and the SLO scale on it."""

    base_s: Annotated[float, Field(gt=0)]
    slo_scale: Annotated[float, Field(gt=0)] = 1.0


class ProgramsSpec(Strict):
    """`workload.programs`: its keys typed and bounded (the policy is its family's to check)."""

    trace: Annotated[str, Field(min_length=1)]
    method: str = "cot"
    policy: Any
    count: Annotated[int, Field(ge=1, le=MAX_PROGRAMS)] = 64
    rate_per_s: Annotated[float, Field(ge=MIN_RATE_PER_S)]
    """programs per second: at least one a day (slower puts arrivals where a latency vanishes
    in the clock's float precision)"""
    deadline: DeadlineSpec


def program_workload(d: dict, base_dir: str | Path = ".") -> ProgramWorkload:
    """Validate a `workload.programs` mapping: one-line errors naming the key."""
    try:
        spec = ProgramsSpec.model_validate(d)
    except ValidationError as e:
        raise ValueError(one_line(e, prefix="workload.programs")) from None
    if spec.method not in methods():
        raise ValueError(f"workload.programs.method: {spec.method!r}; expected one of "
                         f"{methods()}")
    return ProgramWorkload(trace=(Path(base_dir) / spec.trace).resolve(), method=spec.method,
                           policy=make_policy(spec.method, spec.policy), count=spec.count,
                           rate_per_s=spec.rate_per_s, base_deadline_s=spec.deadline.base_s,
                           slo_scale=spec.deadline.slo_scale)


BANKS_KEPT = 4
"""banks a process keeps loaded (`load_bank`): the points of a sweep, a capacity search's probes
and a fidelity suite's workloads read the same traces again and again"""
_BANKS: OrderedDict = OrderedDict()


def load_bank(wl: ProgramWorkload):
    """The traced questions a workload draws from (its family's trace), policy checked; a
    process loads a trace once per state of its files, method and policy (banks are read, never
    written: every run of one shares it)."""
    key = _bank_key(wl)
    bank = _BANKS.get(key)
    if bank is not None:
        _BANKS.move_to_end(key)
        return bank
    try:
        check_sealed(wl.trace)  # a changed byte is refused, not replayed
        bank = family_of(wl.method, wl.policy).load_bank(wl)
    except ValueError as e:  # what the policy cannot replay names its key; the rest is the trace's
        if str(e).startswith(("programs.policy", "workload.programs")):
            raise
        raise type(e)(f"workload.programs.trace: {e}") from None
    _BANKS[key] = bank
    if len(_BANKS) > BANKS_KEPT:
        _BANKS.popitem(last=False)
    return bank


def _bank_key(wl: ProgramWorkload) -> tuple:
    """What a loaded bank depends on: the trace's files as they are now (path, modification
    time and size of each: a rewritten file loads again), the method and the policy."""
    path = Path(wl.trace).resolve()
    files = tuple(sorted((str(f), st.st_mtime_ns, st.st_size) for f in path.rglob("*")
                         if f.is_file() for st in (f.stat(),)))
    return (path, files, wl.method, repr(wl.policy))


def forget_banks() -> None:
    """Drop every kept bank: the next `load_bank` reads its trace again (benchmarks that time
    a whole run, the load included)."""
    _BANKS.clear()



def draw_programs(bank: QuestionBank, count: int, rate_per_s: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrival times, question indices and cot sample indices of `count` programs."""
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, size=count))
    arrival -= arrival[0]
    # Every question once per pass, in a seeded order: accuracy is not left to the draw.
    passes = -(-count // len(bank.questions))
    order = np.concatenate([rng.permutation(len(bank.questions)) for _ in range(passes)])[:count]
    counts = [len(getattr(q, "samples", (0,))) for q in bank.questions]
    if all(c == 1 for c in counts):  # one sample each (search, A1, ToT): nothing to draw
        return arrival, order, np.zeros(count, dtype=np.int64)
    # one bound per program: the same draws as one `integers` call per program in turn
    return arrival, order, rng.integers(np.asarray(counts)[order])


@dataclass(frozen=True)
class ProgramPlan:
    """One program of a workload, as drawn: plain values, the same for sim and live."""

    index: int
    """order of arrival within the workload"""
    question_id: str
    difficulty: int | None
    arrival_s: float
    deadline_s: float
    sample_ids: tuple[int, ...]
    """traced samples its paths replay, in launch order (cot, sc on a probes trace)"""

    @cached_property  # read once per request when tables are written
    def program_id(self) -> str:
        """The program's id in every table."""
        return ids.program_id(self.index)


def plan_programs(wl: ProgramWorkload, bank, seed) -> list[ProgramPlan]:
    """The programs of a workload: arrival, question, samples and deadline (sim and live)."""
    arrival, order, sample = draw_programs(bank, wl.count, wl.rate_per_s,
                                           np.random.default_rng(seed))
    plans = []
    samples_of = family_of(wl.method, wl.policy).samples
    for i in range(wl.count):
        q = bank.questions[order[i]]
        deadline = wl.slo_scale * bank.difficulty_factor.get(q.difficulty or 0, 1.0) * \
            wl.base_deadline_s
        samples = samples_of(wl, q, int(sample[i])) if samples_of else ()
        plans.append(ProgramPlan(i, q.question_id, q.difficulty, float(arrival[i]), deadline,
                                 samples))
    return plans


def draw_seed(seed: int, replicas: int):
    """The seed the program draw uses (after one per replica), so live replays draw the same."""
    return np.random.SeedSequence(seed).spawn(replicas + 1)[-1]
