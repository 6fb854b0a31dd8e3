"""Run the Vidur simulator (PyPI `vidur`, Microsoft, MIT) on a trace, for a side-by-side benchmark.

reasonsim and Vidur are compared on simulated requests per CPU-second over the same workload: a
Vidur trace CSV (`arrived_at,num_prefill_tokens,num_decode_tokens`, seconds), replayed exactly
(arrival times and lengths from the file, no generator of Vidur's own, no clipping or scaling).

    .venv/bin/python benchmarks/vidur_runner.py --trace-csv FILE --out DIR [--setup]
        [--predictor linear_regression|random_forrest] [--retrain] [--json]

Configuration (fixed, as in the profiling data's README): CodeLlama-34B
(`codellama/CodeLlama-34b-Instruct-hf`), TP2, one pipeline stage, one replica, A100 with the
`a100_pairwise_nvlink` network, Sarathi scheduler with chunk 512 and batch cap 128; plots, Chrome
trace, JSON event trace and wandb off.

Vidur lives in its own venv, `.bench/vidur-venv` (never the project's `.venv`: it pins nothing
useful to us and pulls streamlit, wandb, plotly...), and runs as a subprocess of this script with
that venv's python. Nothing of Vidur's (code or data) goes into the project tree: `.bench/` is a
scratch folder. `--setup` creates the venv, installs `vidur` from PyPI and prepares the profiling
data in `.bench/vidur-data` from the shared copy (`<repo>/../shared/vidur-data`, or
`--vidur-data-src`).

What the PyPI package needs that the GitHub README does not say (vidur 0.0.26):
- it reads profiling data from Hugging Face *datasets* (`--*_model_profiling_dataset ORG/NAME`,
  `--*_network_profiling_dataset ORG/NAME`, fetched with `huggingface_hub.snapshot_download` into
  `<cache_dir>/profiling_data/{compute,network}/`), each a folder with `config.json` and
  `mlp.csv.xz`, `attention.csv.xz` / `all_reduce.csv.xz`, `send_recv.csv.xz`. The hub cannot be
  reached here, so `--setup` lays the shared CSVs out as an offline Hugging Face cache (repos
  `local/...`) under the predictor's cache dir and the child runs with `HF_HUB_OFFLINE=1`. Vidur's
  attempt to download ready-made predictions from the hub then fails (it logs "Failed to load
  predictions from HF") and it trains its predictor locally, caching it in the same dir.
- its trace-replay generator (`--request_generator_config_type trace_replay`) reads the columns
  `Date,Time,PromptTokenCount,CompletionTokenCount` (Azure LLM trace style) and keeps the rows whose
  `Date` equals `--trace_request_generator_config_date`; `Time` (seconds) is the arrival. This
  script converts the CSV to that form and passes scale factors of 1 and a `max_tokens` at least the
  longest request so that no length is scaled or clipped.
- Vidur sizes its request slots by that `max_tokens`: the replica's batch size is
  min(batch cap, KV-cache tokens // max_tokens) (56 for CodeLlama-34B TP2 on A100 with
  max_tokens 8000), so the batch cap of 128 is not reached with long requests in the trace; the
  result's `max_batch_size` reports the value Vidur used.
- LinearRegressionExecutionTimePredictor is abstract in the PyPI releases (0.0.17 to 0.0.26: it lacks
  `_get_kv_parallel_communication_time`, which nothing calls); the driver gives it the same
  one-line delegation RandomForrestExecutionTimePredictor has.

Timing: `wall_s` is the Vidur process end to end (interpreter start, imports, predictor training or
cache load, request generation, event loop, metric files); the CPU time is the child's, from
`resource.getrusage(RUSAGE_CHILDREN)` deltas around it. Inside the child a small driver (below)
wraps a few Vidur methods to time the predictor (`SklearnExecutionTimePredictor.__init__`, and
`GridSearchCV.fit` for the training proper), the event loop (`Simulator.run` less
`Simulator._write_output`) and to count the events (`Simulator._add_events`); Vidur itself logs
neither its event count nor its event-loop time.

The first run of a configuration trains and caches the predictor (`predictor_cache: "miss"`); later
runs load it (`"hit"`); `--retrain` forces training again (Vidur's `no_cache`). Random forest
training takes about 50 minutes on 2 cores: prefer `linear_regression` (the default).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import lzma
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vidur_trace import TRACE_DATE, make_poisson_trace, read_trace, write_vidur_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / ".bench"
VENV = BENCH / "vidur-venv"
DATA = BENCH / "vidur-data"
DEFAULT_DATA_SRC = ROOT.parent / "shared" / "vidur-data"

VIDUR_PIN = "vidur==0.0.26"
# the dependency versions this harness was verified with (Python 3.11); `--unpinned` drops them
VERIFIED_PINS = ("numpy==2.4.6", "pandas==3.1.1", "scikit-learn==1.9.1", "scipy==1.17.1",
                 "huggingface_hub==2.4.0")

MODEL = "codellama/CodeLlama-34b-Instruct-hf"
DEVICE = "a100"
NETWORK_DEVICE = "a100_pairwise_nvlink"
TENSOR_PARALLEL = 2
CHUNK_SIZE = 512
BATCH_CAP = 128
KV_GRANULARITY = 64  # Vidur main's default (the PyPI package defaults to 256)
MIN_MAX_TOKENS = 4096  # Vidur's default max tokens per request
PREDICTORS = ("linear_regression", "random_forrest")

COMPUTE_FILES = ("mlp.csv", "attention.csv")
NETWORK_FILES = ("all_reduce.csv", "send_recv.csv")


def log(msg: str) -> None:
    print(f"[vidur_runner] {msg}", file=sys.stderr, flush=True)


def venv_python() -> Path:
    return VENV / "bin" / "python"


def dataset_repo(kind: str, *parts: str) -> str:
    """a valid Hugging Face repo id naming one profiling data set, e.g. local/compute-a100-..."""
    name = "-".join([kind, *parts]).lower().replace("/", "-").replace("_", "-")
    return f"local/{name}"[:96]


COMPUTE_REPO = dataset_repo("compute", DEVICE, MODEL)
NETWORK_REPO = dataset_repo("network", NETWORK_DEVICE)


# ---------------------------------------------------------------- setup


def install_vidur(pinned: bool) -> None:
    if not venv_python().exists():
        log(f"creating {VENV}")
        BENCH.mkdir(exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pkgs = [VIDUR_PIN, *(VERIFIED_PINS if pinned else ())]
    log(f"pip install {' '.join(pkgs)} (into {VENV}; a few minutes the first time)")
    subprocess.run([str(venv_python()), "-m", "pip", "install", "-q", *pkgs], check=True)
    freeze = subprocess.run([str(venv_python()), "-m", "pip", "freeze"], check=True,
                            capture_output=True, text=True).stdout
    (VENV / "pip-freeze.txt").write_text(freeze)
    log(f"installed; versions in {VENV / 'pip-freeze.txt'}")


def _hf_offline_dataset(cache: Path, repo_id: str, files: dict[str, Path], config: dict) -> None:
    """Lay files out as huggingface_hub's cache of dataset `repo_id` (refs/main -> snapshots/SHA)."""
    org, name = repo_id.split("/")
    storage = cache / f"datasets--{org}--{name}"
    digest = hashlib.sha1(json.dumps(config, sort_keys=True).encode())
    for src in files.values():
        digest.update(src.read_bytes())
    sha = digest.hexdigest()
    snap = storage / "snapshots" / sha
    if (storage / "refs" / "main").exists() and (storage / "refs" / "main").read_text() == sha \
            and all((snap / f"{dst}.xz").exists() for dst in files):
        return
    shutil.rmtree(storage, ignore_errors=True)
    snap.mkdir(parents=True)
    for dst, src in files.items():
        with open(src, "rb") as fin, lzma.open(snap / f"{dst}.xz", "wb", preset=1) as fout:
            shutil.copyfileobj(fin, fout)
    (snap / "config.json").write_text(json.dumps(config, indent=2))
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(sha)


