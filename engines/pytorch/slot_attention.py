"""One decoder layer of the PyTorch engine over its slot KV cache (a mixin of `TorchEngine`,
which owns `k_cache`/`v_cache` per layer, `heads`, `kv_heads` and `head_dim`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""Not cuDNN's attention: it builds a plan per new shape, and a decode step's attention span
grows every step (measured on an H100: 9 ms of host time per layer call)."""


class SlotAttention:
    """A Llama decoder layer whose attention reads and writes the engine's slot cache."""

    def _layer(self, layer, i, h, cos, sin, slots, pos, span, mask):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        b, n, _ = x.shape
        q = attn.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        c, s = cos[:, None], sin[:, None]
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        if mask is None:  # a prefill of one sequence: causal over its prompt
            self.k_cache[i][slots[0], :, :n] = k[0]
            self.v_cache[i][slots[0], :, :n] = v[0]
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                 enable_gqa=self.heads != self.kv_heads)
        else:  # new tokens (one per sequence, one sequence's run, or runs), seeing the cache
            if n == 1:
                self.k_cache[i][slots, :, pos[:, 0]] = k[:, :, 0]
                self.v_cache[i][slots, :, pos[:, 0]] = v[:, :, 0]
            elif b == 1:
                lo = int(pos[0, 0])
                self.k_cache[i][slots[0], :, lo:lo + n] = k[0]
                self.v_cache[i][slots[0], :, lo:lo + n] = v[0]
            else:  # [batch, n] positions index the cache: the batch and position dims lead
                self.k_cache[i][slots[:, None], :, pos] = k.transpose(1, 2)
                self.v_cache[i][slots[:, None], :, pos] = v.transpose(1, 2)
            keys = self.k_cache[i][slots, :, :span]
            values = self.v_cache[i][slots, :, :span]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                                 enable_gqa=self.heads != self.kv_heads)
        h = h + attn.o_proj(out.transpose(1, 2).reshape(b, n, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Llama's rotary embedding's half rotation of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
