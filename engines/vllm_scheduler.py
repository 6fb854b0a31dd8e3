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
import zlib
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


def content_ids(idx: int, tokens: int, chain: tuple = ()) -> list[int]:
    """Deterministic token ids of a simulated request's content (prompt, then output): position p
    under the first link `(key, end)` of `chain` with end > p holds the key's token p, the same in
    every request naming the key; positions past the chain hold ids of request `idx` alone. So
    two requests share a KV block's content exactly where the simulator's prefix cache gives them
    the same block (`sim.engine.prefix_cache`)."""
    out: list[int] = []
    for key, end in chain:
        end = min(end, tokens)
        if end > len(out):
            seed = zlib.crc32(repr(key).encode())
            out += np.random.default_rng([1, seed]).integers(10, _VOCAB, end)[len(out):].tolist()
    own = np.random.default_rng([2, idx]).integers(10, _VOCAB, tokens)
    return out + own[len(out):].tolist()


def prompt_ids(idx: int, prompt_tokens: int, group: int = -1, prefix_tokens: int = 0
               ) -> list[int]:
    """Deterministic token ids of a simulated request's prompt: its group's shared prefix (the
    same ids for every member), then ids of its own."""
    chain = ((group, prefix_tokens),) if group >= 0 and prefix_tokens else ()
    return content_ids(idx, prompt_tokens, chain)


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
        self._outputs: dict[str, list[int]] = {}  # request id -> its output's ids

    def add(self, request_id: str, prompt: list[int], output_tokens: int, priority: int = 0,
            output_ids: list[int] | None = None, read_cache: bool = True) -> None:
        """Queue a request that generates exactly `output_tokens` (ignoring EOS): the ids of
        `output_ids` where given (`content_ids` past the prompt: a later prompt continuing this
        output then finds its blocks cached), else `SAMPLED_TOKEN` each. `read_cache` False:
        it reads no cached block (vLLM's `skip_reading_prefix_cache`)."""
        from vllm import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=output_tokens, ignore_eos=True, temperature=0.0,
                                detokenize=False,
                                skip_reading_prefix_cache=None if read_cache else True)
        self._arrived += 1
        if output_ids is not None:
            self._outputs[request_id] = output_ids
        self.scheduler.add_request(Request(request_id, prompt, params, None,
                                           arrival_time=float(self._arrived),
                                           priority=priority, block_hasher=self._hasher))

    def abort(self, request_ids: list[str]) -> None:
        """Finish requests as aborted (a program's cancelled branches)."""
        from vllm.v1.request import RequestStatus

        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        for r in request_ids:
            self._outputs.pop(r, None)

    def has_requests(self) -> bool:
        """Whether any request is waiting or running."""
        return self.scheduler.get_num_unfinished_requests() > 0

    def free_blocks(self) -> int:
        """KV blocks the pool counts free (cached blocks no request holds among them)."""
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def schedule(self):
        """vLLM's next step: its `SchedulerOutput`."""
        return self.scheduler.schedule()

    def complete(self, out) -> list[str]:
        """Feed a scheduled step back as run: every request whose computed tokens reach its
        known tokens samples its next token. The requests it finished, in order."""
        from vllm.v1.outputs import ModelRunnerOutput

        ids = list(out.num_scheduled_tokens)
        requests, outputs = self.scheduler.requests, self._outputs
        sampled = []
        for r in ids:
            req = requests[r]
            if req.num_computed_tokens < req.num_tokens:
                sampled.append([])
            elif r in outputs:
                sampled.append([outputs[r][req.num_output_tokens]])
            else:
                sampled.append([SAMPLED_TOKEN])
        engine_out = self.scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled))
        finished = [o.request_id for outs in engine_out.values() for o in outs.outputs
                    if o.finish_reason is not None]
        for r in finished:
            outputs.pop(r, None)
        return finished

    def step(self) -> PlannedStep:
        """Schedule one step, then feed it back as run: the composition and what finished."""
        out = self.schedule()
        finished = self.complete(out)
        return PlannedStep(dict(out.num_scheduled_tokens), sorted(out.preempted_req_ids or ()),
                           {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs},
                           finished)
