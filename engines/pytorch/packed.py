"""The PyTorch engine's serving step (`TorchSpec.serving`): one packed forward per iteration.

A step is composed as vLLM's scheduler composes it (and the simulator's replica,
`sim.engine.replica.Replica._plan`): the running sequences first, in the order they were
admitted, each taking one decode token or the next chunk of its prompt while the token budget
(`max_num_batched_tokens`) lasts; then waiting requests, while a sequence slot and budget last,
each with its prompt's first chunk. Every scheduled token of every sequence runs in one forward:
the projections and MLPs over all of them at once, attention per sequence over its slot of the
KV cache (the one-token entries batched). The slot cache holds `max_model_len` tokens per
sequence, so a scheduled request always has its KV room: no preemption. A sequence samples a
token at the step whose chunk reaches its last fed token (its prompt's end, or a decode).

A mixin of `TorchEngine` (its `running`, `waiting`, caches, `_choose` and `_finish`).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from engines.pytorch.layer_clock import LayerClock
from engines.pytorch.slot_attention import rotate_half
from engines.pytorch.spec import StepResult


class PackedSteps:
    """`TorchEngine.step` in serving mode."""

    def _schedule(self) -> list[tuple]:
        """(sequence, tokens it computes this step) in vLLM's order: running, then admitted."""
        budget, sched = self.spec.max_num_batched_tokens, []
        for seq in self.running.values():  # insertion order: the order they were admitted
            if budget <= 0:
                break
            todo = len(seq.prompt_ids) - seq.length
            n = min(todo, budget) if todo > 0 else 1
            sched.append((seq, n))
            budget -= n
        free = [s for s in range(self.spec.max_num_seqs) if s not in self.running]
        while self.waiting and free and budget > 0:
            seq = self.waiting.popleft()
            seq.slot = free.pop(0)
            self.running[seq.slot] = seq
            n = min(len(seq.prompt_ids), budget)
            sched.append((seq, n))
            budget -= n
        return sched

    @torch.inference_mode()
    def _serving_step(self) -> StepResult:
        self._sync()
        t0 = time.perf_counter()
        clock = LayerClock(self.device.type == "cuda", self.loaded_layers)
        sched = self._schedule()
        if not sched:
            return StepResult(start_s=t0 - self.t0, duration_ms=0.0, prefill_tokens=0,
                              prefill_seqs=0, decode_seqs=0, context_tokens=0,
                              layer_ms=[0.0] * self.loaded_layers, tokens=[], finished=[])
        ids, pos, slot_of, spans, samples, sampled = [], [], [], [], [], []
        prefill_tokens = prefill_seqs = context = 0
        for seq, n in sched:
            lo = seq.length
            fed = (seq.prompt_ids + seq.output_ids)[lo:lo + n]
            spans.append((len(ids), n, lo, seq.slot))
            ids += fed
            pos += range(lo, lo + n)
            slot_of += [seq.slot] * n
            if lo < len(seq.prompt_ids):
                prefill_tokens, prefill_seqs = prefill_tokens + n, prefill_seqs + 1
            context += lo + n
            if lo + n == len(seq.prompt_ids) + len(seq.output_ids):  # reaches its last token
                samples.append(len(ids) - 1)
                sampled.append(seq)
        if self._graphs is not None and len(samples) == len(sched) == len(ids) \
                and min(pos) > 0 and self.spec.exit_threshold is None \
                and not self.spec.record_exits:  # decodes only (or one-token last chunks)
            logits = self._graphs.decode(ids, pos, slot_of)
            clock.ran = 0  # no per-layer times inside a graph
        else:
            logits = self._packed_forward(ids, pos, slot_of, spans, samples, clock)
        for seq, n in sched:
            seq.length += n
            seq.full_length = seq.length
        tokens = self._choose(logits, sampled) if sampled else []
        finished = self._finish()
        self._sync()
        dt = time.perf_counter() - t0
        return StepResult(start_s=t0 - self.t0, duration_ms=dt * 1e3,
                          prefill_tokens=prefill_tokens, prefill_seqs=prefill_seqs,
                          decode_seqs=len(sched) - prefill_seqs, context_tokens=context,
                          layer_ms=clock.read_ms(), tokens=tokens, finished=finished,
                          scheduled={seq.request_id: n for seq, n in sched})

    def _packed_forward(self, ids, pos, slot_of, spans, samples, clock: LayerClock):
        """Logits [exits, sampled sequences, vocab] (None: nothing sampled) of one packed forward
        over every scheduled token (`spans`: each sequence's (first packed index, tokens, first position, slot))."""
        dev, m = self.device, self.model.model
        ids_t = torch.tensor([ids], device=dev)
        pos_t = torch.tensor([pos], device=dev)
        index = _Index(spans, pos_t[0], torch.tensor(slot_of, device=dev), dev)
        h = m.embed_tokens(ids_t)
        cos, sin = m.rotary_emb(h, pos_t)
        at = torch.tensor(samples, device=dev, dtype=torch.long)
        exits = []
        for i, layer in enumerate(m.layers):
            mark = clock.start()
            h = self._packed_layer(layer, i, h, cos, sin, index)
            exits.append(h[0, at])
            clock.stop(i, mark)
        if not samples:  # prompt chunks only, none at its end
            return None
        if self.spec.exit_threshold is None and not self.spec.record_exits:
            exits = exits[-1:]  # only the last loaded exit decides
        return self.model.lm_head(m.norm(torch.stack(exits))).float()

    def _qkv(self, layer, i, h, cos, sin, slots, pos):
        """A layer's rotated queries, keys and values of the packed tokens [1, heads, tokens,
        head dim], the keys and values written to each token's slot at its position."""
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        n = x.shape[1]
        q = attn.q_proj(x).view(1, n, self.heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
        c, s = cos[:, None], sin[:, None]
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        self.k_cache[i][slots, :, pos] = k[0].transpose(0, 1)  # [tokens, kv heads, head dim]
        self.v_cache[i][slots, :, pos] = v[0].transpose(0, 1)
        return q, k, v

    @staticmethod
    def _close(layer, h, out):
        """The layer's output projection, residual and MLP over attention's `out`."""
        n = h.shape[1]
        h = h + layer.self_attn.o_proj(out.transpose(1, 2).reshape(1, n, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def static_decode(self, inputs, span: int):
        """Logits [1, batch, vocab] of one token per sequence at static shapes (`inputs`: ids,
        positions and slots, [3, batch]; keys over `span` positions, masked): what
        `engines.pytorch.graphs` captures."""
        m = self.model.model
        ids, pos, slots = inputs[0][None], inputs[1][None], inputs[2]
        h = m.embed_tokens(ids)
        cos, sin = m.rotary_emb(h, pos)
        mask = (torch.arange(span, device=self.device)[None] <= inputs[1][:, None])[:, None, None]
        gqa = self.heads != self.kv_heads
        for i, layer in enumerate(m.layers):
            q, _, _ = self._qkv(layer, i, h, cos, sin, slots, inputs[1])
            o = F.scaled_dot_product_attention(
                q[0].transpose(0, 1)[:, :, None], self.k_cache[i][slots, :, :span],
                self.v_cache[i][slots, :, :span], attn_mask=mask, enable_gqa=gqa)
            h = self._close(layer, h, o[:, :, 0].transpose(0, 1)[None])
        return self.model.lm_head(m.norm(h)).float()

    def _packed_layer(self, layer, i, h, cos, sin, index: "_Index"):
        q, k, v = self._qkv(layer, i, h, cos, sin, index.slots, index.pos)
        kc, vc = self.k_cache[i], self.v_cache[i]
        gqa = self.heads != self.kv_heads
        out = torch.empty_like(q)
        if index.one is not None:  # one token each (decodes, a prompt's last chunk of one)
            at, slots, span, mask = index.one
            keys, values = kc[slots, :, :span], vc[slots, :, :span]
            qd = q[0, :, at].transpose(0, 1)[:, :, None]  # [seqs, heads, 1, head dim]
            o = F.scaled_dot_product_attention(qd, keys, values, attn_mask=mask, enable_gqa=gqa)
            out[0, :, at] = o[:, :, 0].transpose(0, 1)
        for a, t, lo, slot, mask in index.runs:  # a prompt chunk: causal, after its cached part
            qs = q[:, :, a:a + t]
            if lo == 0:
                o = F.scaled_dot_product_attention(qs, k[:, :, a:a + t], v[:, :, a:a + t],
                                                   is_causal=True, enable_gqa=gqa)
            else:
                o = F.scaled_dot_product_attention(qs, kc[slot, :, :lo + t][None],
                                                   vc[slot, :, :lo + t][None], attn_mask=mask,
                                                   enable_gqa=gqa)
            out[:, :, a:a + t] = o
        return self._close(layer, h, out)


class _Index:
    """Where a packed step's tokens go: each token's slot and position, the one-token entries
    batched (packed index, slots, key span, mask), and the longer runs with their masks."""

    __slots__ = ("slots", "pos", "one", "runs")

    def __init__(self, spans, pos, slots, dev):
        self.slots, self.pos = slots, pos
        one = [(a, lo, slot) for a, t, lo, slot in spans if t == 1 and lo > 0]
        self.one = None
        if one:
            span = max(lo for _, lo, _ in one) + 1
            seen = torch.tensor([lo for _, lo, _ in one], device=dev)
            mask = (torch.arange(span, device=dev)[None] <= seen[:, None])[:, None, None]
            self.one = (torch.tensor([a for a, _, _ in one], device=dev),
                        torch.tensor([s for _, _, s in one], device=dev), span, mask)
        self.runs = []
        for a, t, lo, slot in spans:
            if t == 1 and lo > 0:
                continue
            mask = None
            if lo:  # each fed position sees the cache up to itself
                mask = (torch.arange(lo + t, device=dev)[None]
                        <= torch.arange(lo, lo + t, device=dev)[:, None])[None, None]
            self.runs.append((a, t, lo, slot, mask))
