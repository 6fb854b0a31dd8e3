"""A program run that keeps no requests table (`output: {requests: false}`) folds each finished
request as it goes (`sim.engine.folded_requests`): the program kernel's result columns then
hold the requests in flight, and the run's summary equals the one read from the table.

The kernel folds mid-run (its columns start at `FOLD_COLUMNS` and fold once half are in use),
and the driver lets go of who sent the requests folded: the blocks folded, end to end, are the
requests table's columns value for value, under KV
pressure (preemptions, aborted chunks and probes) and with A1's scoring requests that run
twice (in flight past their first finish); A1's path times and SEED's tree figures fold with
them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from conftest import REPO
from sim.config import parse_config, read_yaml
from sim.engine.folded_requests import COLUMNS
from sim.families.registry import register_sim_family, sim_family
from sim.kernels.program_room import FOLD_COLUMNS
from sim.output import write_sim
from sim.simulate import simulate

EXAMPLES = REPO / "examples"
TABLE = {"cached_tokens": "cached_prompt_tokens"}
"""the requests table's name of a folded column, where it differs"""
TIMING = ("wall_s", "event_loop_s")
"""summary keys that time the machine"""


class Recorder:
    """A family's fold that keeps a copy of every block folded (each one made in `made`)."""

    made: list = []

    def __init__(self, runs, driver):
        self.blocks, self.driver, self.kept_from = [], driver, []
        Recorder.made.append(self)

    def fold(self, first_idx: int, columns: dict) -> None:
        """Keep the block, and the first request whose sender the driver still keeps."""
        self.blocks.append((first_idx, {k: np.array(v) for k, v in columns.items()}))
        self.kept_from.append(self.driver.owner.base)


def _config(example: str, programs: int, rate_per_s: float, **group):
    d = read_yaml(EXAMPLES / example)
    d["workload"]["programs"].update(count=programs, rate_per_s=rate_per_s)
    for g in d["cluster"]["replicas"]:
        g.pop("device", None)  # each pool on a device of its own: the kernel runs it
        g.update(group)
    return parse_config(d, EXAMPLES)


def _same_summary(kept: dict, folded: dict, rel: dict = {}) -> None:
    """Every figure equal (NaN to NaN), a key in `rel` to that relative tolerance."""
    assert set(kept) == set(folded)
    for key, value in kept.items():
        if key in TIMING:
            continue
        if key in rel:
            assert math.isclose(folded[key], value, rel_tol=rel[key]), key
        elif isinstance(value, dict):
            _same_summary(value, folded[key])
        elif not (isinstance(value, float) and math.isnan(value) and math.isnan(folded[key])):
            assert folded[key] == value, key


@pytest.mark.parametrize("compiled", [True, False])
def test_folded_blocks_are_the_requests_table(compiled):
    """Dynasor CoT under KV pressure: the blocks folded cover every request once, in order,
    each column equal to the kept table's; the summaries are equal."""
    cfg = _config("dynasor-cot-certaindex.yaml", 1500, 4.0, kv_blocks=34, max_num_seqs=16)
    kept = simulate(cfg, compiled=compiled)
    family = sim_family("reasoning")
    register_sim_family(dataclasses.replace(family, folds=Recorder))
    try:
        folded = simulate(dataclasses.replace(cfg, write_requests=False), compiled=compiled)
    finally:
        register_sim_family(family)
    assert folded.requests is None
    assert folded.summary["simulator"] == kept.summary["simulator"] == \
        ("compiled" if compiled else "simpy")
    _same_summary(kept.summary, folded.summary)
    table = kept.requests.to_pandas()
    assert kept.summary["preemptions"] > 0 and (table.finish_reason == "abort").any()
    recorder = Recorder.made.pop()
    blocks = recorder.blocks
    if compiled:  # folded as the run went, a window of columns at a time, and who sent the
        # folded requests let go as it went
        assert len(table) > 3 * FOLD_COLUMNS and len(blocks) > 3
        assert 0 < recorder.kept_from[-1] < len(table) == recorder.driver.owner.base
        assert len(recorder.driver.owner.program) == 0
    starts = [first for first, _ in blocks]
    sizes = [len(b["arrival_s"]) for _, b in blocks]
    assert starts == np.cumsum([0] + sizes[:-1]).tolist() and sum(sizes) == len(table)
    for name in set(COLUMNS) - {"preemptions", "aborted", "rescored"}:  # the table's
        column = np.concatenate([b[name] for _, b in blocks])
        np.testing.assert_array_equal(column, table[TABLE.get(name, name)].to_numpy(), name)
    aborted = np.concatenate([b["aborted"] for _, b in blocks])
    assert (aborted == (table.finish_reason == "abort").to_numpy()).all()


