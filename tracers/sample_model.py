"""Builds the shipped sample model: a small Llama with seeded random weights and the char tokenizer.

Random weights give real latency (shape is what matters); the testbed issue replaces them with
trained weights for behaviour. `python -m tracers.sample_model models/sample-llama` rebuilds it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tracers.tokenizer import VOCAB_SIZE, save_tokenizer

SAMPLE_SHAPE = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048)


def build_sample_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Write config.json, safetensors weights and the tokenizer of the sample model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB_SIZE, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      tie_word_embeddings=False, rope_theta=10000.0, torch_dtype="float32",
                      **SAMPLE_SHAPE)
    LlamaForCausalLM(cfg).save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(out)
    return out


if __name__ == "__main__":
    print(build_sample_model(sys.argv[1] if len(sys.argv) > 1 else "models/sample-llama"))
