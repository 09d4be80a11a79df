"""The public rule API: what a rule is, the tables it reads, and helpers it may use.

A rule is a pure function from the analysis tables (docs/tables.md) to findings, plus the
metadata users see in `kineto-comm rules` / `kineto-comm explain CODE`:

    from kineto_comm.rules_api import Finding, Option, Severity, Tables, rule

    @rule(
        code="XMPL101",
        name="too-many-all-reduces",
        summary="More than `limit` all-reduces per step.",
        tables=("collectives", "steps"),
        options=(Option("limit", 100, "All-reduces per rank and step that are fine."),),
    )
    def too_many_all_reduces(tables: Tables, options: dict) -> list[Finding]:
        '''What it does: ...  Why is this bad? ...  How to fix: ...'''
        ...

Everything here is stable: built-in rules (top-level `rules/`) use nothing else from
kineto_comm. Helpers are column-wise Polars; times are integer ns.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from kineto_comm.analysis import attribution as attribution_
from kineto_comm.analysis import costfit, steptime
from kineto_comm.analysis.bandwidth import busbw_factor, group_size
from kineto_comm.analysis.match import last_arrivals, ranks_in_several_groups
from kineto_comm.analysis.sizes import UNKNOWN_GROUP
from kineto_comm.analysis.steptime import LAUNCH_LATENCY_NS, Edit
from kineto_comm.findings import Finding, Severity
from kineto_comm.lazy import collect, in_rank_order, sample
from kineto_comm.model.collectives import parse_ranks
from kineto_comm.rank_store import RankStore, SpillFolder, keep

__all__ = [
    "LAUNCH_LATENCY_NS",
    "Edit",
    "Finding",
    "Option",
    "Platform",
    "Rule",
    "RuleFunction",
    "Severity",
    "Tables",
    "all_to_all_volume",
    "attribution",
    "busbw_factor",
    "collective_exposure",
    "collective_exposure_lazy",
    "collective_waits",
    "collective_waits_lazy",
    "cost_fit",
    "group_roles",
    "call_roles",
    "group_size",
    "hosts_of",
    "impact_per_step",
    "in_rank_order",
    "job_platform",
    "launch_floor",
    "make_finding",
    "mean_step_ns",
    "median_of_counts",
    "merge_removal",
    "n_steps",
    "parse_ranks",
    "queue_shift",
    "rank_lateness",
    "replay_saving",
    "replay_timeline",
    "rule",
    "saving_severity",
    "severity_for",
    "step_blame",
    "step_time_ns",
    "step_times",
]

# The Report tables of the model of time (computed after the rules; read through it here).
MODEL_TABLES = ("step_times", "step_blame", "attribution")
CODE_RE = re.compile(r"^[A-Z]+[0-9]+$")
NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
DOC_SECTIONS = ("What it does", "Why is this bad?", "How to fix")
SOURCES = ("built-in", "plugin", "file")


@dataclass(frozen=True)
class Option:
    """One rule option: its name, default value (which fixes its type) and what it means."""

    name: str
    default: Any
    description: str

    def coerce(self, value: Any) -> Any:
        """`value` converted to the default's type; ValueError when it cannot be."""
        kind = type(self.default)
        if self.default is None or isinstance(value, kind):
            return value
        if kind is bool:
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
                return value.lower() in ("true", "1")
            raise ValueError(f"expected true or false, got {value!r}")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if kind in (int, float) and isinstance(value, str):
            return kind(value)
        if kind in (list, tuple) and isinstance(value, (list, tuple)):
            return kind(value)
        raise ValueError(f"expected {kind.__name__}, got {value!r}")


RuleFunction = Callable[["Tables", dict[str, Any]], "list[Finding]"]


@dataclass(frozen=True)
class Rule:
    """A rule: metadata plus `check(tables, options) -> list[Finding]`.

    code: letters then digits (`COMM101`); the letters are the family.
    name: kebab-case (`exposed-communication`), also accepted by --select/--ignore.
    doc: the documentation with the sections What it does / Why is this bad? / How to fix.
    tables: the report tables the rule reads (names from docs/tables.md).
    source: built-in, plugin or file; origin: where it was loaded from.
    """

    code: str
    name: str
    summary: str
    doc: str
    check: RuleFunction
    options: tuple[Option, ...] = ()
    tables: tuple[str, ...] = ()
    source: str = "built-in"
    origin: str = ""

    def __post_init__(self) -> None:
        if not CODE_RE.match(self.code):
            raise ValueError(f"rule code {self.code!r} must be capital letters then digits")
        if not NAME_RE.match(self.name):
            raise ValueError(f"rule name {self.name!r} must be kebab-case")
        if not self.summary.strip() or "\n" in self.summary.strip():
            raise ValueError(f"rule {self.code}: summary must be one non-empty line")
        missing = [s for s in DOC_SECTIONS if s not in self.doc]
        if missing:
            raise ValueError(f"rule {self.code}: docstring lacks section(s) {', '.join(missing)}")
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            raise ValueError(f"rule {self.code}: duplicate option names")

    @property
    def family(self) -> str:
        """The code's letters: COMM101 -> COMM."""
        return re.match(r"^[A-Z]+", self.code).group(0)  # type: ignore[union-attr]

    def defaults(self) -> dict[str, Any]:
        """Option name -> default value."""
        return {o.name: o.default for o in self.options}

    def __call__(self, tables: Tables, options: dict[str, Any] | None = None) -> list[Finding]:
        """Run the check with defaults overridden by `options`."""
        return self.check(tables, {**self.defaults(), **(options or {})})


def rule(
    *,
    code: str,
    name: str,
    summary: str,
    tables: Sequence[str] = (),
    options: Sequence[Option] = (),
    doc: str | None = None,
) -> Callable[[RuleFunction], Rule]:
    """Decorator turning `check(tables, options) -> list[Finding]` into a Rule.

    The documentation is `doc` or the function's docstring.
    """

    def wrap(fn: RuleFunction) -> Rule:
        return Rule(
            code=code,
            name=name,
            summary=summary,
            doc=inspect.cleandoc(doc if doc is not None else (fn.__doc__ or "")),
            check=fn,
            options=tuple(options),
            tables=tuple(tables),
        )

    return wrap


class Tables(Mapping[str, pl.DataFrame]):
    """Read-only name -> DataFrame view over a Report (or a dict of DataFrames).

    A table that is absent (or not yet produced by the analysis) reads as an empty
    DataFrame, so rules test `tables.has(name)` or `.height` rather than catching errors.
    A process group the trace does not name reads as "?" in every table (the analysis
    tables' convention), so joins on `process_group` match across tables.

    `kernels`, `collectives`, `collective_waits` and `steps` have a row per kernel, call or
    step of every rank: a big job keeps them in files, one per rank (kineto_comm.rank_store),
    and `tables[name]` assembles them. Rules that must stay within memory whatever the rank
    count read them through `lazy` (aggregations, run by `collect` on the streaming engine)
    or `rank_batches` (a few whole ranks at a time), as the built-in rules do.
    """

    def __init__(self, source: Any) -> None:
        self._source = source
        # Results of the helpers below that several rules ask for (collective_exposure
        # reads every rank's kernels): computed once per Tables, i.e. once per rules run.
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
        if name in MODEL_TABLES and (not isinstance(value, pl.DataFrame) or value.height == 0):
            # The model of time is built after the rules run: a rule (a SQL rule too) asking
            # for it gets it from the same functions the report uses.
            model = {"step_times": step_times, "attribution": attribution}
            value = model.get(name, _critical_blame)(self)
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
    if "process_group" in value.columns and value.schema["process_group"] == pl.String:
        value = value.with_columns(pl.col("process_group").fill_null("?"))
    return value


