"""A model directory's checks before any engine starts: config, weights, tokenizer.

Every engine (vLLM in-process or served, the PyTorch engine) checks its model directory here,
so a missing piece is named before minutes of engine start-up, and the checks import no engine.
"""

from __future__ import annotations

from pathlib import Path


def check_model_dir(model: str | Path) -> Path:
    """A model directory must exist and hold config.json; raise naming what is missing."""
    path = Path(model)
    if path.exists() and not path.is_dir():
        raise FileNotFoundError(f"model directory {path} is a file, not a directory")
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json (a model directory needs one)")
    return path


def has_weights(model: Path) -> bool:
    """True when the model directory carries weight files."""
    return any(model.glob("*.safetensors")) or any(model.glob("*.bin"))


def has_tokenizer(model: Path) -> bool:
    """True when the model directory carries a tokenizer."""
    return (model / "tokenizer.json").is_file() or (model / "tokenizer.model").is_file()


def check_model(model: str | Path, load_format: str) -> Path:
    """Validate a model directory for the load format before any engine import."""
    path = check_model_dir(model)
    if load_format != "dummy" and not has_weights(path):
        raise FileNotFoundError(f"{path}: no weights (*.safetensors/*.bin); use "
                                "--load-format dummy to profile with random weights")
    return path


def check_same_model(model: str | Path, want_hash: str | None, what: str) -> Path:
    """`--model` names where `what`'s model is (a config.json hashing `want_hash`), not
    another model, whose step times and sampling are not the ones recorded."""
    from traces.provenance import config_hash

    try:
        path = check_model_dir(model)
    except FileNotFoundError as e:
        raise ValueError(f"--model: {e}") from None
    got = config_hash(path)
    if want_hash is not None and got != want_hash:
        raise ValueError(f"--model {model}: not the model {what} (its config.json hashes {got}, "
                         f"the recorded model's {want_hash})")
    return path


def check_model_len(model: Path, max_model_len: int) -> None:
    """A `max_model_len` past the model's positions (config.json's max_position_embeddings,
    no rope scaling) is refused before vLLM starts, as vLLM itself refuses it (unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN allows it, as the scheduler-only replica does)."""
    import json
    import os

    if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower() in ("1", "true"):
        return
    cfg = json.loads((Path(model) / "config.json").read_text())
    limit = cfg.get("max_position_embeddings")
    if type(limit) is int and not cfg.get("rope_scaling") and max_model_len > limit:
        raise ValueError(f"max_model_len {max_model_len} exceeds the model's "
                         f"max_position_embeddings {limit} ({Path(model) / 'config.json'})")
