"""A profile's token streams as arrays, and what serving a loaded depth gives each prompt.

Per loaded depth, every token of the stream in rows (stream order, prompt by prompt): its max
probability and its token (argmax) at exits 1..depth; `starts` index each prompt's first token
and end the last. A round's tokens are read as one block (`RoundBlock`, a
`policies.exit_tokens.TokenBlock`), and what serving the depth gives each of its prompts (its
length, its tokens' -log probabilities at the depth summed in token order, the tokens agreeing
with the full model's) is computed for the round's prompts at once (`served_at_depth`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.exit_tokens import column_sums, exit_counts, first_exits, neg_log

CHUNK_VALUES = 1 << 22
"""values a padded per-prompt sum takes at once (the memory it holds)"""


class DepthStream:
    """One loaded depth's traced stream: per token, the max probability and token at each
    exit."""

    def __init__(self, max_prob: np.ndarray, argmax: np.ndarray | None, starts: np.ndarray):
        self.max_prob, self.argmax, self.starts = max_prob, argmax, starts
        self.depth = max_prob.shape[1]
        self._neglog: np.ndarray | None = None
        """-log of every max probability, computed at the first read (`neg_log`)"""

    def rows(self, index) -> np.ndarray:
        """tokens x exits: the max probabilities of the tokens at `index`."""
        return self.max_prob[index]

    def at(self, index, layer: int) -> np.ndarray:
        """The max probability at `layer` (1-based) of the tokens at `index`."""
        return self.max_prob[index, layer - 1]

    def ids_at(self, index, layer: int) -> np.ndarray | None:
        """The token at `layer` of the tokens at `index` (None: no tokens traced)."""
        return None if self.argmax is None else self.argmax[index, layer - 1]

    def neglog(self, index) -> np.ndarray:
        """tokens x exits: -log(max(p, FLOOR)) of the tokens at `index` (`neg_log`)."""
        return self._neglogs()[index]

    def neglog_at(self, index, layer: int) -> np.ndarray:
        """-log(max(p, FLOOR)) at `layer` of the tokens at `index`."""
        return self._neglogs()[index, layer - 1]

    def below(self, block: "RoundBlock", threshold: float) -> np.ndarray:
        """Each token of `block` below `threshold` at the last exit."""
        return self.at(block.index, self.depth) < threshold

    def exit_counts(self, block: "RoundBlock", threshold: float) -> np.ndarray:
        """Per exit, the tokens of `block` leaving there at `threshold`."""
        return exit_counts(self.rows(block.index), threshold)

    def exit_neglog_sums(self, block: "RoundBlock", start: np.ndarray) -> np.ndarray:
        """Per exit, `start` and the -log values of `block`'s tokens added in turn."""
        return column_sums(start, self.neglog(block.index))

    def prompt_nll(self, block: "RoundBlock") -> np.ndarray:
        """Per prompt of `block`, its tokens' -log values at the last exit in token order."""
        return prompt_sums(self.neglog_at(block.index, self.depth),
                           np.r_[0, np.cumsum(block.lengths)])

    def _neglogs(self) -> np.ndarray:
        if self._neglog is None:  # once: every policy and round reads the same stream
            self._neglog = neg_log(self.max_prob)
        return self._neglog


def token_index(starts: np.ndarray, prompts) -> np.ndarray | slice:
    """The tokens of `prompts` (stream indices) in turn: a slice where they follow one another."""
    p = np.asarray(prompts, dtype=np.int64)
    if len(p) and (np.diff(p) == 1).all():
        return slice(int(starts[p[0]]), int(starts[p[-1] + 1]))
    lengths = starts[p + 1] - starts[p]
    offset = np.repeat(starts[p] - (np.cumsum(lengths) - lengths), lengths)
    return offset + np.arange(int(lengths.sum()))


