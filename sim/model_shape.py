"""A model's shape from its Hugging Face `config.json`: what a step's weights, KV and FLOPs come
to (HELIOS's what-if rooflines, A1's arithmetic intensity per step)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


SHAPE_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
"""the keys of a config.json every shape needs; `OPTIONAL_KEYS` default from them"""
OPTIONAL_KEYS = ("num_key_value_heads", "head_dim", "intermediate_size", "ffn_dim")


def read_model_config(config_path: str | Path) -> dict:
    """A Hugging Face config.json with its shape's keys checked: whole numbers >= 1 (a one-line
    error naming the file and the key, not a KeyError or a division by zero later)."""
    try:
        cfg = json.loads(Path(config_path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"model config {config_path}: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"model config {config_path}: not a JSON object")
    for key in SHAPE_KEYS + OPTIONAL_KEYS:
        v = cfg.get(key)
        if v is None and key in SHAPE_KEYS:
            raise ValueError(f"model config {config_path}: no {key}")
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"model config {config_path}: {key} is {v!r}, must be a whole "
                             "number >= 1")
    return cfg


def layer_shape(config_path: str | Path, dtype_bytes: int = 2) -> tuple[int, int, int, int, int]:
    """(layers, weight bytes per layer, matmul parameters per layer, KV bytes per token-layer,
    embedding and head bytes)."""
    return _shape(read_model_config(config_path), dtype_bytes)


def _shape(cfg: dict, dtype_bytes: int) -> tuple[int, int, int, int, int]:
    """`layer_shape` of a config already read."""
    h = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    head_dim = int(cfg.get("head_dim") or h // heads)
    ffn = int(cfg.get("ffn_dim") or cfg.get("intermediate_size") or 4 * h)
    mlp_mats = 3 if cfg.get("model_type") in ("llama", "qwen2", "mistral") else 2
    attn = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2  # q, o; k, v
    params = attn + mlp_mats * h * ffn
    tied = cfg.get("tie_word_embeddings", cfg.get("model_type") == "opt")
    embed = int(cfg["vocab_size"]) * h * dtype_bytes * (1 if tied else 2)
    return (int(cfg["num_hidden_layers"]), params * dtype_bytes, params,
            2 * kv_heads * head_dim * dtype_bytes, embed)


def model_dir_of(model_id: str, has: str = "") -> Path | None:
    """A calibration's model directory (holding `has`, where given): at its path, or found
    again under this checkout's `models/` if it was traced in another; None where neither is."""
    cut = model_id.find("models/")
    for d in (Path(model_id), REPO / model_id[cut:] if cut >= 0 else None):
        if d is not None and d.is_dir() and (not has or (d / has).is_file()):
            return d
    return None


def model_config_of(model_id: str) -> Path | None:
    """The config.json of a calibration's model (`model_dir_of`); None where it is not here."""
    d = model_dir_of(model_id, "config.json")
    return None if d is None else d / "config.json"


def step_intensity(config_path: str | Path, dtype_bytes: int, tokens: np.ndarray,
                   context_tokens: np.ndarray) -> np.ndarray:
    """Arithmetic intensity (FLOP per byte moved) of steps computing `tokens` tokens over
    `context_tokens` summed context: matmul FLOPs 2 x params per token plus attention 4 x
    layers x width per context token (each sequence's context read once), over the weights and
    the KV read and written. A roofline estimate from the shape, not a measurement."""
    cfg = read_model_config(config_path)
    layers, weight_bytes, params, kv_bytes, embed_bytes = _shape(cfg, dtype_bytes)
    width = int(cfg["num_attention_heads"]) * int(
        cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
    tokens = np.asarray(tokens, dtype=float)
    context = np.asarray(context_tokens, dtype=float)
    flops = layers * (2.0 * params * tokens + 4.0 * width * context)
    moved = layers * (weight_bytes + kv_bytes * (context + tokens)) + embed_bytes
    return flops / moved
