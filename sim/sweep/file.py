"""A sweep file's keys as a strict model: wrong types and impossible values are one-line errors
naming the key, before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator

from inputs.limits import MAX_SEEDS, SEED_MAX
from inputs.repeats import repeated
from inputs.strict import Strict, one_line


class SweepFile(Strict):
    """`base`, `seeds` or `noise_seeds` (a count or a list), `grid`, `cases`."""

    base: Annotated[str, Field(min_length=1)]
    seeds: Any = None
    """a count (seeds 0..N-1) or a list of distinct seeds"""
    noise_seeds: Any = None
    grid: dict[Annotated[str, Field(min_length=1)],
               Annotated[list[Any], Field(min_length=1)]] = {}
    cases: list[dict[str, Any]] = []

    @field_validator("seeds", "noise_seeds")
    @classmethod
    def _seeds(cls, v: Any) -> Any:
        def whole(x) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        if v is None or (whole(v) and 1 <= v <= MAX_SEEDS):
            return v
        if isinstance(v, list) and 0 < len(v) <= MAX_SEEDS and \
                all(whole(x) and 0 <= x <= SEED_MAX for x in v):
            if repeated(v):
                raise ValueError(f"seeds repeat ({v})")
            return v
        raise ValueError(f"a count from 1 to {MAX_SEEDS} or a list of distinct seeds from 0 to "
                         f"2^63-1 (got {v!r})")

    @model_validator(mode="after")
    def _one_kind_of_seed(self) -> "SweepFile":
        if self.seeds is not None and self.noise_seeds is not None:
            raise ValueError("give seeds or noise_seeds, not both")
        for key, values in self.grid.items():
            if repeated(values):
                raise ValueError(f"grid.{key}: a value repeats")
        return self

    def seed_list(self) -> list[int] | None:
        """The seeds the file asks for (None: it names none)."""
        given = self.seeds if self.noise_seeds is None else self.noise_seeds
        if given is None:
            return None
        return list(range(given)) if isinstance(given, int) else list(given)


def parse_sweep_file(d: dict, path: Path) -> SweepFile:
    """The sweep file's mapping, validated; one-line errors naming the file and key."""
    try:
        return SweepFile.model_validate(d)
    except ValidationError as e:
        raise ValueError(f"{path}: {one_line(e, 'sweep file')}") from None
