"""Running lazy Polars queries on the in-memory engine.

The per-rank tables are small (thousands to a few hundred thousand rows), so most of a query's
cost is fixed: planning and materialising each step. The per-rank stage therefore chains its
steps lazily and collects once (the optimiser fuses selects, filters and projections and
shares common sub-plans). It asks for the in-memory engine by name: Polars' default ("auto")
sends such small queries to the streaming engine, whose fixed cost per query is about four
times higher on these tables (bench/README.md, seventh session).

Queries over every call of every rank are the exception: on a big job the in-memory engine
materialises each step's intermediate columns (a mode, a list of distinct values, a sort)
over millions of rows, while the streaming engine runs an aggregation into few groups, or a
join with a small table, in bounded memory. Such queries say how many rows they read
(`collect(query, rows=...)`) and take the streaming engine from STREAMING_ROWS up
(bench/README.md, fifteenth session).
"""

from __future__ import annotations

import polars as pl

ENGINE = "in-memory"
STREAMING_ROWS = 1_000_000


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
