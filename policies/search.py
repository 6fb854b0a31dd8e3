"""Multi-path reasoning programs (Dynasor's SC, MCTS and Rebase): search decisions and stops. Pure.

A program produces solutions (paths that reached an answer), each with a reward from a model
signal: the path's likelihood under the model, `exp(mean token log-probability)`, never the gold
answer. The search algorithms decide what to generate next:

- MCTS: each iteration selects a node by UCT over the tree (root included), generates a rollout
  from it to an answer, adds the rollout's first step as a new child and backs the solution's
  reward up its ancestors. One solution per iteration; the knob is the iteration count.
- Rebase: level by level, every open node of the frontier gets `round(W' * softmax(r / T))`
  children, one reasoning step each, where W' is the width not yet used by finished solutions.
  The knob is the width W.

`SearchBudget` is the intra-program allocation policy over any such program: a resource cap, and
an optional certaindex stop (at a detection step, or a Pareto-frontier curve mapping certaindex
to the number of solutions a program may still use).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Sequence

from policies.certaindex import Certaindex, answer_certainty, reward_certainty

SEARCH_METHODS = ("sc", "mcts", "rebase")
# How a method aggregates path rewards into certaindex and picks its answer (Dynasor).
REWARD_AGGREGATE = {"sc": "mean", "mcts": "mean", "rebase": "max"}


def path_reward(logprob_sum: float, tokens: int) -> float:
    """A path's reward: its geometric-mean token likelihood under the model, in (0, 1]."""
    if tokens < 1:
        raise ValueError("path_reward needs at least one token")
    return math.exp(logprob_sum / tokens)


def rebase_children(rewards: Sequence[float], width: int, temperature: float) -> list[int]:
    """Children per frontier node: `width` split by softmax(reward / T), largest remainder."""
    if width < 0 or temperature <= 0:
        raise ValueError(f"rebase_children needs width >= 0 and temperature > 0, got {width}, "
                         f"{temperature}")
    if not rewards or width == 0:
        return [0] * len(rewards)
    top = max(rewards)
    w = [math.exp((r - top) / temperature) for r in rewards]
    total = sum(w)
    share = [width * x / total for x in w]
    n = [int(s) for s in share]
    # Largest remainders first; ties go to the earlier node (an explicit, stable tie-break).
    order = sorted(range(len(share)), key=lambda i: (n[i] - share[i], i))
    for i in order[: width - sum(n)]:
        n[i] += 1
    return n


def uct_select(visits: Sequence[int], value_sums: Sequence[float], expandable: Sequence[bool],
               total_visits: int, exploration: float) -> int:
    """The expandable node with the highest UCT score, over nodes given as columns (visits,
    summed values, expandable: not an answer, not at the token budget); unvisited nodes first;
    ties: lowest index."""
    best, best_score = -1, -math.inf
    log_n = math.log(max(total_visits, 1))
    for i, n in enumerate(visits):
        if not expandable[i]:
            continue
        if n == 0:
            return i
        score = value_sums[i] / n + exploration * math.sqrt(log_n / n)
        if score > best_score:
            best, best_score = i, score
    if best < 0:
        raise ValueError("uct_select: no expandable node")
    return best


def majority_vote(answers: Sequence[str | None]) -> str | None:
    """Most frequent non-empty answer; ties go to the answer reached first; None if none."""
    counts = Counter(a for a in answers if a)
    if not counts:
        return None
    return max(counts, key=lambda a: (counts[a], -answers.index(a)))


def weighted_vote(answers: Sequence[str | None], weights: Sequence[float]) -> str | None:
    """The answer with the largest total weight (Rebase); ties: the answer reached first."""
    total: dict[str, float] = defaultdict(float)
    for a, w in zip(answers, weights):
        if a:
            total[a] += w
    if not total:
        return None
    return max(total, key=lambda a: (total[a], -answers.index(a)))


def best_of_n(answers: Sequence[str | None], rewards: Sequence[float]) -> str | None:
    """The answer of the highest-reward solution (MCTS); ties: the earlier solution."""
    best = None
    for a, r in zip(answers, rewards):
        if a and (best is None or r > best[1]):
            best = (a, r)
    return None if best is None else best[0]


def program_answer(method: str, answers: Sequence[str | None],
                   rewards: Sequence[float]) -> str | None:
    """A search program's final answer from its solutions (Dynasor's aggregation per method)."""
    if method == "mcts":
        return best_of_n(answers, rewards)
    if method == "rebase":
        return weighted_vote(answers, rewards)
    return majority_vote(answers)


@dataclass(frozen=True)
class ParetoFrontier:
    """Certaindex -> how many solutions a program may use: stop once it has used that many.

    `rules` are (certaindex at least, solutions at most) pairs; the most permissive rule that a
    program's current certaindex reaches applies. A fitted skyline
    (`sim.families.dynasor.search.fit_frontier`).
    """

    rules: tuple[tuple[float, int], ...]
    signal: str = "entropy"
    """entropy (1 - H/log n of the answers) or reward (aggregated path reward)"""

    def __post_init__(self) -> None:
        if self.signal not in ("entropy", "reward"):
            raise ValueError(f"ParetoFrontier.signal: {self.signal!r}; expected entropy or reward")
        for t, n in self.rules:
            if n < 1:
                raise ValueError(f"ParetoFrontier rule ({t}, {n}): solutions must be >= 1")

    def allows_stop(self, certaindex: float, solutions: int) -> bool:
        """Whether a program with this certaindex may stop after `solutions` solutions."""
        return any(certaindex >= t and solutions >= n for t, n in self.rules)


