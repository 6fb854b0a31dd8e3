"""The testbed's character-level tokenizer: fixed vocabulary, built offline, saved beside models."""

from __future__ import annotations

from pathlib import Path

SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
VOCAB_SIZE = 128  # padded to a multiple of 64 for friendlier matmul shapes


def vocab() -> dict[str, int]:
    """Token -> id for the fixed vocabulary (specials first)."""
    return {tok: i for i, tok in enumerate(SPECIAL + CHARS)}


def build_tokenizer():
    """A transformers fast tokenizer over single characters (BPE with no merges)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab=vocab(), merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>",
                                   model_max_length=4096, clean_up_tokenization_spaces=False)


def save_tokenizer(out_dir: str | Path) -> None:
    """Write tokenizer.json and its configs into a model directory."""
    build_tokenizer().save_pretrained(str(out_dir))
