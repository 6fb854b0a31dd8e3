"""The tokens an early-exit policy observes, read a block at a time. Pure.

Per token, the max probability at each loaded exit. A policy asks a block of tokens two things:
an evaluation's exit counts and summed -log probabilities per depth (`exit_counts`,
`exit_neglog_sums`), and whether each token's last loaded exit breaches a threshold (`below`).
`Rows` answers from per-token lists (a live round's) with the functions here; the simulator's
blocks answer from its profiles' arrays, or a what-if's first exits, with the same values
(`sim.families.helios.blocks`). The -log values are `math.log`'s, so a block's sums equal the
token-by-token loop's to the last bit (numpy's log may differ from it in the last bit).
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

FLOOR = 1e-12
"""the smallest probability a -log is taken of"""


class TokenBlock(Protocol):
    """Tokens in stream order, each with its max probability at every loaded exit."""

    def rows(self) -> np.ndarray:
        """tokens x exits: the max probabilities."""

    def neglog(self) -> np.ndarray:
        """tokens x exits: -log(max(p, FLOOR)) of `rows`, by `neg_log`."""

    def last(self) -> np.ndarray:
        """Each token's max probability at its last loaded exit."""

    def below(self, threshold: float) -> np.ndarray:
        """Each token's max probability at its last loaded exit below `threshold`."""

    def exit_counts(self, threshold: float) -> np.ndarray:
        """Per loaded exit, the tokens leaving there at `threshold` (`exit_counts`)."""

    def exit_neglog_sums(self, start: np.ndarray) -> np.ndarray:
        """Per loaded exit, `start` and the tokens' -log values added in turn (`column_sums`)."""


def neg_log(p: np.ndarray) -> np.ndarray:
    """-log(max(p, FLOOR)) of every value, each by `math.log`, once per distinct value."""
    p = np.asarray(p, dtype=float)
    values, inverse = np.unique(p, return_inverse=True)
    logs = np.array([-math.log(max(x, FLOOR)) for x in values.tolist()], dtype=float)
    return logs[inverse].reshape(p.shape)


def first_exits(rows: np.ndarray, threshold: float) -> np.ndarray:
    """Each token's first exit (0-based) whose max probability reaches `threshold`, else its
    last loaded one (`rows`: tokens x exits)."""
    reached = rows >= threshold
    if reached.size:
        reached[:, -1] = True
    return reached.argmax(axis=1)


def exit_counts(rows: np.ndarray, threshold: float) -> np.ndarray:
    """Per loaded exit (0-based), the tokens whose first exit reaching `threshold` it is, the
    last counting those reaching it nowhere (`rows`: tokens x exits)."""
    if not len(rows):
        return np.zeros(rows.shape[1], dtype=np.int64)
    return np.bincount(first_exits(rows, threshold), minlength=rows.shape[1])


def column_sums(start: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per column, `start` and then each row's value added in turn (a sequential cumulative sum:
    a token-by-token loop's sums to the last bit)."""
    return np.cumsum(np.vstack([start, values]), axis=0)[-1]


class Rows:
    """A block from per-token lists (or a tokens x exits array)."""

    def __init__(self, tokens):
        try:
            self.max_probs = np.asarray(tokens, dtype=float)
        except ValueError:  # rows of unequal lengths
            self.max_probs = np.zeros(1)
        if self.max_probs.ndim != 2:
            if len(tokens):
                raise ValueError("tokens: every token needs one max probability per loaded "
                                 "exit, the same count for each")
            self.max_probs = np.zeros((0, 0))

    def rows(self) -> np.ndarray:
        """tokens x exits: the max probabilities."""
        return self.max_probs

    def neglog(self) -> np.ndarray:
        """tokens x exits: -log(max(p, FLOOR))."""
        return neg_log(self.max_probs)

    def last(self) -> np.ndarray:
        """Each token's max probability at its last loaded exit."""
        return self.max_probs[:, -1] if self.max_probs.size else np.zeros(len(self.max_probs))

    def below(self, threshold: float) -> np.ndarray:
        """Each token's max probability at its last loaded exit below `threshold`."""
        return self.last() < threshold

    def exit_counts(self, threshold: float) -> np.ndarray:
        """Per loaded exit, the tokens leaving there at `threshold` (`exit_counts`)."""
        return exit_counts(self.max_probs, threshold)

    def exit_neglog_sums(self, start: np.ndarray) -> np.ndarray:
        """Per loaded exit, `start` and the tokens' -log values added in turn (`column_sums`)."""
        return column_sums(start, self.neglog())


class BreachWindow:
    """The last `window` tokens' breach flags and how many of them breached, taken a block of
    tokens at a time (the window's count after each token from a cumulative sum)."""

    def __init__(self, window: int):
        self.window = window
        self.flags = np.zeros(0, dtype=bool)
        """the last `window` flags, oldest first"""

    def extend(self, breached) -> None:
        """Flags in turn, the oldest leaving a full window."""
        new = np.asarray(breached, dtype=bool)[-self.window:]  # the last `window` are kept
        self.flags = np.concatenate([self.flags, new])[-self.window:]

    def first_over(self, breached, limit: int) -> int:
        """Flags in turn up to the first whose window holds more than `limit` breaches: its
        index, the flags after it left out (-1: none, every flag in). Read in stretches that
        double from a few windows, so a window filling early costs that stretch, not the
        block."""
        new = np.asarray(breached, dtype=bool)
        a, size = 0, 4 * self.window
        while a < len(new):
            t = self._first_over(new[a:a + size], limit)
            if t >= 0:
                return a + t
            a, size = a + size, 2 * size
        return -1

    def _first_over(self, new: np.ndarray, limit: int) -> int:
        old, w = len(self.flags), self.window
        # seen[i]: breaches in the first i flags (int32: numpy sums bools into it ~10x faster
        # than into int64)
        seen = np.zeros(old + len(new) + 1, dtype=np.int32)
        np.cumsum(np.concatenate([self.flags, new]), dtype=np.int32, out=seen[1:])
        # the window after flag i (1-based) holds seen[i] - seen[max(i - w, 0)]; new flags are
        # i > old: those before the window's first full length, then the rest, as slices
        full = max(old + 1, w)
        t = _first_true(seen[old + 1:full] > limit)
        if t < 0:
            t = _first_true(seen[full:] - seen[full - w:-w] > limit)
            t = t if t < 0 else full - old - 1 + t
        self.extend(new if t < 0 else new[:t + 1])
        return t

    def clear(self) -> None:
        """No token in the window."""
        self.flags = np.zeros(0, dtype=bool)


def _first_true(flags: np.ndarray) -> int:
    """The first True's index (-1: none)."""
    k = int(flags.argmax()) if flags.size else 0
    return k if flags.size and flags[k] else -1
