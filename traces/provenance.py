"""Run metadata every table set carries: device, git revision, model config hash, command line."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (falls back to platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_rev() -> str:
    """Current git revision of the reasonsim checkout, '+dirty' when it has changes."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=_REPO,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=_REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        return (rev or "unknown") + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def config_hash(model_dir: str | Path) -> str:
    """First 16 hex digits of sha256 over the model's canonicalised config.json."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def run_row(kind: str, engine: str, engine_version: str, device: str, device_count: int,
            model_id: str, model_config_hash: str, dtype: str, load_format: str, seed: int,
            params: dict[str, Any]) -> dict[str, Any]:
    """A `runs` row with the provenance filled in from this process."""
    return {
        "kind": kind, "engine": engine, "engine_version": engine_version, "device": device,
        "device_count": device_count, "model_id": model_id,
        "model_config_hash": model_config_hash, "dtype": dtype, "load_format": load_format,
        "seed": seed, "git_rev": git_rev(), "command": shlex.join(sys.argv),
        "created_at": datetime.now(timezone.utc),
        "params_json": json.dumps(params, sort_keys=True),
    }


def cpu_count() -> int:
    """CPU cores usable by this process."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
