"""Clock alignment: a per-rank offset estimated from matched collectives.

Ranks on different hosts read different clocks. A collective completes at nearly the same
instant on every rank of its group (nobody leaves before the last byte arrives), so each
matched call's end times differ across ranks mostly by the clock offsets. The model
`end(rank, call) = T(call) + offset(rank)` is fitted by alternating medians (robust to the
few calls whose ends genuinely differ), over all groups at once so that ranks that never
share a group with rank 0 are still aligned through the ranks in between. Offsets are
relative to the lowest rank (offset 0); `residual_ns` is each rank's median misfit after
alignment, a measure of how much to trust it. An estimate smaller than SIGNIFICANCE times
its residual (or than MIN_OFFSET_NS) is reported in `estimate_ns` but not applied
(`offset_ns` 0, method `insignificant`): collectives whose ends genuinely vary, such as
gloo's, would otherwise shift ranks that share one clock. Host-timeline (gloo) calls are
not used at all, for the same reason: CPU-only jobs keep each trace's own clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from kineto_comm.lazy import collect, sample

if TYPE_CHECKING:
    from kineto_comm.rank_store import RankStore

OFFSET_COLUMNS = ("rank", "offset_ns", "estimate_ns", "residual_ns", "matched", "method")
_ROUNDS = 12
# An estimate is applied only when it clearly exceeds its own misfit: ranks on one host
# (one clock) otherwise get offsets that are noise of the collectives' end times.
SIGNIFICANCE = 3.0
MIN_OFFSET_NS = 1_000


def estimate_offsets(keyed: pl.DataFrame | RankStore, ranks: list[int]) -> pl.DataFrame:
    """Offsets per rank from matched calls (keyed: rank, device, instance, end_ns)."""
    from kineto_comm.analysis.match import one_row_per_call
    from kineto_comm.rank_store import as_store

    keyed = as_store(keyed)
    # Only device kernels (NCCL/RCCL) complete together on all ranks. Host-side gloo spans
    # do not: a send ends when the data is handed off, a ring all-reduce ends on each rank
    # at its own last hop (tens of us apart, consistently), which would pass for an offset.
    usable = pl.col("instance").is_not_null() & (pl.col("device") != -1)
    calls = keyed.lazy(["instance", "rank", "device", "end_ns"]).filter(usable)
    # Above SAMPLE_ROWS rows, every k-th call: an evenly spread sample whose medians hold
    # the same offsets, in bounded memory (docs/scale.md).
    calls = sample(calls, keyed.height, "instance").select("instance", "rank", "end_ns")
    if not one_row_per_call(keyed):  # a rank's call seen twice: its latest end
        calls = calls.group_by("instance", "rank").agg(pl.col("end_ns").max())
    shared = calls.group_by("instance").agg(pl.len().alias("n")).filter(pl.col("n") > 1)
    ends = collect(
        calls.join(
            shared.select("instance"), on="instance", how="semi", build_side="force_right"
        ).with_columns(pl.col("end_ns").cast(pl.Float64)),
        keyed.height,
    )
    base = pl.DataFrame({"rank": ranks}, schema={"rank": pl.Int64})
    if ends.height == 0 or not ranks:
        return no_offsets(ranks)

    # Every (instance, rank) of `ends` has an offset and a call time: look them up (a join
    # per round would copy `ends`, one row per call and rank, twice per round).
    def offset_of(offsets: pl.DataFrame) -> pl.Expr:
        return pl.col("rank").replace_strict(offsets["rank"], offsets["offset"])

    def time_of(t: pl.DataFrame) -> pl.Expr:
        return pl.col("instance").replace_strict(t["instance"], t["t"])

    def call_times(offsets: pl.DataFrame) -> pl.DataFrame:
        return ends.group_by("instance").agg(t=(pl.col("end_ns") - offset_of(offsets)).median())

    offsets = ends.select("rank").unique().sort("rank").with_columns(offset=pl.lit(0.0))
    for _ in range(_ROUNDS):
        t = call_times(offsets)
        fitted = (
            ends.group_by("rank").agg(offset=(pl.col("end_ns") - time_of(t)).median()).sort("rank")
        )
        settled = fitted.equals(offsets)  # a fixed point: more rounds change nothing
        offsets = fitted
        if settled:
            break
    reference = offsets.filter(pl.col("rank") == offsets["rank"].min())["offset"][0]
    offsets = offsets.with_columns(pl.col("offset") - reference)
    t = call_times(offsets)
    fit = ends.group_by("rank").agg(
        residual_ns=(pl.col("end_ns") - offset_of(offsets) - time_of(t)).abs().median(),
        matched=pl.len().cast(pl.Int64),
    )
    lowest = offsets["rank"].min()
    estimate = pl.col("offset").fill_null(0.0).round().cast(pl.Int64)
    residual = pl.col("residual_ns").round().cast(pl.Int64)
    significant = (estimate.abs() >= MIN_OFFSET_NS) & (
        estimate.abs() >= SIGNIFICANCE * residual.fill_null(0)
    )
    return (
        base.join(offsets, on="rank", how="left")
        .join(fit, on="rank", how="left")
        .select(
            "rank",
            offset_ns=pl.when(significant).then(estimate).otherwise(0),
            estimate_ns=estimate,
            residual_ns=residual,
            matched=pl.col("matched").fill_null(0),
            method=pl.when(pl.col("offset").is_null())
            .then(pl.lit("none"))
            .when(pl.col("rank") == lowest)
            .then(pl.lit("reference"))
            .when(significant)
            .then(pl.lit("collective-end"))
            .otherwise(pl.lit("insignificant")),
        )
        .sort("rank")
    )


def no_offsets(ranks: list[int]) -> pl.DataFrame:
    """The offsets table when alignment is turned off."""
    return pl.DataFrame(
        {"rank": ranks},
        schema={"rank": pl.Int64},
    ).with_columns(
        offset_ns=pl.lit(0, dtype=pl.Int64),
        estimate_ns=pl.lit(None, dtype=pl.Int64),
        residual_ns=pl.lit(None, dtype=pl.Int64),
        matched=pl.lit(0, dtype=pl.Int64),
        method=pl.lit("none"),
    )


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