def test_cot_paths_that_stop_fold_on_ten_replicas():
    """CoT paths that stop on their probes, sent by the kernel from records on ten replicas:
    a request the kernel hands back to the driver stays unfolded while the driver takes it
    (its program's end reads its finish); the summaries are equal."""
    cfg = dataclasses.replace(_config("dynasor-cot-certaindex.yaml", 6000, 30.0, count=10),
                              write_steps=False)  # a step row per replica, as at scale
    kept = simulate(cfg)
    folded = simulate(dataclasses.replace(cfg, write_requests=False))
    assert folded.summary["simulator"] == "compiled"
    _same_summary(kept.summary, folded.summary)
    assert kept.summary["requests"] > 10 * FOLD_COLUMNS


def test_a1_folds_path_times_and_writes_no_requests_table(tmp_path):
    """A1 on two pools, compiled (its scoring requests that run twice stay in flight past
    their first finish): the summary equals the kept table's, its path times to rounding (added
    block by block); the output has no table of a row per request."""
    cfg = _config("a1-async-separate.yaml", 120, 2.0)
    kept = simulate(cfg)
    folded = simulate(dataclasses.replace(cfg, write_requests=False))
    assert folded.summary["simulator"] == "compiled" and folded.requests is None
    paths = ("path_compute_s", "path_queue_s", "path_barrier_s", "async_arithmetic_intensity")
    _same_summary(kept.summary, folded.summary, dict.fromkeys(paths, 1e-9))
    assert kept.summary["requests"] > 3 * FOLD_COLUMNS
    write_sim(dataclasses.replace(cfg, write_requests=False), folded, tmp_path / "out")
    written = {p.name for p in (tmp_path / "out").iterdir()}
    # no table of a row per request (A1's conformity rows are a row per step)
    assert {"programs", "summary.json"} <= written and not written & {"requests", "conformity"}


def test_seed_folds_its_tot_summary():
    """SEED's trees on two pools, compiled (sent from their questions' records, the rows the
    recording's): `tot_summary`'s figures equal the tot_requests table's; no table kept."""
    cfg = _config("seed-separate.yaml", 100, 2.0)
    kept = simulate(cfg)
    folded = simulate(dataclasses.replace(cfg, write_requests=False))
    assert folded.summary["simulator"] == "compiled" and not folded.tables
    spans = ("generator_mean_s", "evaluator_mean_s", "verify_queue_wait_p50_s",
             "verify_queue_wait_p90_s", "tokens_per_round")
    _same_summary(kept.summary, folded.summary, dict.fromkeys(spans, 1e-9))
    assert kept.summary["requests"] > 3 * FOLD_COLUMNS and kept.summary["tot_thoughts"] > 0


def test_folding_refused_where_it_cannot_hold():
    """A family whose results read every request and that has no fold of its own, and a request
    workload (its requests table is its result), are refused."""
    seed = _config("seed-separate.yaml", 4, 2.0)
    family = sim_family("seed")
    register_sim_family(dataclasses.replace(family, folds=None))
    try:
        with pytest.raises(ValueError, match="seed family's results read every request"):
            simulate(dataclasses.replace(seed, write_requests=False))
    finally:
        register_sim_family(family)
    d = read_yaml(EXAMPLES / "demo.yaml")
    d["output"] = {"requests": False}
    with pytest.raises(ValueError, match="output.requests: false folds a program workload"):
        parse_config(d, EXAMPLES)
