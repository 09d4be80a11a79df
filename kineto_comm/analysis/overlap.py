"""Where each rank's device time went: compute, communication, their overlap, and idle time.

One sweep per rank: every kernel adds one to its kind's count where it starts and removes it
where it ends; each segment between two event times goes to every metric its state
satisfies (compute_ns, comm_ns, overlap_ns, exposed_comm_ns, memcpy_ns, memset_ns, busy_ns,
idle_ns, wall_ns), per step window, with the window's compute edges. Why: it is HTA's
definition of compute/communication overlap (`get_comm_comp_overlap`; overlap_ns / comm_ns
equals its ratio over the same kernels), so the numbers can be checked against it.

The interval arithmetic the model of time and the stragglers share lives here too:
merge_intervals and subtract_intervals (unions and differences per group),
disjoint_pieces (labelled pieces made disjoint, the earlier keeping shared time) and
uncovered_ns (each piece's time outside a cover). The sweep and each metric in full:
docs/analyses.md.
"""

from __future__ import annotations

from typing import TypeVar

import polars as pl

from kineto_comm.keys import pair_key
from kineto_comm.lazy import collect, collect_all

# In full: docs/analyses.md, "Each step's time breakdown".

# merge_intervals and subtract_intervals work on eager and lazy frames alike.
Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame)

BITS = {"compute": 1, "communication": 2, "memcpy": 4, "memset": 8}
EDGES = ("start_ns", "end_ns")
METRICS = (
    "wall_ns",
    "busy_ns",
    "compute_ns",
    "comm_ns",
    "overlap_ns",
    "exposed_comm_ns",
    "memcpy_ns",
    "memset_ns",
    "idle_ns",
)
COMPUTE_EDGES = ("compute_start_ns", "compute_end_ns")


def merge_intervals(intervals: Frame, by: list[str]) -> Frame:
    """Union of [start_ns, end_ns) intervals within each `by` group, as disjoint intervals."""
    ordered = intervals.select(*by, "start_ns", "end_ns").sort([*by, "start_ns"])
    reach = pl.col("end_ns").cum_max().shift(1).over(by)
    grouped = ordered.with_columns(
        _new=(reach.is_null() | (pl.col("start_ns") > reach)).cast(pl.Int64)
    ).with_columns(_grp=pl.col("_new").cum_sum().over(by))
    return (
        grouped.group_by([*by, "_grp"], maintain_order=True)
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
        .drop("_grp")
    )


def subtract_intervals(keep: Frame, remove: Frame, by: list[str]) -> Frame:
    """The parts of `keep`'s union not covered by `remove`'s union, per `by` group."""
    a = merge_intervals(keep, by)
    b = merge_intervals(remove, by)
    events = pl.concat(
        [
            a.select(*by, t="start_ns", delta=pl.lit(1)),
            a.select(*by, t="end_ns", delta=pl.lit(-1)),
            b.select(*by, t="start_ns", delta=pl.lit(2)),
            b.select(*by, t="end_ns", delta=pl.lit(-2)),
        ],
        how="vertical",
    )
    return (
        events.group_by(*by, "t")
        .agg(pl.col("delta").sum())
        .sort(*by, "t")
        .with_columns(
            state=pl.col("delta").cum_sum().over(by), end_ns=pl.col("t").shift(-1).over(by)
        )
        .filter((pl.col("state") == 1) & (pl.col("end_ns") > pl.col("t")))
        .select(*by, start_ns="t", end_ns="end_ns")
    )


def disjoint_pieces(pieces: pl.DataFrame, ordered: bool = False) -> pl.DataFrame:
    """`pieces` made disjoint per rank in start order: each starts no earlier than every
    earlier piece's end (the earlier one keeps the shared time); empty ones dropped.
    `ordered`: the rows already come in (rank, start) order, each rank's rows together (the
    kernels table's order): no sort."""
    reach = pl.col("end_ns").cum_max().shift(1).over("rank")
    if not ordered:
        # Ties broken by every column: the same pieces give the same result in any input
        # order (a big job's ranks are built in batches of other sizes).
        rest = sorted(c for c in pieces.columns if c not in ("rank", "start_ns", "end_ns"))
        query = pieces.lazy().sort(["rank", "start_ns", "end_ns", *rest], nulls_last=True)
    else:
        query = pieces.lazy()
    return (
        query.with_columns(
            start_ns=pl.max_horizontal("start_ns", reach.fill_null(pl.col("start_ns")))
        )
        .filter(pl.col("end_ns") > pl.col("start_ns"))
        .collect()
    )


def uncovered_ns(pieces: pl.DataFrame, cover: pl.DataFrame) -> pl.Series:
    """Per row of `pieces` (rank, start_ns, end_ns), its ns that `cover` does not cover;
    `cover` is disjoint per rank and in (rank, start) order (from disjoint_pieces): a
    cumulative "covered before t" read at both ends."""
    length = (pieces["end_ns"] - pieces["start_ns"]).clip(lower_bound=0)
    if cover.height == 0 or pieces.height == 0:
        return length
    union = (
        cover.lazy()
        .select("rank", "start_ns", "end_ns")
        .with_columns(_len=pl.col("end_ns") - pl.col("start_ns"))
        .with_columns(_acc=pl.col("_len").cum_sum().over("rank") - pl.col("_len"))
        .select("rank", _us="start_ns", _ue="end_ns", _acc="_acc")
    )

    def before(column: str) -> pl.Series:
        hit = (
            pieces.lazy()
            .select("rank", _t=pl.col(column))
            .with_row_index("_row")
            .sort("_t")
            .join_asof(
                union,
                left_on="_t",
                right_on="_us",
                by="rank",
                strategy="backward",
                check_sortedness=False,
            )
            .sort("_row")
        )
        inside = (pl.min_horizontal("_t", "_ue") - pl.col("_us")).clip(lower_bound=0)
        return hit.select((pl.col("_acc") + inside).fill_null(0)).collect().to_series()

    return (length - (before("end_ns") - before("start_ns"))).clip(lower_bound=0)


