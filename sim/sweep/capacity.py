"""Capacity search: the highest arrival rate, or the fewest replicas, that meets an attainment target.

Every probe simulates the config at one rate (or replica count) under each seed and takes the
metric's mean over seeds with its confidence interval. Three searches share the probes: the point
answer, where the mean meets the target; the confident bound, where the whole interval does; the
optimistic bound, where any of it does. The answer is reported with [optimistic, confident] (rate:
[confident, optimistic]), so the interval says how far seed-to-seed variation moves it. The
search assumes the metric worsens with rate and improves with replicas; a probe that breaks this
shows in the probes table, and the interval is widened to hold the answer (`note` says so). A
search that never brackets the target (met at every rate up to its ceiling, missed at every one
down to its floor, or at `max_replicas`) reports no number but what it reached (`note`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

import sim.sweep.store as store
from inputs.limits import MAX_REPLICAS
from sim.sweep.run import Backend, run_points
from sim.sweep.spec import Sweep
from sim.sweep.stats import LEVEL, mean_ci

CRITERIA = ("mean", "confident", "optimistic")
MAX_STEPS = 10  # doublings or halvings when bracketing
SUSTAINED_S = 60.0
"""arrivals that last under this at the answer's rate are named a burst (`Search._burst_note`)"""


@dataclass(frozen=True)
class Question:
    """What to search: over `rate` or `replicas`, for `metric` >= `target` over `seeds`."""

    over: str
    target: float
    metric: str = "slo_attainment"
    seeds: tuple[int, ...] = (0, 1, 2)
    level: float = LEVEL
    rel_tol: float = 0.05
    """rate: stop when the bracket is this narrow relative to its lower end"""
    max_replicas: int = 256

    def __post_init__(self) -> None:
        if self.over not in ("rate", "replicas"):
            raise ValueError(f"capacity: --over must be rate or replicas, not {self.over!r}")
        if not (self.metric == "slo_attainment" or self.metric.startswith("accuracy")):
            # the search brackets where a fraction that falls with load still meets the target
            raise ValueError(f"capacity: --metric {self.metric}: a fraction that falls as load "
                             "grows (slo_attainment, accuracy...); for a latency bound, set it "
                             "with --slo and search slo_attainment")
        if not 0 < self.target <= 1:
            raise ValueError(f"capacity: target {self.target} must be in (0, 1]")
        if len(self.seeds) < 2:
            raise ValueError("capacity: an interval needs at least 2 seeds")
        if not 1 <= self.max_replicas <= MAX_REPLICAS:
            raise ValueError(f"capacity: --max-replicas {self.max_replicas}: from 1 to "
                             f"{MAX_REPLICAS:,} (the cap on one simulation's replicas)")
        if not 0 < self.rel_tol < 1:
            raise ValueError(f"capacity: --tolerance {self.rel_tol}: between 0 and 1")


@dataclass
class Answer:
    """The search's result for one config: answer, interval and every probe."""

    label: str
    question: Question
    answer: float | None
    interval: tuple[float | None, float | None]
    probes: pd.DataFrame = field(repr=False)
    note: str | None = None
    """what the search could not settle: no bracket (and where it stopped), or probes that do
    not fall monotonically (the interval widened to hold the answer)"""

    def to_json(self) -> dict:
        """For --json and capacity.json."""
        q = self.question
        return {"policy": self.label, "over": q.over, "metric": q.metric, "target": q.target,
                "answer": self.answer, "interval": list(self.interval), "level": q.level,
                "seeds": len(q.seeds), "note": self.note,
                "probes": self.probes.to_dict("records")}


def axis_keys(base: dict, over: str) -> list[str]:
    """The config paths a probe sets: the arrival rate, or every replica group's count."""
    if over == "replicas":
        groups = base.get("cluster", {}).get("replicas") or []
        if not groups:
            raise ValueError("capacity: the config has no cluster.replicas")
        return [f"cluster.replicas.{i}.count" for i in range(len(groups))]
    wl = base.get("workload", {})
    if "programs" in wl:
        return ["workload.programs.rate_per_s"]
    if isinstance(wl.get("arrival"), dict) and "rate_per_s" in wl["arrival"]:
        return ["workload.arrival.rate_per_s"]
    raise ValueError("capacity --over rate: the workload has no arrival rate "
                     "(workload.arrival.rate_per_s or workload.programs.rate_per_s)")


