"""What a traced reasoning path's prompts hold, named as an engine's prefix cache names it.

vLLM keys each cached block by all the content up to its end. A CoT/SC path's prompts are its
question's prompt, then its reasoning so far (a chunk adds the tokens it writes), then, for a
probe, the probe suffix. Every path of a question starts with the same prompt; two samples
share their reasoning up to where their texts part (`Trajectory.same_text_as`: a model that
samples near-deterministically writes some samples' first tokens alike); probes after equal
text at the same position are equal prompts. `PathContent` names each request's content as a
prefix chain (`sim.engine.prefix_cache`), so programs that draw the same question find in the
cache what the live engine would serve them from it.
"""

from __future__ import annotations

from bisect import bisect_left


class PathContent:
    """The content names of one traced sample's prompts (one per sample, shared by programs)."""

    __slots__ = ("question", "prompt_tokens", "positions", "named", "own", "_texts", "_probes")

    def __init__(self, question_id: str, prompt_tokens: int, traj):
        self.question = (("question", question_id), prompt_tokens)  # the prompt, as a link
        self.prompt_tokens = prompt_tokens
        self.positions = [p.position_tokens for p in traj.probes]
        same = traj.same_text_as or (traj.sample_id,) * len(self.positions)
        self.named = [("reasoning", question_id, s) for s in same]
        self.own = ("reasoning", question_id, traj.sample_id)
        self._texts: dict[int, tuple] = {}
        self._probes: dict[int, tuple] = {}

    def text_key(self, pos: int) -> tuple:
        """The name of the path's reasoning up to `pos` tokens: that of the first traced
        position at or after it (texts equal up to there are equal up to `pos`), the sample's
        own past its last."""
        i = bisect_left(self.positions, pos)
        return self.named[i] if i < len(self.named) else self.own

    def text(self, end: int) -> tuple:
        """The chain of the question's prompt and the path's reasoning up to `end` tokens."""
        chain = self._texts.get(end)
        if chain is None:
            qp, key, links = self.prompt_tokens, self.text_key(end), [self.question]
            # A sample's text joins the lowest equal sample's, and once it parts from one it
            # never joins it again: the names along the path run in order, each once.
            for pos, named in zip(self.positions, self.named):
                if pos >= end or named == key:
                    break
                if links[-1][0] == named:
                    links[-1] = (named, qp + pos)
                else:
                    links.append((named, qp + pos))
            links.append((key, qp + end))
            chain = self._texts[end] = tuple(links)
        return chain

    def probe(self, pos: int, prompt_tokens: int) -> tuple:
        """The chain of a probe at `pos`: the reasoning up to there, then the probe suffix."""
        chain = self._probes.get(pos)
        if chain is None:
            chain = self._probes[pos] = self.text(pos) + ((
                (self.text_key(pos), pos), prompt_tokens),)
        return chain
