"""The PyTorch engine's requests: what a sequence carries, the waiting queue (arrival order, or
vLLM's priority order), admission's bookkeeping, finishing and aborting (a mixin of
`TorchEngine`)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch


@dataclass
class Seq:
    """One request in the engine: its prompt, how it samples, and its state."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    stop_at_eos: bool
    generator: torch.Generator | None
    temperature: float
    top_p: float = 1.0
    logprobs: bool = False
    """keep each sampled token's log-probability (under the model's own distribution)"""
    priority: int = 0
    order: int = 0
    """arrival order at the engine (the priority queue's tie-break)"""
    slot: int = -1
    length: int = 0  # tokens whose KV is in the cache (in the first layer)
    full_length: int = 0  # tokens whose KV is in every loaded layer (layer skipping)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)


class RequestQueue:
    """`add`, `abort` and finishing over the engine's `waiting` queue and `running` slots."""

    def _init_requests(self, priority: bool) -> None:
        self.waiting: deque[Seq] = deque()
        self.running: dict[int, Seq] = {}
        self.outputs: dict[str, Seq] = {}
        self.priority_order = priority
        """waiting requests by (priority, arrival), as vLLM's priority scheduling; else FCFS"""
        self._arrivals = 0

    def add(self, request_id: str, prompt_ids: list[int], max_tokens: int,
            temperature: float = 0.0, seed: int | None = None, stop_at_eos: bool = True,
            top_p: float = 1.0, priority: int = 0, logprobs: bool = False) -> None:
        """Queue a request given as token ids (greedy at temperature 0; nucleus sampling below
        `top_p` 1; `priority`: lower first, with `priority_order`)."""
        if not prompt_ids or max_tokens < 1:
            raise ValueError(f"request {request_id}: needs a prompt and max_tokens >= 1")
        if len(prompt_ids) + max_tokens > self.spec.max_model_len:
            raise ValueError(f"request {request_id}: prompt {len(prompt_ids)} + output "
                             f"{max_tokens} exceeds max_model_len {self.spec.max_model_len}")
        if not (temperature >= 0 and 0 < top_p <= 1):
            raise ValueError(f"request {request_id}: temperature {temperature} must be >= 0 "
                             f"and top_p {top_p} in (0, 1]")
        gen = None
        if temperature > 0:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(self.spec.seed if seed is None else seed)
        seq = Seq(request_id, list(prompt_ids), max_tokens, stop_at_eos, gen, temperature,
                  top_p, logprobs, priority, self._arrivals)
        self._arrivals += 1
        at = len(self.waiting)
        if self.priority_order:  # after every request it does not precede (most often: last)
            while at and (self.waiting[at - 1].priority, self.waiting[at - 1].order) > \
                    (seq.priority, seq.order):
                at -= 1
        self.waiting.insert(at, seq)

    def abort(self, request_id: str) -> list[int]:
        """Drop a waiting or running request (its slot frees); the output it had so far."""
        for i, seq in enumerate(self.waiting):
            if seq.request_id == request_id:
                del self.waiting[i]
                return []
        for slot, seq in self.running.items():
            if seq.request_id == request_id:
                del self.running[slot]
                return seq.output_ids
        raise KeyError(f"request {request_id!r} is neither waiting nor running")

    def running_seq(self, request_id: str) -> Seq:
        """A running request's sequence (KeyError when it is not running)."""
        for seq in self.running.values():
            if seq.request_id == request_id:
                return seq
        raise KeyError(f"request {request_id!r} is not running")

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running."""
        return bool(self.waiting or self.running)

    def _finish(self) -> list[str]:
        eos = self.config.eos_token_id
        done = []
        for slot, seq in list(self.running.items()):
            if (len(seq.output_ids) >= seq.max_tokens or
                    (seq.stop_at_eos and seq.output_ids and seq.output_ids[-1] == eos)):
                del self.running[slot]
                done.append(seq.request_id)
                self.outputs[seq.request_id] = seq
        return done

    def output_ids(self, request_id: str) -> list[int]:
        """Generated token ids of a finished request (and forget it)."""
        return self.outputs.pop(request_id).output_ids

    def finished_seq(self, request_id: str) -> Seq:
        """A finished request's sequence, with its outputs and log-probabilities (and forget
        it)."""
        return self.outputs.pop(request_id)
