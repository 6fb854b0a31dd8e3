"""Ids of the data contract: every question, program, request and cell id is made and parsed here.

Ids are joined on across tables (and across sim and live runs of the same workload), so their
formats are part of the contract; nothing else builds or slices them.
"""

from __future__ import annotations

import re

_QUESTION = re.compile(r"^q(\d{4,})-([a-z]+)-(\d+)$")
_SUFFIX = re.compile(r"^(.*)-([a-z])(\d+)$")


def question_id(index: int, family: str, level: int) -> str:
    """The id of the index-th held-out testbed question of a family and difficulty level."""
    return f"q{index:04d}-{family}-{level}"


def question_index(qid: str) -> int:
    """The held-out index a question id was made from (inverse of `question_id`)."""
    m = _QUESTION.match(qid)
    if m is None:
        raise ValueError(f"{qid!r} is not a question id (q<index>-<family>-<level>)")
    return int(m.group(1))


def program_id(index: int) -> str:
    """The id of the index-th program of a simulated or replayed program workload."""
    return f"prog-{index:05d}"


def request_id(index: int) -> str:
    """The id of the index-th request of a plain (non-program) workload."""
    return f"req-{index:06d}"


def trajectory_id(qid: str, sample: int) -> str:
    """The id of a traced reasoning sample (probes trace): question and sample index."""
    return f"{qid}-s{sample}"


def chunk_id(owner: str, n: int) -> str:
    """The id of the n-th reasoning chunk request of a path or program."""
    return f"{owner}-c{n}"


def probe_id(owner: str, n: int) -> str:
    """The id of a probe request of a path or program (n: chunks decoded before it)."""
    return f"{owner}-p{n}"


def probe_number(rid: str) -> int | None:
    """n of a `probe_id`, None for any other request id."""
    m = _SUFFIX.match(rid)
    return int(m.group(3)) if m and m.group(2) == "p" else None


def search_program_id(qid: str, method: str, cap: int) -> str:
    """The id of a traced search program: question, method and resource cap."""
    return f"{qid}-{method}{cap}"


def a1_program_id(qid: str, phase: str) -> str:
    """The id of a traced A1 program: question and phase (calibration or evaluation)."""
    return f"{qid}-a1{phase[:3]}"


def tot_program_id(qid: str, tree: str) -> str:
    """The id of a traced ToT program: question and tree (ar: the target's own thoughts; sd:
    speculative rounds)."""
    return f"{qid}-tot{tree}"


def search_request_id(program: str, index: int) -> str:
    """The id of the index-th request of a search program."""
    return f"{program}-r{index}"


def cell_id(batch: int, prompt_tokens: int, output_tokens: int, repeat: int,
            regime: str = "greedy") -> str:
    """The id of one grid cell of a step trace (a sampling regime other than greedy is named)."""
    cell = f"b{batch}-p{prompt_tokens}-o{output_tokens}-r{repeat}"
    return cell if regime == "greedy" else f"{cell}-{regime}"


def cell_regime(cell) -> str:
    """A grid cell's sampling regime (`cell_id` names the non-greedy ones; greedy for anything
    that is not a grid cell id)."""
    parts = cell.split("-") if isinstance(cell, str) else []
    return "-".join(parts[4:]) if len(parts) > 4 and parts[0].startswith("b") else "greedy"


def cell_request_id(cell: str, i: int) -> str:
    """The id of the i-th request of a grid cell."""
    return f"{cell}-{i}"
