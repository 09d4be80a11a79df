"""Each call's wait for its group and the time it moved data: the rules' view of the waits.

Why: a collective's time is two different things, the wait for the group's last member and
the transfer after it, and a fix of one does nothing for the other. A call of an instance
every member of its group ran in the traces waited from its arrival to the last member's
(the report's collective_waits, from analysis/match.py: the same wait the stragglers table,
the critical path and the step blame count); any other waited for its duration less the
shortest duration of the same call over its ranks (no clock needed; it counts the waits for
members that were not traced). The model of time (model_of_time.py) and the exposure
(exposure.py) read these tables; rules read them through `Tables` (derived.py).
"""

from __future__ import annotations

import polars as pl

from kineto_comm.analysis.match import last_arrivals, ranks_in_several_groups
from kineto_comm.analysis.sizes import UNKNOWN_GROUP
from kineto_comm.analysis.view import TableView, memo
from kineto_comm.model.names import POINT_TO_POINT

P2P = POINT_TO_POINT  # send, recv, send_recv: calls with one peer
CALL_KEY = ["process_group", "collective", "call_index"]


def collective_waits(tables: TableView) -> pl.DataFrame:
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


def collective_waits_lazy(tables: TableView) -> pl.LazyFrame:
    """collective_waits() as a lazy query (see Tables.lazy): the calls stream through a join
    with one row per matched call."""
    whole = whole_instances(tables)
    arrivals = (
        None
        if whole is None
        else arrival_waits(tables.lazy("collective_waits", list(WAIT_COLUMNS)), whole)
    )
    return with_waits(
        tables.lazy("collectives"), call_durations(tables), arrivals, alone_ranks(tables)
    )


def alone_ranks(tables: TableView) -> pl.Series:
    """The ranks whose calls without a group are matched with no other rank's (in groups
    of different ranks: analysis.match.ranks_in_several_groups)."""

    def compute() -> pl.Series:
        ranks = tables["ranks"]
        found = ranks_in_several_groups(ranks) if tables.has("ranks", "rank") else []
        return pl.Series(found, dtype=pl.Int64)

    return memo(tables, "alone_ranks", compute)


def waits_for_group(alone: pl.Series) -> pl.Expr:
    """The calls that wait for their group: not point-to-point (their waits are the
    pipeline's), and not a call kept alone (`alone`: alone_ranks)."""
    unnamed = pl.col("process_group").fill_null(UNKNOWN_GROUP) == UNKNOWN_GROUP  # Tables: "?"
    kept = unnamed & pl.col("rank").is_in(pl.lit(alone).implode())  # no query, as an expression
    return ~pl.col("collective").is_in(P2P) & ~kept


def call_durations(tables: TableView) -> pl.DataFrame:
    """Per call matched across its group (CALL_KEY, no point-to-point, none kept alone):
    the shortest duration over its ranks (`_min`) and how many ranks ran it (`_n`)."""

    def compute() -> pl.DataFrame:
        query = (
            tables.lazy("collectives", [*CALL_KEY, "rank", "duration_ns"])
            .filter(waits_for_group(alone_ranks(tables)))
            .group_by(CALL_KEY)
            .agg(_min=pl.col("duration_ns").min(), _n=pl.len())
        )
        return tables.collect(query)

    return memo(tables, "call_durations", compute)


# The report's collective_waits columns the waits read.
WAIT_COLUMNS = ("instance", "rank", "start_ns", "wait_ns")


def whole_instances(tables: TableView) -> pl.DataFrame | None:
    """instance: the matched collective instances (no point-to-point) that every rank of
    the group ran in the traces (ranks_seen = group_size > 1): there a call waited from its
    arrival to the last member's (the report's collective_waits.wait_ns). None without the
    cross-rank tables."""
    cols = ["instance", "key_kind", "ranks_seen", "group_size"]
    if not (
        tables.has("collective_instances", *cols) and tables.has("collective_waits", *WAIT_COLUMNS)
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

    return memo(tables, "whole_instances", compute)


def arrival_waits(waits: pl.LazyFrame, whole: pl.DataFrame) -> pl.LazyFrame:
    """rank, start_ns, _arr: per call of `waits` (collective_waits rows) in a whole
    instance, its wait for the group's last arrival."""
    return (
        waits.select(pl.col(c).cast(pl.Int64) for c in WAIT_COLUMNS)
        .join(whole.lazy(), on="instance", how="semi")
        .group_by("rank", "start_ns")
        .agg(_arr=pl.col("wait_ns").max())
    )


def with_waits(
    calls: pl.LazyFrame,
    durations: pl.DataFrame,
    arrivals: pl.LazyFrame | None = None,
    alone: pl.Series | None = None,
) -> pl.LazyFrame:
    """`calls` (collectives rows) plus transfer_ns, ranks_seen, wait_ns and arrived_last.

    A call of an instance every member of its group ran (`arrivals`, arrival_waits)
    waited from its arrival to the last member's (at most its duration); any other waited
    for its duration less the shortest of its group's (the rank that did not wait), which
    counts the waits for members that were not traced. A point-to-point call waits 0 here
    (its peer's time is the pipeline's), and so does a call kept alone (`alone`:
    alone_ranks). transfer_ns is the rest of the call; a rank arrived last when it did
    not wait."""
    grouped = waits_for_group(pl.Series([], dtype=pl.Int64) if alone is None else alone)
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


def call_last(tables: TableView) -> pl.DataFrame:
    """Per call matched across its group (CALL_KEY, no point-to-point, two ranks or more,
    none kept alone): `late_rank`, the rank whose call was the shortest (it arrived last;
    it did not wait)."""

    def compute() -> pl.DataFrame:
        query = (
            tables.lazy("collectives", [*CALL_KEY, "rank", "duration_ns"])
            .filter(waits_for_group(alone_ranks(tables)))
            .group_by(CALL_KEY)
            .agg(
                late_rank=pl.col("rank").sort_by("duration_ns", "rank").first().cast(pl.Int64),
                _n=pl.len(),
            )
            .filter(pl.col("_n") > 1)
            .drop("_n")
        )
        return tables.collect(query)

    return memo(tables, "call_last", compute)


def instance_last(tables: TableView) -> pl.DataFrame | None:
    """The collective_instances columns match.last_arrivals reads (instance, key_kind,
    last_rank, last_start_ns), once per rules run; None without instances."""
    cols = ["instance", "key_kind", "last_rank", "last_start_ns"]
    if not (tables.has("collective_instances", *cols) and tables.has("collective_waits")):
        return None
    return memo(
        tables,
        "instance_last",
        lambda: tables.collect(tables.lazy("collective_instances", cols)),
    )


def rank_waits(tables: TableView, ranks: list[int]) -> pl.DataFrame | None:
    """The report's collective_waits rows (WAIT_COLUMNS) of a few ranks; None without."""
    if not tables.has("collective_waits", *WAIT_COLUMNS):
        return None
    waits = [
        b
        for b in tables.rank_batches("collective_waits", WAIT_COLUMNS, ranks)
        if b.width == len(WAIT_COLUMNS)
    ]
    return pl.concat(waits, how="vertical_relaxed") if waits else None


def named_by_instance(
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
