"""A thought's multi-candidate round (MCSD; SEED's tree drafts), engine-free.

With `k_config`, a round's draft is a tree: at a branching position the draft writes one token
and returns its distribution, the round takes k candidates (`policies.seed.candidates`), and
each candidate becomes a path of its own, branching again or continued by the draft to the
round's length. vLLM has no tree attention, so the target verifies every path as its own
scoring request (a prefill of the path over the cached context, sent together: one item of the
verify queue), and `policies.seed.verify_tree` keeps the longest accepted path.

Requests are named by the path they extend: `draft` (the round's first), `draft@1.0` (the path
of candidate 1, then candidate 0), `verify` (the path of candidates 0: it carries the round's
decision in a trace) and `verify@1.0`. A path's content key is its candidate indices, so the
simulator's prefix cache shares a path's blocks between its draft and its verification, and
never between siblings (whose tokens differ, unless a sampled candidate repeats one).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field

from policies.seed import Leaf, candidates, verify_tree
from programs.base import Outcome, RequestSpec, Sampling


def tot_seed(program_seed: int, key: str, rnd: int, what: str) -> int:
    """A seed for one thought's round (`what`: draft, target, accept)."""
    return zlib.crc32(f"{program_seed}:{key}:{rnd}:{what}".encode()) & 0x7FFFFFFF


def content_link(previous: int, text: str, end_tokens: int) -> tuple[int, int]:
    """The link after `text`: a key for all content so far (the previous link's key and this
    text) and where it ends. Equal texts written in equal pieces get equal keys, as equal token
    blocks get equal hashes in vLLM's prefix cache."""
    return hash((previous, text)), end_tokens


def path_name(choice: tuple[int, ...]) -> str:
    """The '.'-joined candidate indices of a path."""
    return ".".join(map(str, choice))


def draft_kind(choice: tuple[int, ...]) -> str:
    """The kind of the draft request that extends a path."""
    return f"draft@{path_name(choice)}" if choice else "draft"


def verify_kind(choice: tuple[int, ...]) -> str:
    """The kind of a path's verification (the all-zero path's is the round's `verify`)."""
    return "verify" if not any(choice) else f"verify@{path_name(choice)}"


@dataclass(eq=False)
class DraftPath:
    """One path of the round's draft tree."""

    choice: tuple[int, ...]
    n: int = 0
    """tokens drafted on the path"""
    ids: list = field(default_factory=list)
    """their ids (live)"""
    rows: list = field(default_factory=list)
    """the draft's distribution at each of them (live)"""
    links: tuple = ()
    """content links of the path after the thought so far (`content_link`)"""
    verdict: object = None
    """its verification's outcome"""
    spec: object = None
    """its verification request"""


@dataclass(eq=False)
class BranchRound:
    """The draft tree of one round, then its paths' verifications."""

    widths: tuple[int, ...]
    """candidates at each branching position"""
    room: int
    """tokens the round may draft on a path"""
    paths: dict = field(default_factory=dict)
    """choice -> DraftPath"""
    leaves: list = field(default_factory=list)
    """paths drafted to their end, in the order they ended"""
    of: dict = field(default_factory=dict)
    """request spec -> the choice of the path it extends or verifies"""
    drafting: int = 0
    verifying: int = 0

    def branches(self, choice: tuple[int, ...]) -> bool:
        """The draft request extending this path writes one token to branch on."""
        return len(choice) < len(self.widths)

    def child_kinds(self, choice: tuple[int, ...]) -> list[str]:
        """Kinds of the requests that would extend each candidate of a branching request."""
        return [draft_kind(choice + (j,)) for j in range(self.widths[len(choice)])]

    def to_leaves(self, temperature_rows: bool) -> list[Leaf]:
        """The verified paths as `policies.seed.Leaf`s, in choice order."""
        out = []
        for p in sorted(self.leaves, key=lambda p: p.choice):
            rows = tuple(p.verdict.top_logprobs)
            out.append(Leaf(p.choice, tuple(p.ids), tuple(p.rows) if temperature_rows else (),
                            rows))
        return out

    def slots(self) -> int:
        """Uniform slots per position `verify_tree` needs: a test per candidate, one draw."""
        return max(self.widths) + 1


