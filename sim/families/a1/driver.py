"""A1 programs in the simulator: their requests answered from a conformity trace's path trees.

The program (`programs.a1.A1Program`) decides; this oracle tells the driver how long each
request is (draft step, target step, or a one-token scoring prefill) and what it returned (the
step's answer and end, or the score), from the traced node the request belongs to. Draft
requests go to the `draft` pool, scoring and target steps to the `target` pool.
"""

from __future__ import annotations

from programs.a1 import STEP_FIELDS, A1Program, a1_program_seed, conformity_columns
from programs.a1_traced import A1Bank
from programs.base import Outcome, RequestSpec
from sim.families.registry import SimFamily, register_sim_family
from sim.workloads.program_driver import SimProgram


class TracedA1:
    """Outcomes of A1 requests from the traced node of the same sample and decision string."""

    def __init__(self):
        # (question, sample, decision string, kind) -> the request's content chain
        self._chains: dict[tuple, tuple] = {}

    def _node(self, run: SimProgram, spec: RequestSpec) -> tuple[dict, int, str]:
        """(traced node, sample, decision string) of the request."""
        sample, path = run.program.node_of(spec)
        node = run.question.nodes.get((sample, path))
        if node is None or (spec.kind != "target" and node["draft_tokens"] is None):
            raise ValueError(f"{run.question.question_id}: the conformity trace has no "
                             f"{spec.kind} step for sample {sample} after decisions "
                             f"{path or '(none)'}: this policy leaves the traced tree (trace "
                             "its alpha, coverage and calibration with reasonsim trace "
                             "conformity)")
        return node, sample, path

    def request(self, run: SimProgram, spec: RequestSpec) -> tuple[int, int, tuple, int]:
        """(prompt tokens, prefix-cacheable tokens, the prompt's content chain, tokens the
        request generates: the traced step, or 1 for a scoring prefill).

        The content is the question's and the traced text's (`content_chain`), not the
        program's: every path of a question starts with its prompt, programs of one question
        sample with one seed, so they send the same prompts, and the engine serves one's cached
        blocks to another."""
        node, sample, path = self._node(run, spec)
        output = 1 if spec.kind == "score" else int(node[STEP_FIELDS[spec.kind][0]])  # tokens
        key = (run.question.question_id, sample, path, spec.kind)
        chain = self._chains.get(key)
        if chain is None:
            chain = self._chains[key] = content_chain(run.question, sample, path, spec.kind)
            if chain[-1][1] != spec.prompt_tokens + (0 if spec.kind == "score" else output):
                raise ValueError(f"{key[0]}: sample {sample} after decisions {path or '(none)'}"
                                 f": the program's {spec.kind} prompt has {spec.prompt_tokens} "
                                 f"tokens, the trace's context {chain[-2][1]}")
        return spec.prompt_tokens, chain[-1][1], chain, output

    def outcome(self, run: SimProgram, spec: RequestSpec, tokens: int, aborted: bool) -> Outcome:
        """What the request returned, as the trace recorded it."""
        node = self._node(run, spec)[0]
        if spec.kind == "score":
            return Outcome(0, score=float(node["score"]))
        *_, answer, ended = STEP_FIELDS[spec.kind]
        return Outcome(tokens, aborted=aborted, ended=bool(node[ended]), answer=node[answer])


def content_chain(question, sample: int, path: str, kind: str) -> tuple:
    """A request's content as a prefix chain (`sim.engine.prefix_cache`): the question's prompt,
    then the path's text after each turn (named by the text itself: samples that wrote the same
    steps hold the same blocks), then the step the request writes (a draft or target step: its
    output's blocks are the next turn's context) or scores (the draft step in its prompt)."""
    qid, nodes = question.question_id, question.nodes
    text: str | None = ""
    links = [(("a1", qid, text), int(nodes[(sample, "")]["context_tokens"]))]

    def after(node: dict, step: str, name: str) -> None:
        nonlocal text
        piece = node[f"{step}_text"]
        # a trace without the step's text: the path's own name (shared by no other sample)
        text = None if text is None or piece is None else text + piece
        links.append((("a1", qid, text if text is not None else (sample, name)),
                      int(node["context_tokens"]) + int(node[f"{step}_tokens"])))

    for i, letter in enumerate(path):
        after(nodes[(sample, path[:i])], "draft" if letter == "A" else "target", path[:i + 1])
    after(nodes[(sample, path)], "target" if kind == "target" else "draft",
          path + ("R" if kind == "target" else "A"))
    return tuple(links)


def build_a1_runs(wl, bank: A1Bank, plans) -> tuple[list[SimProgram], int, TracedA1]:
    """A1 program objects of planned programs, a bound on their requests, and their oracle."""
    by_id = {q.question_id: q for q in bank.questions}
    policy = bank.calibrate(wl.policy)
    settings = bank.settings_for(policy)
    runs = [SimProgram(p, A1Program(p.question_id, (policy.step,), settings,
                                    by_id[p.question_id].prompt_tokens,
                                    a1_program_seed(bank.seed, p.question_id)),
                       by_id[p.question_id]) for p in plans]
    # three requests a turn per path at most
    capacity = sum(3 * settings.turns * settings.samples for _ in runs)
    return runs, capacity, TracedA1()


def a1_results(runs: list[SimProgram], driver, cluster, makespan_s: float) -> tuple[dict, dict]:
    """The conformity table of the simulated programs (a row per step: none where the run
    folded its requests, `output.requests: false`) and their A1 summary."""
    from sim.families.a1.metrics import a1_summary

    folded = cluster.res.folded
    tables = {} if folded is not None else {"conformity": conformity_columns(
        [(r.program, r.plan.program_id, r.question.gold_answer,
          {"difficulty": r.question.difficulty}) for r in runs])}
    log = folded.family.totals() if folded is not None else request_log(runs, driver, cluster)
    busy = {pool: float(sum(cluster.replicas[i].busy_s for i in members))
            for pool, members in cluster.pools.items()}
    summary = a1_summary([r.program for r in runs], log, busy, makespan_s)
    summary.update(kv_peaks(cluster))
    return tables, summary


def request_log(runs: list[SimProgram], driver, cluster):
    """Every request's program, path and times (`a1.metrics.path_times`' log)."""
    import pandas as pd

    n = len(driver.owner)
    res = cluster.res
    program_id = {r.idx: r.plan.program_id for r in runs}
    return pd.DataFrame({"program_id": [program_id[i] for i in driver.owner.program],
                         "sample": list(driver.owner.path),
                         "arrival_s": res.arrival_s[:n], "scheduled_s": res.scheduled_s[:n],
                         "finish_s": res.finish_s[:n]})


def fold_a1(runs: list[SimProgram], driver):
    """The path times of requests as they fold, where the run keeps no requests table."""
    from sim.families.a1.metrics import FoldedPathTimes

    samples = max((r.program.settings.samples for r in runs), default=1)
    return FoldedPathTimes(driver.owner, len(runs), samples)


def kv_peaks(cluster) -> dict:
    """Each pool's most KV blocks in use at once (at the start of a run of iterations, as vLLM
    counts them: cached blocks no request holds are free): A1's memory figure."""
    return {f"{pool}_kv_peak_blocks": cluster.res.kv_peak_blocks(members)
            for pool, members in sorted(cluster.pools.items())}


register_sim_family(SimFamily("a1", build_a1_runs, a1_results, folds=fold_a1, compiles=True,
                               templated=True))
