"""`Tables`: a job's tables by name, as the rules read them, whatever their size.

Why: rules are pure functions of tables, and must not care whether a big job keeps its
per-rank tables (kernels, collectives, their waits, steps) in memory or in files, one per
rank (kineto_comm.rank_store). This view reads a Report (or a dict of DataFrames) by name:
whole, a few ranks at a time, as lazy queries run in bounded memory, or in views of a few
ranks; it also serves the derived tables (step times, blame, waits, exposure, roles, ...) by
name from their registry (kineto_comm.analysis.derived), each built once per view. The rule
API (kineto_comm.rules_api) exports it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

import polars as pl

from kineto_comm.analysis import derived
from kineto_comm.analysis.derived import DERIVED
from kineto_comm.lazy import collect, sample
from kineto_comm.rank_store import RankStore, SpillFolder, keep


class Tables(Mapping[str, pl.DataFrame]):
    """Read-only name -> DataFrame view over a Report (or a dict of DataFrames).

    Besides the Report's tables, it serves the derived tables by name (docs/tables.md,
    "Derived tables": step_times, rank_blame, call_waits, cost_fit, ...), each built once
    per Tables from its home in analysis/ (kineto_comm.analysis.derived). A table that is
    absent (or not yet produced by the analysis) reads as an empty DataFrame, so rules
    test `tables.has(name)` or `.height` rather than catching errors. A process group the
    trace does not name reads as "?" in every table (the analysis tables' convention), so
    joins on `process_group` match across tables.

    `kernels`, `collectives`, `collective_waits` and `steps` have a row per kernel, call or
    step of every rank: a big job keeps them in files, one per rank (kineto_comm.rank_store),
    and `tables[name]` assembles them. Rules that must stay within memory whatever the rank
    count read them through `lazy` (aggregations, run by `collect` on the streaming engine)
    or `rank_batches` (a few whole ranks at a time), as the built-in rules do.
    """

    def __init__(self, source: Any) -> None:
        self._source = source
        # The derived tables and what rules share through `once` (the blame reads every
        # rank's kernels): computed once per Tables, i.e. once per rules run.
        self._memo: dict[Any, Any] = {}
        # A view of a few ranks (rank_slices): their range, and the whole tables' memo.
        self._window: tuple[int | None, int | None] | None = None
        self._shared: dict[Any, Any] = {}

    def __getitem__(self, name: str) -> pl.DataFrame:
        src = self._source
        if isinstance(src, Mapping):
            value = src.get(name)
            if isinstance(value, RankStore):
                value = value.frame()
        elif self._window is not None and (store := self._store(name)) is not None:
            value = store.frame()
        else:
            try:
                value = src.table(name)
            except KeyError:
                value = None
        if name in DERIVED and (not isinstance(value, pl.DataFrame) or value.height == 0):
            # A derived table (analysis/derived.py), the model of time's too: it is built
            # after the rules run, so a rule (a SQL rule too) asking for it gets it from the
            # same functions the report uses.
            value = derived.frame(self, name)
        return _normal(value)

    def once(self, key: Hashable, compute: Callable[[], pl.DataFrame]) -> pl.DataFrame:
        """`compute()`, run the first time `key` is asked for in this rules run and remembered
        after: how rules share a table that is costly to build (e.g. one that reads every
        rank's kernels). Keys should name their owner (("mypackage", "what", ...))."""
        if key in self._shared:
            return self._shared[key]
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def rank_slices(self, rows: int | None = None) -> Iterator[Tables]:
        """Views of these tables, each holding only a range of whole ranks' rows of the
        per-rank tables (`kernels`, `collectives`, `collective_waits`, `steps` and the
        `derived` ones), about `rows` calls each (default rank_store.SLICE_ROWS); every rank is in
        exactly one view. A job that fits in one gets these tables themselves.

        How a rule keeps state per (rank, step) within bounds whatever the rank count: it
        folds each view's result into a state per step (as `impact_per_step` does). In a
        view, `once` and `derived` give what the whole tables already hold (computed over
        every rank; a derived table restricted to the view's ranks); anything else is
        computed over the view's ranks only, so a query over every rank is built on the
        whole tables first."""
        from kineto_comm import rank_store

        if self._window is not None:
            yield self
            return
        store = self._store("collectives") or self._store("kernels")
        limit = rank_store.SLICE_ROWS if rows is None else rows
        windows = [(None, None)] if store is None else store.windows(limit)
        if len(windows) == 1:
            yield self
            return
        for window in windows:
            view = Tables(self._source)
            view._window = window
            view._shared = self._memo
            yield view

    def _store(self, name: str) -> RankStore | None:
        """The per-rank store holding table `name`, None for other tables."""
        src = self._source
        if isinstance(src, Mapping):
            store = src.get(name)
        else:
            from kineto_comm.report import STORES

            store = getattr(src, STORES[name], None) if name in STORES else None
        if not isinstance(store, RankStore):
            return None
        return store if self._window is None else store.restricted(*self._window)

    def rank_batches(
        self, name: str, columns: Sequence[str] = (), ranks: Sequence[int] | None = None
    ) -> Iterator[pl.DataFrame]:
        """The table in DataFrames of whole ranks (every row of a rank in the same one),
        with only `columns` (those the table has) when given, only `ranks`' rows when given.

        A big job keeps `kernels`, `collectives`, `collective_waits` and `steps` in files,
        one per rank: reading them a few ranks and columns at a time keeps memory bounded whatever
        the rank count (kineto_comm.rank_store). Other tables come as one DataFrame.
        """
        store = self._store(name)
        if store is not None:
            for batch in store.batches(ranks, columns=list(columns) or None):
                yield _normal(batch)
            return
        table = self[name]
        if ranks is not None and "rank" in table.columns:
            wanted = pl.Series(list(ranks), dtype=table.schema["rank"])
            table = table.filter(pl.col("rank").is_in(wanted.implode()))
        yield table.select(c for c in columns if c in table.columns) if columns else table

    def lazy(self, name: str, columns: Sequence[str] = ()) -> pl.LazyFrame:
        """Table `name` (only `columns`, those it has, when given) as one lazy query over
        every rank's rows: aggregations and joins with small tables over it run in bounded
        memory when given to `collect`, however many ranks a big job keeps in files."""
        store = self._store(name)
        if store is not None and store.height:
            names = store.columns
            query = store.lazy([c for c in columns if c in names] if columns else None)
        elif name in DERIVED and DERIVED[name].lazy:
            query = derived.read(self, name)
            if columns:
                names = query.collect_schema().names()
                query = query.select(c for c in columns if c in names)
        else:
            table = self[name]
            query = (
                table.lazy().select(c for c in columns if c in table.columns)
                if columns
                else table.lazy()
            )
        schema = query.collect_schema()
        if schema.get("process_group") == pl.String:
            query = query.with_columns(pl.col("process_group").fill_null("?"))
        return query

    def collect(self, query: pl.LazyFrame) -> pl.DataFrame:
        """The query's result: on the streaming engine when the job's per-call tables are
        big (a bounded state for aggregations whatever the rank count), else in memory."""
        return collect(query, self._rows())

    def sample(self, query: pl.LazyFrame, key: str = "call_index") -> pl.LazyFrame:
        """The query's rows whose integer `key` is a multiple of k, k chosen so that about a
        million of the job's calls are left: an evenly spread sample of every k-th call for
        statistics that hold every value at once (medians, quantiles). A job below that
        size keeps every row, so its results are exact."""
        return sample(query, self._height("collectives"), key)

    def _rows(self) -> int:
        """Rows of the biggest per-rank table: what a query over them may read."""
        from kineto_comm.report import STORES

        return max(self._height(name) for name in STORES)

    def _height(self, name: str) -> int:
        """Rows of table `name`, without reading a per-rank table's files."""
        store = self._store(name)
        if store is not None:
            return store.height
        if isinstance(self._source, Mapping) and name not in self._source:
            return 0
        return self[name].height

    def derived(
        self,
        key: Hashable,
        source: str,
        build: Callable[[pl.DataFrame], pl.DataFrame],
        columns: Sequence[str] = (),
    ) -> pl.LazyFrame:
        """A table with rows per rank built from `source` a few whole ranks at a time:
        `build(batch)` gets a batch of `source`'s rows (`columns` only, when given) and
        returns the new table's rows for those ranks. Built the first time `key` is asked
        for in this rules run and kept like `source`: in files, one batch each, on a big
        job. Returned as one lazy query (see `lazy`)."""
        if key in self._shared:
            return self._shared[key].restricted(*self._window).lazy()
        if key not in self._memo:
            store = self._store(source)
            folder = SpillFolder() if store is not None and store.spilled else None
            parts = []
            for batch in self.rank_batches(source, columns):
                rows = build(batch)
                if rows.height or not parts:  # an empty first batch keeps the schema
                    parts.append(keep(rows, folder))
            if not parts:  # a source without rows: `build` gives the schema
                empty = self[source]
                if columns:
                    empty = empty.select(c for c in columns if c in empty.columns)
                parts.append(keep(build(empty), None))
            self._memo[key] = RankStore(parts, folder=folder)
        return self._memo[key].lazy()

    def __iter__(self) -> Iterator[str]:
        src = self._source
        if isinstance(src, Mapping):
            return iter(src)
        from kineto_comm.report import TABLE_NAMES

        return iter(TABLE_NAMES)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def has(self, name: str, *columns: str) -> bool:
        """True when the table has rows and all the given columns."""
        store = self._store(name)
        if store is not None:
            return store.height > 0 and all(c in store.columns for c in columns)
        df = self[name]
        return df.height > 0 and all(c in df.columns for c in columns)


def _normal(value: Any) -> pl.DataFrame:
    if not isinstance(value, pl.DataFrame):
        return pl.DataFrame()
    if (
        "process_group" in value.columns
        and value.schema["process_group"] == pl.String
        and value["process_group"].null_count()  # a count Arrow keeps: no query
    ):
        value = value.with_columns(pl.col("process_group").fill_null("?"))
    return value
