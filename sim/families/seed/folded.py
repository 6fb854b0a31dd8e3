"""`tot_summary`'s figures of a run's requests added as they fold (`sim.engine.folded_requests`),
where the run keeps no requests table and so no `tot_requests` table: the same figures, sums to
rounding (added block by block, not in the table's order).

A request's row is its program's log's (`ToTProgram.rows`) or, for a program sent from its
question's record, the recording's, as `tot_results` finds it. A program's requests fold in
the order they were sent: a verification's draft folds before it (it finished before the
verification was sent), and a component's intervals in the order they start.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from programs.seed_eval import EVAL_KINDS
from sim.families.seed.metrics import tot_figures
from sim.workloads.request_templates import RequestTemplate

KINDS = ("draft", "verify", "eval", "eval-verify")
"""the kinds `tot_summary` names, coded 0.. (any other kind after them, as first seen)"""
DRAFT, VERIFY, EVAL, EVAL_VERIFY = range(4)


class FoldedToT:
    """`tot_summary` of a ToT run, request block by request block."""

    def __init__(self, runs: list, driver):
        self._runs, self._owner, self._trows = runs, driver.owner, driver.trows
        self._kinds = {k: i for i, k in enumerate(KINDS)}
        self._recorded: dict = {}  # per recording program: its rows' columns (`_log`)
        n = len(runs)
        # per component (generator, evaluator) and program: time with a request in flight, the
        # latest finish so far, whether it had a request
        self._span = np.zeros((2, n))
        self._end = np.full((2, n), -np.inf)
        self._has = np.zeros((2, n), dtype=bool)
        self._drafts: dict = {}  # (program, node, round) -> a draft's finish, until verified
        self._waits: list[np.ndarray] = []
        self.requests = self.thoughts = 0
        # accepted, drafted tokens (verify, eval-verify); verify output tokens and count;
        # eval-verify count
        self._sums = np.zeros(7)

    def fold(self, first_idx: int, columns: dict) -> None:
        """Add requests first_idx, ... (their columns as `FoldedRequests.add` takes them)."""
        n = len(columns["arrival_s"])
        a = first_idx - self._owner.base  # where the driver's columns start
        program = np.frombuffer(self._owner.program, np.int64)[a:a + n].copy()
        rows = self._rows(program, a, n)
        kind, node, rnd, accepted, drafted, output = rows
        sent, finish = columns["arrival_s"], columns["finish_s"]
        self.requests += n
        self.thoughts += int(((kind == EVAL) | ((kind == EVAL_VERIFY) & (rnd == 0))).sum())
        evaluator = self._evaluator(kind)
        for which, mask in enumerate((~evaluator, evaluator)):
            self._spans(which, program[mask], sent[mask], finish[mask])
        v, ev = kind == VERIFY, kind == EVAL_VERIFY
        self._sums += (accepted[v].sum(), drafted[v].sum(), accepted[ev].sum(),
                       drafted[ev].sum(), output[v].sum(), v.sum(), ev.sum())
        self._queue_waits(program, node, rnd, kind, sent, finish)

    def _evaluator(self, kind: np.ndarray) -> np.ndarray:
        codes = [c for k, c in self._kinds.items() if k in EVAL_KINDS]
        return np.isin(kind, codes)

    def _rows(self, program: np.ndarray, a: int, n: int) -> tuple:
        """Each request's row fields (kind code, node code, round, accepted and drafted tokens,
        output tokens) from its log (the requests at `a` on in the driver's columns)."""
        numbers = np.frombuffer(self._owner.index, np.int64)[a:a + n]
        trows = np.frombuffer(self._trows, np.int64)[a:a + n]
        out = np.zeros((6, n))
        order = np.argsort(program, kind="stable")
        cuts = np.flatnonzero(np.diff(program[order])) + 1
        for at in np.split(order, cuts):  # each program's requests in the block
            run = self._runs[int(program[at[0]])]
            tpl = run.template
            if type(tpl) is RequestTemplate:  # the recording's row of each template request
                log = self._recorded.get(id(tpl.program))
                if log is None:
                    log = self._recorded[id(tpl.program)] = self._log(tpl.program.rows)
                out[:, at] = log[:, trows[at]]
            else:
                out[:, at] = self._log(run.program.rows)[:, numbers[at]]
        kind, node, rnd = (out[i].astype(np.int64) for i in range(3))
        return kind, node, rnd, out[3], out[4], out[5]

    def _log(self, rows) -> np.ndarray:
        """A log's fields by request number: kind and node codes (a node's code its own in the
        log), round, accepted and drafted tokens (0 where None), output tokens."""
        out = np.zeros((6, len(rows)))
        at = np.asarray(rows.column("request_index"), dtype=np.int64)
        kinds = [self._kinds.setdefault(k, len(self._kinds)) for k in rows.column("kind")]
        nodes, _ = pd.factorize(pd.Series(rows.column("node"), dtype=object))
        for i, col in enumerate((kinds, nodes, rows.column("round"),
                                 [x or 0 for x in rows.column("accepted_tokens")],
                                 [x or 0 for x in rows.column("drafted_tokens")],
                                 rows.column("output_tokens"))):
            out[i, at] = col
        return out

    def _spans(self, which: int, program, sent, finish) -> None:
        """`component_s`' intervals of one component, added to each program's time."""
        if not len(program):
            return
        order = np.lexsort((finish, sent, program))  # by program, then (sent, finish)
        program, sent, finish = program[order], sent[order], finish[order]
        end = pd.Series(finish).groupby(program).cummax().to_numpy()
        first = np.r_[True, program[1:] != program[:-1]]
        before = np.where(first, -np.inf, np.r_[-np.inf, end[:-1]])
        before = np.maximum(before, self._end[which, program])  # its earlier blocks' latest
        gained = np.maximum(0.0, finish - np.maximum(sent, before))
        np.add.at(self._span[which], program, gained)
        last = np.r_[program[1:] != program[:-1], True]
        self._end[which, program[last]] = np.maximum(self._end[which, program[last]], end[last])
        self._has[which, program] = True

    def _queue_waits(self, program, node, rnd, kind, sent, finish) -> None:
        """`queue_waits_s`: each verification's seconds from its draft's finish (the draft's
        key kept until its verification folds)."""
        drafts = self._drafts
        d = kind == DRAFT
        drafts.update(zip(zip(program[d].tolist(), node[d].tolist(), rnd[d].tolist()),
                          finish[d].tolist()))
        v = kind == VERIFY
        keys = zip(program[v].tolist(), node[v].tolist(), rnd[v].tolist())
        done = np.array([drafts.pop(k, np.nan) for k in keys], dtype=float)
        w = sent[v] - done
        self._waits.append(np.maximum(w[~np.isnan(w)], 0.0))

    def totals(self, busy_s: dict, makespan_s: float) -> dict:
        """`tot_summary`'s figures."""
        spans = [self._span[i][self._has[i]] for i in range(2)]
        acc_v, drafted_v, acc_ev, drafted_ev, out_v, n_v, n_ev = self._sums.tolist()
        return tot_figures(
            self.requests, self.thoughts,
            tuple(float(s.mean()) if len(s) else 0.0 for s in spans),
            float(acc_ev / max(1, drafted_ev)) if n_ev else None,
            (float(acc_v / max(1, drafted_v)), float(out_v / n_v),
             np.concatenate(self._waits)) if n_v else None, busy_s, makespan_s)
