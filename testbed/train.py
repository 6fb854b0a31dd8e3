"""Train the testbed models: two early-exit targets and a small draft, on the synthetic task.

Every model is trained with a loss at every layer through the shared final norm and head, so an
exit at any layer is meaningful. The loss covers the reasoning and the answer, never the
question (random question tokens carry nothing to learn and slow learning badly). A share of
examples are probe continuations: reasoning cut at a random point, the probe suffix, then the
gold answer, so probing mid-reasoning yields the model's current best guess.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from testbed import lm, tasks



@dataclass(frozen=True)
class Stage:
    """One training stage: its own optimiser, warm-up/cosine schedule and data mix."""

    steps: int
    lr: float = 3e-3
    probe_share: float = 0.3
    """share of examples that are probe continuations"""
    boundary_share: float = 0.0
    """share of probe cuts placed at a line boundary (the rest are uniform over characters)"""


@dataclass(frozen=True)
class ModelSpec:
    """Shape and training stages of one testbed model."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    stages: tuple[Stage, ...]
    tokens_per_batch: int = 3072
    seed: int = 0

    @property
    def steps(self) -> int:
        """Optimiser steps over all stages."""
        return sum(st.steps for st in self.stages)

    def config(self):
        """The transformers LlamaConfig of this model."""
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=128, hidden_size=self.hidden_size, intermediate_size=3 * self.hidden_size,
            num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_heads, head_dim=self.hidden_size // self.num_heads,
            max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=lm.EOS_ID, pad_token_id=lm.PAD_ID,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


# Step budgets leave the models imperfect on purpose. Trained to convergence (6,000 steps, 34 min)
# target-large solved every held-out item at every level: no errors that compound with chain
# length, no answer diversity, nothing for self-consistency or certaindex to decide.
# Stage 1 learns the task; probes after a finished chain of the `mod` family then agreed with the
# model's own answer only ~30% of the time (the answer sits behind the 76-character suffix).
# Stage 2, a short low-lr fine-tune with more probes cut at line boundaries, fixes that without
# unlearning the arithmetic (training the probe-heavy mix from scratch learned it worse).
_PROBE_FINETUNE = Stage(steps=400, lr=1e-3, probe_share=0.5, boundary_share=0.5)
SPECS = {
    "target-large": ModelSpec("target-large", hidden_size=128, num_layers=4, num_heads=4,
                              stages=(Stage(2000), _PROBE_FINETUNE), seed=11),
    "target-small": ModelSpec("target-small", hidden_size=96, num_layers=2, num_heads=3,
                              stages=(Stage(2500), _PROBE_FINETUNE), seed=12),
    "draft": ModelSpec("draft", hidden_size=64, num_layers=1, num_heads=2,
                       stages=(Stage(2000),), seed=13),
}


def example(rng: random.Random, stage: Stage) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of one training example: a full solution or a probe continuation."""
    item = tasks.draw(rng, rng.choice(tasks.FAMILIES), rng.choice(tasks.LEVELS), held_out=False)
    if rng.random() < stage.probe_share:
        if stage.boundary_share and rng.random() < stage.boundary_share:
            # At a line boundary the running value is defined: this teaches "answer with what
            # you have so far".
            cut = rng.choice([0] + [i + 1 for i, ch in enumerate(item.cot) if ch == "\n"])
        else:
            cut = rng.randint(0, len(item.cot))
        head, tail = item.prompt + item.cot[:cut], tasks.PROBE_SUFFIX + item.answer + "}"
        ids = lm.encode(head + tail)
        # Loss on the reasoning prefix and the answer; the suffix is injected, not generated.
        mask = ([0] * len(item.prompt) + [1] * cut + [0] * len(tasks.PROBE_SUFFIX)
                + [1] * (len(item.answer) + 1))
        return ids, mask
    ids = lm.encode(item.text) + [lm.EOS_ID]
    return ids, [0] * len(item.prompt) + [1] * (len(ids) - len(item.prompt))


def batches(rng: random.Random, stage: Stage, tokens_per_batch: int, pool: int = 512):
    """Endless padded batches of similar-length examples (sorted pools waste little padding)."""
    while True:
        exs = sorted((example(rng, stage) for _ in range(pool)), key=lambda e: len(e[0]))
        chunks, cur = [], []
        for ex in exs:
            if cur and (len(cur) + 1) * len(ex[0]) > tokens_per_batch:
                chunks.append(cur)
                cur = []
            cur.append(ex)
        chunks.append(cur)
        rng.shuffle(chunks)
        for chunk in chunks:
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.full((len(chunk), width), lm.PAD_ID)
            mask = torch.zeros((len(chunk), width))
            for i, (x, m) in enumerate(chunk):
                ids[i, : len(x)] = torch.tensor(x)
                mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
            yield ids, mask


def exit_weights(num_layers: int) -> torch.Tensor:
    """Per-exit loss weights: deeper exits count more, the final layer most; they sum to 1."""
    w = torch.arange(1, num_layers + 1, dtype=torch.float32)
    return w / w.sum()


def multi_exit_loss(model, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Weighted next-token loss over every exit; also the final exit's loss alone."""
    logits = lm.layer_logits(model, ids[:, :-1])  # [L, B, T-1, V]
    target = ids[:, 1:]
    m = mask[:, 1:]
    ce = torch.nn.functional.cross_entropy(
        logits.flatten(0, 2), target.repeat(logits.shape[0], 1, 1).flatten(), reduction="none"
    ).view(logits.shape[:3])
    per_exit = (ce * m).sum(dim=(1, 2)) / m.sum()
    return (exit_weights(len(per_exit)) * per_exit).sum(), float(per_exit[-1].detach())


