"""Measure the testbed on held-out items: accuracy, probes, answer entropy, exits, acceptance.

Everything is computed from the models' own generations with transformers on CPU:
- accuracy: greedy answers against gold, by difficulty level;
- probes: each greedy trajectory's reasoning is cut at fractions 0.1..1.0, the probe suffix
  appended, and the greedy probe answer compared with the trajectory's own final answer;
- entropy: `samples` answers per item at temperature 0.7, normalised entropy of the answer groups
  (0 = all agree, 1 = all differ);
- exits: teacher-forced on the model's greedy tokens, the first exit whose max-probability reaches
  0.9 (else the last layer), and whether each early exit's argmax equals the final layer's;
- acceptance: teacher-forced on a target's greedy tokens, the share of positions where the
  draft's greedy token equals the target's (per-token acceptance of greedy speculation).
"""

from __future__ import annotations

import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

from policies.certaindex import answer_certainty
from testbed import lm, tasks

TARGETS = ("target-large", "target-small")
DRAFT = "draft"
EXIT_THRESHOLD = 0.9
PROBE_FRACTIONS = tuple(round(0.1 * i, 1) for i in range(1, 11))
SAMPLE_TEMPERATURE = 0.7
MAX_NEW_TOKENS = 256
PROBE_TOKENS = 6
BATCH = 256


def reasoning_of(generation: str) -> str:
    """The reasoning part of a generation: everything before its last ``\\boxed{``."""
    cut = generation.rfind(tasks.BOXED)
    return generation if cut < 0 else generation[:cut]


def _generate(model, prompts: list[str], max_new_tokens: int, temperature: float = 0.0,
              seed: int = 0) -> list[str]:
    out = []
    for start in range(0, len(prompts), BATCH):
        out += lm.generate(model, prompts[start:start + BATCH], max_new_tokens,
                           temperature=temperature, seed=seed + start)
    return out


@torch.inference_mode()
def _teacher_forced(model, sequences: list[tuple[list[int], int]]):
    """Per generated position: exit-layer logits, for (ids, prompt_len) pairs; yields per sequence."""
    for ids, n_prompt in sequences:
        logits = lm.layer_logits(model, torch.tensor([ids]))[:, 0]  # [L, T, V]
        # Position t predicts token t+1: the generated tokens are predicted from n_prompt-1 on.
        yield logits[:, n_prompt - 1: len(ids) - 1], torch.tensor(ids[n_prompt:])


def _exit_stats(model, sequences) -> dict:
    layers = model.config.num_hidden_layers
    exit_counts = torch.zeros(layers)
    match_all = match_below = total_all = total_below = 0
    for logits, _ in _teacher_forced(model, sequences):
        probs = logits.softmax(-1)
        conf, top = probs.max(-1)  # [L, T]
        reached = conf >= EXIT_THRESHOLD
        reached[-1] = True  # the last layer always emits
        exit_layer = reached.float().argmax(0)  # first layer at threshold
        exit_counts += torch.bincount(exit_layer, minlength=layers).float()
        same = top[:-1] == top[-1]
        below = ~reached[:-1]
        match_all += int(same.sum())
        total_all += same.numel()
        match_below += int((same & below).sum())
        total_below += int(below.sum())
    dist = (exit_counts / exit_counts.sum()).tolist()
    return {"exit_share_before_last": 1.0 - dist[-1],
            "exit_layer_distribution": {str(i + 1): round(p, 4) for i, p in enumerate(dist)},
            "early_token_matches_final": match_all / max(1, total_all),
            "early_token_matches_final_below_threshold": match_below / max(1, total_below)}


def _acceptance(draft, sequences, levels: list[int]) -> dict:
    hits, totals = Counter(), Counter()
    for (logits, tokens), level in zip(_teacher_forced(draft, sequences), levels):
        accepted = int((logits[-1].argmax(-1) == tokens).sum())
        for key in ("all", str(level)):
            hits[key] += accepted
            totals[key] += len(tokens)
    return {k: hits[k] / totals[k] for k in sorted(totals)}


