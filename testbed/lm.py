"""Small-model helpers shared by testbed training and evaluation: encoding, loading, generation.

The testbed uses the character tokenizer of `testbed.tokenizer` with no BOS token, so a prompt's
ids here are exactly what vLLM's tokenizer produces from the same text.
"""

from __future__ import annotations

from pathlib import Path

import torch

from testbed.tokenizer import vocab

_VOCAB = vocab()
_INV = {i: t for t, i in _VOCAB.items()}
PAD_ID, EOS_ID, UNK_ID = _VOCAB["<pad>"], _VOCAB["</s>"], _VOCAB["<unk>"]


def encode(text: str) -> list[int]:
    """Token ids of `text`, one per character (no BOS)."""
    return [_VOCAB.get(ch, UNK_ID) for ch in text]


def decode(ids) -> str:
    """Text of `ids`, dropping specials and the unused padding ids of the vocabulary."""
    return "".join(_INV.get(i, "") for i in ids if i > UNK_ID)


def load_model(path: str | Path):
    """A testbed model from its directory, in eval mode, float32."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.eval()


def layer_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits at every exit: shape [layers, batch, seq, vocab], through the shared norm and head."""
    out = model.model(input_ids=input_ids, output_hidden_states=True)
    hidden = out.hidden_states  # embeddings, then each layer; the last is already normed
    exits = [model.model.norm(h) for h in hidden[1:-1]] + [hidden[-1]]
    return torch.stack([model.lm_head(h) for h in exits])


@torch.inference_mode()
def generate(model, prompts: list[str], max_new_tokens: int, temperature: float = 0.0,
             seed: int = 0) -> list[str]:
    """Continuations of `prompts` (greedy at temperature 0), cut at EOS."""
    ids = [encode(p) for p in prompts]
    width = max(len(x) for x in ids)
    input_ids = torch.tensor([[PAD_ID] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    kwargs = dict(do_sample=temperature > 0, max_new_tokens=max_new_tokens,
                  eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    if temperature > 0:
        torch.manual_seed(seed)
        kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
    out = model.generate(input_ids=input_ids, attention_mask=mask, **kwargs)
    return [decode(row[width:].tolist()) for row in out]
