"""Where a HELIOS stream's time goes, simulated and live: steps, loads, the loop between them.

    python benchmarks/helios_time_parts.py CONFIG DIR --policies static:target-small --repeats 2
    python benchmarks/helios_time_parts.py CONFIG DIR --policies helios:accuracy --by-depth

Serves each named policy's stream on the profiles retraced in DIR (`DIR/<model>`, as
`helios replay --retrace DIR` wrote them) once simulated and `--repeats` times live on the
PyTorch engine, and prints per run: the span, the steps' compute (`busy`), layer loads, the
time inside rounds that no step computed (the serving loop's host time) and the time between
rounds beyond the loads, with the host time per step. `--by-depth`: per live run, the rounds'
step time by the model and depth serving them, live over simulated (the same rounds: a
replay's decisions are equal), beside the prompts per round. `--latency`: per live run, the
prompts' TTFT and TPOT medians by model, depth and prompts per round, simulated and live.
`--first-step`: per live run, each round's prefill step (the prompts' first tokens) by model,
depth, prompts per round and whether the engine was reconfigured just before it (another model,
depth or batch than the round before), simulated and live, beside the live TTFT's median (the
step plus the prompts' admission and the loop's host time). `--steps`: every live step priced
by its model's layered fit (its shape at its depth, as `round_times` prices it, unscaled), and
the traced steps of the same model priced alike: time over price by model, depth, kind
(prefill or decode) and sequences, live beside traced. `--rounds`: per live run, each round's
step time live over simulated, in order (the machine's speed as the run goes), with its
quantiles.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from helios_rejudge import retraced  # noqa: E402  (this directory)
from live.helios import run_live, stream_prompts  # noqa: E402
from sim.families.helios.profile import traced_steps  # noqa: E402
from sim.families.helios.serving import simulate_stream  # noqa: E402
from validation.helios import check_same_rounds  # noqa: E402


def parts(requests, rounds) -> dict:
    """A run's span and its parts, in seconds."""
    end = requests.groupby("arrival_s").finish_s.max()  # a round's prompts share its start
    rounds = rounds.sort_values("start_s")
    ends = rounds.start_s.map(end)
    busy_s, load_s = rounds.busy_ms.sum() / 1e3, rounds.load_ms.sum() / 1e3
    host_s = float((ends - rounds.start_s).sum() - busy_s)
    return {"span_s": float(requests.finish_s.max()), "busy_s": busy_s, "load_s": load_s,
            "host_s": host_s, "between_s": float((rounds.start_s.shift(-1) - ends).sum()),
            "host_ms_per_step": host_s * 1e3 / rounds.steps.sum()}


def by_depth(sim_rounds, live_rounds):
    """Per (model, depth): rounds, prompts per round, simulated and live step time (ms) and
    their ratio; the two runs' rounds in the same order."""
    check_same_rounds(sim_rounds, live_rounds)
    df = sim_rounds[["model", "depth", "batch", "busy_ms"]].reset_index(drop=True).assign(
        live_ms=live_rounds.busy_ms.to_numpy())
    g = df.groupby(["model", "depth"]).agg(rounds=("batch", "size"), prompts=("batch", "mean"),
                                           sim_ms=("busy_ms", "sum"), live_ms=("live_ms", "sum"))
    return g.assign(live_over_sim=g.live_ms / g.sim_ms)


def latency_by_round(sim_requests, live_requests):
    """Per (model, depth, prompts per round): prompts, and the simulated and live TTFT and TPOT
    medians (ms) with their ratio; the two runs' prompts matched by stream index."""
    s = sim_requests.sort_values("prompt").reset_index(drop=True)
    v = live_requests.sort_values("prompt").reset_index(drop=True)
    if list(s.prompt) != list(v.prompt):
        raise ValueError("the live run served other prompts than the simulation")
    batch = s.groupby("arrival_s").prompt.transform("size")
    df = pd.DataFrame({"model": s.model, "depth": s.depth,
                       "batch": pd.cut(batch, [0, 1, 5, 12, 32, 10**6]),
                       "sim_ttft": _ttft_ms(s), "live_ttft": _ttft_ms(v),
                       "sim_tpot": _tpot_ms(s), "live_tpot": _tpot_ms(v)})
    g = df.groupby(["model", "depth", "batch"], observed=True).agg(
        prompts=("sim_ttft", "size"), sim_ttft=("sim_ttft", "median"),
        live_ttft=("live_ttft", "median"), sim_tpot=("sim_tpot", "median"),
        live_tpot=("live_tpot", "median"))
    return g.assign(ttft_sim_over_live=g.sim_ttft / g.live_ttft,
                    tpot_sim_over_live=g.sim_tpot / g.live_tpot)


def first_steps(sim_rounds, live_rounds, live_requests):
    """Per (model, depth, prompts per round, reconfigured): rounds, and the medians of the
    simulated and live first step (ms), their ratio, and the live TTFT (ms); the two runs'
    rounds in the same order."""
    check_same_rounds(sim_rounds, live_rounds)
    s, v = sim_rounds.reset_index(drop=True), live_rounds.reset_index(drop=True)
    shape = s[["model", "depth", "batch"]]
    ttft = _ttft_ms(live_requests).groupby(live_requests.arrival_s).median()
    df = shape.assign(reconfigured=(shape != shape.shift()).any(axis=1),
                      sim_ms=s.first_step_ms, live_ms=v.first_step_ms,
                      live_ttft_ms=v.start_s.map(ttft).to_numpy())
    g = df.groupby(["model", "depth", "batch", "reconfigured"]).agg(
        rounds=("sim_ms", "size"), sim_ms=("sim_ms", "median"), live_ms=("live_ms", "median"),
        live_ttft_ms=("live_ttft_ms", "median"))
    return g.assign(sim_over_live=g.sim_ms / g.live_ms)