def severity_for(share: float, warn: float, error: float) -> Severity | None:
    """error at >= `error`, warning at >= `warn`, None below (no finding)."""
    if share >= error:
        return Severity.error
    if share >= warn:
        return Severity.warning
    return None


# A finding's default floor: below this share of the step its fix buys too little to be
# more than info (a rule's own `info_share` option wins).
INFO_SHARE = 0.01


def saving_severity(share: float, options: Mapping[str, Any]) -> Severity | None:
    """The severity a fix that saves `share` of the step earns on a rule's ladder: error from
    its `error_share`, warning from its `warn_share`, info from its `info_share` (default
    INFO_SHARE), None below. The engine caps the severity of every finding of a rule with
    such options at this (rules_engine.settle_severity): a finding is as bad as what fixing
    it buys, whatever share of the step its cause shows."""
    floor = float(options.get("info_share", INFO_SHARE))
    warn, error = options.get("warn_share"), options.get("error_share")
    sev = None
    if warn is not None and error is not None:
        sev = severity_for(share, float(warn), float(error))
    if sev is None and share >= floor:
        sev = Severity.info
    return sev


def mean_step_ns(tables: Tables) -> int:
    """The job's step time (kineto_comm.analysis.steptime, docs/tables.md `step_times`): per
    step the longest rank's device window, averaged over the complete steps (step >= 0, not
    the last one when there are several, whose window is cut at its last kernel); without
    step markers the whole trace is one step. The same number as `step_time_ns`."""
    return step_time_ns(tables)


def step_time_ns(tables: Tables) -> int:
    """The job's step time: the one every rule's share and saving is "of the step"."""
    return steptime.job_step_ns(step_times(tables))


def step_times(tables: Tables) -> pl.DataFrame:
    """Per step: step, step_ns (the longest rank's window), critical_rank (that rank),
    ranks, complete (counts toward the job's step time). Computed once per rules run from
    the steps table's windows."""

    def compute() -> pl.DataFrame:
        if tables.has("steps", "rank", "step", "wall_ns"):
            wall = pl.col("wall_ns")
        elif tables.has("steps", "rank", "step", "start_ns", "end_ns"):
            wall = pl.col("end_ns") - pl.col("start_ns")
        else:
            return pl.DataFrame(schema=steptime.STEP_TIMES_SCHEMA)
        walls = tables.collect(
            tables.lazy("steps", ["rank", "step", "start_ns", "end_ns", "wall_ns"]).select(
                pl.col("rank").cast(pl.Int64),
                pl.col("step").cast(pl.Int64),
                wall_ns=wall.clip(lower_bound=0).cast(pl.Int64),
            )
        )
        return steptime.step_times(walls)

    return tables.once(("kineto_comm", "step_times"), compute)


def _critical_blame(tables: Tables) -> pl.DataFrame:
    """The step_blame table (the critical rank's rows of each step) from step_blame."""
    times = step_times(tables)
    if times.height == 0:
        return pl.DataFrame(schema=steptime.BLAME_SCHEMA)
    blame = tables.once(
        ("rules_api", "step_blame_frame"), lambda: tables.collect(step_blame(tables))
    )
    return steptime.critical_blame(blame, times)


def _call_last(tables: Tables) -> pl.DataFrame:
    """Per call matched across its group (CALL_KEY, no point-to-point, two ranks or more,
    none kept alone): `late_rank`, the rank whose call was the shortest (it arrived last;
    it did not wait)."""

    def compute() -> pl.DataFrame:
        query = (
            tables.lazy("collectives", [*CALL_KEY, "rank", "duration_ns"])
            .filter(_grouped(_alone_ranks(tables)))
            .group_by(CALL_KEY)
            .agg(
                late_rank=pl.col("rank").sort_by("duration_ns", "rank").first().cast(pl.Int64),
                _n=pl.len(),
            )
            .filter(pl.col("_n") > 1)
            .drop("_n")
        )
        return tables.collect(query)

    return tables.once(("rules_api", "call_last"), compute)


def step_blame(tables: Tables) -> pl.LazyFrame:
    """Every rank's step windows split into blame categories (docs/tables.md `step_blame`;
    kineto_comm.analysis.steptime): rank, step, category, collective, process_group, role,
    late_rank, last_call, calls, ns; per (rank, step) the ns sum to the window exactly. Built a few
    ranks at a time, once per rules run (kept in files on a big job), as a lazy query."""
    rows = _model_of_time(tables)
    return rows.filter(pl.col("_call_row").is_null() & pl.col("_chain").is_null()).select(
        list(steptime.BLAME_SCHEMA)
    )


def replay_timeline(tables: Tables) -> pl.LazyFrame:
    """What the replay re-times (steptime.CHAIN_SCHEMA, in the blame's columns; `part`):
    per rank and step its window ("window": `at_ns`, `end_ns`), its communication, launch
    and queued pieces at their times ("event"; `sync` marks the exposed waits for another
    rank), and the tail chain ("chain": the calls queued back to back up to the step's
    last call, `span_ns` their whole time, hidden parts included). From the same pass as
    the blame."""
    rows = _model_of_time(tables)
    return rows.filter(pl.col("_chain").fill_null(False)).select(list(steptime.CHAIN_SCHEMA))


def _call_exposure(tables: Tables) -> pl.LazyFrame:
    """rank, process_group, collective, call_index, exposed_ns, exposed_all_ns, step (the
    window the call ends in), last_call: the time the blame charges to each call and where
    (steptime.rank_time), from the same pass."""
    rows = _model_of_time(tables)
    return rows.filter(pl.col("_call_row").is_not_null()).select(
        "rank", *CALL_KEY, "exposed_ns", "exposed_all_ns", "step", "last_call"
    )


# The columns of a call's exposure rows in _model_of_time's table.
_CALL_COLUMNS: dict[str, pl.DataType] = {
    "_call_row": pl.UInt32(),
    "call_index": pl.Int64(),
    "exposed_ns": pl.Int64(),
    "exposed_all_ns": pl.Int64(),
}


