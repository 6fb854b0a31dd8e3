"""HELIOS: early-exit model selection, greedy loaded depth, confidence breaches. Pure.

Step 0 (HELIOS's Step-1) shortlists the candidates: `shortlist` takes the top k models of a Model
Repository table (benchmark telemetry as given: throughput, latency, accuracy, energy, memory)
for the SLO strategy, among those that fit the device and reach an accuracy floor.

The policy sees a prompt stream and the tokens each prompt produced; it answers, before each
prompt, which model serves it at which loaded depth (decisions as data), and learns from
evaluation prompts a Performance History Table (PHT). The steps (HELIOS, Algorithm 1):

1. **Evaluate** each shortlisted candidate on `eval_prompts` prompts in turn, full depth, and
   record its PHT row: exit distribution under the threshold and per-depth cost figures.
2. **Select** the candidate that best serves the SLO strategy at its greedy depth: the smallest
   depth at which at least `coverage` of its evaluated tokens exit (HELIOS loads "up to the exit
   layer most tokens take").
3. **Confidence breaches**: a token whose max probability at the last loaded layer is below the
   threshold is a breach. When more than `cbc_max` of the last `window` tokens breached, compare
   loading the current model's remaining layers with switching to the best other candidate at its
   greedy depth, by estimated overhead (load time + serving cost over `horizon_tokens`), and take
   the cheaper. The counter is reset after a decision. Decisions apply at the next prompt.
4. **Re-assess** every `reassess_every` prompts: evaluate the candidates again, select again.
   `reassess_every="auto"` sets each interval at its selection (HELIOS's "simple algorithm" over
   the candidates' token latency and loading cost): the fewest prompts that keep the
   evaluation's estimated cost within `overhead_share` of the time serving the rest takes.

Baselines are policies too: `Static` (one model, full depth) and `EarlyExitFull` (one model, full
depth loaded, tokens exit at the threshold: EE-LLM style).

Costs come from the PHT, measured in evaluation: per step, a fixed time plus a time per loaded
layer (linear in depth, as the layers are identical); memory sets the batch a depth allows.
Energy is a proxy (layer-token executions x a per-layer energy), labelled so wherever shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from policies.exit_tokens import BreachWindow, Rows, TokenBlock

STRATEGIES = ("throughput", "response_time", "accuracy", "energy")
MAX_AUTO_INTERVAL = 1 << 20
"""the longest automatic re-assessment interval, in prompts past the evaluation"""


@dataclass(frozen=True)
class RepositoryEntry:
    """A Model Repository row: one model's benchmark telemetry (given, not measured here)."""

    model: str
    memory_mb: float
    """footprint of the whole model's weights"""
    accuracy: float | None = None
    throughput_tok_s: float | None = None
    latency_ms: float | None = None
    energy_per_token: float | None = None


RANK_BY = {"throughput": ("throughput_tok_s", -1), "response_time": ("latency_ms", 1),
           "accuracy": ("accuracy", -1), "energy": ("energy_per_token", 1)}
"""per strategy: the repository figure it ranks by, and its sign (-1: higher is better)"""


def shortlist(repository: list[RepositoryEntry], strategy: str, k: int, memory_mb: float,
              min_accuracy: float = 0.0) -> list[str]:
    """HELIOS Step-1: the k best models for the strategy among those whose weights fit
    `memory_mb` and whose accuracy reaches `min_accuracy`, in repository order (ties by it)."""
    if strategy not in RANK_BY or k < 1:
        raise ValueError(f"shortlist: strategy {strategy!r}, k {k}")
    key, sign = RANK_BY[strategy]
    fit = []
    for i, e in enumerate(repository):
        figure = getattr(e, key)
        if figure is None:
            raise ValueError(f"repository[{i}] ({e.model}): no {key} to rank by for {strategy}")
        if e.memory_mb <= memory_mb and (e.accuracy or 0.0) >= min_accuracy:
            fit.append((sign * figure, i, e.model))
    chosen = {m for _, _, m in sorted(fit)[:k]}
    return [e.model for e in repository if e.model in chosen]


