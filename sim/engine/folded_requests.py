"""Finished requests' results folded as a run goes, for runs too large to keep a requests table
(`output: {requests: false}`): what the summary reads of them, in request order.

A million programs of ~150 requests each would keep ~150 million rows of a dozen columns, and
a table of them with a string id each: more memory than a 24 GB machine has. Folded, a request
leaves its TTFT, TPOT and end-to-end latency (the columns whose percentiles the summary
reports, 24 bytes) and adds to the run's totals; a family that reads more of each request
(`sim.families`) listens to the same columns as they fold (`listen`).
"""

from __future__ import annotations

import numpy as np

COLUMNS = ("arrival_s", "scheduled_s", "first_token_s", "finish_s", "output_tokens",
           "prompt_tokens", "cached_tokens", "preemptions", "aborted", "rescored")
"""the result columns a fold hands over, as `sim.engine.request_state.Results` names them"""


class FoldedRequests:
    """The summary's columns of every request folded so far, and the run's totals."""

    def __init__(self):
        self._latency: dict[str, list[np.ndarray]] = {"ttft_s": [], "tpot_s": [], "e2e_s": []}
        self.requests = 0
        self.output_tokens = self.prompt_tokens = self.cached_tokens = self.preemptions = 0
        self.first_arrival_s, self.last_finish_s = np.inf, -np.inf
        self._listeners: list = []
        self.family = None  # the family's own fold (`SimFamily.folds`), where it has one

    def listen(self, fold) -> None:
        """Call `fold(first_idx, columns)` with each block of requests as it folds."""
        self._listeners.append(fold)

    def add(self, first_idx: int, columns: dict) -> None:
        """Fold requests first_idx, first_idx + 1, ... (`COLUMNS`, equal lengths; every one
        finished)."""
        n = len(columns["arrival_s"])
        if not n:
            return
        for fold in self._listeners:
            fold(first_idx, columns)
        arrival, first, finish = columns["arrival_s"], columns["first_token_s"], \
            columns["finish_s"]
        out = columns["output_tokens"]
        # `sim.metrics.latency_columns`' expressions, value for value
        self._latency["ttft_s"].append(first - arrival)
        self._latency["tpot_s"].append((finish - first) / np.where(out > 1, out - 1, np.nan))
        self._latency["e2e_s"].append(finish - arrival)
        self.requests += n
        self.output_tokens += int(out.sum(dtype=np.int64))
        self.prompt_tokens += int(columns["prompt_tokens"].sum(dtype=np.int64))
        self.cached_tokens += int(columns["cached_tokens"].sum(dtype=np.int64))
        self.preemptions += int(columns["preemptions"].sum(dtype=np.int64))
        self.first_arrival_s = min(self.first_arrival_s, float(arrival.min()))
        self.last_finish_s = max(self.last_finish_s, float(finish.max()))

    def latencies(self) -> dict[str, np.ndarray]:
        """Every folded request's TTFT, TPOT and end-to-end seconds, in request order (once:
        the blocks are let go as they are joined, so a column is held once)."""
        out = {}
        for k, blocks in self._latency.items():
            out[k] = np.concatenate(blocks) if blocks else np.zeros(0)
            blocks.clear()
        return out

    def span_s(self) -> float:
        """First arrival to last finish (0 with no request)."""
        return self.last_finish_s - self.first_arrival_s if self.requests else 0.0

    def cached_share(self) -> float:
        """Share of the requests' prompt tokens found in the prefix cache."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def fold_results(folded: FoldedRequests, res, n: int) -> None:
    """Fold requests 0..n-1 of a run that kept every column (`Results`) at once."""
    folded.add(0, {k: getattr(res, k)[:n] for k in COLUMNS})