def _model_of_time(tables: Tables) -> pl.LazyFrame:
    """One table per rules run, built a few ranks at a time from one read of their kernels
    and calls (steptime.rank_time): the blame rows (`_call_row` null) and, per call, its
    exposed time (`_call_row` set; rank and the call's key in the blame's columns)."""
    schema = {
        **steptime.BLAME_SCHEMA,
        **_CALL_COLUMNS,
        "_chain": pl.Boolean(),
        "part": pl.String(),
        "span_ns": pl.Int64(),
        "at_ns": pl.Int64(),
        "end_ns": pl.Int64(),
        "sync": pl.Boolean(),
    }
    if not tables.has("steps", "step", "start_ns", "end_ns"):
        return pl.DataFrame(schema=schema).lazy()
    has_calls = tables.has("collectives")
    durations = _call_durations(tables) if has_calls else None
    late = _call_last(tables) if has_calls else None
    last = _instance_last(tables) if has_calls else None
    kcols: tuple[str, ...] = ("rank", "kind", "start_ns", "end_ns", "launch_ns")
    if tables.has("kernels", "launch_end_ns"):
        kcols += ("launch_end_ns",)
    ccols = (*CALL_KEY, "rank", "start_ns", "end_ns", "duration_ns", "launch_ns", "peer")
    # A pooled group's calls take their kind's role, an all_reduce's by its size.
    sized = tables.has("collectives", "bytes")
    if sized:
        ccols += ("bytes",)
    whole = _whole_instances(tables) if has_calls else None
    alone = _alone_ranks(tables)

    def build(windows: pl.DataFrame) -> pl.DataFrame:
        ranks = windows["rank"].unique().sort().to_list()
        kernels = pl.concat(
            [b for b in tables.rank_batches("kernels", kcols, ranks) if b.width == len(kcols)]
            or [pl.DataFrame(schema={c: pl.Int64 for c in kcols} | {"kind": pl.String})],
            how="vertical_relaxed",
        )
        if has_calls and durations is not None and late is not None:
            calls = pl.concat(
                list(tables.rank_batches("collectives", ccols, ranks)), how="vertical_relaxed"
            )
            waits = _rank_waits(tables, ranks) if last is not None else None
            arrivals = (
                None if waits is None or whole is None else _arrival_waits(waits.lazy(), whole)
            )
            calls = collect(
                _with_waits(calls.lazy(), durations, arrivals, alone)
                .join(late.lazy(), on=CALL_KEY, how="left", nulls_equal=True)
                # A point-to-point call waits for, or receives from, its peer; a call
                # kept alone, for no one.
                .with_columns(
                    late_rank=pl.when(pl.col("collective").is_in(P2P))
                    .then(pl.col("peer").cast(pl.Int64))
                    .when(_grouped(alone))
                    .then(pl.col("late_rank"))
                )
                .with_columns(pl.col("process_group").cast(pl.String))
                .pipe(lambda frame: call_roles(tables, frame))
                .drop("bytes", strict=False)
            )
            if last is not None and waits is not None:
                calls = _named_by_instance(calls, waits, last)
        else:
            calls = pl.DataFrame(
                schema={
                    "rank": pl.Int64,
                    "start_ns": pl.Int64,
                    "end_ns": pl.Int64,
                    "transfer_ns": pl.Int64,
                }
                | {c: pl.String for c in CALL_KEY[:2]}
                | {"call_index": pl.Int64}
            )
        blame, exposure, chain = steptime.rank_time(kernels, calls, windows)
        per_call = exposure.join(
            calls.with_row_index("_call_row").select(
                "_call_row",
                pl.col("rank").cast(pl.Int64),
                *[pl.col(c).cast(pl.String) for c in CALL_KEY[:2]],
                pl.col("call_index").cast(pl.Int64),
            ),
            on="_call_row",
        )
        return pl.concat(
            [blame, per_call, chain.with_columns(_chain=pl.lit(True))], how="diagonal_relaxed"
        ).select(*[pl.col(n).cast(t) for n, t in schema.items()])

    return tables.derived(
        ("rules_api", "model_of_time"), "steps", build, ("rank", "step", "start_ns", "end_ns")
    )


def _instance_last(tables: Tables) -> pl.DataFrame | None:
    """The collective_instances columns match.last_arrivals reads (instance, key_kind,
    last_rank, last_start_ns), once per rules run; None without instances."""
    cols = ["instance", "key_kind", "last_rank", "last_start_ns"]
    if not (tables.has("collective_instances", *cols) and tables.has("collective_waits")):
        return None
    return tables.once(
        ("rules_api", "instance_last"),
        lambda: tables.collect(tables.lazy("collective_instances", cols)),
    )


def _rank_waits(tables: Tables, ranks: list[int]) -> pl.DataFrame | None:
    """The report's collective_waits rows (_WAIT_COLUMNS) of a few ranks; None without."""
    if not tables.has("collective_waits", *_WAIT_COLUMNS):
        return None
    waits = [
        b
        for b in tables.rank_batches("collective_waits", _WAIT_COLUMNS, ranks)
        if b.width == len(_WAIT_COLUMNS)
    ]
    return pl.concat(waits, how="vertical_relaxed") if waits else None


def _named_by_instance(
    calls: pl.DataFrame, waits: pl.DataFrame, instances: pl.DataFrame
) -> pl.DataFrame:
    """`calls` (a few ranks' collectives rows with `late_rank`) with `late_rank` the rank
    that arrived last at the call's instance (match.last_arrivals over `waits`, those
    ranks' collective_waits rows: one straggler named the same way in the blame, the
    stragglers table and the critical path); none where the call's own rank arrived last
    (what is left of its call, at an instance some ranks of whose group were not traced, is
    a wait for no traced rank); a call in no instance keeps the rank whose call was the
    shortest."""
    arrivals = last_arrivals(waits, instances)
    cast = {"rank": calls.schema["rank"], "start_ns": calls.schema["start_ns"]}
    named = (
        arrivals.filter(~pl.col("p2p"))
        .select("rank", "start_ns", _last="last_rank")
        .with_columns(pl.col(c).cast(t) for c, t in cast.items())
    )
    # A point-to-point call that waited for its peer (`first`): the peer arrived after it,
    # before it ended (one that ended first, an eager send, waited for no one: wait 0).
    paired = (
        arrivals.filter(pl.col("p2p"))
        .select("rank", "start_ns", first=pl.col("wait_ns") > 0)
        .with_columns(pl.col(c).cast(t) for c, t in cast.items())
        .unique(["rank", "start_ns"], keep="first")
    )
    return (
        calls.join(named, on=["rank", "start_ns"], how="left", maintain_order="left")
        .join(paired, on=["rank", "start_ns"], how="left", maintain_order="left")
        .with_columns(
            late_rank=pl.when(pl.col("collective").is_in(P2P) | pl.col("_last").is_null())
            .then(pl.col("late_rank"))
            .when(pl.col("_last") != pl.col("rank").cast(pl.Int64))
            .then(pl.col("_last"))
        )
        .drop("_last")
    )


def rank_lateness(tables: Tables, where: pl.Expr | None = None) -> pl.DataFrame:
    """rank, step, remove_ns: per step, the longest wait any rank had for this rank (the
    model of time's `late_rank` waits, and the tail chain's, hidden parts included, that
    held back the calls queued behind them): the time its window loses when it does the
    mean rank's work. For an Edit's `rank_ns`. `where`: only the wait rows it keeps (an
    expression over the step_blame columns), e.g. the calls another rule owns left out."""
    blame, chain = step_blame(tables), replay_timeline(tables)
    if where is not None:
        blame, chain = blame.filter(where), chain.filter(where)
    return tables.collect(steptime.lateness(blame, chain))


