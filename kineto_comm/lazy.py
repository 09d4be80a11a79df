"""Running lazy Polars queries on the in-memory engine.

The per-rank tables are small (thousands to a few hundred thousand rows), so most of a query's
cost is fixed: planning and materialising each step. The per-rank stage therefore chains its
steps lazily and collects once (the optimiser fuses selects, filters and projections and
shares common sub-plans). It asks for the in-memory engine by name: Polars' default ("auto")
sends such small queries to the streaming engine, whose fixed cost per query is about four
times higher on these tables (bench/README.md, seventh session).
"""

from __future__ import annotations

import polars as pl

ENGINE = "in-memory"


def collect(query: pl.LazyFrame) -> pl.DataFrame:
    """The query's result."""
    return query.collect(engine=ENGINE)


def collect_all(queries: list[pl.LazyFrame]) -> list[pl.DataFrame]:
    """The queries' results, planned together (sub-plans they share run once)."""
    return pl.collect_all(queries, engine=ENGINE)
