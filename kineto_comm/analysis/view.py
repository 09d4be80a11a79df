"""What the derived tables read: a job's tables by name, as `Tables` (rules_api) gives them.

Why: the analyses that the rules read after the report is built (the model of time, waits,
exposure, roles, volumes, the cost fit) need more than frames: a big job keeps its per-rank
tables in files, read a few ranks at a time or as one lazy query, and each derived table is
built once per rules run. This protocol names that face, so the analyses can take a `Tables`
without importing the rule API (layers point down: docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Protocol

import polars as pl


class TableView(Protocol):
    """A job's tables by name (kineto_comm.tables.Tables is the one implementation)."""

    def __getitem__(self, name: str) -> pl.DataFrame: ...

    def has(self, name: str, *columns: str) -> bool: ...

    def lazy(self, name: str, columns: Sequence[str] = ()) -> pl.LazyFrame: ...

    def collect(self, query: pl.LazyFrame) -> pl.DataFrame: ...

    def once(self, key: Hashable, compute: Callable[[], Any]) -> Any: ...

    def rank_batches(
        self, name: str, columns: Sequence[str] = (), ranks: Sequence[int] | None = None
    ) -> Iterator[pl.DataFrame]: ...

    def rank_slices(self, rows: int | None = None) -> Iterator[TableView]: ...

    def derived(
        self,
        key: Hashable,
        source: str,
        build: Callable[[pl.DataFrame], pl.DataFrame],
        columns: Sequence[str] = (),
    ) -> pl.LazyFrame: ...


def memo(tables: TableView, name: str, compute: Callable[[], Any], *key: Hashable) -> Any:
    """`compute()` once per rules run under the derived table's `name` (and `key`, for one
    built with a parameter): the key every reader of that table shares."""
    return tables.once(("derived", name, *key), compute)