def prepare_data(src: Path) -> None:
    compute = src / "compute" / DEVICE / MODEL
    network = src / "network" / NETWORK_DEVICE
    missing = [p for p in [*(compute / f for f in COMPUTE_FILES), *(network / f for f in NETWORK_FILES)]
               if not p.is_file()]
    if missing:
        sys.exit(f"vidur_runner: profiling data missing under {src}: "
                 + ", ".join(str(p.relative_to(src)) for p in missing))
    log(f"preparing profiling data in {DATA} (offline Hugging Face cache layout)")
    _hf_offline_dataset(DATA / "profiling_data" / "compute", COMPUTE_REPO,
                        {f: compute / f for f in COMPUTE_FILES},
                        {"model": MODEL, "device_sku": DEVICE, "source": str(compute)})
    _hf_offline_dataset(DATA / "profiling_data" / "network", NETWORK_REPO,
                        {f: network / f for f in NETWORK_FILES},
                        {"sku": NETWORK_DEVICE, "source": str(network)})


# ---------------------------------------------------------------- the child (runs in the vidur venv)

# The driver runs in the Vidur venv (its own numpy/sklearn): a file of its own, never imported here.
DRIVER = Path(__file__).resolve().parent / "vidur_child.py"


def vidur_args(predictor: str, vidur_csv: Path, out: Path, max_tokens: int, train_jobs: int,
               retrain: bool) -> list[str]:
    p = f"--{predictor}_execution_time_predictor_config_"
    args = [
        "--seed", "0",
        "--log_level", "info",
        "--cluster_config_num_replicas", "1",
        "--replica_config_model_name", MODEL,
        "--replica_config_device", DEVICE,
        "--replica_config_network_device", NETWORK_DEVICE,
        "--replica_config_tensor_parallel_size", str(TENSOR_PARALLEL),
        "--replica_config_num_pipeline_stages", "1",
        "--global_scheduler_config_type", "round_robin",
        "--replica_scheduler_config_type", "sarathi",
        "--sarathi_scheduler_config_chunk_size", str(CHUNK_SIZE),
        "--sarathi_scheduler_config_batch_size_cap", str(BATCH_CAP),
        # replay: arrivals and lengths from the file, unscaled and unclipped
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file", str(vidur_csv),
        "--trace_request_generator_config_date", TRACE_DATE,
        "--trace_request_generator_config_prefill_scale_factor", "1",
        "--trace_request_generator_config_decode_scale_factor", "1",
        "--trace_request_generator_config_time_scale_factor", "1",
        "--trace_request_generator_config_max_tokens", str(max_tokens),
        "--execution_time_predictor_config_type", predictor,
        p + "model_profiling_dataset", COMPUTE_REPO,
        p + "network_profiling_dataset", NETWORK_REPO,
        p + "cache_dir", str(DATA),
        p + "kv_cache_prediction_granularity", str(KV_GRANULARITY),
        p + "prediction_max_tokens_per_request", str(max_tokens),
        p + "num_training_job_threads", str(train_jobs),
        p + "no_cache" if retrain else "--no-" + p[2:] + "no_cache",
        # light outputs: request/batch metric CSVs only
        "--no-metrics_config_store_plots",
        "--no-metrics_config_enable_chrome_trace",
        "--no-metrics_config_write_json_trace",
        "--no-metrics_config_save_table_to_wandb",
        "--metrics_config_output_dir", str(out / "vidur_output"),
    ]
    return args


