"""The `reasonsim` command: one entry point; each subcommand's handler lives in a `cmd_*` module
and imports its engine or simulator only when it runs, so `--help` stays fast."""

from __future__ import annotations

import argparse
import os
import sys

from reasonsim.cmd_dynasor import (cmd_dynasor_calibrate, cmd_dynasor_offline, cmd_dynasor_online,
                                   cmd_dynasor_replay)
from reasonsim.cmd_a1 import add_a1_parser
from reasonsim.cmd_a1 import add_trace_parser as add_trace_conformity
from reasonsim.cmd_seed import add_seed_parser
from reasonsim.cmd_seed import add_trace_parser as add_trace_spec
from reasonsim.cmd_helios import cmd_helios_offline, cmd_helios_replay
from reasonsim.cmd_fidelity import cmd_fidelity
from reasonsim.cmd_sweep import add_sweep_parser
from reasonsim.cmd_sim import cmd_calibrate, cmd_demo, cmd_replay, cmd_simulate, cmd_validate
from reasonsim.cmd_testbed import cmd_testbed_build, cmd_testbed_eval
from reasonsim.cmd_trace import (cmd_trace_branches, cmd_trace_exits, cmd_trace_probes,
                                 cmd_trace_serve, cmd_trace_steps, cmd_traces_check)
