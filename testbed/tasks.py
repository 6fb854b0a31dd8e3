"""The testbed's synthetic reasoning task: seeded questions with worked chains of thought.

Two families of a different character, each with difficulty levels 1..4:

- ``mod``: a chain of single-digit operations modulo 10 (``+ - *``). Each line of the chain of
  thought applies one operation, so the answer is knowable only after the last line.
- ``count``: count how often a digit occurs in a tagged list. Each line checks one item and
  carries the running count, so the answer is knowable only after the last item.

Operands are tagged with letters (``a+4 b-2``) and each chain line starts with its tag: finding
the next operand is then a content match, which a small transformer learns quickly, instead of
positional counting, which it does not.

After the chain, a random amount of verification chatter restates the work ("wait, let me
check ..."), as real reasoning models keep spending tokens once they know. The example ends with
``\\boxed{answer}``. Probe examples cut the chain at a random point and append the probe suffix
followed by the gold answer, so a probe mid-reasoning yields the model's current best guess.

Pure Python: no torch.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from policies.certaindex import BOXED, PROBE_SUFFIX, extract_boxed, probe_answer  # noqa: F401

FAMILIES = ("mod", "count")
LEVELS = (1, 2, 3, 4)
MOD_OPS_BY_LEVEL = {1: 2, 2: 4, 3: 6, 4: 8}
COUNT_ITEMS_BY_LEVEL = {1: 3, 2: 5, 3: 7, 4: 9}
TAGS = "abcdefghijklmnop"
MAX_CHATTER = 3
HELD_OUT_MODULUS = 10  # one question in ten is reserved for evaluation and never trained on


@dataclass(frozen=True)
class Item:
    """One question with its worked solution; ``prompt + cot + answer_text`` is the full text."""

    family: str
    level: int
    prompt: str       # the question, ending in a newline; what a client sends
    cot: str          # chain of thought, then verification chatter (the reasoning)
    answer: str       # the gold answer, as it appears inside \boxed{}
    solved_at: int    # characters of `cot` after which the answer is stated for the first time

    @property
    def answer_text(self) -> str:
        """The closing ``\\boxed{...}`` the model emits after its reasoning."""
        return f"{BOXED}{self.answer}}}"

    @property
    def text(self) -> str:
        """Prompt, reasoning and boxed answer (the training target after the prompt)."""
        return self.prompt + self.cot + self.answer_text


def _apply(value: int, op: str, operand: int) -> int:
    if op == "+":
        return (value + operand) % 10
    if op == "-":
        return (value - operand) % 10
    return (value * operand) % 10


def _mod_item(rng: random.Random, level: int) -> tuple[str, list[str], str, list[str]]:
    n_ops = MOD_OPS_BY_LEVEL[level]
    start = rng.randrange(10)
    # '*' is rarer: multiplying by 0/5/even digits collapses the chain, which makes answers
    # guessable long before the end.
    ops = rng.choices("+-*", weights=(4, 4, 1), k=n_ops)
    operands = [rng.randrange(1, 10) for _ in range(n_ops)]
    prompt = f"mod10: {start} " + " ".join(f"{TAGS[i]}{op}{x}" for i, (op, x) in
                                              enumerate(zip(ops, operands))) + "\n"
    lines, value = [], start
    for i, (op, x) in enumerate(zip(ops, operands)):
        new = _apply(value, op, x)
        lines.append(f"{TAGS[i]} {value}{op}{x}={new}\n")
        value = new
    last = lines[-1].strip()
    chatter = [f"wait, let me check {last}\n", "hmm, yes\n", f"so the result is {value}\n",
               f"let me verify {lines[0].strip()} ok\n"]
    return prompt, lines, str(value), chatter


def _count_item(rng: random.Random, level: int) -> tuple[str, list[str], str, list[str]]:
    n_items = COUNT_ITEMS_BY_LEVEL[level]
    target = rng.randrange(10)
    # The target digit is over-represented so counts spread over 0..n instead of piling at 0.
    items = [target if rng.random() < 0.35 else rng.randrange(10) for _ in range(n_items)]
    prompt = f"count {target} in: " + " ".join(f"{TAGS[i]}{x}" for i, x in enumerate(items)) + "\n"
    lines, count = [], 0
    for i, x in enumerate(items):
        hit = x == target
        count += hit
        lines.append(f"{TAGS[i]} {x} {'yes' if hit else 'no'} {count}\n")
    chatter = [f"wait, let me recount {target}s\n", "hmm, yes\n", f"so there are {count}\n",
               f"let me check {lines[-1].strip()} ok\n"]
    return prompt, lines, str(count), chatter


def make_item(rng: random.Random, family: str, level: int) -> Item:
    """Draw one item of a family and difficulty level from `rng`."""
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r}; expected one of {FAMILIES}")
    if level not in LEVELS:
        raise ValueError(f"unknown difficulty level {level!r}; expected one of {LEVELS}")
    build = _mod_item if family == "mod" else _count_item
    prompt, lines, answer, chatter_pool = build(rng, level)
    chain = "".join(lines)
    chatter = "".join(rng.sample(chatter_pool, rng.randint(0, MAX_CHATTER)))
    return Item(family=family, level=level, prompt=prompt, cot=chain + chatter, answer=answer,
                solved_at=len(chain))


def is_held_out(prompt: str) -> bool:
    """Whether a question belongs to the evaluation split (a stable hash of its text)."""
    return zlib.crc32(prompt.encode()) % HELD_OUT_MODULUS == 0


def draw(rng: random.Random, family: str, level: int, held_out: bool) -> Item:
    """An item of the requested split: training draws never see an evaluation question."""
    while True:
        item = make_item(rng, family, level)
        if is_held_out(item.prompt) == held_out:
            return item


def items(seed: int, n: int, families: tuple[str, ...] = FAMILIES,
          levels: tuple[int, ...] = LEVELS, held_out: bool = True) -> list[Item]:
    """`n` items cycling over families x levels, deterministic in `seed` (evaluation split)."""
    rng = random.Random(seed)
    cells = [(f, lv) for f in families for lv in levels]
    return [draw(rng, *cells[i % len(cells)], held_out=held_out) for i in range(n)]


def testbed_prompts(tok, prompt_tokens, seed: int, questions: list | None = None
                    ) -> list[list[int]]:
    """Prompts of the given lengths cut from the testbed's questions (`questions`, or 64 drawn
    from `seed`): request i starts at question i and runs on through the next ones as far as its
    length needs. `tok` is any tokenizer with `encode`."""
    questions = questions or items(seed, 64)
    encoded = [tok.encode(q.prompt + "\n", add_special_tokens=False) for q in questions]
    out = []
    for i, n in enumerate(int(p) for p in prompt_tokens):
        ids: list[int] = []
        j = i
        while len(ids) < n:
            ids += encoded[j % len(encoded)]
            j += 1
        out.append(ids[:n])
    return out
