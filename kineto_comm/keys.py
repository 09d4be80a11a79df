"""One integer for a pair of integer columns, where their values allow it.

A join, group-by, duplicate test or sort on one Int64 column costs less time and memory than
on two (two keys are row-encoded or hashed together: bench/README.md, eleventh and twelfth
sessions). The integer is (outer - its lowest) * span + (inner - its lowest), span being the
width of the inner column's range: it orders rows as (outer, inner) does, and two rows share
it only when they share the pair. Where the ranges are too wide for that to fit in 62 bits,
callers keep the two columns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import polars as pl

_LIMIT = 1 << 62


def pair_key(frames: Sequence[pl.DataFrame], outer: str, inner: str) -> pl.Expr | None:
    """The (outer, inner) pair as one Int64 expression meaning the same in every frame of
    `frames` (so that it can join them), or None where the values do not fit. A row with a
    null in either column gets a null."""
    bounds = [
        f.select(
            pl.col(outer).min().alias("a"),
            pl.col(outer).max().alias("b"),
            pl.col(inner).min().alias("c"),
            pl.col(inner).max().alias("d"),
        ).row(0)
        for f in frames
    ]

    def bound(k: int, pick: Callable[[list[int]], int]) -> int:
        found = [int(b[k]) for b in bounds if b[k] is not None]
        return pick(found) if found else 0

    low_outer, high_outer = bound(0, min), bound(1, max)
    low_inner, high_inner = bound(2, min), bound(3, max)
    span = high_inner - low_inner + 1
    if (high_outer - low_outer + 1) * span >= _LIMIT:
        return None
    return (pl.col(outer) - low_outer) * span + (pl.col(inner) - low_inner)
