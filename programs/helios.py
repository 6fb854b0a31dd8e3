"""A HELIOS-family policy over a prompt stream, in rounds: engine-free, driven by sim and live.

Prompts are served in rounds: consecutive prompts the policy gives the same model and loaded
depth, at most the batch that depth allows, all admitted together and run to completion. After a
round its tokens are fed to the policy in prompt order, then the next round is planned. So the
policy's decisions depend only on what the tokens were, never on timing, and a simulator and a
live engine fed the same tokens make the same decisions at the same prompt index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from policies.exit_tokens import TokenBlock
from policies.helios import Serve


class StreamPolicy(Protocol):
    """What the program needs of a policy (`policies.helios`: Helios, Static, EarlyExitFull)."""

    events: list

    def next_prompt(self) -> Serve: ...

    def same_after(self) -> int: ...

    def planned_next(self) -> Serve | None: ...

    def observe_tokens(self, serve: Serve, tokens) -> None: ...

    def observe_block(self, serve: Serve, block: TokenBlock) -> None: ...


@dataclass(frozen=True)
class Round:
    """Prompts (stream indices) served together at one model and loaded depth."""

    serve: Serve
    prompts: tuple[int, ...]


class HeliosProgram:
    """Plans rounds from a policy and feeds the policy each finished round's tokens.

    `prompts` is the stream's length (the program serves it all) or the stream indices it serves,
    in order (a replica's share of the stream); rounds name stream indices either way."""

    def __init__(self, policy: StreamPolicy, prompts: int | Sequence[int],
                 max_batch: Callable[[Serve], int]):
        self.policy = policy
        self.stream = list(range(prompts)) if isinstance(prompts, int) else list(prompts)
        self.num_prompts = len(self.stream)
        self.max_batch = max_batch
        self._next = 0
        self.rounds: list[Round] = []

    def next_round(self) -> Round | None:
        """The next round, or None when the stream is served."""
        if self._next >= self.num_prompts:
            return None
        first = self.policy.next_prompt()
        n = min(max(1, self.max_batch(first)), 1 + self.policy.same_after(),
                self.num_prompts - self._next)
        for _ in range(n - 1):
            s = self.policy.next_prompt()
            if (s.model, s.depth, s.exit_threshold, s.evaluating) != \
                    (first.model, first.depth, first.exit_threshold, first.evaluating):
                raise RuntimeError(f"policy changed its decision within same_after(): {s}")
        r = Round(first, tuple(self.stream[self._next:self._next + n]))
        self._next += n
        self.rounds.append(r)
        return r

    def lookahead(self) -> Serve | None:
        """The decision the next round starts with unless the last round's tokens change it;
        None at the stream's end or where tokens decide it."""
        if self._next >= self.num_prompts:
            return None
        return self.policy.planned_next()

    def stream_events(self) -> list[tuple[int, Serve]]:
        """The policy's events, each at the stream index of the prompt it applies to."""
        return [(self.stream[i], s) for i, s in self.policy.events]

    def finish_round(self, tokens: list[list[list[float]]]) -> None:
        """Per prompt of the last round, per token, the max probability at each loaded exit."""
        r = self.rounds[-1]
        if len(tokens) != len(r.prompts):
            raise ValueError(f"round of {len(r.prompts)} prompts got tokens for {len(tokens)}")
        for prompt in tokens:
            self.policy.observe_tokens(r.serve, prompt)

    def finish_block(self, block: TokenBlock) -> None:
        """The last round's tokens as one block, its prompts' in turn (`finish_round`'s
        observations: a policy's are the same token by token)."""
        self.policy.observe_block(self.rounds[-1].serve, block)
