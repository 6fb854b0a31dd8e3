"""How many distinct request sets a program workload's programs send, per question.

    python benchmarks/program_templates.py seed-separate.yaml a1-async-separate.yaml --count 200

Each example (under `examples/`, as `family_speed.program_config` scales it: COUNT programs,
REPLICAS times its replica groups) simulated once; a program's request set is its requests'
(prompt tokens, output tokens), order aside. Where every question's programs send one set, a
program's requests are a function of its question and the kernel could replay them without the
program's Python (only their order depends on timing). Prints a line per example.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from family_speed import program_config  # noqa: E402  (this directory)
from sim.simulate import simulate  # noqa: E402


def request_sets(example: str, count: int, replicas: int) -> tuple[int, dict]:
    """(programs, question -> the distinct request sets its programs sent)."""
    res = simulate(program_config(example, count, replicas))
    programs = res.programs.to_pydict()
    question = dict(zip(programs["program_id"], programs["question_id"]))
    requests = res.requests.to_pydict()
    sent = defaultdict(list)
    for program, prompt, output in zip(requests["program_id"], requests["prompt_tokens"],
                                       requests["output_tokens"]):
        sent[program].append((prompt, output))
    by_question = defaultdict(set)
    for program, reqs in sent.items():
        by_question[question[program]].add(tuple(sorted(reqs)))
    return len(sent), by_question


def main() -> None:
    """Print, per example, its programs, questions and the most request sets on one question."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("examples", nargs="+")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--replicas", type=int, default=2)
    args = ap.parse_args()
    for example in args.examples:
        n, by_question = request_sets(example, args.count, args.replicas)
        most = max((len(v) for v in by_question.values()), default=0)
        print(f"{example}: {n} programs on {len(by_question)} questions; most distinct request "
              f"sets on one question: {most}")


if __name__ == "__main__":
    main()