@dataclass(frozen=True)
class Candidate:
    """A model HELIOS may serve with: its depth and per-layer costs (measured or from config)."""

    name: str
    layers: int
    layer_ms: float
    """time per loaded layer per step (at the evaluation batch)"""
    fixed_ms: float
    """time per step outside the layers (embedding, head, scheduling)"""
    load_ms_per_layer: float
    """measured time to bring one layer's weights into memory"""
    batch_at_depth: tuple[int, ...]
    """largest batch that fits with d layers loaded, for d = 1..layers (memory model)"""
    energy_per_layer_token: float = 1.0
    """energy of one layer on one token (a proxy unless a power reading calibrated it)"""


@dataclass
class PHTRow:
    """Performance History Table row: what evaluating one candidate measured."""

    model: str
    tokens: int = 0
    exit_counts: list[int] = field(default_factory=list)
    """tokens whose first confident exit is layer d (index d-1); the last counts the rest"""
    nll_at_depth: list[float] = field(default_factory=list)
    """summed -log(max probability) of the tokens at each depth (perplexity per depth)"""

    def exit_share_upto(self, depth: int) -> float:
        """Share of evaluated tokens that exit at or before `depth`."""
        return sum(self.exit_counts[:depth]) / self.tokens if self.tokens else 0.0

    def perplexity(self, depth: int) -> float:
        """exp(mean NLL) of the evaluated tokens' own probability at `depth`."""
        return math.exp(self.nll_at_depth[depth - 1] / self.tokens) if self.tokens else math.inf


@dataclass(frozen=True)
class Serve:
    """Decision for one prompt: the model and loaded depth serving it, and why it changed."""

    model: str
    depth: int
    event: str | None = None
    """None, 'evaluate', 'select', 'load' (LD: more layers of the model) or 'switch' (SW)"""
    evaluating: bool = False
    exit_threshold: float | None = None
    """tokens exit at this threshold within the loaded depth (EE-full baseline); None: at depth"""