def _probe_stats(model, held: list[tasks.Item], generations: list[str]) -> dict:
    finals = [tasks.extract_boxed(g) for g in generations]
    prompts, owners = [], []
    for i, (item, gen) in enumerate(zip(held, generations)):
        if finals[i] is None:
            continue
        reasoning = reasoning_of(gen)
        for f in PROBE_FRACTIONS:
            prompts.append(item.prompt + reasoning[: round(f * len(reasoning))] + tasks.PROBE_SUFFIX)
            owners.append((i, f))
    outs = _generate(model, prompts, PROBE_TOKENS)
    agree = defaultdict(list)
    per_item = defaultdict(dict)
    for (i, f), out in zip(owners, outs):
        same = tasks.probe_answer(out) == finals[i]
        agree[f].append(same)
        per_item[i][f] = same
    # An item's answer is stable from the earliest fraction after which every probe agrees.
    stable_before_end, saved = [], []
    for i, by_f in per_item.items():
        if finals[i] != held[i].answer:
            continue
        stable_from = 1.0
        for f in reversed(PROBE_FRACTIONS):
            if not by_f[f]:
                break
            stable_from = f
        stable_before_end.append(stable_from < 1.0)
        saved.append(1.0 - stable_from)
    return {"probe_agreement_by_fraction": {str(f): sum(v) / len(v) for f, v in agree.items()},
            "probe_stable_before_end": sum(stable_before_end) / max(1, len(stable_before_end)),
            "probe_savable_reasoning_share": sum(saved) / max(1, len(saved))}


def evaluate(models_dir: str | Path, items_per_cell: int = 24, samples: int = 8, seed: int = 0,
             progress: bool = True) -> dict:
    """Every testbed figure as one JSON-ready dict (levels and fractions as string keys)."""
    models_dir = Path(models_dir)
    missing = [n for n in (*TARGETS, DRAFT) if not (models_dir / n / "config.json").is_file()]
    if missing:
        raise ValueError(f"{models_dir}: missing testbed model(s) {missing}; "
                         "run `reasonsim testbed build` first")

    def say(msg: str) -> None:
        if progress:
            print(f"[testbed eval] {msg}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    held = tasks.items(seed, items_per_cell * len(tasks.FAMILIES) * len(tasks.LEVELS))
    prompts = [it.prompt for it in held]
    levels = [it.level for it in held]
    draft = lm.load_model(models_dir / DRAFT)
    result: dict = {"items": len(held), "samples_per_item": samples, "seed": seed,
                    "exit_threshold": EXIT_THRESHOLD, "sample_temperature": SAMPLE_TEMPERATURE}
    keys = ("accuracy_by_difficulty", "accuracy_by_family", "probe_agreement_by_fraction",
            "probe_stable_before_end", "probe_savable_reasoning_share",
            "answer_entropy_by_difficulty", "exit_share_before_last", "exit_layer_distribution",
            "early_token_matches_final", "early_token_matches_final_below_threshold",
            "acceptance_rate", "reasoning_tokens_by_difficulty")
    for k in keys:
        result[k] = {}
    for name in (*TARGETS, DRAFT):
        model = draft if name == DRAFT else lm.load_model(models_dir / name)
        say(f"{name}: greedy generation of {len(held)} items")
        greedy = _generate(model, prompts, MAX_NEW_TOKENS)
        correct = [tasks.extract_boxed(g) == it.answer for it, g in zip(held, greedy)]
        result["accuracy_by_difficulty"][name] = _by(levels, correct)
        result["accuracy_by_family"][name] = _by([it.family for it in held], correct)
        result["reasoning_tokens_by_difficulty"][name] = _by(
            levels, [len(reasoning_of(g)) for g in greedy])
        if name == DRAFT:
            continue
        say(f"{name}: probes")
        for k, v in _probe_stats(model, held, greedy).items():
            result[k][name] = v
        say(f"{name}: {samples} samples per item at T={SAMPLE_TEMPERATURE}")
        sampled = _generate(model, [p for p in prompts for _ in range(samples)], MAX_NEW_TOKENS,
                            temperature=SAMPLE_TEMPERATURE, seed=seed)
        entropy = [1.0 - answer_certainty([tasks.extract_boxed(s) for s in
                                       sampled[i * samples:(i + 1) * samples]])
                   for i in range(len(held))]
        result["answer_entropy_by_difficulty"][name] = _by(levels, entropy)
        say(f"{name}: exits and draft acceptance")
        sequences = [(lm.encode(p + g), len(p)) for p, g in zip(prompts, greedy)]
        for k, v in _exit_stats(model, sequences).items():
            result[k][name] = v
        result["acceptance_rate"][name] = _acceptance(draft, sequences, levels)
    result["eval_s"] = round(time.perf_counter() - t0, 1)
    return _rounded(result)


def _by(keys: list, values: list) -> dict:
    groups = defaultdict(list)
    for k, v in zip(keys, values):
        groups[str(k)].append(float(v))
    return {k: sum(v) / len(v) for k, v in sorted(groups.items())}


def _rounded(obj):
    if isinstance(obj, float):
        return round(obj, 4)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    return obj