def launch_floor(tables: Tables, removals: pl.DataFrame) -> pl.DataFrame:
    """rank, step, removed_ns, allowed_ns, share: per window, what a fix that leaves the
    CPU's launches where they are can take out of it (steptime.launch_floor: no kernel
    starts before its launch, but a launch after the CPU waited for the device moves with
    what is taken out before that wait), from `removals` (rank, step, at_ns, remove_ns: time the
    fix takes out at `at_ns`, a call's end); `share` = allowed / removed, to scale an
    Edit's per-window fraction. Reads the kernels of those ranks only."""
    if removals.height == 0 or not tables.has("kernels", "launch_ns"):
        return pl.DataFrame(schema=_SHARE_SCHEMA)
    ranks = removals["rank"].cast(pl.Int64).unique().implode()
    cols = [c for c in ("waited_ns",) if tables.has("kernels", c)]
    kernels = tables.lazy("kernels", ["rank", "step", "start_ns", "launch_ns", *cols]).filter(
        pl.col("rank").cast(pl.Int64).is_in(ranks)
    )
    return _with_share(tables.collect(steptime.launch_floor(kernels, removals)))


# launch_floor's and queue_shift's columns.
_SHARE_SCHEMA = {
    "rank": pl.Int64,
    "step": pl.Int64,
    "removed_ns": pl.Float64,
    "allowed_ns": pl.Float64,
    "share": pl.Float64,
}