from reasonsim.common import DEFAULT_MODEL, TESTBED, UserError, counts, floats, ints


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (also used by the docs test)."""
    p = argparse.ArgumentParser(prog="reasonsim", description=__doc__.split(":")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    trace = sub.add_parser("trace", help="record traces from a real engine")
    tsub = trace.add_subparsers(dest="trace_command", required=True, metavar="TRACER")

    s = tsub.add_parser("steps", help="profile an engine step by step over a grid",
                        description="Drive vLLM's LLMEngine step by step over a grid of batch "
                        "sizes x prompt lengths x output lengths; record every iteration "
                        "(steps table) and every request (requests table).")
    s.add_argument("--model", default=str(DEFAULT_MODEL),
                   help="model directory (config.json; weights optional with --load-format "
                   "dummy); default: the testbed's target-large")
    s.add_argument("-o", "--out", required=True, help="trace directory to write")
    s.add_argument("--batch-sizes", type=ints, default=[1, 4, 16, 64], help="e.g. 1,4,16,64")
    s.add_argument("--prompt-tokens", type=ints, default=[32, 128, 512, 1024])
    s.add_argument("--output-tokens", type=ints, default=[16, 64, 128, 256])
    s.add_argument("--repeats", type=int, default=2,
                   help="repeats of each grid cell (>= 2 gives every shape warm samples)")
    s.add_argument("--warmup-steps", type=int, default=3,
                   help="first N iterations of the run flagged is_warmup; the first iteration "
                   "of each new shape is flagged too")
    s.add_argument("--idle-ms", type=counts, default=[0], help="idle time before each cell, "
                   "cycling (e.g. 0,20,100: steps after idle, as live traffic has them)")
    s.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="dummy = random weights from config.json alone")
    s.add_argument("--dtype", default="auto", help="auto = float32 on CPU, bfloat16 on GPU")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-num-seqs", type=int, default=None)
    s.add_argument("--max-num-batched-tokens", type=int, default=None)
    s.add_argument("--max-model-len", type=int, default=None,
                   help="the engine's longest request (prompt + output); the calibration "
                   "carries it, so set it to the deployment's (default: the grid's longest)")
    s.add_argument("--kv-cache-gb", type=float, default=1.0, help="CPU KV cache space (GiB)")
    s.add_argument("--regimes", type=lambda t: tuple(x for x in t.split(",") if x),
                   default=("greedy",), help="sampling regimes, each cell run in each: greedy, "
                   "seeded (temperature 0.7, top-p 0.95, a seed per request), logprobs (seeded "
                   "with the sampled tokens' log-probabilities); e.g. greedy,seeded,logprobs")
    s.add_argument("--engine", default="vllm", choices=["vllm", "torch"],
                   help="torch: the PyTorch engine, on CUDA where torch sees a GPU (no vLLM "
                   "there); a KV slot per sequence, so --kv-cache-gb does not apply")
    s.add_argument("--resume", action="store_true", help="continue an interrupted trace")
    s.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_trace_steps)

    v = tsub.add_parser("serve", help="stream a workload against an OpenAI-compatible server",
                        description="Send a seeded Poisson workload to /v1/completions with "
                        "streaming and record per-token arrival times (token_times) and "
                        "per-request timings (requests).")
    v.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    v.add_argument("--model", default=None, help="model name on the server (default: first "
                   "model listed by /v1/models)")
    v.add_argument("-o", "--out", required=True, help="trace directory to write")
    v.add_argument("--num-requests", type=int, default=32)
    v.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals per second "
                   "(0 = all at once)")
    v.add_argument("--prompt-tokens", type=ints, default=[64, 256], help="choices, sampled")
    v.add_argument("--output-tokens", type=ints, default=[32, 128], help="choices, sampled")
    v.add_argument("--concurrency", type=int, default=64, help="max requests in flight")
    v.add_argument("--warmup-requests", type=int, default=2,
                   help="unrecorded requests sent before the clock starts (server warm-up)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--resume", action="store_true")
    v.add_argument("--json", action="store_true")
    v.add_argument("-q", "--quiet", action="store_true")
    v.set_defaults(func=cmd_trace_serve)

    pr = tsub.add_parser("probes", help="probe chain-of-thought mid-reasoning on vLLM (Dynasor)",
                         description="Decode each question x sample in chunks and probe the "
                         "answer after every chunk; never stop early (counterfactual replay).")
    pr.add_argument("--model", default=str(DEFAULT_MODEL),
                    help="trained model directory; default: the testbed's target-large")
    pr.add_argument("-o", "--out", required=True, help="trace directory to write")
    pr.add_argument("--questions", type=int, default=4, help="questions per family x level")
    pr.add_argument("--samples", type=int, default=4, help="reasoning samples per question")
    pr.add_argument("--stride", type=int, default=16, help="reasoning tokens between probes")
    pr.add_argument("--budget", type=int, default=256, help="reasoning token budget")
    pr.add_argument("--probe-tokens", type=int, default=20, help="tokens per probe")
    pr.add_argument("--temperature", type=float, default=0.7, help="reasoning temperature")
    pr.add_argument("--probe-temperature", type=float, default=0.6,
                    help="probe temperature (0.6 is the public reference's; 0 is greedy)")
    pr.add_argument("--seed", type=int, default=0)
    pr.add_argument("--resume", action="store_true", help="continue a killed trace")
    pr.add_argument("--json", action="store_true")
    pr.add_argument("-q", "--quiet", action="store_true")
    pr.set_defaults(func=cmd_trace_probes)

    br = tsub.add_parser("branches", help="SC, MCTS and Rebase programs on vLLM (Dynasor)",
                         description="Run each question's self-consistency, MCTS and Rebase "
                         "programs to their caps and record every request (the branches table) "
                         "with its path reward: the model's own path likelihood.")
    br.add_argument("--model", default=str(DEFAULT_MODEL),
                    help="trained model directory; default: the testbed's target-large")
    br.add_argument("-o", "--out", required=True, help="trace directory to write")
    br.add_argument("--questions", type=int, default=6, help="questions per family x level")
    br.add_argument("--methods", type=lambda t: t.split(","), default=["sc", "mcts", "rebase"])
    br.add_argument("--samples", type=int, default=16, help="self-consistency samples")
    br.add_argument("--iterations", type=int, default=16, help="MCTS iterations")
    br.add_argument("--widths", type=ints, default=[4, 8, 16], help="Rebase widths")
    br.add_argument("--budget", type=int, default=256, help="reasoning tokens per path")
    br.add_argument("--temperature", type=float, default=0.7)
    br.add_argument("--seed", type=int, default=0)
    br.add_argument("--resume", action="store_true", help="continue a killed trace")
    br.add_argument("--json", action="store_true")
    br.add_argument("-q", "--quiet", action="store_true")
    br.set_defaults(func=cmd_trace_branches)

    add_trace_conformity(tsub)
    add_trace_spec(tsub)

    ex = tsub.add_parser("exits", help="every exit's view of every token on the PyTorch engine "
                         "(HELIOS)", description="Run a stream of held-out testbed prompts in "
                         "phases of one task family each on the PyTorch engine at full depth "
                         "(greedy) and record, per output token, the max probability and argmax "
                         "at every exit; per step, each layer's time; per layer, weight and KV "
                         "bytes and the measured load time. The stream is also served with layer "
                         "skipping (EE-LLM style, one sequence) at each --ee-thresholds value, "
                         "to time the EE-full baseline's steps.")
    ex.add_argument("--model", default=str(DEFAULT_MODEL),
                    help="Llama model directory; default: the testbed's target-large")
    ex.add_argument("-o", "--out", required=True, help="trace directory to write")
    ex.add_argument("--phases", type=lambda t: tuple(t.split(",")),
                    default=("mod", "count", "mod", "count"), help="task family per phase")
    ex.add_argument("--prompts-per-phase", type=int, default=30)
    ex.add_argument("--max-tokens", type=int, default=96)
    ex.add_argument("--max-num-seqs", type=int, default=32)
    ex.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    ex.add_argument("--ee-thresholds", type=lambda t: tuple(float(x) for x in t.split(",") if x),
                    default=(0.9,), help="thresholds of the layer-skipping passes (EE-full "
                    "baseline); '' for none. Default: 0.9")
    ex.add_argument("--seed", type=int, default=0)
    ex.add_argument("--json", action="store_true")
    ex.add_argument("-q", "--quiet", action="store_true")
    ex.set_defaults(func=cmd_trace_exits)

    tr = sub.add_parser("traces", help="inspect and validate trace directories")
    trsub = tr.add_subparsers(dest="traces_command", required=True, metavar="ACTION")
    c = trsub.add_parser("check", help="validate trace directories or part files",
                         description="Validate schema, version, columns, times; name file, "
                         "column and row of every violation. Exit 2 if any path fails.")
    c.add_argument("paths", nargs="+", metavar="PATH")
    c.add_argument("--max-errors", type=int, default=20)
    c.set_defaults(func=cmd_traces_check)

    cal = sub.add_parser("calibrate", help="fit the latency model from steps traces",
                         description="Fit per-iteration latency from steps tables (NNLS, relative "
                         "error); report held-out error on grid cells the fit never saw.")
    cal.add_argument("trace_dirs", nargs="+", metavar="TRACE_DIR")
    cal.add_argument("-o", "--out", required=True, help="calibration JSON to write")
    cal.add_argument("--seed", type=int, default=0, help="held-out split seed")
    cal.add_argument("--model", choices=["serving", "linear"], default="serving",
                     help="step-time model: serving (linear + first-of-shape, idle and prefill-"
                     "step terms) or linear")
    cal.add_argument("--host-from", nargs="+", default=[], metavar="RUN_DIR",
                     help="live runs of in-process engines stepped from one loop (each a trace "
                     "or a directory of one per engine): fit the host time per added request "
                     "and after idle from them (default: from the live replays among the "
                     "traces)")
    cal.add_argument("--spec-k", type=int, default=None, metavar="K",
                     help="fit the steps of vLLM's speculative decoding with K draft tokens (a "
                     "spec trace's K cells, or live replays of a speculative engine)")
    cal.add_argument("--json", action="store_true")
    cal.set_defaults(func=cmd_calibrate)

    sm = sub.add_parser("simulate", help="simulate a cluster from a YAML config",
                        description="Run the SimPy cluster model; print a summary; with -o write "
                        "requests/steps tables (same schema as live traces) and summary.json.")
    sm.add_argument("config", nargs="?")
    sm.add_argument("-o", "--out", help="directory for the tables")
    sm.add_argument("--json", action="store_true")
    sm.add_argument("--seeds", type=int, default=0, metavar="N",
                    help="also simulate N draws of the step-time noise (same workload) and "
                    "report each metric's 5-95%% band (bands.json under -o)")
    sm.add_argument("--help-config", action="store_true",
                    help="list every cluster/slo/output config key with its type, default and "
                    "bounds (from the schema the config is validated against), then exit")
    sm.set_defaults(func=cmd_simulate)

    add_sweep_parser(sub)

    dm = sub.add_parser("demo", help="simulate the default cluster and write a report",
                        description="Simulate examples/demo.yaml from the shipped calibration, "
                        "sweep the arrival rate, write PNG plots and report.md.")
    dm.add_argument("-o", "--out", default="reports/demo")
    dm.add_argument("--quick", action="store_true", help="smaller workload (tests)")
    dm.add_argument("--json", action="store_true")
    dm.set_defaults(func=cmd_demo)

    rp = sub.add_parser("replay", help="serve a config's workload live on vLLM (one replica)",
                        description="Same arrivals, lengths (ignore_eos) and seed as `simulate`, "
                        "in real time on vLLM's engine; writes the same tables.")
    rp.add_argument("config")
    rp.add_argument("-o", "--out", required=True)
    rp.add_argument("--model", help="model directory (default: the calibration's model)")
    rp.add_argument("--json", action="store_true")
    rp.add_argument("-q", "--quiet", action="store_true")
    rp.set_defaults(func=cmd_replay)

    va = sub.add_parser("validate", help="compare simulated and live tables",
                        description="Per metric (mean/P50/P90/P99 of TTFT, TPOT, e2e; throughput) "
                        "print simulated, live and relative error; write overlaid CDF plots.")
    va.add_argument("sim_dir")
    va.add_argument("live_dir")
    va.add_argument("-o", "--out", default="reports/validate", help="plot directory")
    va.add_argument("--allow-device-mismatch", action="store_true",
                    help="give a pass/fail verdict even when the calibration was traced on "
                    "another device than the live run")
    va.add_argument("--json", action="store_true")
    va.set_defaults(func=cmd_validate)

    fi = sub.add_parser("fidelity", help="trace, calibrate, simulate and replay live a suite "
                        "of workloads on this machine; one sim-vs-live table",
                        description="Traces a step grid here, calibrates (serving model), then "
                        "simulates each workload of the suite and replays it live twice; each "
                        "metric passes within its tolerance or the live-vs-live spread.")
    fi.add_argument("--quick", action="store_true", help="the quick grid and suite (~3 min)")
    fi.add_argument("-o", "--out", default="reports/fidelity", help="directory to write (new)")
    fi.add_argument("--suite", default=None, help="suite YAML (default "
                    "examples/fidelity/suite.yaml)")
    fi.add_argument("--json", action="store_true")
    fi.add_argument("-q", "--quiet", action="store_true")
    fi.set_defaults(func=cmd_fidelity)
    add_a1_parser(sub)
    add_seed_parser(sub)

    he = sub.add_parser("helios", help="HELIOS early-exit experiments on exits traces")
    hesub = he.add_subparsers(dest="helios_command", required=True, metavar="EXPERIMENT")
    ho = hesub.add_parser("offline", help="exit distribution per model and threshold",
                          description="Counterfactually, from exits traces (reasonsim trace "
                          "exits): the share of tokens exiting at each layer per threshold, how "
                          "often an early token equals the full model's (HELIOS's insight), and "
                          "per loaded depth the confidence-breach rate.")
    ho.add_argument("traces", nargs="+", help="exits trace directories")
    ho.add_argument("--thresholds", type=floats, default=[0.5, 0.7, 0.8, 0.9, 0.95, 0.99])
    ho.add_argument("--breach-threshold", type=float, default=0.9,
                    help="a token at the last loaded layer below it is a confidence breach")
    ho.add_argument("-o", "--out", help="write exits.json and exit_shares.png here")
    ho.add_argument("--json", action="store_true")
    ho.set_defaults(func=cmd_helios_offline)
    hr = hesub.add_parser("replay", help="each policy live on the PyTorch engine vs simulated",
                          description="Serve a helios config's prompt stream live with each "
                          "policy (the same policy objects and round program as the simulator) "
                          "and compare: decision agreement, throughput, TTFT, TPOT, batch, "
                          "perplexity, with the live-vs-live spread over --repeats runs.")
    hr.add_argument("config", help="a config with a helios: section (examples/helios-*.yaml)")
    hr.add_argument("--policies", type=lambda t: t.split(","),
                    help="policy names to replay (default: all)")
    hr.add_argument("--repeats", type=int, default=2, help="live runs per policy")
    hr.add_argument("--retrace", metavar="DIR",
                    help="first trace every model's exits again on this machine, with its "
                    "trace's own workload, into DIR/<model>, and simulate from those (profiles "
                    "belong to the device that traced them)")
    hr.add_argument("--prompts-per-phase", type=int,
                    help="with --retrace: a longer (or shorter) stream than the trace's, so "
                    "live runs last long enough to average a shared machine's speed spells")
    hr.add_argument("--json", action="store_true")
    hr.set_defaults(func=cmd_helios_replay)

    dy = sub.add_parser("dynasor", help="Dynasor experiments on probes traces")
    dysub = dy.add_subparsers(dest="dynasor_command", required=True, metavar="EXPERIMENT")
    off = dysub.add_parser("offline", help="tokens-to-accuracy of certaindex vs fixed budgets",
                           description="Replay probe-consistency stopping (window x interval) "
                           "and fixed token budgets counterfactually on a probes trace; or, on a "
                           "branches trace, certaindex stops vs baseline-even caps for SC, MCTS "
                           "and Rebase.")
    off.add_argument("trace", help="probes or branches trace directory (reasonsim trace ...)")
    off.add_argument("-o", "--out", default="reports/dynasor", help="directory for plot + JSON")
    off.add_argument("--windows", type=ints, default=[2, 3, 4, 5], help="e.g. 2,3,4,5")
    off.add_argument("--intervals", type=ints, default=None,
                     help="probe intervals in tokens (multiples of the stride; default: stride, "
                     "2 x stride)")
    off.add_argument("--budgets", type=ints, default=[32, 64, 96, 128, 160, 192, 256])
    off.add_argument("--json", action="store_true")
    off.add_argument("--per-round", type=int, default=2,
                     help="branches traces: self-consistency paths per round")
    off.set_defaults(func=cmd_dynasor_offline)
    ca = dysub.add_parser("calibrate", help="profiler-guided certaindex threshold and Pareto "
                          "frontier on a branches trace",
                          description="Split the questions (seeded, by difficulty); on the "
                          "calibration half choose the most aggressive threshold, and fit a "
                          "Pareto-frontier curve, that keep the cap's accuracy; report both on "
                          "the held-out half against baseline-even.")
    ca.add_argument("trace", help="branches trace directory (reasonsim trace branches)")
    ca.add_argument("--method", choices=["sc", "mcts", "rebase"], required=True)
    ca.add_argument("--cap", type=int, required=True,
                    help="samples (sc), iterations (mcts) or width (rebase)")
    ca.add_argument("--signal", choices=["entropy", "reward"], default="entropy")
    ca.add_argument("--thresholds", type=floats, default=None,
                    help="candidates; default: 0.05..0.95 (entropy), the traced rewards (reward)")
    ca.add_argument("--detect", type=int, default=None,
                    help="detect@knob: check once at this many solutions (default: every round)")
    ca.add_argument("--per-round", type=int, default=0, help="sc: paths per round")
    ca.add_argument("--split-seed", type=int, default=0)
    ca.add_argument("--json", action="store_true")
    ca.set_defaults(func=cmd_dynasor_calibrate)
    on = dysub.add_parser("online", help="deadline attainment vs rate and SLO scale per scheduler",
                          description="Simulate program configs (same cluster, different "
                          "allocation policies) under each scheduler, sweeping the arrival rate "
                          "and the SLO scale; report the max rate at the target attainment.")
    on.add_argument("configs", nargs="+", help="program workload configs (examples/dynasor-*.yaml)")
    on.add_argument("-o", "--out", default="reports/dynasor", help="directory for plots + JSON")
    on.add_argument("--schedulers", type=lambda t: t.split(","),
                    default=["fcfs", "lpm", "app_fifo", "dynasor"])
    on.add_argument("--rates", type=floats, default=[1, 2, 3, 4, 5, 6])
    on.add_argument("--slo-scales", type=floats, default=[0.5, 1, 1.5, 2, 3, 4])
    on.add_argument("--target", type=float, default=0.9, help="attainment target")
    on.add_argument("--workers", type=int, default=2, help="simulations at once (process pool)")
    on.add_argument("--json", action="store_true")
    on.set_defaults(func=cmd_dynasor_online)
    rp = dysub.add_parser("replay", help="run a program config live on vLLM and compare with sim",
                          description="Drive real vLLM with the config's programs and policy "
                          "objects (probes as prefix-sharing requests, stops as aborts, "
                          "scheduler priorities as vLLM priorities), simulate the same config, "
                          "and report decision agreement and sim-vs-live errors.")
    rp.add_argument("config", help="a program workload config with one replica")
    rp.add_argument("-o", "--out", default="reports/dynasor-replay")
    rp.add_argument("--count", type=int, default=None, help="override the number of programs")
    rp.add_argument("--model", default=None, help="model directory (default: the trace's)")
    rp.add_argument("--url", default=None,
                    help="run on this OpenAI-compatible server instead of an in-process engine "
                    "(start it with the trace's block size and, for non-fcfs schedulers, "
                    "--scheduling-policy priority)")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=cmd_dynasor_replay)

    tb = sub.add_parser("testbed", help="build and measure the small trained testbed models")
    tbsub = tb.add_subparsers(dest="testbed_command", required=True, metavar="ACTION")
    b = tbsub.add_parser("build", help="train target-large, target-small and draft (CPU, ~1 h)",
                         description="Train the testbed models on the synthetic reasoning task, "
                         "deterministically (seeded data and initialisation).")
    b.add_argument("-o", "--out", default=str(TESTBED), help="directory for the model folders")
    b.add_argument("--models", nargs="+", default=None, help="subset of models to train")
    b.add_argument("--steps-scale", type=float, default=1.0,
                   help="multiply every model's step budget (e.g. 0.01 for a smoke run)")
    b.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    b.add_argument("--init-from", default=None,
                   help="directory of models that finished stage 1: run only the later stages")
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(func=cmd_testbed_build)
    e = tbsub.add_parser("eval", help="measure accuracy, probes, entropy, exits and acceptance",
                         description="Evaluate the testbed models on held-out items and print "
                         "one JSON object.")
    e.add_argument("--models", default=str(TESTBED), help="directory holding the model folders")
    e.add_argument("--items", type=int, default=24, help="held-out items per family x level")
    e.add_argument("--samples", type=int, default=8, help="samples per item at temperature 0.7")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--save", default=None, help="also write the JSON object to this file")
    e.add_argument("--json", action="store_true", help="print compact JSON, no progress")
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(func=cmd_testbed_eval)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `reasonsim` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UserError, ValueError, OSError, RuntimeError) as e:
        # Bad input, unreachable servers, dead engines: one line. REASONSIM_DEBUG=1 shows where.
        if os.environ.get("REASONSIM_DEBUG"):
            raise
        print(f"reasonsim: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reasonsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
