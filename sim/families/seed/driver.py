"""ToT programs in the simulator: their requests answered from a tot trace, by identity.

The program (`programs.seed.ToTProgram`) decides (what goes when, acceptance's consequences, the
tree); this oracle tells the driver how long each request is and what it returned, from the
traced request of the same (thought, kind, round) in the tree of the program's mode. Drafts go
to the `draft` pool; verifications (a prefill of the drafted tokens over the cached context, one
token generated), the target's own thoughts and value prompts to the `target` pool. What each
prompt finds in a replica's prefix cache follows from its content (the program's chain of text
pieces), as on the live engine: identical sibling thoughts share blocks, and a verification
whose drafted tail is already cached runs uncached, as the live engine re-runs it. A
multi-candidate round's draft tree is the one traced: a candidate was drafted further where
the trace holds the request that did it. Every program of one question builds the same tree,
so most are sent from their question's record (`sim.workloads.request_templates`), their rows
the recording's, numbered as each program numbered its requests.
"""

from __future__ import annotations

from programs.base import Outcome, RequestSpec
from programs.seed import ROW_FIELDS, ToTProgram, tot_program_seed
from programs.seed_branch import content_link
from programs.seed_traced import ToTBank
from sim.families.registry import SimFamily, register_sim_family
from sim.workloads.program_driver import SimProgram
from sim.workloads.request_templates import RequestTemplate
from traces import ids


class TracedToT:
    """Outcomes of ToT requests from the traced request of the same identity."""

    def _row(self, run: SimProgram, spec: RequestSpec) -> dict:
        key = run.program.key_of(spec)
        tree = run.question.requests.get(run.program.policy.tree, {})
        row = tree.get(key)
        if row is None:
            raise ValueError(f"{run.question.question_id}: the tot trace has no {key[1]} "
                             f"request of thought {key[0]} round {key[2]} in its "
                             f"{run.program.policy.tree} tree (a bug, or a trace from another "
                             "program version: re-trace with reasonsim trace tot)")
        return row

    def request(self, run: SimProgram, spec: RequestSpec) -> tuple[int, int, int | tuple, int]:
        """(prompt tokens, prefix-cacheable tokens, prefix-cache key: one per program, or (`ar`)
        the content chain that extends the spec's, tokens the engine generates: the drafted or
        written thought or answer tokens, else one); the spec's content chain says which blocks
        other prompts share. A thought the target writes (`ar`) is the next piece of its
        thought's content, as the program links it (`ToTProgram._extend`): its chain extends
        over it, so the blocks the request fills while decoding serve the value prompt and the
        children that repeat them, as vLLM's cache serves them."""
        if spec.kind == "ar":  # a ToT spec's chain starts with its question's prompt
            row = self._row(run, spec)
            output = int(row["output_tokens"])
            chain = spec.prefix_chain + (content_link(
                spec.prefix_chain[-1][0], row["text"], spec.prompt_tokens + output),)
            return spec.prompt_tokens, chain[-1][1], chain, output
        output = 1
        if spec.kind in ("eval", "eval-draft") or spec.kind.startswith("draft"):
            output = int(self._row(run, spec)["output_tokens"])
        return spec.prompt_tokens, spec.prompt_tokens, 0, output

    def outcome(self, run: SimProgram, spec: RequestSpec, tokens: int, aborted: bool) -> Outcome:
        """What the request returned, as the trace recorded it."""
        r = self._row(run, spec)
        if spec.kind == "eval":
            return Outcome(tokens, score=float(r["value"]), answer=r["answer"])
        kids = run.program.branch_children(spec)
        if kids is not None:  # which candidates were drafted further: the requests traced
            node, _, rnd = run.program.key_of(spec)
            tree = run.question.requests[run.program.policy.tree]
            return Outcome(int(r["output_tokens"]), text=r["text"],
                           step=tuple((node, k, rnd) in tree for k in kids))
        step = score = None
        if spec.kind in ("verify", "eval-verify"):
            step = (int(r["accepted_tokens"]), int(r["drafted_tokens"]),
                    tuple(r["accepted_positions"]))
        if spec.kind == "eval-verify":
            score = float(r["value"])
        return Outcome(int(r["output_tokens"]), ended=bool(r["ended"]), eos=bool(r["eos"]),
                       text=r["text"], step=step, score=score)