def _with_share(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` (rank, step, removed_ns, allowed_ns) with share = allowed / removed (1 where
    nothing is removed), in _SHARE_SCHEMA."""
    return frame.with_columns(
        share=pl.when(pl.col("removed_ns") > 0)
        .then(pl.col("allowed_ns") / pl.col("removed_ns"))
        .otherwise(1.0)
    ).select(*[pl.col(c).cast(t) for c, t in _SHARE_SCHEMA.items()])


def queue_shift(tables: Tables) -> pl.DataFrame:
    """rank, step, removed_ns, allowed_ns, share: per window that holds queued time (the
    step_blame rows of category `queued`), what moving the device's other work off the
    rank takes out of it (steptime.queue_shift: no kernel starts before its launch, and a
    step's start moves with its first kernel's queue); `share` = allowed / removed, an
    Edit's fraction of those rows. Reads the kernels of the ranks with queued time only, a
    few ranks at a time."""
    if not tables.has("kernels", "launch_ns") or not tables.has("steps", "start_ns", "end_ns"):
        return pl.DataFrame(schema=_SHARE_SCHEMA)
    ranks = tables.collect(
        step_blame(tables).filter(pl.col("category") == "queued").select(pl.col("rank").unique())
    )["rank"].sort()
    cols = ["rank", "step", "start_ns", "end_ns", "launch_ns", "launch_end_ns"]
    parts = [pl.DataFrame(schema=_SHARE_SCHEMA)]
    for kernels in tables.rank_batches("kernels", cols, ranks.to_list() if ranks.len() else []):
        if kernels.height == 0:
            continue
        mine = (
            pl.col("rank").cast(pl.Int64).is_in(kernels["rank"].cast(pl.Int64).unique().implode())
        )
        windows = tables.collect(
            tables.lazy("steps", ["rank", "step", "start_ns", "end_ns"]).filter(mine)
        )
        parts.append(_with_share(steptime.queue_shift(kernels.lazy(), windows)))
    return pl.concat(parts)


def replay_saving(tables: Tables, *edits: Edit) -> int:
    """The step time (ns per step) the edits save, replayed together on the model of time
    (kineto_comm.analysis.steptime): each rank's windows lose what the edits remove, each
    step lasts as long as its longest rank's new window, and the saving is the job's step
    time less the new one. Never more than the step; several edits never save more than
    the largest share each row loses to one of them (overlaps are not added up)."""
    if not edits:
        return 0
    blame = tables.once(
        ("rules_api", "step_blame_frame"), lambda: tables.collect(step_blame(tables))
    )
    line = tables.once(
        ("rules_api", "timeline"),
        lambda: steptime.timeline(tables.collect(replay_timeline(tables))),
    )
    return steptime.saving(blame, step_times(tables), edits, line)


# What any link of the platform moves at least (GB/s of bus bandwidth): NCCL's links (PCIe,
# NVLink, InfiniBand, even 10 GbE) and gloo's TCP. The cost fit's bandwidth where the
# message sizes do not span enough to fit one: a floor, so the latency is not overstated.
PRIOR_BUSBW_GBPS = {"device": 1.0, "host": 0.1}


def _fit_calls(tables: Tables) -> pl.LazyFrame:
    """Every call with what the cost fit reads: its group ("?" unnamed), collective, size,
    group size n and transfer time (after the last rank arrived), rank and step."""
    return collective_exposure_lazy(tables, transfer_only=False).select(
        "rank",
        "step",
        pl.col("process_group").cast(pl.String).fill_null(UNKNOWN_GROUP),
        "collective",
        "bytes",
        "transfer_ns",
        n=group_size(),
    )


def cost_fit(tables: Tables) -> pl.DataFrame:
    """Per (process_group, collective): its calls' cost as latency + bytes / bandwidth
    (kineto_comm.analysis.costfit: calls, sizes, median_bytes, median_ns, latency_ns,
    busbw_gbps, latency_share, method). Where the sizes do not span enough for a fit, the
    bandwidth is at least the platform's PRIOR_BUSBW_GBPS. Computed once per rules run."""
    platform = job_platform(tables)
    gloo = platform.host or platform.backend == "gloo"
    prior = PRIOR_BUSBW_GBPS["host" if gloo else "device"]
    if not tables.has("collectives"):
        return pl.DataFrame(schema=costfit.FIT_SCHEMA)
    return tables.once(
        ("rules_api", "cost_fit"), lambda: costfit.cost_fit(_fit_calls(tables), prior)
    )


def merge_removal(tables: Tables, target_bytes: int) -> pl.DataFrame:
    """rank, step, process_group, collective, n, m, transfer_ns, removed_ns: per rank and
    step, each (process_group, collective)'s calls below `target_bytes` merged into calls of
    about that size (without sizes: its latency-sized calls into one), and the transfer time
    the latencies saved remove, on `cost_fit`'s latency (kineto_comm.analysis.costfit)."""
    fit = cost_fit(tables)
    if fit.height == 0:
        return costfit.merge_removal(
            pl.DataFrame(
                schema={
                    "rank": pl.Int64,
                    "step": pl.Int64,
                    "process_group": pl.String,
                    "collective": pl.String,
                    "bytes": pl.Int64,
                    "transfer_ns": pl.Int64,
                }
            ),
            fit,
            target_bytes,
        )
    return tables.once(
        ("rules_api", "merge_removal", int(target_bytes)),
        lambda: costfit.merge_removal(_fit_calls(tables), fit, target_bytes),
    )


def all_to_all_volume(tables: Tables) -> pl.DataFrame:
    """What each rank of a group sends and receives in its all-to-alls: process_group,
    rank, calls, sent_bytes and received_bytes over the trace (the calls' input and output
    sizes: an uneven all-to-all, PyTorch's all_to_allv, moves what its split sizes say);
    received_vs_mean, the rank's received_bytes over the group's mean rank's (a rank that
    always receives more); and, the same on each row of a group, call_imbalance: the mean
    over the group's calls (by `call_index`) of what the call's busiest receiver got over
    the call's mean rank (1.0: every call even; a call ends when its busiest rank is done).
    In a mixture-of-experts layer what a rank receives at dispatch is the tokens its
    experts compute: a rank that receives more works longer and reaches the group's next
    call later. Left out: groups whose all-to-alls carry no sizes, and groups with fewer
    ranks in the traces than their size, or of unknown size (their mean rank is not known,
    nor which calls are one call of the group)."""
    schema = {
        "process_group": pl.String,
        "rank": pl.Int64,
        "calls": pl.Int64,
        "sent_bytes": pl.Int64,
        "received_bytes": pl.Int64,
        "received_vs_mean": pl.Float64,
        "call_imbalance": pl.Float64,
    }
    need = ("rank", "process_group", "collective", "call_index", "group_size")
    need += ("in_bytes", "out_bytes")
    if not tables.has("collectives", *need):
        return pl.DataFrame(schema=schema)
    return tables.once(("rules_api", "all_to_all_volume"), lambda: _volume(tables, need, schema))


def _volume(tables: Tables, need: tuple[str, ...], schema: dict) -> pl.DataFrame:
    """all_to_all_volume, computed."""
    calls = (
        tables.lazy("collectives", list(need))
        .filter(pl.col("collective") == "all_to_all", pl.col("out_bytes").is_not_null())
        .with_columns(pl.col("process_group").cast(pl.String), pl.col("rank").cast(pl.Int64))
    )
    per_call = (
        calls.group_by("process_group", "call_index")
        .agg(_max=pl.col("out_bytes").max(), _mean=pl.col("out_bytes").mean())
        .group_by("process_group")
        .agg(
            call_imbalance=pl.when(pl.col("_mean") > 0)
            .then(pl.col("_max") / pl.col("_mean"))
            .mean()
        )
    )
    per = tables.collect(
        calls.group_by("process_group", "rank")
        .agg(
            calls=pl.len().cast(pl.Int64),
            sent_bytes=pl.col("in_bytes").sum().cast(pl.Int64),
            received_bytes=pl.col("out_bytes").sum().cast(pl.Int64),
            _size=pl.col("group_size").max(),
        )
        .join(per_call, on="process_group", how="left")
    )
    mean = pl.col("received_bytes").mean().over("process_group")
    size = pl.col("_size").max().over("process_group")
    whole = size.is_not_null() & (size <= pl.len().over("process_group"))
    return (
        per.filter(whole)
        .with_columns(received_vs_mean=pl.when(mean > 0).then(pl.col("received_bytes") / mean))
        .sort("process_group", "rank")
        .select([pl.col(c).cast(t) for c, t in schema.items()])
    )


def n_steps(tables: Tables) -> int:
    """Number of distinct steps (at least 1 when there is any step row)."""
    if not tables.has("steps", "step"):
        return 1
    query = tables.lazy("steps", ["step"]).select(pl.col("step").n_unique())
    return max(1, int(tables.collect(query).item()))


def median_of_counts(
    counts: pl.DataFrame, by: list[str], value: str, count: str, name: str = "median"
) -> pl.DataFrame:
    """Per `by` group of `counts` (each row: `count` calls of one `value`), the median of the
    values, nulls left out, as Polars' median over the calls themselves would give: exact,
    from a table with a row per distinct value (message sizes repeat) instead of a row per
    call."""
    known = pl.col(value).is_not_null()
    rows = (
        counts.filter(known)
        .sort([*by, value], nulls_last=True)
        .with_columns(_hi=pl.col(count).cum_sum().over(by), _n=pl.col(count).sum().over(by))
        .with_columns(_lo=pl.col("_hi") - pl.col(count))
    )

    def at(position: pl.Expr, alias: str) -> pl.DataFrame:
        hit = (pl.col("_lo") <= position) & (position < pl.col("_hi"))
        return rows.filter(hit).select(*by, pl.col(value).alias(alias))

    lower = at((pl.col("_n") - 1) // 2, "_a")
    upper = at(pl.col("_n") // 2, "_b")
    medians = lower.join(upper, on=by, nulls_equal=True).select(
        *by, ((pl.col("_a") + pl.col("_b")) / 2).alias(name)
    )
    groups = counts.select(by).unique(maintain_order=True)
    return groups.join(medians, on=by, how="left", nulls_equal=True)


@dataclass(frozen=True)
class Platform:
    """What the job ran on, for advice that differs by it: `backend` is the communication
    backend the traces' `distributedInfo` names ("nccl", "gloo", ...; None where no rank names
    one or the ranks name different ones) and `host` whether every rank's timeline is the
    host's (CPU-only traces: gloo spans against the CPU's work), so no GPU is in the job."""

    backend: str | None
    host: bool


def job_platform(tables: Tables) -> Platform:
    """The job's `Platform`, from the `ranks` table (its `backend` and `timeline` columns)."""
    if not tables.has("ranks", "backend", "timeline"):
        return Platform(None, False)
    ranks = tables["ranks"]
    backends = ranks["backend"].drop_nulls().unique()
    timelines = set(ranks["timeline"].drop_nulls().unique()) - {"none"}
    return Platform(backends.item() if backends.len() == 1 else None, timelines == {"host"})


def hosts_of(ranks: pl.Expr, ranks_per_host: int) -> pl.Expr:
    """Number of distinct hosts a list of ranks spans (rank // ranks_per_host)."""
    return (ranks.list.eval(pl.element() // max(1, ranks_per_host))).list.n_unique()


P2P = ("send", "recv", "send_recv")
CALL_KEY = ["process_group", "collective", "call_index"]


def collective_waits(tables: Tables) -> pl.DataFrame:
    """Every collectives row with how long it waited for its group and how long it moved data.

    Adds `wait_ns`, `transfer_ns = duration_ns - wait_ns`, `ranks_seen` and `arrived_last`
    (wait_ns is 0). A call of a matched instance that every rank of its group ran in the
    traces waited from its arrival to the last member's (the report's collective_waits,
    at most its duration): the same wait the stragglers table, the critical path and the
    step blame count. Any other collective (an instance some members of which were not
    traced, or files without the cross-rank tables) waited for its duration less the
    shortest duration of the same call over the ranks that ran it, matched by
    (process_group, collective, call_index): that counts waits for untraced members and
    needs no clock. Point-to-point calls wait 0 here (their waits are the pipeline's), and
    so do the calls the report matched with no other rank's for naming no group on a rank
    in groups of different ranks (collective_instances key_kind `ungrouped`).
    Every rank's rows in one DataFrame: rules that must stay within memory on big jobs use
    `collective_waits_lazy`.
    """
    if not tables.has("collectives"):
        return tables["collectives"]
    return tables.collect(collective_waits_lazy(tables))


def collective_waits_lazy(tables: Tables) -> pl.LazyFrame:
    """collective_waits() as a lazy query (see Tables.lazy): the calls stream through a join
    with one row per matched call."""
    whole = _whole_instances(tables)
    arrivals = (
        None
        if whole is None
        else _arrival_waits(tables.lazy("collective_waits", list(_WAIT_COLUMNS)), whole)
    )
    return _with_waits(
        tables.lazy("collectives"), _call_durations(tables), arrivals, _alone_ranks(tables)
    )


def _alone_ranks(tables: Tables) -> pl.Series:
    """The ranks whose calls without a group are matched with no other rank's (in groups
    of different ranks: analysis.match.ranks_in_several_groups)."""
    found = ranks_in_several_groups(tables["ranks"]) if tables.has("ranks", "rank") else []
    return pl.Series(found, dtype=pl.Int64)


def _grouped(alone: pl.Series) -> pl.Expr:
    """The calls that wait for their group: not point-to-point (their waits are the
    pipeline's), and not a call kept alone (`alone`: _alone_ranks)."""
    unnamed = pl.col("process_group").fill_null(UNKNOWN_GROUP) == UNKNOWN_GROUP  # Tables: "?"
    kept = unnamed & pl.col("rank").is_in(alone.implode())
    return ~pl.col("collective").is_in(P2P) & ~kept


def _call_durations(tables: Tables) -> pl.DataFrame:
    """Per call matched across its group (CALL_KEY, no point-to-point, none kept alone):
    the shortest duration over its ranks (`_min`) and how many ranks ran it (`_n`)."""

    def compute() -> pl.DataFrame:
        query = (
            tables.lazy("collectives", [*CALL_KEY, "rank", "duration_ns"])
            .filter(_grouped(_alone_ranks(tables)))
            .group_by(CALL_KEY)
            .agg(_min=pl.col("duration_ns").min(), _n=pl.len())
        )
        return tables.collect(query)

    return tables.once(("rules_api", "call_durations"), compute)


# The report's collective_waits columns the waits read.
_WAIT_COLUMNS = ("instance", "rank", "start_ns", "wait_ns")


def _whole_instances(tables: Tables) -> pl.DataFrame | None:
    """instance: the matched collective instances (no point-to-point) that every rank of
    the group ran in the traces (ranks_seen = group_size > 1): there a call waited from its
    arrival to the last member's (the report's collective_waits.wait_ns). None without the
    cross-rank tables."""
    cols = ["instance", "key_kind", "ranks_seen", "group_size"]
    if not (
        tables.has("collective_instances", *cols) and tables.has("collective_waits", *_WAIT_COLUMNS)
    ):
        return None

    def compute() -> pl.DataFrame:
        query = (
            tables.lazy("collective_instances", cols)
            .filter(
                (pl.col("key_kind").cast(pl.String) != "p2p")
                & (pl.col("ranks_seen") >= pl.col("group_size"))
                & (pl.col("ranks_seen") > 1)
            )
            .select(pl.col("instance").cast(pl.Int64))
        )
        return tables.collect(query)

    return tables.once(("rules_api", "whole_instances"), compute)


def _arrival_waits(waits: pl.LazyFrame, whole: pl.DataFrame) -> pl.LazyFrame:
    """rank, start_ns, _arr: per call of `waits` (collective_waits rows) in a whole
    instance, its wait for the group's last arrival."""
    return (
        waits.select(pl.col(c).cast(pl.Int64) for c in _WAIT_COLUMNS)
        .join(whole.lazy(), on="instance", how="semi")
        .group_by("rank", "start_ns")
        .agg(_arr=pl.col("wait_ns").max())
    )


def _with_waits(
    calls: pl.LazyFrame,
    durations: pl.DataFrame,
    arrivals: pl.LazyFrame | None = None,
    alone: pl.Series | None = None,
) -> pl.LazyFrame:
    """`calls` (collectives rows) plus transfer_ns, ranks_seen, wait_ns and arrived_last.

    A call of an instance every member of its group ran (`arrivals`, _arrival_waits)
    waited from its arrival to the last member's (at most its duration); any other waited
    for its duration less the shortest of its group's (the rank that did not wait), which
    counts the waits for members that were not traced. A point-to-point call waits 0 here
    (its peer's time is the pipeline's), and so does a call kept alone (`alone`:
    _alone_ranks). transfer_ns is the rest of the call; a rank arrived last when it did
    not wait."""
    grouped = _grouped(pl.Series([], dtype=pl.Int64) if alone is None else alone)
    out = calls.join(
        durations.lazy(),
        on=CALL_KEY,
        how="left",
        nulls_equal=True,
        maintain_order="left",
        build_side="force_right",
    )
    if arrivals is None:
        out = out.with_columns(_arr=pl.lit(None, dtype=pl.Int64))
    else:
        schema = out.collect_schema()
        out = out.join(
            arrivals.with_columns(pl.col(c).cast(schema[c]) for c in ("rank", "start_ns")),
            on=["rank", "start_ns"],
            how="left",
            maintain_order="left",
        )
    duration = pl.col("duration_ns")
    waited = (
        pl.when(grouped & pl.col("_arr").is_not_null())
        .then(pl.min_horizontal(pl.max_horizontal(pl.col("_arr"), 0), duration))
        .when(grouped)
        .then(duration - pl.col("_min"))
        .otherwise(0)
    )
    return (
        out.with_columns(
            transfer_ns=(duration - waited).cast(pl.Int64),
            ranks_seen=pl.when(grouped).then(pl.col("_n")).otherwise(1).cast(pl.Int64),
        )
        .drop("_min", "_n", "_arr")
        .with_columns(wait_ns=duration - pl.col("transfer_ns"))
        .with_columns(arrived_last=pl.col("wait_ns") == 0)
    )


def collective_exposure(tables: Tables, transfer_only: bool = True) -> pl.DataFrame:
    """collective_waits() plus `exposed_ns`: the time of each call that the model of time
    charges to it (steptime.rank_time; docs/tables.md `step_blame`): inside a step window,
    with no compute or memory kernel running on its rank, and not already held by an
    earlier call on the rank. With `transfer_only`, only the call's last `transfer_ns`
    count (the time it moved data, not the time it sat waiting for late ranks). Summed
    over a rank's calls in a step, it is that step's transfer and pipeline_bubble blame
    (with the waits: every communication row). Every rank's rows in one DataFrame: rules
    that must stay within memory on big jobs use `collective_exposure_lazy`."""
    if not tables.has("collectives"):
        return tables["collectives"].with_columns(exposed_ns=pl.lit(0, dtype=pl.Int64))
    return tables.collect(collective_exposure_lazy(tables, transfer_only))


def collective_exposure_lazy(tables: Tables, transfer_only: bool = True) -> pl.LazyFrame:
    """collective_exposure() as a lazy query (see Tables.lazy): the calls stream through a
    join with their exposure, which the blame's pass computed (kept in files on a big
    job)."""
    if not tables.has("collectives"):
        return collective_exposure(tables, transfer_only).lazy()
    exposure = _call_exposure(tables).select(
        "rank",
        *CALL_KEY,
        "last_call",
        exposed_ns="exposed_ns" if transfer_only else "exposed_all_ns",
        _window="step",
    )
    calls = collective_waits_lazy(tables)
    schema = calls.collect_schema()
    exposure = exposure.with_columns(
        pl.col(c).cast(schema[c]) for c in ("rank", *CALL_KEY) if c in schema
    )
    step = schema.get("step", pl.Int64)
    return (
        calls.join(
            exposure, on=["rank", *CALL_KEY], how="left", nulls_equal=True, maintain_order="left"
        )
        .with_columns(
            pl.col("exposed_ns").fill_null(0),
            # The step whose window the call ends in, as the blame counts it.
            step=pl.coalesce(pl.col("_window").cast(step), pl.col("step"))
            if "step" in schema
            else pl.col("_window"),
        )
        .drop("_window")
    )


def attribution(tables: Tables) -> pl.DataFrame:
    """The report's `attribution` table (docs/tables.md; analysis/attribution.py): the
    model of time's exposure, waits and bubbles of the calls per phase x module x role x
    collective, per step, over ranks and on the critical rank. Built once per rules run from
    the per-call exposure the blame's pass charged (_call_exposure) and each call's role
    (call_roles); empty where the calls have no phase (no collectives)."""

    def compute() -> pl.DataFrame:
        empty = pl.DataFrame(schema=attribution_.ATTRIBUTION_SCHEMA)
        if not tables.has("collectives", "phase"):
            return empty
        cols = ["rank", *CALL_KEY, "phase", "module", "module_source"]
        if tables.has("collectives", "bytes"):
            cols.append("bytes")
        calls = tables.lazy("collectives", cols).with_columns(
            pl.col("rank").cast(pl.Int64),
            pl.col("process_group").cast(pl.String),
            pl.col("collective").cast(pl.String),
            pl.col("call_index").cast(pl.Int64),
        )
        exposure = _call_exposure(tables).select(
            "rank", *CALL_KEY, "exposed_ns", "exposed_all_ns", "step"
        )
        joined = call_roles(
            tables,
            calls.join(exposure, on=["rank", *CALL_KEY], how="inner", nulls_equal=True),
        )
        assert isinstance(joined, pl.LazyFrame)
        return attribution_.attribution_table(joined, step_times(tables))

    return tables.once(("rules_api", "attribution"), compute)


ROLE_PATTERNS = (
    (r"(?i)tensor|(^|_)tp($|_)", "tensor_parallel"),
    (r"(?i)pipeline|(^|_)pp($|_)", "pipeline"),
    (r"(?i)expert|moe|(^|_)ep($|_)", "expert"),
    (r"(?i)fsdp|shard|zero", "fsdp"),
    (r"(?i)data|(^|_)dp($|_)|default", "data_parallel"),
)


def group_roles(tables: Tables) -> pl.DataFrame:
    """process_group -> role (data_parallel, tensor_parallel, pipeline, expert, fsdp, unknown).

    From the process_groups table when the analysis filled it; otherwise inferred from the
    group description (Megatron's TENSOR_MODEL_PARALLEL_GROUP, default_pg, ...) and what the
    group does: only point-to-point -> pipeline; all-gather and reduce-scatter on a
    data-parallel group -> fsdp. Columns: process_group, role, size, ranks (list[int]).
    """
    pgs = tables["process_groups"]
    if tables.has("process_groups", "process_group", "role"):
        if "pooled_collective" in pgs.columns and "calls_per_step" in pgs.columns:
            # A pooled group split by kind of call (roles.py): one row per group here, the
            # kind with the most calls; call_roles gives each call its own kind's role.
            pgs = pgs.sort(
                "calls_per_step", descending=True, nulls_last=True, maintain_order=True
            ).unique("process_group", keep="first", maintain_order=True)
        size = pl.col("size") if "size" in pgs.columns else pl.lit(None, dtype=pl.Int64)
        ranks = (
            pl.col("ranks").cast(pl.String).pipe(parse_ranks)
            if "ranks" in pgs.columns and pgs.schema["ranks"] == pl.String
            else (pl.col("ranks") if "ranks" in pgs.columns else pl.lit(None))
        )
        return pgs.select(
            pl.col("process_group").cast(pl.String), "role", size=size.cast(pl.Int64), ranks=ranks
        )
    if not tables.has("collectives"):
        return pl.DataFrame(
            schema={
                "process_group": pl.String,
                "role": pl.String,
                "size": pl.Int64,
                "ranks": pl.List(pl.Int64),
            }
        )
    cols = ["process_group", "pg_desc", "group_size", "pg_ranks", "collective"]
    per = tables.collect(
        tables.lazy("collectives", cols)
        .group_by("process_group")
        .agg(
            desc=pl.col("pg_desc").drop_nulls().first().fill_null(""),
            size=pl.col("group_size").max(),
            ranks=pl.col("pg_ranks").drop_nulls().first(),
            p2p_only=pl.col("collective").is_in(P2P).all(),
            sharded=pl.col("collective").is_in(["all_gather", "reduce_scatter"]).any(),
        )
    )
    role = (
        pl.when(pl.col("sharded") & pl.col("_r").is_in(["data_parallel", "unknown"]))
        .then(pl.lit("fsdp"))
        .otherwise(pl.col("_r"))
    )
    return (
        per.with_columns(
            _r=pl.when(pl.col("p2p_only"))
            .then(pl.lit("pipeline"))
            .otherwise(_desc_role(pl.col("desc")))
        )
        .with_columns(role=role)
        .select(
            pl.col("process_group").cast(pl.String),
            "role",
            pl.col("size").cast(pl.Int64),
            ranks=parse_ranks("ranks"),
        )
    )


def call_roles(tables: Tables, frame: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame | pl.LazyFrame:
    """`frame` (process_group, and collective and bytes where it has them) plus `role`: its
    group's (group_roles), and for a call of a pooled group that the process_groups table
    splits by kind of call (no group named per call: roles.py), its kind's role (an
    all_to_all's, an all_reduce's of its size), so a dense gradient all-reduce pooled with
    embedding all-to-alls is not 'embedding'. Null where the group is unknown."""
    roles = group_roles(tables).select(pl.col("process_group").alias("_pg"), "role")
    lazy = isinstance(frame, pl.LazyFrame)
    pg = pl.col("process_group").cast(pl.String).fill_null(UNKNOWN_GROUP)
    out = frame.lazy().with_columns(_pg=pg).join(roles.lazy(), on="_pg", how="left")
    pgs = tables["process_groups"]
    columns = frame.collect_schema().names() if lazy else frame.columns
    if "pooled_collective" in pgs.columns and "collective" in columns:
        pooled = pgs.filter(pl.col("pooled_collective").is_not_null()).select(
            _pg="process_group", _pc="pooled_collective", _pb="pooled_bytes", _pr="role"
        )
        if pooled.height:
            kinds = pooled.filter(pl.col("_pb").is_null()).select("_pg", "_pc", _kr="_pr")
            out = out.join(
                kinds.lazy(), left_on=["_pg", "collective"], right_on=["_pg", "_pc"], how="left"
            )
            sized = pooled.filter(pl.col("_pb").is_not_null())
            if "bytes" in columns and sized.height:
                out = out.join(
                    sized.select("_pg", "_pc", "_pb", _sr="_pr").lazy(),
                    left_on=["_pg", "collective", pl.col("bytes").cast(pl.Int64)],
                    right_on=["_pg", "_pc", "_pb"],
                    how="left",
                )
            else:
                out = out.with_columns(_sr=pl.lit(None, dtype=pl.String))
            # The rest of the pool: calls of a kind the split has no row for.
            rest = pgs.filter(
                pl.col("pooled_collective").is_null()
                & pl.col("process_group").is_in(pooled["_pg"].unique().implode())
            ).select(_pg="process_group", _rr="role")
            split = pooled["_pc"].unique().to_list()
            out = (
                out.join(rest.lazy(), on="_pg", how="left")
                .with_columns(
                    role=pl.coalesce(
                        "_sr",
                        "_kr",
                        pl.when(~pl.col("collective").is_in(split)).then(pl.col("_rr")),
                        "role",
                    )
                )
                .drop("_kr", "_sr", "_rr")
            )
    out = out.drop("_pg")
    return out if lazy else out.collect()


def _desc_role(desc: pl.Expr) -> pl.Expr:
    """Role from a group description by ROLE_PATTERNS (first match wins)."""
    out = pl.lit("unknown")
    for pattern, name in reversed(ROLE_PATTERNS):
        out = pl.when(desc.str.contains(pattern)).then(pl.lit(name)).otherwise(out)
    return out


def make_finding(
    rule_: Rule | str,
    severity: Severity,
    title: str,
    message: str,
    *,
    impact_ns_per_step: float,
    step_ns: int,
    ranks: Sequence[int] = (),
    steps: Sequence[int] = (),
    process_group: str | None = None,
    window_ns: tuple[int, int] | None = None,
    evidence: dict[str, Any] | None = None,
    advice: Sequence[str] = (),
    edit: Edit | None = None,
) -> Finding:
    """A Finding with `step_share = impact / step_ns` (unrounded: each format rounds it once,
    so a message and its annotation give one number) and JSON-safe ints, sorted ranks.

    `edit`: the change that fixes the cause, as the model of time replays it (its saving
    is what `replay_saving(tables, edit)` gives); the report replays every finding's edit
    together for the saving of all fixes at once."""
    code = rule_.code if isinstance(rule_, Rule) else rule_
    impact = max(0, int(round(impact_ns_per_step or 0)))
    return Finding(
        code=code,
        severity=severity,
        title=title,
        message=message,
        impact_ns_per_step=impact,
        step_share=impact / step_ns if step_ns > 0 else None,
        ranks=tuple(sorted({int(r) for r in ranks})),
        steps=tuple(sorted({int(s) for s in steps})),
        process_group=process_group,
        window_ns=(int(window_ns[0]), int(window_ns[1])) if window_ns else None,
        evidence=dict(evidence or {}),
        advice=tuple(advice),
        rule=rule_.name if isinstance(rule_, Rule) else "",
        edit=edit,
    )


def impact_per_step(
    rows: pl.DataFrame | pl.LazyFrame | Callable[[Tables], pl.LazyFrame],
    value: str,
    by: Sequence[str] = (),
    steps: int | None = None,
    tables: Tables | None = None,
) -> pl.DataFrame:
    """Step time a cause costs: `value` summed per (by, rank, step), the worst rank taken per
    (by, step) (a synchronous job waits for its slowest rank), averaged over `steps` (default:
    with `tables`, the job's complete steps, as the step time and every replayed saving are
    (step_times; a step without the cause counts as 0); without, the steps present). Returns
    by + impact_ns, ranks (list), steps (list) and calls (mean rows per rank and step with a
    cost), of those steps.

    `rows` may be a lazy query over every call (collective_exposure_lazy), collected by
    `tables.collect` when `tables` is given; then its sums per (by, rank, step) are held at
    once. A function from a Tables to that query keeps memory bounded whatever the rank
    count: it is called on `tables` (to plan; nothing is run) and then on each of
    `tables.rank_slices()`, and only a few ranks' sums are held at a time. The function
    reads the per-rank tables through the Tables it gets, and treats ranks apart: a join on
    (rank, step) with an aggregation of its own rows is fine, a statistic over every rank
    comes from the whole tables."""
    by = list(by)
    if callable(rows):
        if tables is None:
            raise ValueError("impact_per_step: rows given as a function need `tables`")
        names = rows(tables).collect_schema()
        queries = ((view, rows(view)) for view in tables.rank_slices())
    else:
        names = rows.lazy().collect_schema()
        queries = iter([(tables, rows.lazy())])
    schema = {
        **{c: names.get(c, pl.String) for c in by},
        "impact_ns": pl.Float64,
        "ranks": pl.List(pl.Int64),
        "steps": pl.List(pl.Int64),
        "calls": pl.Int64,
    }
    # The job's complete steps: where the step time and the savings are measured.
    done = None
    if tables is not None and steps is None:
        times = step_times(tables).filter(pl.col("complete"))
        done = times["step"].cast(pl.Int64).implode() if times.height else None
    # Per view of a few ranks, state per (by, step) and per (by, rank), not per rank and step.
    per_step, per_rank = [], []
    for view, query in queries:
        query = query.group_by([*by, "rank", "step"]).agg(
            v=pl.col(value).sum(), calls=pl.len().cast(pl.Int64)
        )
        if done is not None:
            query = query.filter(pl.col("step").cast(pl.Int64).is_in(done))
        sums = view.collect(query) if view is not None else collect(query)
        cost = pl.col("v") > 0
        per_step.append(
            sums.group_by([*by, "step"]).agg(
                v=pl.col("v").max(),
                _calls=pl.when(cost).then(pl.col("calls")).sum(),
                _n=cost.sum().cast(pl.Int64),
            )
        )
        numbered = pl.col("step") >= 0
        per_rank.append(sums.filter(cost).select(*by, "rank", _numbered=numbered).unique())
    step = pl.concat(per_step)
    if step.height == 0:
        return pl.DataFrame(schema=schema)
    ranks = pl.concat(per_rank)
    if (step["step"] >= 0).any():
        step = step.filter(pl.col("step") >= 0)
        ranks = ranks.filter(pl.col("_numbered"))
    n = steps or (done.list.len().item() if done is not None else step["step"].n_unique())
    n = max(1, n)
    key = by or ["_all"]
    if not by:
        step = step.with_columns(_all=pl.lit(0))
        ranks = ranks.with_columns(_all=pl.lit(0))
    step = (
        step.group_by([*key, "step"])
        .agg(pl.col("v").max(), pl.col("_calls").sum(), pl.col("_n").sum())
        .sort([*key, "step"], nulls_last=True)
    )
    totals = step.group_by(key, maintain_order=True).agg(impact_ns=pl.col("v").sum() / n)
    members = (
        step.filter(pl.col("_n") > 0)
        .group_by(key)
        .agg(
            steps=pl.col("step").unique().sort(),
            calls=(pl.col("_calls").sum() / pl.col("_n").sum()).round().cast(pl.Int64),
        )
        .join(
            ranks.group_by(key).agg(ranks=pl.col("rank").unique().sort()),
            on=key,
            how="left",
            nulls_equal=True,
        )
    )
    return (
        totals.join(members, on=key, how="left", nulls_equal=True)
        .drop("_all", strict=False)
        .select(list(schema))
    )
