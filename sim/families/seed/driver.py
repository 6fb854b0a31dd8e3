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
the trace holds the request that did it.
"""

from __future__ import annotations

from itertools import chain

from programs.base import Outcome, RequestSpec
from programs.seed import ROW_FIELDS, ToTProgram, tot_program_seed
from programs.seed_branch import content_link
from programs.seed_traced import ToTBank
from sim.families.registry import SimFamily, register_sim_family
from sim.workloads.program_driver import SimProgram
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


def tot_results(runs: list[SimProgram], driver, cluster, makespan_s: float) -> tuple[dict, dict]:
    """The tot_requests table of the simulated programs and their ToT summary."""
    import pandas as pd

    from sim.families.seed.metrics import SUMMARY_COLUMNS, tot_summary

    res = cluster.res
    at = {key: i for i, key in enumerate(zip(driver.owner.program, driver.owner.index))}
    logged = [k for k in ROW_FIELDS if k != "request_index"]
    cols = {k: list(chain.from_iterable(run.program.rows.column(k) for run in runs))
            for k in logged}
    idx, own = [], []  # each row's request idx; its program's columns
    for run in runs:
        q, prog = run.question, run.program
        pid = run.plan.program_id
        mine = (pid, q.question_id, q.difficulty, q.gold_answer, prog.policy.mode)
        for index in prog.rows.column("request_index"):
            idx.append(at[(run.idx, index)])
            own.append(mine + (ids.search_request_id(pid, index),))
    cols.update(zip(("program_id", "question_id", "difficulty", "gold_answer", "mode",
                     "request_id"), map(list, zip(*own))))
    cols.update(sent_s=res.arrival_s[idx].tolist(), finish_s=res.finish_s[idx].tolist(),
                rescored=res.rescored[idx].tolist())
    busy = {pool: float(sum(cluster.replicas[i].busy_s for i in members))
            for pool, members in cluster.pools.items()}
    summary = tot_summary(pd.DataFrame({k: cols[k] for k in SUMMARY_COLUMNS}), busy, makespan_s)
    return {"tot_requests": cols}, summary


register_sim_family(SimFamily("seed", build_tot_runs, tot_results, compiles=True))