def breakdown(kernels: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Time metrics per window.

    kernels: rank, kind, start_ns, end_ns.  windows: rank, window, start_ns, end_ns (windows
    of one rank must not overlap). Returns rank, window, start_ns, end_ns, METRICS and
    COMPUTE_EDGES.
    """
    return breakdowns(kernels, [windows])[0]


def breakdowns(kernels: pl.DataFrame, window_sets: list[pl.DataFrame]) -> list[pl.DataFrame]:
    """breakdown() for several sets of windows (e.g. the steps and the whole trace), sharing
    the sweep: windows of different sets may overlap."""
    # One rank (a file modelled alone): the rank needs no sorting and no matching.
    ranks = {r for f in (kernels, *window_sets) for r in f.get_column("rank").unique()}
    one_rank = len(ranks) <= 1
    wins = [
        w.lazy()
        .select(pl.col("rank").cast(pl.Int64), "window", "start_ns", "end_ns")
        .filter(pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null())
        for w in window_sets
    ]
    counts = [f"_n_{kind}" for kind in BITS]
    spans = (
        kernels.lazy()
        .filter(pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null())
        .select(
            pl.col("rank").cast(pl.Int64),
            "start_ns",
            "end_ns",
            *[
                (pl.col("kind") == kind).cast(pl.Int64).alias(n)
                for kind, n in zip(BITS, counts, strict=True)
            ],
        )
    )
    zero = [pl.lit(0, dtype=pl.Int64).alias(n) for n in counts]
    events = pl.concat(
        [
            spans.select("rank", pl.col("start_ns").alias("t"), *counts),
            spans.select("rank", pl.col("end_ns").alias("t"), *[-pl.col(n) for n in counts]),
            *[w.select("rank", pl.col(edge).alias("t"), *zero) for w in wins for edge in EDGES],
        ],
        how="vertical",
    )
    # Sorted by (rank, t). Each rank's changes sum to zero, so sums over the whole table are
    # the per-rank sums. Of several events at one time only the last keeps a positive
    # length, and its sums include them all (so their order does not matter).
    state = pl.sum_horizontal(
        (pl.col(n).cum_sum() > 0).cast(pl.Int64) * bit
        for n, bit in zip(counts, BITS.values(), strict=True)
    )
    same_rank = pl.lit(True) if one_rank else pl.col("rank").shift(-1) == pl.col("rank")
    ordered = events.sort("t") if one_rank else _rank_time_order(collect(events)).lazy()
    segments = ordered.select(
        "rank",
        "t",
        state=state,
        dur=pl.when(same_rank).then(pl.col("t").shift(-1) - pl.col("t")).otherwise(0),
    ).filter(pl.col("dur") > 0)
    return collect_all([_per_window(segments, w, one_rank) for w in wins])


def _rank_time_order(events: pl.DataFrame) -> pl.DataFrame:
    """The events sorted by (rank, t): by one integer key where it fits (kineto_comm.keys),
    which took a third of the time of two sorts, or of one two-key sort, on a batch of rank
    files (bench/README.md, eleventh session)."""
    key = pair_key([events], "rank", "t")
    if key is None:
        return events.sort("t").sort("rank", maintain_order=True)
    return events.sort(key)


def _per_window(segments: pl.LazyFrame, win: pl.LazyFrame, one_rank: bool) -> pl.LazyFrame:
    """Sum the sweep's segments into the (non-overlapping) windows that hold them."""
    starts = win.sort("start_ns").rename({"start_ns": "w_start", "end_ns": "w_end"})
    placed = segments.join_asof(
        starts.drop("rank") if one_rank else starts,
        left_on="t",
        right_on="w_start",
        by=None if one_rank else "rank",
        strategy="backward",
        check_sortedness=False,
    ).filter(pl.col("window").is_not_null() & (pl.col("t") < pl.col("w_end")))
    s = pl.col("state")

    def total(cond: pl.Expr) -> pl.Expr:
        return pl.col("dur").filter(cond).sum()

    # Time per state first (at most 16 per window), then the metrics from those few rows.
    by_state = placed.group_by("rank", "window", "state").agg(
        pl.col("dur").sum(), _from=pl.col("t").min(), _to=(pl.col("t") + pl.col("dur")).max()
    )
    computing = (s & 1) != 0
    sums = by_state.group_by("rank", "window").agg(
        compute_start_ns=pl.col("_from").filter(computing).min(),
        compute_end_ns=pl.col("_to").filter(computing).max(),
        busy_ns=total(s != 0),
        compute_ns=total(computing),
        comm_ns=total((s & 2) != 0),
        overlap_ns=total((s & 3) == 3),
        exposed_comm_ns=total(((s & 2) != 0) & ((s & 1) == 0)),
        memcpy_ns=total((s & 4) != 0),
        memset_ns=total((s & 8) != 0),
    )
    out = win.join(sums, on=["rank", "window"], how="left").with_columns(
        pl.col(c).fill_null(0)
        for c in ("busy_ns", "compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns")
        + ("memcpy_ns", "memset_ns")
    )
    return out.with_columns(
        wall_ns=pl.col("end_ns") - pl.col("start_ns"),
        idle_ns=pl.col("end_ns") - pl.col("start_ns") - pl.col("busy_ns"),
    ).select("rank", "window", "start_ns", "end_ns", *METRICS, *COMPUTE_EDGES)
