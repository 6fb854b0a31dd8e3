"""vLLM starts: explicit CPU memory settings, and a draft and a target engine side by side."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, TESTBED
from engines.vllm_engine import GIB, check_kv_env, vllm_memory_args, vllm_memory_flags

# Both engines in one process, stepped in turn, as a draft/target program would drive them.
_TWO_ENGINES = """
import json
from engines.vllm_engine import Engine, EngineSpec
from vllm import SamplingParams
engines = {role: Engine(EngineSpec(model=f"models/testbed/{name}", kv_cache_gb=gb,
                                   max_model_len=512))
           for role, name, gb in (("draft", "draft", 0.25), ("target", "target-large", 0.5))}
greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
for role, e in engines.items():
    e.add(role, [5, 6, 7, 8, 9], greedy)
tokens = {}
while any(e.has_unfinished() for e in engines.values()):
    for e in engines.values():
        if e.has_unfinished():
            tokens.update({o.request_id: len(o.outputs[0].token_ids) for o in e.step()[0]
                           if o.finished})
print(json.dumps({"tokens": tokens, "blocks": {r: [e.kv_blocks_total, e.block_size]
                                               for r, e in engines.items()}}))
"""


# A toy two-role program through the live runner: the draft proposes 4 tokens, the target
# continues by one; each engine records its own requests.
_TWO_ROLE_PROGRAM = """
import json, sys, time
from pathlib import Path
from engines.live_engine import VllmEngine
from live.runner import LiveRun, run_programs
from programs.base import RequestSpec, Sampling
from traces.store import TraceWriter
from engines.vllm_engine import Engine, EngineSpec

class DraftThenTarget:
    def __init__(self, ids, rounds):
        self.ids, self.rounds, self.requests, self.tokens, self.done = list(ids), rounds, 0, 0, False
    def _spec(self, role, n):
        spec = RequestSpec(role, self.requests, len(self.ids), Sampling(n), role=role,
                           prompt_ids=list(self.ids), prefix_tokens=len(self.ids))
        self.requests += 1
        return spec
    def start(self):
        return [self._spec("draft", 4)]
    def interpret(self, spec, raw, answer_of):
        return raw
    def on_done(self, spec, outcome):
        self.tokens += outcome.tokens
        self.ids += list(outcome.token_ids)
        if spec.role == "draft":
            return [self._spec("target", 1)]
        self.rounds -= 1
        self.done = self.rounds == 0
        return [] if self.done else [self._spec("draft", 4)]

class Plan:
    def __init__(self, i):
        self.index, self.arrival_s = i, 0.02 * i

out = Path(sys.argv[1])
t0 = time.perf_counter()
engines = {}
for role, name, gb in (("draft", "draft", 0.25), ("target", "target-large", 0.5)):
    e = Engine(EngineSpec(model=f"models/testbed/{name}", kv_cache_gb=gb, max_model_len=512))
    engines[role] = VllmEngine(e, TraceWriter(out / role, e.run_row("live", 0, {})), t0)
runs = [LiveRun(Plan(i), DraftThenTarget([5 + i, 6, 7, 8], 3), f"prog-{i:05d}") for i in range(4)]
run_programs(engines, runs)
for role, e in engines.items():
    e.rec.writer.flush("all")
    e.rec.writer.seal()
print(json.dumps({"done": [r.program.done for r in runs],
                  "tokens": [r.program.tokens for r in runs],
                  "finish": [r.finish_s for r in runs]}))
"""


@pytest.mark.engine
def test_live_runner_drives_one_program_on_two_engines(tmp_path):
    from traces import check_trace, read_table

    proc = subprocess.run([sys.executable, "-c", _TWO_ROLE_PROGRAM, str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["done"] == [True] * 4 and out["tokens"] == [3 * (4 + 1)] * 4
    assert all(f > 0 for f in out["finish"])
    for role, per_program in (("draft", 3), ("target", 3)):
        assert check_trace(tmp_path / role) == []
        req = read_table(tmp_path / role, "requests").to_pandas()
        # Every request went to the engine of its role, with what it asked for.
        assert len(req) == 4 * per_program and (req.groupby("program_id").size() == 3).all()
        assert (req.output_tokens == (4 if role == "draft" else 1)).all()


def _kv_bytes_per_block(model: str, block_size: int) -> int:
    cfg = json.loads((TESTBED / model / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    # K and V, float32, every layer.
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * block_size * 4


@pytest.mark.engine
def test_draft_and_target_engines_run_side_by_side_with_their_own_kv_size():
    proc = subprocess.run([sys.executable, "-c", _TWO_ENGINES], cwd=REPO, capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["tokens"] == {"draft": 16, "target": 16}
    # Each engine got exactly the KV space it asked for, not a process-wide setting.
    for role, model, gb in (("draft", "draft", 0.25), ("target", "target-large", 0.5)):
        blocks, block_size = out["blocks"][role]
        assert blocks == int(gb * GIB) // _kv_bytes_per_block(model, block_size), role


def test_memory_settings_are_explicit_and_legacy_env_is_refused(monkeypatch):
    args = vllm_memory_args(0.5)
    assert args == {"kv_cache_memory_bytes": GIB // 2, "gpu_memory_utilization": 0.5}
    assert vllm_memory_flags(0.5) == [f"--kv-cache-memory-bytes={GIB // 2}",
                                      "--gpu-memory-utilization=0.5"]
    with pytest.raises(ValueError, match="kv_cache_gb must be > 0"):
        vllm_memory_args(0)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    with pytest.raises(ValueError, match="unset the variable"):
        check_kv_env()
