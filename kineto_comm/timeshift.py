"""Times moved onto the reference clock: each row's rank offset (the offsets table's
`offset_ns`, fitted by kineto_comm.analysis.align) subtracted from its time columns.

Its own module so that storage (kineto_comm.rank_store, which applies offsets as rows are
read) depends on no analysis.
"""

from __future__ import annotations

import polars as pl


def shift(table: pl.DataFrame, offsets: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    """Subtract each row's rank offset from the given time columns."""
    if table.height == 0 or "rank" not in table.columns:
        return table
    moved = shifted(offsets, [c for c in columns if c in table.columns])
    # Nothing to move: no copy of a table that may hold every kernel.
    return table.with_columns(moved) if moved else table


def shifted(offsets: pl.DataFrame, columns: list[str]) -> list[pl.Expr]:
    """Expressions for `columns` less each row's rank offset (none when no offset moves)."""
    # Read as Python lists: a row per rank, and every read of a store asks (a query here
    # cost as much as some of the reads).
    ranks, values = offsets.get_column("rank").to_list(), offsets["offset_ns"].to_list()
    moved = [(rank, value) for rank, value in zip(ranks, values, strict=True) if value]
    if not moved or not columns:
        return []
    by_rank = pl.col("rank").replace_strict(
        pl.Series([r for r, _ in moved], dtype=pl.Int64),
        pl.Series([v for _, v in moved], dtype=pl.Int64),
        default=0,
        return_dtype=pl.Int64,
    )
    return [pl.col(c) - by_rank for c in columns]