class Helios:
    """HELIOS's state machine over a prompt stream."""

    def __init__(self, candidates: list[Candidate], threshold: float = 0.9,
                 strategy: str = "throughput", eval_prompts: int = 5, cbc_max: int = 50,
                 window: int = 100, reassess_every: int | str = 150, coverage: float = 0.5,
                 horizon_tokens: int = 1000, overhead_share: float = 0.05):
        if not candidates:
            raise ValueError("helios: needs at least one candidate model")
        if strategy not in STRATEGIES:
            raise ValueError(f"helios: strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
        if not 0 < threshold <= 1 or not 0 < coverage <= 1:
            raise ValueError("helios: threshold and coverage must be in (0, 1]")
        if min(eval_prompts, window, horizon_tokens) < 1 or not 0 <= cbc_max < window:
            raise ValueError("helios: eval_prompts, window and horizon_tokens must be >= 1, and "
                             "0 <= cbc_max < window")
        self.auto = reassess_every == "auto"
        if not self.auto and (isinstance(reassess_every, str)
                              or reassess_every <= eval_prompts * len(candidates)):
            raise ValueError(f"helios: reassess_every ({reassess_every}) must exceed the "
                             f"evaluation phase ({eval_prompts} prompts x {len(candidates)} "
                             "candidates) or be 'auto'")
        if not 0 < overhead_share <= 1:
            raise ValueError("helios: overhead_share must be in (0, 1]")
        self.candidates = {c.name: c for c in candidates}
        self.order = [c.name for c in candidates]
        self.threshold, self.strategy, self.eval_prompts = threshold, strategy, eval_prompts
        self.cbc_max, self.window, self.reassess_every = cbc_max, window, reassess_every
        self.coverage, self.horizon_tokens = coverage, horizon_tokens
        self.overhead_share = overhead_share
        self.interval = None if self.auto else reassess_every
        """prompts in the current re-assessment interval (auto: set at its selection)"""
        self.interval_start = 0
        self.intervals: list[int] = []
        """every interval's length, as decided (auto) or fixed"""
        self.pht: dict[str, PHTRow] = {}
        self.prompt_index = 0
        self.current: Serve | None = None
        self.breaches = BreachWindow(window)
        self.pending: Serve | None = None
        self.events: list[tuple[int, Serve]] = []

    # -- the stream -----------------------------------------------------------------------

    def next_prompt(self) -> Serve:
        """The model and depth that serve the next prompt (call once per prompt, in order)."""
        i = self.prompt_index
        self.prompt_index += 1
        j = i - self.interval_start
        if self.interval is not None and j >= self.interval:  # the next interval starts
            self.interval_start, j = i, 0
            self.interval = None if self.auto else self.interval
        if j < self.eval_prompts * len(self.order):  # every interval starts evaluating
            if j == 0:
                self.pht = {}
            name = self.order[j // self.eval_prompts]
            serve = Serve(name, self.candidates[name].layers,
                          "evaluate" if j % self.eval_prompts == 0 else None, evaluating=True)
        elif self.current is None or self.current.evaluating:
            serve = self._select("select")
            self.breaches.clear()
            self.pending = None
            if self.auto:
                self.interval = self.auto_interval(serve)
            self.intervals.append(self.interval)
        elif self.pending is not None:
            serve, self.pending = self.pending, None
        else:  # as the last prompt, without its event (a decision is immutable: kept)
            c = self.current
            serve = c if c.event is None else Serve(c.model, c.depth)
        if serve.event is not None:
            self.events.append((i, serve))
        self.current = serve
        return serve

    def planned_next(self) -> Serve | None:
        """The model and depth the next prompt gets unless tokens change it (a standby server
        may load it early); None where tokens decide it (the selection after an evaluation)."""
        j = self.prompt_index - self.interval_start
        if self.interval is not None and j >= self.interval:
            j = 0
        if j < self.eval_prompts * len(self.order):
            name = self.order[j // self.eval_prompts]
            return Serve(name, self.candidates[name].layers, evaluating=True)
        if self.current is None or self.current.evaluating:
            return None
        return Serve(self.current.model, self.current.depth)

    def same_after(self) -> int:
        """Prompts after the last one that get the same decision unless tokens change it."""
        j = self.prompt_index - 1 - self.interval_start
        if j < self.eval_prompts * len(self.order):
            return self.eval_prompts - 1 - j % self.eval_prompts
        return self.interval - 1 - j

    def observe(self, serve: Serve, max_probs: list[float]) -> None:
        """One token generated under `serve`: its max probability at each loaded exit."""
        self.observe_tokens(serve, (max_probs,))

    def observe_tokens(self, serve: Serve, tokens) -> None:
        """`observe` of each of a prompt's tokens in turn (per token, the max probability at
        each loaded exit)."""
        self.observe_block(serve, Rows(tokens))

    def observe_block(self, serve: Serve, block: TokenBlock) -> None:
        """`observe` of each token of a block in turn (`policies.exit_tokens`): an evaluation
        counts exits and sums -log probabilities per depth, token by token; otherwise each
        token's last loaded exit is a breach or not."""
        if serve.evaluating:
            self._evaluated(serve.model, block)
            return
        breached = block.below(self.threshold)
        if self.pending is not None:  # decided already: the window only counts
            self.breaches.extend(breached)
            return
        t = self.breaches.first_over(breached, self.cbc_max)
        if t >= 0:
            self.pending = self._on_breaches(serve)
            self.breaches.clear()
            self.breaches.extend(breached[t + 1:])

    def _evaluated(self, model: str, block: TokenBlock) -> None:
        """A block's tokens into the model's PHT row: each token's first exit at the threshold
        (else the last), and the -log probabilities added in token order (a sequential
        cumulative sum: the loop's sums to the last bit)."""
        counts = block.exit_counts(self.threshold)
        n = int(counts.sum())
        if not n:
            return
        depth = len(counts)
        row = self.pht.setdefault(model, PHTRow(model, 0, [0] * depth, [0.0] * depth))
        for d, c in enumerate(counts.tolist()):
            row.exit_counts[d] += c
        row.nll_at_depth = block.exit_neglog_sums(np.asarray(row.nll_at_depth)).tolist()
        row.tokens += n

    # -- decisions ------------------------------------------------------------------------

    def greedy_depth(self, model: str) -> int:
        """Smallest depth at which `coverage` of the model's evaluated tokens exit."""
        row, c = self.pht.get(model), self.candidates[model]
        if row is None or not row.tokens:
            return c.layers
        return next(d for d in range(1, c.layers + 1)
                    if d == c.layers or row.exit_share_upto(d) >= self.coverage)

    def cost(self, model: str, depth: int) -> float:
        """The strategy's cost of serving at `depth` (lower is better)."""
        c = self.candidates[model]
        step_ms = c.fixed_ms + depth * c.layer_ms
        if self.strategy == "throughput":
            return step_ms / c.batch_at_depth[depth - 1]  # ms per token at the batch that fits
        if self.strategy == "response_time":
            return step_ms
        if self.strategy == "accuracy":
            row = self.pht.get(model)
            return row.perplexity(depth) if row else math.inf
        return depth * c.energy_per_layer_token

    def auto_interval(self, chosen: Serve) -> int:
        """Prompts in an interval whose evaluation (each candidate loaded whole and serving its
        prompts at full depth, then the choice loaded again) costs at most `overhead_share` of
        the time its other prompts take at the choice, by the evaluated tokens per prompt."""
        phase = self.eval_prompts * len(self.order)
        tokens = sum(r.tokens for r in self.pht.values()) / phase
        per_prompt_ms = tokens * self._per_token_ms(chosen.model, chosen.depth)
        chosen_c = self.candidates[chosen.model]
        cost_ms = chosen.depth * chosen_c.load_ms_per_layer
        for name in self.order:
            c = self.candidates[name]
            cost_ms += c.layers * c.load_ms_per_layer + self.eval_prompts * tokens * max(
                self._per_token_ms(name, c.layers) - self._per_token_ms(chosen.model,
                                                                        chosen.depth), 0.0)
        if per_prompt_ms <= 0:
            return phase + 1
        return phase + max(1, min(MAX_AUTO_INTERVAL,
                                  math.ceil(cost_ms / (self.overhead_share * per_prompt_ms))))

    def _per_token_ms(self, model: str, depth: int) -> float:
        """Serving time per token at `depth`, at the batch that depth allows."""
        c = self.candidates[model]
        return (c.fixed_ms + depth * c.layer_ms) / c.batch_at_depth[depth - 1]

    def _select(self, event: str) -> Serve:
        best = min(self.order, key=lambda m: (self.cost(m, self.greedy_depth(m)),
                                              self.order.index(m)))
        return Serve(best, self.greedy_depth(best), event)

    def _on_breaches(self, serve: Serve) -> Serve | None:
        """Load the serving model's remaining layers, or switch: whichever costs less."""
        cur = self.candidates[serve.model]
        options = []
        if serve.depth < cur.layers:
            load = (cur.layers - serve.depth) * cur.load_ms_per_layer
            options.append((load + self._serving(cur.name, cur.layers), 0,
                            Serve(cur.name, cur.layers, "load")))
        for k, name in enumerate(self.order):
            if name == cur.name:
                continue
            d = self.greedy_depth(name)
            load = d * self.candidates[name].load_ms_per_layer
            options.append((load + self._serving(name, d), k + 1, Serve(name, d, "switch")))
        return min(options, key=lambda o: o[:2])[2] if options else None

    def _serving(self, model: str, depth: int) -> float:
        """Estimated time to serve `horizon_tokens` at `depth` (the batch it allows)."""
        c = self.candidates[model]
        return self.horizon_tokens * (c.fixed_ms + depth * c.layer_ms) / c.batch_at_depth[depth - 1]


class Static:
    """Baseline: one model at full depth, every token from the last layer."""

    def __init__(self, candidate: Candidate):
        self.candidate = candidate
        self.events: list[tuple[int, Serve]] = []
        self.decision = Serve(candidate.name, candidate.layers)

    def next_prompt(self) -> Serve:
        """Always the same decision."""
        return self.decision

    def same_after(self) -> int:
        """Every later prompt gets the same decision."""
        return 1 << 30

    def planned_next(self) -> Serve:
        """The same decision."""
        return self.decision

    def observe_tokens(self, serve: Serve, tokens) -> None:
        """Static selection learns nothing."""

    def observe_block(self, serve: Serve, block) -> None:
        """Static selection learns nothing."""


class EarlyExitFull(Static):
    """Baseline: an early-exit model with every layer loaded; tokens exit at the threshold."""

    def __init__(self, candidate: Candidate, threshold: float = 0.9):
        super().__init__(candidate)
        self.threshold = threshold
        # the whole model loaded; exits decided per token at the threshold
        self.decision = Serve(candidate.name, candidate.layers, exit_threshold=threshold)