class MultiCandidateRounds:
    """`ToTProgram`'s multi-candidate rounds (its settings, seed, queue and request helpers);
    `t` is always the round's `programs.seed.Thought`."""

    def _path_draft(self, t, choice: tuple) -> RequestSpec:
        b, s = t.branch, self.settings
        p, branches = b.paths[choice], b.branches(choice)
        spec = self._spec(t, draft_kind(choice), "draft", p.ids, p.n, Sampling(
            max_tokens=1 if branches else b.room - p.n, temperature=s.temperature,
            seed=tot_seed(self.seed, t.key, t.rounds, draft_kind(choice)), stop=("\n",),
            top_logprobs=self.vocab if s.temperature > 0 else
            (b.widths[len(choice)] if branches else 0)), extra_links=p.links)
        b.of[spec] = choice
        return spec

    def _verify_paths(self, t) -> list:
        b, s = t.branch, self.settings
        specs = []
        for p in sorted(b.leaves, key=lambda p: p.choice):
            spec = self._spec(t, verify_kind(p.choice), "target", p.ids, p.n, Sampling(
                max_tokens=1, temperature=s.temperature, prompt_logprobs=p.n,
                seed=tot_seed(self.seed, t.key, t.rounds, "target"),
                top_logprobs=self.vocab if s.temperature > 0 else 1), extra_links=p.links)
            b.of[spec] = p.choice
            specs.append(spec)
        b.verifying = len(specs)
        return self._to_target(tuple(specs))

    def _on_branch(self, t, spec: RequestSpec, o: Outcome) -> list:
        """A request of a multi-candidate round: grow the draft tree, verify its paths once
        drafted, decide once every path is verified."""
        b = t.branch
        choice = b.of[spec]
        p = b.paths[choice]
        start = t.parent.tokens + t.tokens  # where the round's paths begin
        if spec.kind.startswith("draft"):
            self._log(spec, t, o)
            self.drafted_tokens += o.tokens
            b.drafting -= 1
            out = []
            prev = p.links[-1][0] if p.links else self._thought_key(t)
            if not b.branches(choice):  # a path continued to the round's length
                p.n += o.tokens
                p.ids += list(o.token_ids)
                p.rows += list(o.top_logprobs)
                p.links += (content_link(prev, o.text, start + p.n),)
                b.leaves.append(p)
            else:
                for j, more in enumerate(o.step):  # per candidate: drafted further
                    c = DraftPath(choice + (j,), p.n + 1, p.ids + list(o.token_ids[j:j + 1]),
                                  p.rows + list(o.top_logprobs[:1]),
                                  p.links + (content_link(prev, f"\x00cand{j}", start + p.n + 1),))
                    b.paths[c.choice] = c
                    if more:
                        b.drafting += 1
                        out.append(self._path_draft(t, c.choice))
                    else:
                        b.leaves.append(c)
            return out if b.drafting else out + self._verify_paths(t)
        p.verdict, p.spec = o, spec
        b.verifying -= 1
        if b.verifying:
            return []
        self._queue.done()
        out = self._ready()
        main = next(q for q in b.leaves if not any(q.choice))
        decision = main.verdict if main.verdict.step is not None else self._decide(t)
        for q in sorted(b.leaves, key=lambda q: q.choice):
            self._log(q.spec, t, decision if q is main else q.verdict)
        t.branch = None
        return out + self._extend(t, "verify", decision)

    def _thought_key(self, t) -> int:
        return t.links[-1][0] if t.links else self._question_key

    def branch_children(self, spec: RequestSpec) -> list[str] | None:
        """For a draft request a multi-candidate round branches on: the kinds of the requests
        that would draft each candidate further (which were sent is the outcome); else None."""
        b = self._flight[spec].branch
        if b is None or spec not in b.of or not spec.kind.startswith("draft") or \
                not b.branches(b.of[spec]):
            return None
        return b.child_kinds(b.of[spec])

    def _interpret_branch(self, t, spec: RequestSpec, raw: Outcome) -> Outcome:
        b = t.branch
        choice = b.of[spec]
        if spec.kind.startswith("verify"):
            n = b.paths[choice].n
            if len(raw.top_logprobs) != n + 1:
                raise RuntimeError(f"verify request {spec.index}: {len(raw.top_logprobs)} rows "
                                   f"for {n} drafted tokens")
            return Outcome(raw.tokens, top_logprobs=raw.top_logprobs)
        if not b.branches(choice):
            return Outcome(raw.tokens, token_ids=raw.token_ids, text=raw.text, eos=raw.eos,
                           top_logprobs=raw.top_logprobs)
        k = b.widths[len(choice)]
        rng = random.Random(tot_seed(self.seed, t.key, t.rounds, "cand" + path_name(choice)))
        row = raw.top_logprobs[0]
        cands = candidates(row, raw.token_ids[0], k, self.settings.temperature,
                           [rng.random() for _ in range(k - 1)])
        more = len(choice) + 1 < b.room
        return Outcome(1, token_ids=tuple(cands), top_logprobs=(row,), step=tuple(
            more and c not in (self.newline_id, self.eos_id) for c in cands))

    def _decide(self, t) -> Outcome:
        """A multi-candidate round's decision from its paths' rows (live)."""
        b = t.branch
        leaves = b.to_leaves(self.settings.temperature > 0)
        rng = random.Random(tot_seed(self.seed, t.key, t.rounds, "accept"))
        slots = b.slots()
        v = verify_tree(leaves, self.settings.temperature,
                        [rng.random() for _ in range(slots * b.room + 1)], slots)
        leaf = leaves[v.leaf]
        return self._kept(t, list(leaf.tokens[:v.accepted]) + [v.token],
                          (v.accepted, len(leaf.tokens), v.positions))