@dataclass(frozen=True)
class SearchBudget:
    """Allocation for a multi-path program: up to `cap` solutions, stopped early by certaindex.

    - `certaindex` alone: checked at every checkpoint from two solutions on (with `every`: only
      at the checkpoints that cross a multiple of `every` solutions, Dynasor's k-step threshold);
    - with `detect`: checked once, at the first checkpoint with at least `detect` solutions
      (detect@knob); an uncertain program then runs to the cap;
    - `frontier`: a Pareto-frontier curve instead of one threshold, checked at every checkpoint
      (dynamic curve fitting); with `detect`, read once on the first `detect` solutions' signal,
      which then sets the solutions the program may use (initial-step curve fitting);
    - `length_tokens` with `detect` (baseline-length): checked once, at the detection
      checkpoint, stop if the solving requests' mean output length is this short (short
      reasoning = an easy question), in place of certaindex.
    None of them: baseline-even (every program gets the cap).
    """

    cap: int
    certaindex: Certaindex | None = None
    detect: int | None = None
    frontier: ParetoFrontier | None = None
    reward_aggregate: str = "mean"
    per_round: int = 0
    """sc: paths launched per round, a checkpoint after each (0: all at once)"""
    length_tokens: float | None = None
    """baseline-length: at the detection checkpoint, stop if the solutions' mean output
    length is this short"""
    every: int = 0
    """certaindex: check only where a checkpoint crosses a multiple of this many solutions
    (0: at every checkpoint)"""

    def __post_init__(self) -> None:
        if self.cap < 1 or self.per_round < 0:
            raise ValueError(f"SearchBudget needs cap >= 1 and per_round >= 0, got cap="
                             f"{self.cap}, per_round={self.per_round}")
        if self.detect is not None and not 1 <= self.detect <= self.cap:
            raise ValueError(f"SearchBudget.detect must be in 1..cap={self.cap}, got {self.detect}")
        if self.certaindex is not None and self.frontier is not None:
            raise ValueError("SearchBudget: choose certaindex or frontier, not both")
        if self.every < 0 or (self.every and (self.certaindex is None or self.detect is not None)):
            raise ValueError(f"SearchBudget.every {self.every}: a cadence (>= 1) for certaindex "
                             "checked at every checkpoint (no detect)")
        if self.every > self.cap:  # no checkpoint would cross a multiple: never checked
            raise ValueError(f"SearchBudget.every {self.every}: more than the cap ({self.cap}) "
                             "solutions, so certaindex would never be checked")
        if self.length_tokens is not None and (self.detect is None or self.certaindex is not None
                                               or self.frontier is not None):
            raise ValueError("SearchBudget: length_tokens (baseline-length) needs detect and "
                             "no certaindex or frontier")

    @property
    def name(self) -> str:
        """Label in tables and figures: cap, rounds, the stopping signal or frontier."""
        parts = [f"cap={self.cap}"]
        if self.per_round:
            parts.append(f"r={self.per_round}")
        cx = self.certaindex
        if cx is not None:
            if cx.entropy_threshold is not None:
                parts.append(f"H>={cx.entropy_threshold:g}")
            if cx.reward_threshold is not None:
                parts.append(f"R{cx.reward_aggregate}>={cx.reward_threshold:g}")
            if self.detect is not None:
                parts[-1] += f"@{self.detect}"
        if self.frontier is not None:
            parts.append(f"frontier({self.frontier.signal}:" + ";".join(
                f"{t:g}->{n}" for t, n in self.frontier.rules) + ")")
        if self.length_tokens is not None:
            parts.append(f"len<={self.length_tokens:g}@{self.detect}")
        elif self.frontier is not None and self.detect is not None:
            parts[-1] += f"@{self.detect}"
        if self.every:
            parts.append(f"every={self.every}")
        return "search(" + ",".join(parts) + ")"

    def should_stop(self, answers: Sequence[str | None], rewards: Sequence[float],
                    previous: int = 0, lengths: Sequence[int] = ()) -> bool:
        """After a checkpoint (`previous` solutions before it; `lengths`: the solving requests'
        output tokens, for baseline-length): stop the program now?"""
        n = len(answers)
        if n >= self.cap:
            return True
        if self.length_tokens is not None:  # checked once, at the detection checkpoint
            return previous < self.detect <= n and sum(lengths) / n <= self.length_tokens
        if self.frontier is not None:
            if self.detect is not None:  # the first `detect` solutions' signal sets the budget
                if n < self.detect:
                    return False
                answers, rewards = answers[:self.detect], rewards[:self.detect]
            if len(answers) < 2 and self.frontier.signal == "entropy":
                return False  # entropy over one answer says nothing
            return self.frontier.allows_stop(
                self.signal_value(self.frontier.signal, answers, rewards), n)
        if self.certaindex is None:
            return False
        if self.detect is not None:
            # Checked once: at the checkpoint that crossed the detection step.
            if not previous < self.detect <= n:
                return False
        elif n < 2:
            return False  # entropy over one answer says nothing
        elif self.every and previous // self.every == n // self.every:
            return False  # no multiple of `every` crossed at this checkpoint
        return self.certaindex.is_certain(answers, rewards)

    def signal_value(self, signal: str, answers: Sequence[str | None],
                     rewards: Sequence[float]) -> float:
        """The certaindex signal a frontier reads: answer certainty or aggregated reward."""
        if signal == "entropy":
            return answer_certainty(answers)
        return reward_certainty(rewards, self.reward_aggregate)


def certaindex_for(method: str, entropy_threshold: float | None = None,
                   reward_threshold: float | None = None) -> Certaindex:
    """Certaindex with the method's reward aggregate (MCTS mean, Rebase max)."""
    return Certaindex(entropy_threshold, reward_threshold, REWARD_AGGREGATE[method])
