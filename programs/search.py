"""Multi-path search programs (Dynasor's SC, MCTS, Rebase) on one question, engine-free.

Every request's prompt is the question plus the path it extends (prefix-cached); every request
carries a seed derived from the program's seed and the request's index within the program, so a
program is a deterministic function of its seed and its decisions, and a live replay with the same
policy reproduces a traced program request for request unless batching changes the numerics.

- sc: independent samples to the end, `per_round` at a time.
- mcts: one request per iteration, from the UCT-selected node to an answer (the rollout); its
  first reasoning step (line) becomes the new tree node.
- rebase: one request per new node, a single reasoning step (stop at the newline).

Rewards are the model's own path likelihood (`path_reward`, from the sampled tokens' log-
probabilities returned with the generation: no extra request), never the gold answer.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field

from policies.certaindex import extract_boxed
from policies.search import SearchBudget, path_reward, program_answer, rebase_children, uct_select
from programs.base import Outcome, RequestSpec, Sampling
from traces.seeds import chunk_seed, request_seed

METHOD_INDEX = {"sc": 1, "mcts": 2, "rebase": 3}  # part of each program's seed


@dataclass(frozen=True)
class SearchSettings:
    """How a search program generates (shared by the tracer and the live replay)."""

    budget_tokens: int = 256
    """reasoning tokens per path"""
    step_tokens: int = 32
    """longest reasoning step (rebase); a step ends at a newline"""
    temperature: float = 0.7
    rebase_temperature: float = 0.05
    """softmax temperature over path rewards (rewards lie in (0, 1])"""
    exploration: float = 0.3
    """UCT exploration constant"""


@dataclass
class _Node:
    node_id: int
    parent: int | None
    depth: int
    ids: list                 # reasoning token ids of the path through this node
    text: str                 # its text
    logprob_sum: float = 0.0  # over every generated token of the path
    tokens: int = 0           # generated tokens of the path
    terminal: bool = False    # an answer, end of sequence or the token budget
    reward: float = 0.0       # path reward (rebase allocation)


@dataclass
class SearchProgram:
    """One SC/MCTS/Rebase program on the engine: decides its requests and when it is done."""

    key: str
    method: str
    policy: SearchBudget
    prompt_ids: list | None
    """question token ids (live); None in the simulator"""
    seed: int
    settings: SearchSettings
    nodes: dict = field(default_factory=dict)       # node id (request index + 1) -> node
    solutions: list = field(default_factory=list)   # (request index, answer, reward, tokens),
    #                                                 in request order
    # mcts: per node, in node id order (ids are dense: one rollout in flight at a time), what
    # UCT selection reads (`uct_select`'s columns), kept as rollouts back their rewards up
    visits: list = field(default_factory=lambda: [0])
    value_sums: list = field(default_factory=lambda: [0.0])
    expandable: list = field(default_factory=lambda: [True])
    rows: list = field(default_factory=list)        # one branches row per request
    requests: int = 0
    tokens: int = 0
    pending: int = 0
    level: int = 0
    solved_before: int = 0
    done: bool = False

    def __post_init__(self) -> None:
        self.nodes[0] = _Node(0, None, 0, [], "")

    # Solutions in request order, not completion order: decisions do not depend on timing.
    @property
    def answers(self) -> list:
        return [a for _, a, _, _ in self.solutions]

    @property
    def rewards(self) -> list:
        return [r for _, _, r, _ in self.solutions]

    @property
    def lengths(self) -> list:
        """The solving requests' output tokens (baseline-length reads them)."""
        return [n for _, _, _, n in self.solutions]

    # The accounting a programs table reads.
    paths_used = property(lambda self: self.requests)
    reasoning = property(lambda self: self.tokens)
    probe_tokens = property(lambda self: 0)
    stop_at = property(lambda self: None)

    def remaining_tokens(self) -> int:
        """The program's own estimate of the tokens it may still generate (Dynasor's approximate
        SJF): its mean tokens per finished request so far (the trace's step budget before any)
        times the requests its cap leaves (solutions left for Rebase, whose levels branch)."""
        finished = self.requests - self.pending
        per = self.tokens / finished if finished else self.settings.budget_tokens
        left = self.policy.cap - (len(self.solutions) if self.method == "rebase" else
                                  self.requests)
        return int(per * max(left, 0))

    @property
    def answer(self) -> str | None:
        """The program's answer from its solutions so far."""
        return program_answer(self.method, self.answers, self.rewards)

    def _gen(self, parent: int, step: bool) -> RequestSpec:
        s = self.settings
        node = self.nodes[parent]
        left = s.budget_tokens - node.tokens
        seed = chunk_seed(self.seed, self.requests)
        sampling = Sampling(min(s.step_tokens, left), s.temperature, 1.0, seed, ("\n",), True) \
            if step else Sampling(left, s.temperature, 1.0, seed, logprobs=True)
        # In the simulator (no prompt ids) the driver takes prompt lengths from the trace.
        ids = None if self.prompt_ids is None else self.prompt_ids + node.ids
        n = 0 if ids is None else len(ids)
        g = RequestSpec("step" if step else "rollout", self.requests, n, sampling,
                        path=parent, position=node.tokens, prefix_tokens=n, prompt_ids=ids)
        self.requests += 1
        self.pending += 1
        return g

    def start(self) -> list[RequestSpec]:
        """The first requests."""
        if self.method == "sc":
            return [self._gen(0, False) for _ in range(self._sc_round())]
        if self.method == "mcts":
            return [self._gen(0, False)]
        return [self._gen(0, True) for _ in range(self.policy.cap)]

    def _sc_round(self) -> int:
        left = self.policy.cap - self.requests
        return max(0, min(self.policy.per_round or left, left))

    def interpret(self, spec: RequestSpec, raw: Outcome, answer_of=None) -> Outcome:
        """A live outcome in the program's terms: answer, path end and reward from the tokens'
        texts and log-probabilities, and the part of the output that becomes the new node."""
        token_ids, logprobs, pieces = list(raw.token_ids), list(raw.logprobs), list(raw.pieces)
        parent = self.nodes[spec.path]
        keep = len(token_ids) - 1 if raw.eos and token_ids else len(token_ids)  # EOS not re-sent
        total = parent.tokens + len(token_ids)
        answer = extract_boxed(parent.text + "".join(pieces))
        ended = raw.eos or answer is not None or total >= self.settings.budget_tokens
        cut = len(token_ids)
        if self.method == "mcts":
            # The rollout's first step (through its first newline) is the new tree node; the
            # rest of the rollout only scores the solution.
            cut = next((i + 1 for i, p in enumerate(pieces) if "\n" in p), len(token_ids))
        step = (tuple(token_ids[:min(cut, keep)]), "".join(pieces[:cut]), sum(logprobs[:cut]),
                cut, ended and cut == len(token_ids))
        return Outcome(len(token_ids), ended=ended, answer=answer,
                       reward=path_reward(parent.logprob_sum + sum(logprobs), total), step=step)

    def on_done(self, gen: RequestSpec, outcome: Outcome) -> list[RequestSpec]:
        """A request finished: record its node and solution, then decide what comes next.

        `outcome.step` is the part of the output that becomes the new node (live); without it
        (the simulator, whose trace keeps whole requests) the node is the whole output and ends
        the path where the output found an answer.
        """
        self.pending -= 1
        self.tokens += outcome.tokens
        parent = self.nodes[gen.path]
        ended, answer, reward = outcome.ended, outcome.answer, outcome.reward
        if outcome.step is None:
            node = _Node(gen.index + 1, gen.path, parent.depth + 1, parent.ids, parent.text,
                         parent.logprob_sum, parent.tokens + outcome.tokens, terminal=ended,
                         reward=reward)
        else:
            ids, text, logprob, tokens, terminal = outcome.step
            node = _Node(gen.index + 1, gen.path, parent.depth + 1, parent.ids + list(ids),
                         parent.text + text, parent.logprob_sum + logprob,
                         parent.tokens + tokens, terminal=terminal, reward=reward)
        self.nodes[node.node_id] = node
        if ended:  # request indices are unique: the tuples never compare past the first
            insort(self.solutions, (gen.index, answer, reward, outcome.tokens))
        if self.method == "mcts":
            self._backup(node, reward)
        self.rows.append({"branch_id": node.node_id, "parent_branch_id": gen.path or None,
                          "depth": node.depth, "round": self._round(gen),
                          "answer": answer if ended else None,
                          "output_tokens": outcome.tokens,
                          "prompt_tokens": gen.prompt_tokens,
                          "reward": reward, "is_leaf": ended,
                          "request_seed": gen.sampling.seed})
        if self.pending:
            return []  # a round (sc) or level (rebase) is still in flight
        return self._checkpoint()

    def _backup(self, node: _Node, reward: float) -> None:
        """A rollout's node joins the selection columns; its reward backs up to the root."""
        if node.node_id != len(self.visits):
            raise RuntimeError(f"mcts program {self.key}: node {node.node_id} finished out of "
                               f"order (expected {len(self.visits)}): one rollout at a time")
        self.visits.append(0)
        self.value_sums.append(0.0)
        self.expandable.append(not node.terminal)
        visits, values, nodes, p = self.visits, self.value_sums, self.nodes, node.node_id
        while p is not None:
            visits[p] += 1
            values[p] += reward
            p = nodes[p].parent

    def _round(self, gen: RequestSpec) -> int:
        if self.method == "rebase":
            return self.nodes[gen.path].depth
        if self.method == "sc" and self.policy.per_round:
            return gen.index // self.policy.per_round
        return gen.index

    def _checkpoint(self) -> list[RequestSpec]:
        n, before = len(self.solutions), self.solved_before
        self.solved_before = n
        if n > before and self.policy.should_stop(self.answers, self.rewards, before,
                                                  self.lengths):
            self.done = True
            return []
        if self.method == "sc":
            gens = [self._gen(0, False) for _ in range(self._sc_round())]
        elif self.method == "mcts":
            gens = [] if self.requests >= self.policy.cap or True not in self.expandable else \
                [self._gen(uct_select(self.visits, self.value_sums, self.expandable,
                                      self.requests, self.settings.exploration), False)]
        else:
            self.level += 1
            frontier = [self.nodes[i] for i in sorted(self.nodes)
                        if self.nodes[i].depth == self.level and not self.nodes[i].terminal]
            counts = rebase_children([nd.reward for nd in frontier], max(self.policy.cap - n, 0),
                                     self.settings.rebase_temperature)
            gens = [self._gen(nd.node_id, True) for nd, k in zip(frontier, counts)
                    for _ in range(k)]
        self.done = not gens
        return gens


def program_seed(seed: int, question_index: int, method: str) -> int:
    """A search program's seed: the same whatever its cap, so smaller caps replay a prefix."""
    return request_seed(seed, question_index, 100 + METHOD_INDEX[method])