def check_replay(trace: list[tuple[float, int, int]], output_dir: Path) -> dict:
    """Compare Vidur's request_metrics.csv with the trace: token counts exact, arrivals to 1e-6 s."""
    path = output_dir / "request_metrics.csv"
    if not path.exists():
        return {"ok": None, "reason": f"{path.name} not written"}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    rows.sort(key=lambda r: int(float(r["Request Id"])))
    if len(rows) != len(trace):
        return {"ok": False, "reason": f"{len(rows)} requests in Vidur's metrics, {len(trace)} in trace"}
    bad_len = sum(int(float(r["request_num_prefill_tokens"])) != p
                  or int(float(r["request_num_decode_tokens"])) != d
                  for r, (_, p, d) in zip(rows, trace))
    worst = 0.0
    for i in range(1, len(trace)):
        delay = rows[i].get("request_inter_arrival_delay", "")
        if delay not in ("", None):
            worst = max(worst, abs(float(delay) - (trace[i][0] - trace[i - 1][0])))
    ok = bad_len == 0 and worst < 1e-6
    return {"ok": ok, "length_mismatches": bad_len, "max_inter_arrival_error_s": worst}


def _result(a: argparse.Namespace, trace: list, s: dict, wall: float, cpu: float,
            max_rss_kb: int, max_tokens: int) -> dict:
    """The run's figures from the child's stats `s`, its wall and CPU seconds."""
    n = len(trace)
    trained = s["train_fits"] > 0
    loop_events = s["arrival_events"] + s["added_events"]
    result = {
        "simulator": "vidur",
        "vidur_version": s["vidur_version"],
        "predictor": a.predictor,
        "predictor_cache": "miss" if trained else "hit",
        "requests": n,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "requests_per_cpu_s": round(n / cpu, 2),
        "requests_per_wall_s": round(n / wall, 2),
        "predictor_train_s": round(s["train_s"], 3) if trained else None,
        "predictor_train_note": (f"{s['train_fits']} GridSearchCV fits (sum of their wall time)"
                                 if trained else "predictor loaded from cache: nothing trained "
                                 "this run (use --retrain to measure training)"),
        "predictor_init_s": round(s["predictor_init_s"], 3),
        "event_loop_s": round(s["event_loop_s"], 3),
        "event_loop_cpu_s": round(s["event_loop_cpu_s"], 3),
        "requests_per_event_loop_cpu_s": round(n / s["event_loop_cpu_s"], 2),
        "events": loop_events,
        "events_note": "counted by the harness (arrivals + events returned by handlers); "
                       "Vidur does not report it",
        "events_per_event_loop_cpu_s": round(loop_events / s["event_loop_cpu_s"]),
        "import_s": round(s["import_s"], 3),
        "setup_s": round(s["setup_s"], 3),
        "write_output_s": round(s["write_output_s"], 3),
        "simulated_s": round(s["simulated_s"], 3),
        "max_tokens": max_tokens,
        "max_batch_size": s.get("max_batch_size"),
        "child_max_rss_mb": round(max_rss_kb / 1024, 1),
        "replay_check": check_replay(trace, Path(s["output_dir"])),
        "config": {"model": MODEL, "device": DEVICE, "network_device": NETWORK_DEVICE,
                   "tensor_parallel": TENSOR_PARALLEL, "scheduler": "sarathi",
                   "chunk_size": CHUNK_SIZE, "batch_size_cap": BATCH_CAP,
                   "kv_cache_prediction_granularity": KV_GRANULARITY,
                   "train_jobs": a.train_jobs, "blas_threads": a.threads},
        "versions": s["versions"],
        "trace_csv": str(a.trace_csv),
        "output_dir": s["output_dir"],
    }
    return result


