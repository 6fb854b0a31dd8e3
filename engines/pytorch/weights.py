"""Loading a Llama model's weights in part: the first layers only, or named layers later."""

from __future__ import annotations

from pathlib import Path

import torch


def load_partial(cls, path: Path, config, dtype):
    """from_pretrained without the progress bar and the report of the deeper layers' weights
    it skips on purpose (a partial load)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        return cls.from_pretrained(str(path), config=config, dtype=dtype)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()


def read_layer_weights(path: Path, layers: range) -> dict[str, torch.Tensor]:
    """The weights of `layers` read from the model's safetensors files."""
    from safetensors import safe_open

    prefixes = tuple(f"model.layers.{i}." for i in layers)
    state = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                if key.startswith(prefixes):
                    state[key] = st.get_tensor(key)
    return state
