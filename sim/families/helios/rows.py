"""A HELIOS replica's per-prompt rows, kept as columns a round at a time.

Each served prompt is one row: its model and loaded depth, when its round started (its arrival:
the stream is a backlog), its first token and finish, its lengths, its tokens' exit layers (a
tuple), the summed -log probability at them and the tokens agreeing with the full model's. A round's rows are
added together (one list extension per column), and the table is built once at the end with the
types a list of row dicts would give.
"""

from __future__ import annotations

import pandas as pd

from policies.helios import Serve

COLUMNS = ("prompt", "model", "depth", "arrival_s", "first_token_s", "finish_s",
           "prompt_tokens", "output_tokens", "exit_layers", "nll_sum",
           "reference_agree_tokens", "replica_id")


class RequestColumns:
    """One replica's per-prompt rows, a list per column."""

    def __init__(self):
        self.cols: dict[str, list] = {c: [] for c in COLUMNS}
        self.exits: dict[tuple[int, int], tuple] = {}

    def add_round(self, replica_id: int, serve: Serve, prompts, prompt_tokens: list[int],
                  start_s: float, times: dict, served) -> None:
        """A round's prompts served at its depth (`served`: `ModelProfile.served_at`'s
        arrays, one value per prompt), each token leaving there."""
        n = len(prompts)
        outputs = served.output_tokens.tolist()
        agree = [None] * n if served.agree is None else served.agree.tolist()
        self._add(replica_id, serve, list(prompts), prompt_tokens, start_s, times, outputs,
                  [self._at_depth(serve.depth, k) for k in outputs], served.nll.tolist(),
                  agree)

    def _at_depth(self, depth: int, tokens: int) -> tuple:
        """`tokens` exits at `depth`: one tuple per (depth, length), shared by the rows that
        have it (immutable, so no row can change another's)."""
        key = (depth, tokens)
        out = self.exits.get(key)
        if out is None:
            out = self.exits[key] = (depth,) * tokens
        return out

    def add_one(self, replica_id: int, serve: Serve, prompt: int, prompt_tokens: int,
                start_s: float, times: dict, served: tuple) -> None:
        """One prompt served with exits (`ModelProfile.served_with`: exits, nll, agree)."""
        exits, nll, agree = served
        self._add(replica_id, serve, [prompt], [prompt_tokens], start_s, times, [len(exits)],
                  [tuple(exits)], [nll], [agree])

    def _add(self, replica_id, serve, prompts, prompt_tokens, start_s, times, outputs, exits,
             nll, agree) -> None:
        n, c = len(prompts), self.cols
        first = start_s + times["first_s"]
        for name, values in (("prompt", prompts), ("model", [serve.model] * n),
                             ("depth", [serve.depth] * n), ("arrival_s", [start_s] * n),
                             ("first_token_s", [first] * n),
                             ("finish_s", [start_s + f for f in times["finish_s"]]),
                             ("prompt_tokens", prompt_tokens), ("output_tokens", outputs),
                             ("exit_layers", exits), ("nll_sum", nll),
                             ("reference_agree_tokens", agree),
                             ("replica_id", [replica_id] * n)):
            c[name].extend(values)


def request_frame(parts: list[RequestColumns]) -> pd.DataFrame:
    """The replicas' rows, one after another, as one table (no rows: no columns)."""
    if not any(p.cols["prompt"] for p in parts):
        return pd.DataFrame()
    return pd.DataFrame({c: [v for p in parts for v in p.cols[c]] for c in COLUMNS})
