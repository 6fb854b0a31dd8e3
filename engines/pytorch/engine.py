"""A PyTorch engine for Llama-architecture models (Llama, Qwen2) with early exits and a loaded-
depth limit.

vLLM cannot run a partial model or exit early, and the GPU machines we reach have torch and
transformers but not vLLM; this engine covers both. It runs batched continuous decoding with a
per-layer KV cache in fixed slots (one per running sequence), on CPU or CUDA.

- **Loaded depth** `loaded_layers = D`: only layers 1..D are in memory; deeper layers are never
  built, and `load_layers(n)` brings more in, timed.
- **Exits**: every layer can exit through the shared final norm and head (as the testbed models
  were trained). A token's exit is the first loaded layer whose max softmax probability reaches
  `exit_threshold`, else layer D; its token comes from that exit.
- **KV of deeper layers**: by default every token of a step runs every loaded layer whatever its
  exit (batch-synchronous, HELIOS's fixed loaded depth), so each loaded layer holds the real KV of
  every token and no layer's KV is ever missing. An exit picks the head, it does not save compute;
  the compute saving comes from the loaded depth.
- **Layer skipping** (`skip_layers`, EE-LLM style, one sequence): a decode step stops at its
  token's exit, so the layers after it do not run and lack that token's KV. The next step that
  runs them recomputes it: a decode step feeds every token since the last step that reached the
  last loaded layer (the pending ones) with the new one, through every layer it runs, so every
  layer it runs ends with the KV of every token (exact: a layer's KV at a position depends only
  on earlier layers at that and earlier positions). The prefill runs every layer. The simulator
  uses the same rule (`sim/families/helios/replica.py`).

Each `step()` admits waiting requests (up to `max_num_seqs` running and `max_num_batched_tokens`
prompt tokens), prefills each admitted prompt, then decodes every running sequence in one
batched forward, and returns what happened (`StepResult`), including per-layer time. In serving
mode (`TorchSpec.serving`, `engines.pytorch.packed`) a step is composed as vLLM's scheduler
composes it (chunked prefill under the token budget) and runs as one packed forward.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch
from torch.nn.attention import sdpa_kernel

from engines.allocator import steady_heap
from engines.model_dir import check_model
from engines.pytorch.graphs import DecodeGraphs
from engines.pytorch.layer_clock import LayerClock
from engines.pytorch.packed import PackedSteps
from engines.pytorch.requests import RequestQueue, Seq
from engines.pytorch.sampling import TokenChoice
from engines.pytorch.slot_attention import SDPA_BACKENDS, SlotAttention
from engines.pytorch.spec import StepResult, TorchSpec
from engines.pytorch.verify import VerifySteps
from engines.pytorch.weights import load_partial, read_layer_weights


def _resolve(spec: TorchSpec) -> tuple[torch.device, torch.dtype]:
    dev = torch.device("cuda" if spec.device == "auto" and torch.cuda.is_available()
                       else "cpu" if spec.device == "auto" else spec.device)
    if spec.dtype == "auto":
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, getattr(torch, spec.dtype)


class TorchEngine(RequestQueue, TokenChoice, SlotAttention, PackedSteps, VerifySteps):
    """Batched decoding of a Llama or Qwen2 model with early exits and a loaded-depth limit."""

    def __init__(self, spec: TorchSpec):
        from transformers import AutoConfig, AutoModelForCausalLM

        self.spec = spec
        self.path = check_model(spec.model, spec.load_format)
        self.device, self.dtype = _resolve(spec)
        if self.device.type == "cpu":  # host memory holds the activations: price by shape
            steady_heap()
        self.config = AutoConfig.from_pretrained(str(self.path))
        _decoder_layer(self.config)  # refuses what the engine cannot run
        self.num_layers = int(self.config.num_hidden_layers)
        depth = self.num_layers if spec.loaded_layers is None else spec.loaded_layers
        if not 1 <= depth <= self.num_layers:
            raise ValueError(f"loaded_layers {spec.loaded_layers}: must be in 1..{self.num_layers}")
        _check_skipping(spec)
        torch.manual_seed(spec.seed)
        # Build the full module skeleton without touching memory, then keep `depth` layers.
        self.config.num_hidden_layers = depth
        if spec.load_format == "dummy":  # built where it runs: an 8B model's random init on
            # the GPU takes seconds, in float32 on the host minutes and twice its memory
            with torch.device(self.device):
                model = AutoModelForCausalLM.from_config(self.config, dtype=self.dtype)
        else:
            model = load_partial(AutoModelForCausalLM, self.path, self.config, self.dtype)
        self.config.num_hidden_layers = self.num_layers
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        cfg = self.config
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.heads = int(cfg.num_attention_heads)
        self._alloc_cache()
        self._init_requests(spec.scheduling_policy == "priority")
        self.t0 = time.perf_counter()

    # -- memory ---------------------------------------------------------------------------

    @property
    def loaded_layers(self) -> int:
        """Layers in memory now."""
        return len(self.model.model.layers)

    def _alloc_cache(self) -> None:
        # with decode graphs, one more slot: padded entries write and read it (`graphs`)
        slots = self.spec.max_num_seqs + self.spec.graphs
        shape = (slots, self.kv_heads, self.spec.max_model_len, self.head_dim)
        self.k_cache = [torch.zeros(shape, device=self.device, dtype=self.dtype)
                        for _ in range(self.loaded_layers)]
        self.v_cache = [torch.zeros_like(k) for k in self.k_cache]
        # captured graphs hold the old cache's addresses: capture anew
        self._graphs = DecodeGraphs(self) if self.spec.graphs else None

    def layer_weight_bytes(self) -> int:
        """Bytes of one decoder layer's weights."""
        layer = self.model.model.layers[0]
        return sum(p.numel() * p.element_size() for p in layer.parameters())

    def kv_bytes_per_token_layer(self) -> int:
        """KV cache bytes one token takes in one layer."""
        return 2 * self.kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()

    def load_layers(self, depth: int) -> float:
        """Bring layers up to `depth` into memory (weights from the model's files); wall ms."""
        if not self.loaded_layers < depth <= self.num_layers:
            raise ValueError(f"load_layers({depth}): loaded {self.loaded_layers} of "
                             f"{self.num_layers}")
        if self.running or self.waiting:
            raise RuntimeError("load_layers needs an idle engine (the KV of new layers is empty)")
        layer_cls = _decoder_layer(self.config)
        self._sync()
        t0 = time.perf_counter()
        new = [layer_cls(self.config, i) for i in range(self.loaded_layers, depth)]
        if self.spec.load_format != "dummy":
            state = read_layer_weights(self.path, range(self.loaded_layers, depth))
            for layer, i in zip(new, range(self.loaded_layers, depth)):
                prefix = f"model.layers.{i}."
                layer.load_state_dict({k[len(prefix):]: v for k, v in state.items()
                                       if k.startswith(prefix)})
        for layer in new:
            self.model.model.layers.append(layer.to(device=self.device, dtype=self.dtype).eval())
        self._sync()
        load_ms = (time.perf_counter() - t0) * 1e3
        self._alloc_cache()
        return load_ms

    def unload_layers(self, depth: int) -> None:
        """Drop layers beyond `depth` from memory (engine idle; 0 keeps only embedding and head,
        as a switched-out model does, and the engine cannot step until layers are loaded)."""
        if not 0 <= depth <= self.loaded_layers:
            raise ValueError(f"unload_layers({depth}): loaded {self.loaded_layers}")
        if self.running or self.waiting:
            raise RuntimeError("unload_layers needs an idle engine")
        del self.model.model.layers[depth:]
        self._alloc_cache()

    def set_max_num_seqs(self, n: int) -> None:
        """Change the number of sequence slots (engine idle): the KV cache is reallocated."""
        if n < 1:
            raise ValueError(f"max_num_seqs {n}: must be >= 1")
        if self.running or self.waiting:
            raise RuntimeError("set_max_num_seqs needs an idle engine")
        _check_skipping(replace(self.spec, max_num_seqs=n))
        self.spec = replace(self.spec, max_num_seqs=n)
        self._alloc_cache()

    def set_exits(self, threshold: float | None, skip_layers: bool = False) -> None:
        """Change the exit threshold and layer skipping (engine idle)."""
        if self.running or self.waiting:
            raise RuntimeError("set_exits needs an idle engine")
        spec = replace(self.spec, exit_threshold=threshold, skip_layers=skip_layers)
        _check_skipping(spec)
        self.spec = spec

    def now_s(self) -> float:
        """Seconds since the engine started."""
        return time.perf_counter() - self.t0

    # -- the step -------------------------------------------------------------------------

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self) -> StepResult:
        """One iteration: admit and prefill waiting requests, then decode the running ones."""
        with sdpa_kernel(SDPA_BACKENDS):
            return self._serving_step() if self.spec.serving else self._step()

    @torch.inference_mode()
    def _step(self) -> StepResult:
        if not self.loaded_layers:
            raise RuntimeError("no layers loaded: load_layers() first")
        self._sync()
        t0 = time.perf_counter()
        clock = LayerClock(self.device.type == "cuda", self.loaded_layers)
        decoding = list(self.running.values())
        admitted, budget = [], self.spec.max_num_batched_tokens
        free = [s for s in range(self.spec.max_num_seqs) if s not in self.running]
        while self.waiting and free and (len(self.waiting[0].prompt_ids) <= budget or
                                         not admitted):
            seq = self.waiting.popleft()
            seq.slot = free.pop(0)
            budget -= len(seq.prompt_ids)
            self.running[seq.slot] = seq
            admitted.append(seq)
        tokens: list[Token] = []
        # Computed tokens of the scheduled sequences after the step (vLLM's definition).
        prompts = sum(len(s.prompt_ids) for s in admitted)
        context = sum(s.length + 1 for s in decoding) + prompts
        # one mask for the decode batch: each attends over the longest's span (`_forward`)
        attended = len(decoding) * (max(s.length for s in decoding) + 1) + prompts \
            if decoding else prompts
        for seq in admitted:
            ids = torch.tensor([seq.prompt_ids], device=self.device)
            pos = torch.arange(len(seq.prompt_ids), device=self.device)[None]
            logits = self._forward(ids, pos, [seq], clock, prefill=True)
            seq.full_length = seq.length
            tokens += self._choose(logits, [seq])
        recomputed = 0
        if decoding and self.spec.skip_layers:
            seq = decoding[0]
            recomputed = seq.length - seq.full_length
            logits = self._forward_skipping(seq, clock)
            tokens += self._choose(logits, [seq])
            clock.ran = len(logits)  # nothing else ran (one sequence)
        elif decoding:
            ids = torch.tensor([[s.output_ids[-1]] for s in decoding], device=self.device)
            pos = torch.tensor([[s.length] for s in decoding], device=self.device)
            logits = self._forward(ids, pos, decoding, clock, prefill=False)
            tokens += self._choose(logits, decoding)
        finished = self._finish()
        self._sync()
        dt = time.perf_counter() - t0
        return StepResult(start_s=t0 - self.t0, duration_ms=dt * 1e3,
                          prefill_tokens=prompts + recomputed,
                          prefill_seqs=len(admitted), decode_seqs=len(decoding),
                          context_tokens=context, layer_ms=clock.read_ms(),
                          tokens=tokens, finished=finished, recomputed_tokens=recomputed,
                          attended_tokens=attended)

    def _forward(self, ids, pos, seqs: list[Seq], clock: LayerClock, prefill: bool,
                 all_positions: bool = False):
        """Logits at every loaded exit, [layers, batch, vocab], for each sequence's last position
        (`all_positions`: the last exit's at every fed position, [batch, positions, vocab])."""
        m = self.model.model
        h = m.embed_tokens(ids)
        cos, sin = m.rotary_emb(h, pos)
        slots = torch.tensor([s.slot for s in seqs], device=self.device)
        if prefill:
            span, mask = ids.shape[1], None
        else:  # each fed position sees the cache up to itself
            span = max(s.length for s in seqs) + ids.shape[1]
            mask = (torch.arange(span, device=self.device)[None, None] <= pos[:, :, None])[:, None]
        exits = []
        for i, layer in enumerate(m.layers):
            mark = clock.start()
            h = self._layer(layer, i, h, cos, sin, slots, pos, span, mask)
            exits.append(h[:, -1])
            clock.stop(i, mark)
        for s in seqs:
            s.length += ids.shape[1]
        if all_positions:
            return self.model.lm_head(m.norm(h)).float()
        if self.spec.exit_threshold is None and not self.spec.record_exits:
            exits = exits[-1:]  # only the last loaded exit decides
        return self.model.lm_head(m.norm(torch.stack(exits))).float()

    def _forward_skipping(self, seq: Seq, clock: LayerClock):
        """One sequence's decode step that stops at its exit: the pending tokens and the new one
        run layer by layer until the new token's max probability reaches the threshold (or the
        last loaded layer); logits [layers run, 1, vocab]."""
        m = self.model.model
        lo, hi = seq.full_length, seq.length + 1  # positions fed: pending ones and the new one
        ids = torch.tensor([(seq.prompt_ids + seq.output_ids)[lo:hi]], device=self.device)
        pos = torch.arange(lo, hi, device=self.device)[None]
        h = m.embed_tokens(ids)
        cos, sin = m.rotary_emb(h, pos)
        slots = torch.tensor([seq.slot], device=self.device)
        mask = (torch.arange(hi, device=self.device)[None] <= pos[0][:, None])[None, None]
        exits = []
        for i, layer in enumerate(m.layers):
            mark = clock.start()
            h = self._layer(layer, i, h, cos, sin, slots, pos, hi, mask)
            logits = self.model.lm_head(m.norm(h[:, -1])).float()
            exits.append(logits)
            top = float(torch.softmax(logits, dim=-1).max())  # the exit decision: a sync
            clock.stop(i, mark)
            if top >= self.spec.exit_threshold:
                break
        seq.length = hi
        if len(exits) == self.loaded_layers:
            seq.full_length = hi
        return torch.stack(exits)