def priced(steps, profiles):
    """Each step's price (ms) by its model's layered fit at its depth, unscaled."""
    price = pd.Series(np.nan, index=steps.index)
    for name, g in steps.groupby("model"):
        price[g.index] = profiles[name].step.steps_ms(g.prefill_tokens, g.decode_seqs,
                                                      g.attended_tokens, g.depth, g.prefill_seqs)
    return price


def step_ratios(live_steps, profiles, retrace: Path):
    """Per (model, depth, kind, sequences): live and traced steps' median time over price and
    their counts (decode steps by their sequences, prefill by the prompts they admit)."""
    frames = [live_steps.assign(source="live")]
    for name in profiles:
        t = traced_steps(retrace / name)
        frames.append(t[t.cell_id.str.startswith("depth")].assign(model=name, source="traced"))
    df = pd.concat(frames, ignore_index=True)[
        ["source", "model", "depth", "prefill_tokens", "prefill_seqs", "decode_seqs",
         "attended_tokens", "duration_ms"]]
    df["ratio"] = df.duration_ms / priced(df, profiles)
    df["kind"] = (df.prefill_seqs > 0).map({True: "prefill", False: "decode"})
    df["seqs"] = pd.cut(df.prefill_seqs.where(df.prefill_seqs > 0, df.decode_seqs),
                        [0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 10**6])
    g = df.groupby(["model", "depth", "kind", "seqs", "source"], observed=True).ratio.agg(
        ["median", "size"]).unstack("source")
    return g[g[("size", "live")].notna()]


def round_levels(sim_rounds, live_rounds) -> str:
    """Each round's live over simulated step time in run order, and their p10 / p50 / p90."""
    r = live_rounds.busy_ms.to_numpy() / sim_rounds.busy_ms.to_numpy()
    rounds = " ".join(f"{m}@{d}:{x:.2f}"
                      for m, d, x in zip(live_rounds.model, live_rounds.depth, r))
    q = np.quantile(r, [0.1, 0.5, 0.9])
    return f"{rounds}\np10 / p50 / p90: {q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f}"


def _ttft_ms(r):
    return (r.first_token_s - r.arrival_s) * 1e3


def _tpot_ms(r):
    return (r.finish_s - r.first_token_s) / (r.output_tokens - 1).clip(lower=1) * 1e3


def main() -> None:
    """Print each policy's time parts, simulated and per live run."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("retrace", type=Path)
    ap.add_argument("--policies", type=lambda t: t.split(","), required=True)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--by-depth", action="store_true",
                    help="also each live run's step time by model and depth against the sim")
    ap.add_argument("--latency", action="store_true",
                    help="also each live run's TTFT and TPOT by model, depth and round size")
    ap.add_argument("--first-step", action="store_true",
                    help="also each live run's rounds' first step by model, depth, round size "
                    "and reconfiguration, against the sim")
    ap.add_argument("--steps", action="store_true",
                    help="also every live step priced by its model's fit, beside the traced "
                    "steps, by model, depth, kind and sequences")
    ap.add_argument("--rounds", action="store_true",
                    help="also each live run's rounds' step time over the sim, in order")
    args = ap.parse_args()
    exp = retraced(args.config, args.retrace)
    first = next(iter(exp.profiles.values()))
    prompts = stream_prompts(first.workload, first.prompt_tokens)
    dirs = {name: p.model_dir for name, p in exp.profiles.items()}
    specs = {exp.policy_name(p): p for p in exp.spec.helios.policies}
    print(f"{'policy':24} {'run':6} {'span s':>8} {'busy s':>8} {'load s':>7} {'host s':>7} "
          f"{'between s':>9} {'host ms/step':>12}")
    for name in args.policies:
        sim = simulate_stream(exp.program(specs[name]), exp.profiles)
        runs, steps = [("sim", sim.requests, sim.rounds)], []
        for i in range(args.repeats):
            steps.append([])
            req, rounds, _ = run_live(exp.program(specs[name]), dirs, prompts,
                                      exp.memory.seq_tokens,
                                      int(first.workload.get("max_tokens", 96)), seed=exp.spec.seed,
                                      steps=steps[-1])
            runs.append((f"live{i + 1}", req, rounds))
        for who, req, rounds in runs:
            p = parts(req, rounds)
            print(f"{name:24} {who:6} {p['span_s']:>8.3f} {p['busy_s']:>8.3f} {p['load_s']:>7.3f} "
                  f"{p['host_s']:>7.3f} {p['between_s']:>9.3f} {p['host_ms_per_step']:>12.3f}")
        for who, _, rounds in runs[1:] if args.by_depth else ():
            print(f"{name} {who}: step time by model and depth, live over simulated")
            print(by_depth(runs[0][2], rounds).round(3).to_string())
        for who, req, _ in runs[1:] if args.latency else ():
            print(f"{name} {who}: TTFT and TPOT (ms) by model, depth and prompts per round")
            print(latency_by_round(runs[0][1], req).round(3).to_string())
        for who, req, rounds in runs[1:] if args.first_step else ():
            print(f"{name} {who}: the rounds' first step (ms), simulated and live")
            print(first_steps(runs[0][2], rounds, req).round(3).to_string())
        for who, _, rounds in runs[1:] if args.rounds else ():
            print(f"{name} {who}: each round's step time, live over simulated, in order")
            print(round_levels(runs[0][2], rounds))
        for i, rows in enumerate(steps if args.steps else ()):
            print(f"{name} live{i + 1}: step time over its price, live and traced")
            print(step_ratios(pd.DataFrame(rows), exp.profiles, args.retrace).round(3).to_string())


if __name__ == "__main__":
    main()