def greedy_accuracy(model, n: int = 64, seed: int = 7) -> float:
    """Share of `n` held-out items whose greedy answer is right (a training-time check)."""
    model.eval()
    held = tasks.items(seed, n)
    outs = lm.generate(model, [it.prompt for it in held], max_new_tokens=200)
    model.train()
    return sum(tasks.extract_boxed(o) == it.answer for it, o in zip(held, outs)) / n


def _run_stage(model, stage: Stage, rng: random.Random, tokens_per_batch: int, name: str,
               log, eval_every: int, t0: float, history: list, step0: int) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=stage.lr, betas=(0.9, 0.98),
                            weight_decay=0.01)
    warmup = min(200, stage.steps // 10)

    def lr_at(step: int) -> float:
        if step < warmup:
            return stage.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, stage.steps - warmup)
        return stage.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))

    stream = batches(rng, stage, tokens_per_batch)
    for step in range(stage.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        ids, mask = next(stream)
        loss, final_loss = multi_exit_loss(model, ids, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step0 + step + 1
        if done % eval_every == 0 or step + 1 == stage.steps:
            acc = greedy_accuracy(model)
            elapsed = time.perf_counter() - t0
            history.append({"step": done, "loss_final_exit": round(final_loss, 4),
                            "greedy_accuracy": acc, "elapsed_s": round(elapsed, 1)})
            log(f"{name} step {done}/{step0 + stage.steps} loss {final_loss:.4f} "
                f"greedy acc {acc:.2f} ({elapsed:.0f} s)")


def train(spec: ModelSpec, out_dir: str | Path, log=print, eval_every: int = 500,
          init_dir: str | Path | None = None) -> dict:
    """Train one model through its stages and save it (weights, config, tokenizer, log).

    With `init_dir`, start from that model's weights and run only the stages after the first
    (used to add a later stage to an already trained model).
    """
    from transformers import LlamaForCausalLM

    from testbed.tokenizer import save_tokenizer

    torch.manual_seed(spec.seed)
    stages = list(enumerate(spec.stages))
    if init_dir is not None:
        model = LlamaForCausalLM.from_pretrained(str(init_dir), dtype=torch.float32)
        stages = stages[1:]
    else:
        model = LlamaForCausalLM(spec.config())
    model.train()
    history: list = []
    t0 = time.perf_counter()
    step0 = sum(st.steps for st in spec.stages[:stages[0][0]]) if stages else spec.steps
    for index, stage in stages:
        # Stage 1 draws from Random(seed); later stages from their own stream.
        rng = random.Random(spec.seed + 1000 * index)
        _run_stage(model, stage, rng, spec.tokens_per_batch, spec.name, log, eval_every, t0,
                   history, step0)
        step0 += stage.steps
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.generation_config.pad_token_id = lm.PAD_ID
    model.generation_config.eos_token_id = lm.EOS_ID
    model.generation_config.bos_token_id = 1
    model.save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(out)
    summary = {"spec": asdict(spec), "parameters": sum(p.numel() for p in model.parameters()),
               "train_s": round(time.perf_counter() - t0, 1), "threads": torch.get_num_threads(),
               "initialised_from": None if init_dir is None else "stage 1 weights",
               "history": history}
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def build(out_dir: str | Path, names: list[str] | None = None, steps_scale: float = 1.0,
          log=print, init_dir: str | Path | None = None) -> dict:
    """Train the named testbed models (all by default) into `out_dir/<name>`, in a fixed order."""
    names = names or list(SPECS)
    unknown = sorted(set(names) - set(SPECS))
    if unknown:
        raise ValueError(f"unknown testbed model(s) {unknown}; expected some of {list(SPECS)}")
    results = {}
    for name in names:
        spec = SPECS[name]
        if steps_scale != 1.0:
            from dataclasses import replace

            spec = replace(spec, stages=tuple(replace(st, steps=max(1, round(st.steps * steps_scale)))
                                              for st in spec.stages))
        init = None if init_dir is None else Path(init_dir) / name
        results[name] = train(spec, Path(out_dir) / name, log=log, init_dir=init)
    return results