def _decoder_layer(config):
    """The decoder layer class of a model the engine runs: Llama's architecture, or Qwen2's
    (Llama's with biased q/k/v projections) without sliding windows."""
    if config.model_type == "llama":
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
        return LlamaDecoderLayer
    if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
        from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer
        return Qwen2DecoderLayer
    raise ValueError(f"model_type {config.model_type!r}"
                     + (" with sliding windows" if config.model_type == "qwen2" else "")
                     + ": the torch engine runs Llama and Qwen2 (no sliding window) models")


def _check_skipping(spec: TorchSpec) -> None:
    if spec.scheduling_policy not in ("fcfs", "priority"):
        raise ValueError(f"scheduling_policy {spec.scheduling_policy!r}: fcfs or priority")
    if spec.graphs and not spec.serving:
        raise ValueError("graphs: decode graphs are the serving mode's (serving=True)")
    if spec.skip_layers and spec.serving:
        raise ValueError("skip_layers (EE-LLM style exits) runs one sequence layer by layer; "
                         "the serving mode packs every sequence into one forward")
    if spec.skip_layers and (spec.exit_threshold is None or spec.max_num_seqs != 1):
        raise ValueError("skip_layers (EE-LLM style exits) needs an exit_threshold and "
                         f"max_num_seqs 1 (got {spec.exit_threshold}, {spec.max_num_seqs})")
