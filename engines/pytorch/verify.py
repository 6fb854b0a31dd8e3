"""Speculative decoding on the PyTorch engine: verify several tokens a sequence in one batched
forward, roll back what was rejected, release a sequence (a mixin of `TorchEngine`)."""

from __future__ import annotations

import time

import torch
from torch.nn.attention import sdpa_kernel

from engines.pytorch.layer_clock import LayerClock
from engines.pytorch.slot_attention import SDPA_BACKENDS


class VerifySteps:
    """`extend`, `set_context` and `release` over the engine's running sequences."""

    def extend(self, tokens: dict[str, list[int]]) -> tuple[dict[str, list[int]], float]:
        """Feed running sequences their tokens (as many each) in one batched forward, as a
        speculative verify step does: per request the greedy token after each fed position,
        and the forward's wall ms. The tokens' KV stays; `set_context` rolls back the rejected."""
        with sdpa_kernel(SDPA_BACKENDS), torch.inference_mode():
            seqs = [self.running_seq(rid) for rid in tokens]
            counts = {len(t) for t in tokens.values()}
            if not seqs or len(counts) != 1 or 0 in counts:
                raise ValueError(f"extend: needs one or more tokens, as many for every sequence "
                                 f"(got {sorted(counts)})")
            if self.spec.skip_layers:
                raise RuntimeError("extend runs every loaded layer: not with skip_layers")
            n = counts.pop()
            over = [s.request_id for s in seqs if s.length + n > self.spec.max_model_len]
            if over:
                raise ValueError(f"extend: {over} would exceed max_model_len "
                                 f"{self.spec.max_model_len}")
            self._sync()
            t0 = time.perf_counter()
            ids = torch.tensor([tokens[s.request_id] for s in seqs], device=self.device)
            pos = torch.tensor([[s.length + j for j in range(n)] for s in seqs],
                               device=self.device)
            clock = LayerClock(self.device.type == "cuda", self.loaded_layers)
            logits = self._forward(ids, pos, seqs, clock, prefill=False, all_positions=True)
            greedy = logits.argmax(-1).cpu().tolist()  # the sync that ends the step
            ms = (time.perf_counter() - t0) * 1e3
        return {s.request_id: row for s, row in zip(seqs, greedy)}, ms

    def set_context(self, request_id: str, output_ids: list[int], kv_tokens: int) -> None:
        """Replace a running sequence's output and keep the KV of its first `kv_tokens` tokens
        (a rollback after verification: the rest is overwritten as it is fed again)."""
        seq = self.running_seq(request_id)
        if not 0 < kv_tokens <= min(seq.length, len(seq.prompt_ids) + len(output_ids)):
            raise ValueError(f"set_context({request_id!r}): kv_tokens {kv_tokens} must be in "
                             f"1..{min(seq.length, len(seq.prompt_ids) + len(output_ids))}")
        seq.output_ids = list(output_ids)
        seq.length = seq.full_length = kv_tokens

    def release(self, request_id: str) -> list[int]:
        """Drop a running sequence (its slot frees); its output ids."""
        seq = self.running_seq(request_id)
        del self.running[seq.slot]
        return seq.output_ids

    def running_output_ids(self, request_id: str) -> list[int]:
        """The output so far of a running sequence (a draft's proposals are its last ones)."""
        return self.running_seq(request_id).output_ids