class Search:
    """Probes of one config, cached by value; `answer()` runs the three searches."""

    def __init__(self, label: str, base: dict, base_dir: Path, question: Question,
                 out_dir: Path, backend: Backend, on_probe=None):
        self.label, self.base, self.base_dir, self.q = label, base, base_dir, question
        self.out_dir, self.backend, self.on_probe = out_dir, backend, on_probe
        self.keys = axis_keys(base, question.over)
        self.probes: dict[float, tuple[float, float, float]] = {}
        self.limits: dict[str, str] = {}
        """criterion -> where its search stopped without bracketing the target"""

    def probe(self, x: float) -> tuple[float, float, float]:
        """(mean, lo, hi) of the metric over seeds at rate or replica count x."""
        if x not in self.probes:
            case = {k: (int(x) if self.q.over == "replicas" else x) for k in self.keys}
            sweep = Sweep(self.base, self.base_dir, {}, [case], list(self.q.seeds))
            points = run_points(sweep, self.out_dir, self.backend)
            df = store.collect(self.out_dir, sweep, points)
            if self.q.metric not in df.columns:
                raise ValueError(f"capacity: the simulation reports no {self.q.metric!r} "
                                 "(slo_attainment needs an slo: or program deadlines)")
            self.probes[x] = mean_ci(df[self.q.metric], self.q.level)
            if self.on_probe is not None:
                self.on_probe(self.label, x, *self.probes[x])
        return self.probes[x]

    def ok(self, x: float, criterion: str) -> bool:
        """Does x meet the target under the criterion?"""
        mean, lo, hi = self.probe(x)
        value = {"mean": mean, "confident": lo, "optimistic": hi}[criterion]
        return value >= self.q.target

    def answer(self) -> Answer:
        """The point answer and its interval."""
        x0 = float(self.base_value())
        found = {}
        for crit in CRITERIA:
            start = found.get("mean") or x0  # the bounds lie near the point answer
            found[crit] = (self._max_rate(start, crit) if self.q.over == "rate"
                           else self._min_replicas(int(start), crit))
        rows = [{"value": x, "mean": m, "lo": lo, "hi": hi, "meets": m >= self.q.target}
                for x, (m, lo, hi) in sorted(self.probes.items())]
        lo, hi = ((found["confident"], found["optimistic"]) if self.q.over == "rate"
                  else (found["optimistic"], found["confident"]))
        notes = [f"{'answer' if c == 'mean' else c + ' bound'}: {m}"
                 for c, m in self.limits.items()]
        answer = found["mean"]
        if answer is not None and (lo is not None and lo > answer or
                                   hi is not None and hi < answer):
            lo = None if lo is None else min(lo, answer)
            hi = None if hi is None else max(hi, answer)
            notes.append("the probes do not fall monotonically: the interval is widened to "
                         "hold the answer (see the probes)")
        if self.q.over == "rate" and self.probes:  # at the answer, or the highest rate probed
            notes.extend(self._burst_note(answer or max(self.probes)))
        return Answer(self.label, self.q, answer, (lo, hi), pd.DataFrame(rows),
                      "; ".join(notes) or None)

    def _burst_note(self, rate: float) -> list[str]:
        """A note where a fixed count of arrivals lasts under SUSTAINED_S at `rate`: the probes
        measured a burst and its drain, not sustained load."""
        wl = self.base.get("workload", {})
        key, count = (("workload.programs.count", wl["programs"].get("count", 64))
                      if "programs" in wl else ("workload.num_requests", wl.get("num_requests")))
        if not isinstance(count, int) or count / rate >= SUSTAINED_S:
            return []
        return [f"{key} is fixed at {count}: at {rate:g}/s they arrive within "
                f"{count / rate:.3g} s, a burst rather than sustained load (give more, or "
                "workload.duration_s)"]

    def base_value(self) -> float:
        """The config's own rate or replica count (where the search starts)."""
        node = self.base
        for part in self.keys[0].split("."):
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node

    def _max_rate(self, start: float, crit: str) -> float | None:
        """The highest rate meeting the criterion, within rel_tol (None: not even start/2^10)."""
        x = _round(start)
        if self.ok(x, crit):
            lo, hi = x, None
            for _ in range(MAX_STEPS):
                x = _round(x * 2)
                if not self.ok(x, crit):
                    hi = x
                    break
                lo = x
            if hi is None:  # met even at the largest rate probed: no bracket
                self.limits[crit] = f"met at every rate probed, up to {lo:.4g} (the search's " \
                    "ceiling: start from a higher rate)"
                return None
        else:
            lo, hi = None, x
            for _ in range(MAX_STEPS):
                x = _round(x / 2)
                if self.ok(x, crit):
                    lo = x
                    break
                hi = x
            if lo is None:
                self.limits[crit] = f"missed at every rate probed, down to {hi:.4g}"
                return None
        while (hi - lo) > self.q.rel_tol * lo:
            mid = _round((lo + hi) / 2)
            if mid in (lo, hi):
                break
            if self.ok(mid, crit):
                lo = mid
            else:
                hi = mid
        return lo

    def _min_replicas(self, start: int, crit: str) -> int | None:
        """The fewest replicas meeting the criterion (None: not even max_replicas)."""
        lo, hi = 0, None  # lo fails (0 replicas serve nothing), hi meets
        n = max(1, start)
        while hi is None:
            if self.ok(n, crit):
                hi = n
            elif n >= self.q.max_replicas:
                self.limits[crit] = f"missed at {self.q.max_replicas} replicas (--max-replicas)"
                return None
            else:
                lo, n = n, min(2 * n, self.q.max_replicas)
        while hi > 1 and lo == 0:  # walk down while the count still meets it
            n = hi // 2
            if self.ok(n, crit):
                hi = n
            else:
                lo = n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.ok(mid, crit):
                hi = mid
            else:
                lo = mid
        return hi


def _round(x: float) -> float:
    """Probe rates at 4 significant digits, so nearby searches share probes."""
    return float(f"{x:.4g}")