class RoundBlock:
    """A round's tokens at one loaded depth, its prompts' in turn (a `TokenBlock`)."""

    def __init__(self, stream, prompts):
        self.stream = stream
        self.prompts = np.asarray(prompts, dtype=np.int64)
        """stream indices, in turn"""
        self._index = None

    @property
    def lengths(self) -> np.ndarray:
        """Each prompt's tokens."""
        return self.stream.starts[self.prompts + 1] - self.stream.starts[self.prompts]

    @property
    def index(self) -> np.ndarray | slice:
        """The prompts' tokens in turn (`token_index`), computed at the first read."""
        if self._index is None:
            self._index = token_index(self.stream.starts, self.prompts)
        return self._index

    def rows(self) -> np.ndarray:
        """tokens x exits: the max probabilities."""
        return self.stream.rows(self.index)

    def neglog(self) -> np.ndarray:
        """tokens x exits: -log(max(p, FLOOR))."""
        return self.stream.neglog(self.index)

    def last(self) -> np.ndarray:
        """Each token's max probability at the loaded depth."""
        return self.stream.at(self.index, self.stream.depth)

    def below(self, threshold: float) -> np.ndarray:
        """Each token's max probability at the loaded depth below `threshold` (`last`'s)."""
        return self.stream.below(self, threshold)

    def exit_counts(self, threshold: float) -> np.ndarray:
        """Per loaded exit, the tokens leaving there at `threshold` (`exit_counts`)."""
        return self.stream.exit_counts(self, threshold)

    def exit_neglog_sums(self, start: np.ndarray) -> np.ndarray:
        """Per loaded exit, `start` and the tokens' -log values added in turn (`column_sums`)."""
        return self.stream.exit_neglog_sums(self, start)

    def prompt_nll(self) -> np.ndarray:
        """Per prompt, its tokens' -log(max(p, FLOOR)) at the loaded depth added in token order
        (`prompt_sums`)."""
        return self.stream.prompt_nll(self)


def prompt_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per prompt, its tokens' values (`values[starts[i]:starts[i + 1]]`) added in token order
    from the first (Python's `sum`, bit for bit: a row-wise cumulative sum over the prompts,
    padded with -0.0, which adds nothing, where their lengths differ); 0.0 for a prompt without
    tokens."""
    lengths = np.diff(starts)
    out = np.zeros(len(lengths))
    width = int(lengths.max()) if len(lengths) else 0
    if width == 0:
        return out
    if lengths.min() == width:
        return np.cumsum(values.reshape(len(lengths), width), axis=1)[:, -1]
    step = max(1, CHUNK_VALUES // width)
    for a in range(0, len(lengths), step):
        n = lengths[a:a + step]
        pad = np.full((len(n), width), -0.0)
        pad[np.arange(width) < n[:, None]] = values[starts[a]:starts[a + len(n)]]
        out[a:a + len(n)] = np.cumsum(pad, axis=1)[:, -1]
    out[lengths == 0] = 0.0
    return out


@dataclass(frozen=True)
class Served:
    """Per prompt of a round, what serving it at one loaded depth (every token leaving there)
    gives."""

    output_tokens: np.ndarray
    nll: np.ndarray
    """its tokens' -log max probability at the depth, summed in token order"""
    agree: np.ndarray | None
    """its tokens equal to the full model's at the same position (None: none traced)"""


def served_at_depth(block: RoundBlock, reference: DepthStream | None) -> Served:
    """A round's prompts (`block`) served at its stream's depth; `reference` the full-depth
    stream whose last exit's tokens the served ones are counted against, position by position up
    to the shorter (None: not counted)."""
    stream, p, lengths = block.stream, block.prompts, block.lengths
    agree = None
    if reference is not None and stream.argmax is not None:
        agree = agreeing(stream.ids_at(block.index, stream.depth), np.r_[0, np.cumsum(lengths)],
                         p, reference)
    return Served(lengths, block.prompt_nll(), agree)


def agreeing(ids: np.ndarray, starts: np.ndarray, prompts: np.ndarray,
             reference: DepthStream) -> np.ndarray:
    """Per prompt of `prompts`, its tokens (`ids[starts[i]:starts[i + 1]]`) equal to the
    reference's last exit's token at the same position, up to the shorter of the two."""
    lengths = np.diff(starts)
    prompt = np.repeat(np.arange(len(lengths)), lengths)
    pos = np.arange(len(ids)) - np.repeat(starts[:-1], lengths)
    ref_starts = reference.starts[prompts]
    ok = pos < (reference.starts[prompts + 1] - ref_starts)[prompt]
    ref = reference.argmax[ref_starts[prompt[ok]] + pos[ok], -1]
    return np.bincount(prompt[ok][ids[ok] == ref], minlength=len(lengths))


def served_with_exits(rows: np.ndarray, neglog: np.ndarray, ids: np.ndarray | None,
                      threshold: float, reference: np.ndarray | None
                      ) -> tuple[list[int], float, int | None]:
    """One prompt's tokens (`rows`: tokens x exits, `neglog` their -log, `ids` their tokens)
    each leaving at its first exit reaching `threshold` (else the last): (the exits, 1-based;
    their -log probabilities summed in token order; the tokens agreeing with `reference`,
    position by position up to the shorter, None where either is missing)."""
    exits = first_exits(rows, threshold)
    at = np.arange(len(rows))
    nll = float(np.cumsum(neglog[at, exits])[-1]) if len(rows) else 0.0
    agree = None
    if ids is not None and reference is not None:
        n = min(len(rows), len(reference))
        agree = int((ids[at[:n], exits[:n]] == reference[:n]).sum())
    return (exits + 1).tolist(), nll, agree
