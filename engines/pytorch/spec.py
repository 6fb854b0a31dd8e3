"""What the PyTorch engine (`engines.pytorch.engine`) is started with and what a step returns."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TorchSpec:
    """How to start the PyTorch engine; every field lands in the run's params_json."""

    model: str
    """model directory (config.json, optional safetensors weights)"""
    load_format: str = "auto"
    """auto = weights from the directory; dummy = random weights from config.json (seeded)"""
    dtype: str = "auto"
    """auto = float32 on CPU, bfloat16 on CUDA"""
    device: str = "auto"
    """auto = cuda when available, else cpu"""
    seed: int = 0
    max_num_seqs: int = 16
    max_model_len: int = 1024
    max_num_batched_tokens: int = 2048
    """tokens a step computes (serving: decode tokens and prompt chunks; else the prompt tokens
    admitted)"""
    loaded_layers: int | None = None
    """layers in memory (None: all)"""
    exit_threshold: float | None = None
    """exit at the first loaded layer whose max probability reaches it (None: the last loaded)"""
    record_exits: bool = False
    """report max probability and argmax at every loaded exit for every token"""
    skip_layers: bool = False
    """decode steps stop at the exit (EE-LLM style; needs exit_threshold and max_num_seqs 1)"""
    serving: bool = False
    """one packed forward per step: decode tokens and prompt chunks under the token budget,
    composed as vLLM's scheduler composes them (`engines.pytorch.packed`); False: each admitted
    prompt prefilled whole in its own forward, then the decodes"""
    scheduling_policy: str = "fcfs"
    """fcfs, or priority: waiting requests by (priority, arrival), as vLLM's priority
    scheduling (no preemption: a slot holds its sequence's whole context)"""
    graphs: bool = False
    """serving mode: decode-only steps at static shapes, replayed as CUDA graphs per (batch, span)
    bucket (`engines.pytorch.graphs`); on the CPU the same static code runs eagerly"""


@dataclass
class Token:
    """One generated token: where it exited and, with `record_exits`, every exit's view."""

    request_id: str
    token_index: int
    token_id: int
    exit_layer: int
    exit_prob: float
    max_probs: list[float] = field(default_factory=list)
    argmax_ids: list[int] = field(default_factory=list)


@dataclass
class StepResult:
    """What one engine iteration did."""

    start_s: float
    duration_ms: float
    prefill_tokens: int
    """prompt tokens, plus the pending tokens a skipping decode step recomputes"""
    prefill_seqs: int
    decode_seqs: int
    context_tokens: int
    layer_ms: list[float]
    """per layer the step ran (a skipping decode step runs layers 1..its exit)"""
    tokens: list[Token]
    finished: list[str]
    recomputed_tokens: int = 0
    """pending tokens whose deeper KV a skipping decode step computed"""
    attended_tokens: int = 0
    """HELIOS mode: the tokens its attention ran over, the decode batch padded to its longest
    sequence plus the prompts prefilled (`sim.families.helios.attended`); 0 in serving mode"""
    scheduled: dict[str, int] = field(default_factory=dict)
    """serving mode: request id -> tokens the step computed for it, in the scheduler's order"""
