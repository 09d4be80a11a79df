"""Running Polars work at a low fixed cost: lazy queries on the in-memory engine, and
several files' tables stacked into one and split back without a query per file.

Why: the per-rank tables are small, so most of a query's cost is fixed (planning,
materialising each step): the per-rank stage chains its steps lazily and collects once, on
the in-memory engine by name (Polars' "auto" sends small queries to the streaming engine,
about four times dearer on these tables). Queries over every call of every rank are the
exception: they say how many rows they read (`collect(query, rows=...)`) and take the
streaming engine from STREAMING_ROWS up, which runs them in bounded memory. The measurements
and the three habits that keep the streaming engine's state bounded: docs/scale.md.
"""

from __future__ import annotations

import polars as pl

# In full: docs/scale.md, "Polars work at a low fixed cost".

ENGINE = "in-memory"
STREAMING_ROWS = 1_000_000
# Statistics that need every value at once (medians, quantiles of times) use an evenly
# spread sample of at most about this many rows on bigger jobs (docs/scale.md).
SAMPLE_ROWS = 1_000_000


def sample(query: pl.LazyFrame, rows: int, key: str) -> pl.LazyFrame:
    """The query's rows whose integer `key` is a multiple of k, k the smallest that leaves
    about SAMPLE_ROWS of `rows` rows: every k-th call when `key` numbers calls (an evenly
    spread sample); all rows up to SAMPLE_ROWS."""
    every = -(-rows // SAMPLE_ROWS)
    return query if every <= 1 else query.filter(pl.col(key) % every == 0)


def collect(query: pl.LazyFrame, rows: int = 0) -> pl.DataFrame:
    """The query's result (`rows`: how many rows it reads, when that may be millions)."""
    return query.collect(engine="streaming" if rows >= STREAMING_ROWS else ENGINE)


def collect_all(queries: list[pl.LazyFrame], rows: int = 0) -> list[pl.DataFrame]:
    """The queries' results, planned together (sub-plans they share run once); from
    STREAMING_ROWS up, one after the other on the streaming engine (a shared sub-plan would
    be held in memory whole)."""
    if rows >= STREAMING_ROWS:
        return [collect(query, rows) for query in queries]
    return pl.collect_all(queries, engine=ENGINE)


def stack(frames: list[pl.DataFrame], key: str) -> pl.LazyFrame:
    """The frames one above the other, each row with `key` (Int64) holding its frame's
    position in `frames`: one query for all of them (the inverse of `split`)."""
    return pl.concat(
        [f.lazy().with_columns(pl.lit(i, dtype=pl.Int64).alias(key)) for i, f in enumerate(frames)],
        how="vertical",
        rechunk=False,
    )


def split(frame: pl.DataFrame, key: str, n: int, keep_key: bool = True) -> list[pl.DataFrame]:
    """The rows of `frame` for each value 0 .. n-1 of its integer column `key`, each in the
    table's order (an empty frame for a value without rows); `keep_key=False` leaves the
    column out.

    One pass and no query per part: `partition_by(as_dict=True)` runs a query per part to
    read its key, and an eager `drop` is a query too; on a batch of small rank files those
    fixed costs added up to a tenth of the per-rank time (bench/README.md, sixteenth
    session)."""
    keys = None if n == 1 else frame.get_column(key)
    if keys is None:
        out = [frame]
    elif keys.null_count() == 0 and keys.is_sorted():
        # Each value's rows are one run (a batch's tables are stacked file by file): views
        # of the frame, not copies.
        bounds = keys.search_sorted(pl.Series(range(n + 1), dtype=keys.dtype)).to_list()
        out = [frame.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]
    else:
        out = [frame.clear()] * n
        for part in frame.partition_by(key, maintain_order=True):
            out[part.get_column(key)[0]] = part
    if keep_key:
        return out
    return [_without(part, key) for part in out]


def in_rank_order(rows: pl.DataFrame) -> pl.DataFrame:
    """`rows` sorted by rank, then start_ns: as they are when every rank's rows are stored in
    start order (kernels, calls), checked in one pass and sorted only when they are not."""
    rank, start = pl.col("rank"), pl.col("start_ns")
    later = (rank > rank.shift(1)) | ((rank == rank.shift(1)) & (start >= start.shift(1)))
    if rows.select(later.slice(1).all(ignore_nulls=False).fill_null(False)).item():
        return rows
    return rows.sort("rank", "start_ns")


def _without(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """The frame less one column, without a query (the columns are shared, not copied)."""
    out = frame.clone()
    out.drop_in_place(column)
    return out
