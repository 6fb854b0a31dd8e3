"""Prompt streams of testbed questions: the HELIOS stream that `trace exits` records and
`helios replay` serves, phases of one task family each."""

from __future__ import annotations

from dataclasses import dataclass

from testbed import tasks


@dataclass(frozen=True)
class ExitsWorkload:
    """The prompt stream: phases of one task family each, levels cycling, held-out items."""

    phases: tuple[str, ...] = ("mod", "count", "mod", "count")
    prompts_per_phase: int = 30
    max_tokens: int = 96
    max_num_seqs: int = 32
    load_repeats: int = 5
    seed: int = 0
    waves: tuple[int, ...] = (24, 1, 32, 4, 16, 2, 8, 3, 12)
    """prompts per arrival wave, cycled within each phase (`trace exits --waves`); each wave
    is prefilled in one step, as a HELIOS round is, and the largest as large as the rounds
    `max_num_seqs` admits: fitted on waves of at most 12, a round's 24-32-prompt prefill was
    priced 5% high at the live runs' own speed (`docs/measurements/2026-12-06-family-replays.md`;
    the shipped traces, recorded before, prefill 1-12)"""

    def __post_init__(self):
        if not self.waves or any(w < 1 for w in self.waves):
            raise ValueError(f"waves {self.waves}: need at least one wave, each >= 1 prompt")

    def prompts(self) -> list[tuple[str, tasks.Item]]:
        """(cell_id, item) in stream order: cell_id = phase index, family and level."""
        return [p for phase in self.phase_prompts() for p in phase]

    def phase_prompts(self) -> list[list[tuple[str, tasks.Item]]]:
        """The stream cut into its phases."""
        return [[(f"p{k}-{family}-l{item.level}", item)
                 for item in tasks.items(self.seed * 1000 + k, self.prompts_per_phase,
                                         families=(family,))]
                for k, family in enumerate(self.phases)]