def run_vidur(a: argparse.Namespace) -> dict:
    if not venv_python().exists():
        sys.exit(f"vidur_runner: no Vidur venv at {VENV}: run with --setup first")
    if not (DATA / "profiling_data").exists():
        sys.exit(f"vidur_runner: no profiling data in {DATA}: run with --setup first")
    trace = read_trace(a.trace_csv)
    longest = max(p + d for _, p, d in trace)
    max_tokens = a.max_tokens or max(MIN_MAX_TOKENS, -(-longest // KV_GRANULARITY) * KV_GRANULARITY)
    if max_tokens < longest:
        sys.exit(f"vidur_runner: --max-tokens {max_tokens} < longest request ({longest} tokens): "
                 "Vidur would clip its prompt")
    a.out.mkdir(parents=True, exist_ok=True)
    vidur_csv = a.out / "vidur_trace.csv"
    write_vidur_trace(trace, vidur_csv)
    stats_file = a.out / "child_stats.json"
    stats_file.unlink(missing_ok=True)
    cmd = [str(venv_python()), str(DRIVER),
           *vidur_args(a.predictor, vidur_csv.resolve(), a.out.resolve(), max_tokens, a.train_jobs,
                       a.retrain)]
    (a.out / "vidur_command.json").write_text(json.dumps(cmd, indent=1))
    threads = str(a.threads)
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="disabled", WANDB_SILENT="true",
               MPLBACKEND="Agg", VIDUR_RUNNER_STATS=str(stats_file.resolve()),
               OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    env.pop("PYTHONPATH", None)
    log(f"running Vidur ({a.predictor}) on {len(trace)} requests; log: {a.out / 'vidur.log'}")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    with open(a.out / "vidur.log", "w") as logf:
        proc = subprocess.run(cmd, cwd=a.out, env=env, stdout=logf, stderr=subprocess.STDOUT,
                              preexec_fn=(lambda: os.nice(a.nice)) if a.nice else None)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        tail = (a.out / "vidur.log").read_text().splitlines()[-25:]
        sys.exit(f"vidur_runner: Vidur exited {proc.returncode}; last lines of {a.out / 'vidur.log'}:\n"
                 + "\n".join(tail))
    s = json.loads(stats_file.read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = _result(a, trace, s, wall, cpu, after.ru_maxrss, max_tokens)
    (a.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace-csv", type=Path,
                    help="Vidur trace CSV: arrived_at,num_prefill_tokens,num_decode_tokens (s)")
    ap.add_argument("--out", type=Path, help="output folder (made if missing)")
    ap.add_argument("--setup", action="store_true",
                    help=f"create {VENV.relative_to(ROOT)}, install {VIDUR_PIN}, prepare "
                         f"{DATA.relative_to(ROOT)}, then run")
    ap.add_argument("--setup-only", action="store_true", help="--setup, then stop")
    ap.add_argument("--unpinned", action="store_true",
                    help="with --setup: install vidur's dependencies unpinned (latest)")
    ap.add_argument("--vidur-data-src", type=Path, default=DEFAULT_DATA_SRC,
                    help="shared Vidur profiling data (compute/, network/) (default: %(default)s)")
    ap.add_argument("--predictor", choices=PREDICTORS, default="linear_regression",
                    help="execution time predictor (default: %(default)s; random_forrest "
                         "trains for ~50 min on 2 cores)")
    ap.add_argument("--retrain", action="store_true",
                    help="ignore the cached predictor and train it again (Vidur's no_cache)")
    ap.add_argument("--max-tokens", type=int, default=0,
                    help="Vidur's max tokens per request (default: longest request rounded up to "
                         f"{KV_GRANULARITY}, at least {MIN_MAX_TOKENS}); also sizes the KV slots")
    ap.add_argument("--train-jobs", type=int, default=1,
                    help="GridSearchCV jobs for predictor training (default 1; -1 = all cores)")
    ap.add_argument("--threads", type=int, default=1,
                    help="BLAS/OpenMP threads in the Vidur process (default 1)")
    ap.add_argument("--nice", type=int, default=0, help="niceness increment for the Vidur process")
    ap.add_argument("--make-trace-from", type=Path, metavar="LENGTHS_CSV",
                    help="first write --trace-csv: lengths from this Vidur CSV's first "
                         "--num-requests rows, Poisson arrivals at --rate with --seed")
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print only the result JSON on stdout")
    a = ap.parse_args(argv)
    if not a.setup_only and (a.trace_csv is None or a.out is None):
        ap.error("--trace-csv and --out are required (except with --setup-only)")

    if a.predictor == "random_forrest" and not a.json:
        log("note: a first random_forrest run trains 13 forests (~50 min on 2 cores)")
    if a.setup or a.setup_only:
        install_vidur(pinned=not a.unpinned)
        prepare_data(a.vidur_data_src)
        if a.setup_only:
            return 0
    if a.make_trace_from:
        make_poisson_trace(a.make_trace_from, a.trace_csv, a.num_requests, a.rate, a.seed)
    result = run_vidur(a)
    if a.json:
        print(json.dumps(result))
    else:
        for k in ("vidur_version", "predictor", "predictor_cache", "requests", "wall_s", "cpu_s",
                  "requests_per_cpu_s", "predictor_train_s", "predictor_init_s", "event_loop_s",
                  "events", "requests_per_event_loop_cpu_s", "replay_check"):
            print(f"{k:32s} {result[k]}")
        print(f"{'result':32s} {a.out / 'result.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
