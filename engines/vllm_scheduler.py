"""vLLM's own scheduler as a step planner: the `vllm.v1` `Scheduler` the engine runs, with no model.

The simulator's replica re-implements vLLM v1's scheduling: this module runs the real one from
the installed vLLM, built in-process from a replica's limits (sequence slots, token budget, KV
blocks and block size, chunked prefill, prefix caching, priority or FCFS) and fed
fabricated model outputs: every request whose computed tokens reach its known tokens samples one
token, as a non-speculative engine's step does. Each step's composition comes back as the
scheduler decided it: tokens per request, preemptions, prompt tokens found cached
(`validation.conformance` compares them with the replica's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SAMPLED_TOKEN = 7
"""the token every fabricated step samples (requests ignore EOS and stop at their length)"""
_VOCAB = 30_000


@dataclass
class PlannedStep:
    """One step as vLLM's scheduler composed it."""

    tokens: dict[str, int]
    """request id -> tokens scheduled (prefill chunk or decode)"""
    preempted: list[str] = field(default_factory=list)
    cached: dict[str, int] = field(default_factory=dict)
    """request id -> prompt tokens found cached, for requests scheduled for the first time"""
    finished: list[str] = field(default_factory=list)
    """requests the step finished, in the scheduler's order"""


def prompt_ids(idx: int, prompt_tokens: int, group: int = -1, prefix_tokens: int = 0
               ) -> list[int]:
    """Deterministic token ids of a simulated request's prompt: its group's shared prefix (the
    same ids for every member), then ids of its own."""
    head = []
    if group >= 0 and prefix_tokens:
        head = np.random.default_rng([1, group]).integers(10, _VOCAB, prefix_tokens).tolist()
    own = np.random.default_rng([2, idx]).integers(10, _VOCAB, prompt_tokens - len(head))
    return head + own.tolist()


class VllmPlanner:
    """A real vLLM v1 `Scheduler` sized by a replica's limits, stepped with fabricated outputs."""

    def __init__(self, cfg, model_dir: str | Path, max_model_len: int):
        """`cfg`: a replica's limits (`sim.engine.replica_config.ReplicaConfig`'s fields);
        `model_dir`: a model whose `config.json` the scheduler's configuration reads."""
        from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, \
            VllmConfig
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, \
            KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager
        import torch

        model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True,
                            max_model_len=max_model_len, dtype="float32", seed=0)
        sched = SchedulerConfig(max_num_seqs=cfg.max_num_seqs,
                                max_num_batched_tokens=cfg.max_num_batched_tokens,
                                max_model_len=max_model_len, enable_chunked_prefill=True,
                                is_encoder_decoder=False,
                                policy="priority" if cfg.priority_scheduling else "fcfs")
        cache = CacheConfig(block_size=cfg.block_size,
                            enable_prefix_caching=cfg.enable_prefix_caching)
        cache.num_gpu_blocks = cfg.kv_blocks
        vllm_config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache,
                                 device_config=DeviceConfig("cpu"))
        # One attention group; the head shape does not enter scheduling, only the block count.
        kv = KVCacheConfig(num_blocks=cfg.kv_blocks, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["layer"], FullAttentionSpec(
                block_size=cfg.block_size, num_kv_heads=1, head_size=8, dtype=torch.float32))])
        self.scheduler = Scheduler(vllm_config, kv, StructuredOutputManager(vllm_config),
                                   block_size=cfg.block_size)
        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(cfg.block_size, sha256)
        self._arrived = 0

    def add(self, request_id: str, prompt: list[int], output_tokens: int,
            priority: int = 0) -> None:
        """Queue a request (ignoring EOS, it generates exactly `output_tokens`)."""
        from vllm import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=output_tokens, ignore_eos=True, temperature=0.0,
                                detokenize=False)
        self._arrived += 1
        self.scheduler.add_request(Request(request_id, prompt, params, None,
                                           arrival_time=float(self._arrived),
                                           priority=priority, block_hasher=self._hasher))

    def abort(self, request_ids: list[str]) -> None:
        """Finish requests as aborted (a program's cancelled branches)."""
        from vllm.v1.request import RequestStatus

        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def has_requests(self) -> bool:
        """Whether any request is waiting or running."""
        return self.scheduler.get_num_unfinished_requests() > 0

    def step(self) -> PlannedStep:
        """Schedule one step, then feed it back as run: the composition and what finished."""
        from vllm.v1.outputs import ModelRunnerOutput

        out = self.scheduler.schedule()
        ids = list(out.num_scheduled_tokens)
        requests = self.scheduler.requests
        sampled = [[SAMPLED_TOKEN] if requests[r].num_computed_tokens >= requests[r].num_tokens
                   else [] for r in ids]
        engine_out = self.scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled))
        finished = [o.request_id for outs in engine_out.values() for o in outs.outputs
                    if o.finish_reason is not None]
        return PlannedStep(dict(out.num_scheduled_tokens), sorted(out.preempted_req_ids or ()),
                           {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs},
                           finished)
