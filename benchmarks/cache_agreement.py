"""Does the simulated prefix cache serve each request what the live engine's served it?

    python benchmarks/cache_agreement.py LIVE SIM [LIVE SIM ...] [--json]

LIVE and SIM are the `requests` tables of a live run and of its simulation (a `dynasor replay`'s
`-o DIR/live` and `DIR/sim`; a `reasonsim fidelity` workload's `live1` and `sim`). A program's
requests (a request workload's, all as one) are matched in the order they arrived (ties by
request id); per pair this
prints the requests, the prompt tokens, the prompt tokens found cached on each side, how many
matched requests found the same number cached, and how the others differ (simulated minus
live, in tokens). Cached tokens depend on content and scheduling, not on the machine's speed:
where the requests agree (same prompts and outputs), a difference is the cache model's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from traces import read_table  # noqa: E402


def in_order(requests):
    """Requests indexed by (program, arrival order within it); a request workload's (no
    program) as one program's."""
    d = requests.assign(program_id=requests.program_id.fillna("")).sort_values(
        ["program_id", "arrival_s", "request_id"])
    return d.assign(k=d.groupby("program_id").cumcount()).set_index(["program_id", "k"])


def agreement(live_dir: Path, sim_dir: Path) -> dict:
    """Cached prompt tokens of a live run's requests beside its simulation's."""
    cols = ["prompt_tokens", "output_tokens", "cached_prompt_tokens"]
    live, sim = (read_table(d, "requests").to_pandas() for d in (live_dir, sim_dir))
    both = in_order(live)[cols].merge(in_order(sim)[cols], left_index=True, right_index=True,
                                      suffixes=("", "_sim"))
    same = (both.prompt_tokens == both.prompt_tokens_sim) & \
        (both.output_tokens == both.output_tokens_sim)
    diff = (both.cached_prompt_tokens_sim - both.cached_prompt_tokens)[same]
    return {"live": str(live_dir), "sim": str(sim_dir), "requests": [len(live), len(sim)],
            "prompt_tokens": [int(live.prompt_tokens.sum()), int(sim.prompt_tokens.sum())],
            "cached_tokens": [int(live.cached_prompt_tokens.sum()),
                              int(sim.cached_prompt_tokens.sum())],
            "matched": int(same.sum()), "equal_cached": int((diff == 0).sum()),
            "differences": {int(k): int(v) for k, v in diff[diff != 0].value_counts()
                            .sort_index().items()}}


def main() -> None:
    """Print each pair's agreement (or all as JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="LIVE SIM pairs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if len(args.dirs) % 2:
        ap.error("give the directories in LIVE SIM pairs")
    rows = [agreement(a, b) for a, b in zip(args.dirs[::2], args.dirs[1::2])]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| live | requests live / sim | prompt tokens | cached live / sim | equal cached "
          "(of matched) | sim - live: requests |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['live']} | {r['requests'][0]} / {r['requests'][1]} | "
              f"{r['prompt_tokens'][0]:,} | {r['cached_tokens'][0]:,} / "
              f"{r['cached_tokens'][1]:,} | {r['equal_cached']} ({r['matched']}) | "
              f"{r['differences'] or '-'} |")


if __name__ == "__main__":
    main()