def build_tot_runs(wl, bank: ToTBank, plans) -> tuple[list[SimProgram], int, TracedToT]:
    """ToT program objects of planned programs, their request count, and their oracle."""
    bank.check(wl.policy)
    by_id = {q.question_id: q for q in bank.questions}
    runs = [SimProgram(p, ToTProgram(p.question_id, wl.policy, by_id[p.question_id].prompt_tokens,
                                     tot_program_seed(bank.seed, p.question_id),
                                     bank.probe_tokens, vocab=bank.vocab), by_id[p.question_id])
            for p in plans]
    capacity = sum(len(r.question.requests[wl.policy.tree]) for r in runs)
    return runs, capacity, TracedToT()


LOGGED = tuple(k for k in ROW_FIELDS if k != "request_index")
"""the program's row fields the table carries (its requests' numbers name them instead)"""
OWN = ("program_id", "question_id", "difficulty", "gold_answer", "mode", "request_id")
"""the table's columns of each request's program"""


def tot_results(runs: list[SimProgram], driver, cluster, makespan_s: float) -> tuple[dict, dict]:
    """The tot_requests table of the simulated programs (each program's rows in the order its
    requests finished, ties in the order they were made; none where the run folded its
    requests, `output.requests: false`) and their ToT summary."""
    import numpy as np
    import pandas as pd

    from sim.families.seed.metrics import SUMMARY_COLUMNS, tot_summary

    busy = {pool: float(sum(cluster.replicas[i].busy_s for i in members))
            for pool, members in cluster.pools.items()}
    if cluster.res.folded is not None:
        return {}, cluster.res.folded.family.totals(busy, makespan_s)
    res, owner = cluster.res, driver.owner
    n = len(owner)
    program = np.frombuffer(owner.program, dtype=np.int64)[:n]
    numbers = np.frombuffer(owner.index, dtype=np.int64)[:n]
    by_program = np.argsort(program, kind="stable")  # each program's idx in the order sent
    starts = np.searchsorted(program[by_program], [run.idx for run in runs] + [1 << 62])
    logs = _Logs()
    where = [logs.positions(run, by_program[starts[i]:starts[i + 1]], numbers, driver.trows)
             for i, run in enumerate(runs)]
    idx = by_program[starts[0]:starts[-1]] if runs else by_program[:0]
    of = np.repeat(np.arange(len(runs)), np.diff(starts))  # each row's run
    order = np.lexsort((numbers[idx], res.finish_s[idx], of))
    idx, of = idx[order], of[order].tolist()
    at = np.concatenate(where + [np.zeros(0, dtype=np.int64)])[order].tolist()
    cols = {k: list(map(logs.columns[k].__getitem__, at)) for k in LOGGED}
    own = [(r.plan.program_id, r.question.question_id, r.question.difficulty,
            r.question.gold_answer, r.program.policy.mode) for r in runs]
    cols.update(zip(OWN[:-1], map(list, zip(*map(own.__getitem__, of))) if of else
                    ([],) * (len(OWN) - 1)))
    cols["request_id"] = list(map(ids.search_request_id, cols["program_id"],
                                  numbers[idx].tolist()))
    cols.update(sent_s=res.arrival_s[idx].tolist(), finish_s=res.finish_s[idx].tolist(),
                rescored=res.rescored[idx].tolist())
    summary = tot_summary(pd.DataFrame({k: cols[k] for k in SUMMARY_COLUMNS}), busy, makespan_s)
    return {"tot_requests": cols}, summary


class _Logs:
    """The programs' row logs end to end, column by column: each program's own, or (programs
    sent from their question's template) their recording's, once."""

    def __init__(self):
        self.columns: dict = {k: [] for k in LOGGED}
        self._at: dict = {}  # per recording program: its rows' positions by request number

    def positions(self, run: SimProgram, idx, numbers, trows):
        """Where the rows of a program's requests (idx) are in the columns."""
        import numpy as np

        tpl = run.template
        if type(tpl) is RequestTemplate:  # the recording's row of each template request
            at = self._at.get(id(tpl.program))
            if at is None:
                at = self._at[id(tpl.program)] = self._add(tpl.program.rows)
            return at[np.frombuffer(trows, dtype=np.int64)[idx]]
        return self._add(run.program.rows)[numbers[idx]]

    def _add(self, log):
        """A log's rows appended: their positions by request number."""
        import numpy as np

        first = len(self.columns[LOGGED[0]])
        for k in LOGGED:
            self.columns[k] += log.column(k)
        at = np.zeros(len(log), dtype=np.int64)
        at[log.column("request_index")] = np.arange(first, first + len(log))
        return at


def fold_tot(runs: list[SimProgram], driver):
    """The ToT summary of requests as they fold, where the run keeps no requests table."""
    from sim.families.seed.folded import FoldedToT

    return FoldedToT(runs, driver)


register_sim_family(SimFamily("seed", build_tot_runs, tot_results, folds=fold_tot,
                               compiles=True, templated=True, template_rows=True))
