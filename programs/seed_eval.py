"""A state's evaluation written in speculative rounds (SEED's State Evaluator), engine-free.

The value prompt (the testbed's probe suffix after the state) writes the state's answer, up to
`eval_tokens` tokens, ending at the close of its box; the state's value is the target's
probability of the answer's first token. With `speculative_eval` the answer is written as
thoughts are: the draft writes up to K tokens (`eval-draft`), the target verifies them
(`eval-verify`: a prefill of the drafted tokens over the cached state and value prompt, with
their log-probabilities, one token generated) and greedy acceptance keeps the target's own
tokens, so answer and value are the target's own evaluation's. The mode schedules an
evaluation's rounds as it schedules a thought's: serially, or every evaluation drafting at
once with verifications through the target's queue. Evaluations are greedy whatever the
thoughts' temperature (a value is a probability, not a sample).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from policies.certaindex import probe_answer
from policies.seed import verify
from programs.base import Outcome, RequestSpec, Sampling
from programs.seed_branch import content_link, tot_seed

PROBE_TEXT = "\x00value prompt"
"""the value prompt's content key (its text is the testbed's probe suffix)"""

EVAL_KINDS = ("eval", "eval-draft", "eval-verify")
"""the evaluator's request kinds (the rest write thoughts)"""


@dataclass(eq=False)
class Evaluation:
    """The answer a state's value prompt has written so far, in speculative rounds."""

    tokens: int = 0
    ids: list = field(default_factory=list)
    text: str = ""
    links: tuple = ()
    """content links after the state: the value prompt's, then one per round"""
    rounds: int = 0
    drafted: Outcome | None = None
    value: float = -math.inf
    """the target's probability of the answer's first token (its first round's)"""


def answer_of(text: str, eval_tokens: int) -> str | None:
    """A value prompt's answer: one token stripped, else the text before the box closes."""
    return (text.strip() if eval_tokens == 1 else probe_answer(text)) or None


class SpeculativeEvaluation:
    """`ToTProgram`'s evaluations (its settings, seed, queue and request helpers); `t` is the
    `programs.seed.Thought` whose new state (`t.child`) is evaluated."""

    def _evaluate_state(self, t) -> list:
        """The new state's evaluation: the target's one request, or speculative rounds."""
        if not self.settings.speculative_eval:
            return self._to_target(self._evaluate(t))
        c = t.child
        last = c.links[-1][0] if c.links else self._question_key
        t.eval = Evaluation(links=(content_link(last, PROBE_TEXT,
                                                c.tokens + self.probe_prompt_tokens),))
        return [self._eval_draft(t)]

    def _evaluate(self, t) -> RequestSpec:
        s = self.settings
        sampling = Sampling(max_tokens=1, logprobs=True) if s.eval_tokens == 1 else \
            Sampling(max_tokens=s.eval_tokens, logprobs=True, stop=("}",))
        return self._spec(t, "eval", "target", list(self.probe_ids or ()), self.probe_prompt_tokens,
                          sampling, state=t.child, extra_text=PROBE_TEXT)

    def _eval_draft(self, t) -> RequestSpec:
        e, s = t.eval, self.settings
        return self._spec(t, "eval-draft", "draft", list(self.probe_ids or ()) + e.ids,
                          self.probe_prompt_tokens + e.tokens, Sampling(
                              max_tokens=min(s.draft_tokens, s.eval_tokens - e.tokens),
                              seed=tot_seed(self.seed, t.key, e.rounds, "eval-draft"),
                              stop=("}",)), state=t.child, extra_links=e.links)

    def _eval_verify(self, t) -> RequestSpec:
        e, d = t.eval, t.eval.drafted
        end = t.child.tokens + self.probe_prompt_tokens + e.tokens + d.tokens
        return self._spec(t, "eval-verify", "target",
                          list(self.probe_ids or ()) + e.ids + list(d.token_ids),
                          self.probe_prompt_tokens + e.tokens + d.tokens, Sampling(
                              max_tokens=1, prompt_logprobs=d.tokens, top_logprobs=1,
                              seed=tot_seed(self.seed, t.key, e.rounds, "eval-target")),
                          state=t.child,
                          extra_links=e.links + (content_link(e.links[-1][0], d.text, end),))

    def _on_eval(self, t, spec: RequestSpec, o: Outcome) -> list:
        """An evaluator's request came back: draft -> verify -> next round or the value."""
        if spec.kind == "eval-draft":
            t.eval.drafted = o
            return self._to_target(self._eval_verify(t))
        self._queue.done()
        out = self._ready()
        self.probe_tokens_used += o.tokens
        self.tokens += o.tokens
        if spec.kind == "eval":
            return out + self._evaluated(t, float(o.score), o.answer)
        e = t.eval
        if not e.rounds:
            e.value = float(o.score)
        e.tokens += o.tokens
        e.ids += list(o.token_ids)
        e.text += o.text
        e.links += (content_link(e.links[-1][0], o.text,
                                 t.child.tokens + self.probe_prompt_tokens + e.tokens),)
        e.rounds += 1
        if not o.ended and e.tokens < self.settings.eval_tokens:
            return out + [self._eval_draft(t)]
        return out + self._evaluated(t, e.value, answer_of(e.text, self.settings.eval_tokens))

    def _evaluated(self, t, value: float, answer: str | None) -> list:
        t.child.value, t.child.answer = value, answer
        self.evaluated += 1
        self._active -= 1
        self._left -= 1
        return self._pump() if self._left else self._next_level()

    def _interpret_eval(self, t, spec: RequestSpec, raw: Outcome) -> Outcome:
        """A live evaluator request's outcome: value and answer, a draft, or a verdict."""
        if spec.kind == "eval":
            # 4 decimals: batching changes the last bits, and equal states must tie exactly
            return Outcome(raw.tokens, score=round(math.exp(raw.logprobs[0]), 4),
                           answer=answer_of(raw.text, self.settings.eval_tokens))
        if spec.kind == "eval-draft":
            return Outcome(raw.tokens, token_ids=raw.token_ids, text=raw.text, eos=raw.eos)
        drafted = list(t.eval.drafted.token_ids)
        rows = list(raw.top_logprobs)
        if len(rows) != len(drafted) + 1:
            raise RuntimeError(f"eval-verify request {spec.index}: {len(rows)} rows for "
                               f"{len(drafted)} drafted tokens")
        v = verify(drafted, [], rows, 0.0, [])
        return self._cut(drafted[:v.accepted] + [v.token],
                         self.settings.eval_tokens - t.eval.tokens, self.close_id,
                         (v.accepted, len(drafted), v.positions),
                         score=round(math.exp(max(rows[0].values())), 4))
