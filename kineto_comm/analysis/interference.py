"""Overlap is not free: how much slower kernels run while the other kind runs beside them.

Overlapped communication shares the GPU's SMs and memory bandwidth with the compute beside it
(NVIDIA/nccl #1428, #1433: a GEMM at 1.18 ms alone, 2.08 ms overlapped). Per rank, a compute
kernel is `overlapped` when a communication kernel of its rank runs during it (its time the
union of the rank's communication leaves uncovered, kineto_comm.analysis.overlap), else
`alone`. Kernels of one call site are compared: the name and CONTEXT neighbours each side on
its stream (the kernels table has no launch shape; a model's layers repeat the sequence), with
MIN_SAMPLES on each side and each side of one shape (SPREAD). `slowdown` = overlapped median /
alone median - 1; `extra_ns`, what overlap cost, = the overlapped time x slowdown / (1 +
slowdown) (each kernel at its alone speed), 0 where not slower; per step over the rank's
steps. Overlapped kernels of a name at sites never seen alone get the name's slowdown over
its compared sites (`measured` false). Collectives of one (collective, process group,
bytes) are compared the same way with and without compute beside them (their duration
includes waiting for the group: evidence only). Host timelines (CPU-only) have no rows.
Column-wise Polars, a few ranks at a time; docs/tables.md `interference`.
"""

from __future__ import annotations

import polars as pl

from kineto_comm.analysis.overlap import merge_intervals, uncovered_ns
from kineto_comm.rank_store import RankStore

# Kernels of a class needed on each side (overlapped, alone) for a comparison.
MIN_SAMPLES = 3
# Kernels of one call site on one side are one shape when their 90th percentile is at most
# this many times their 10th: a class holding several shapes is no comparison.
SPREAD = 1.25
# Neighbours on each side that name a call site.
CONTEXT = 2
SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "kind": pl.String(),
    "name": pl.String(),
    "before": pl.String(),
    "after": pl.String(),
    "process_group": pl.String(),
    "bytes": pl.Int64(),
    "overlapped": pl.Int64(),
    "alone": pl.Int64(),
    "overlapped_median_ns": pl.Int64(),
    "alone_median_ns": pl.Int64(),
    "slowdown": pl.Float64(),
    "measured": pl.Boolean(),
    "overlapped_ns": pl.Int64(),
    "extra_ns": pl.Int64(),
    "steps": pl.Int64(),
    "extra_ns_per_step": pl.Int64(),
}
KERNEL_COLUMNS = ["rank", "device", "stream", "kind", "name", "start_ns", "end_ns", "step"]
CALL_COLUMNS = ["rank", "collective", "process_group", "bytes", "start_ns", "end_ns"]


def empty() -> pl.DataFrame:
    """The table with no rows."""
    return pl.DataFrame(schema=SCHEMA)


def _covered(pieces: pl.DataFrame, others: pl.DataFrame) -> pl.Series:
    """Per row of `pieces` (rank, start_ns, end_ns): whether any interval of `others` (rank,
    start_ns, end_ns) of its rank overlaps it."""
    cover = merge_intervals(others, ["rank"]).sort("rank", "start_ns")
    length = (pieces["end_ns"] - pieces["start_ns"]).clip(lower_bound=0)
    return uncovered_ns(pieces, cover) < length


def _compare(rows: pl.DataFrame, keys: list[str], steps: pl.DataFrame) -> pl.DataFrame:
    """rows: rank, *keys, dur, overlapped (bool) -> one row per class with both sides."""
    dur, over = pl.col("dur"), pl.col("overlapped")

    def spread(side: pl.Expr) -> pl.Expr:
        d = dur.filter(side)
        return d.quantile(0.9, "nearest") / d.quantile(0.1, "nearest").clip(lower_bound=1)

    per = (
        rows.group_by("rank", *keys)
        .agg(
            overlapped=over.sum().cast(pl.Int64),
            alone=(~over).sum().cast(pl.Int64),
            overlapped_median_ns=dur.filter(over).median(),
            alone_median_ns=dur.filter(~over).median(),
            overlapped_ns=dur.filter(over).sum(),
            _spread=pl.max_horizontal(spread(over), spread(~over)),
        )
        .filter(
            (pl.col("overlapped") >= MIN_SAMPLES)
            & (pl.col("alone") >= MIN_SAMPLES)
            & (pl.col("_spread") <= SPREAD)
        )
        .drop("_spread")
    )
    ratio = pl.col("overlapped_median_ns") / pl.col("alone_median_ns")
    slow = (ratio - 1.0).fill_nan(0.0)
    return (
        per.with_columns(slowdown=slow)
        .with_columns(
            extra_ns=(pl.col("overlapped_ns") * (slow / (1.0 + slow)))
            .clip(lower_bound=0)
            .round()
            .cast(pl.Int64),
            overlapped_median_ns=pl.col("overlapped_median_ns").round().cast(pl.Int64),
            alone_median_ns=pl.col("alone_median_ns").round().cast(pl.Int64),
        )
        .join(steps, on="rank", how="left")
        .with_columns(extra_ns_per_step=pl.col("extra_ns") // pl.col("steps").clip(lower_bound=1))
    )


def _sites(compute: pl.DataFrame, comm: pl.DataFrame) -> pl.DataFrame:
    """rank, name, before, after, dur, overlapped per compute kernel: its call site is its
    name and CONTEXT neighbours each side on its stream (the layers of a model repeat them;
    the kernels table has no launch shape)."""
    near = pl.col("name").fill_null("")

    def side(shifts: range) -> pl.Expr:
        return pl.concat_str(
            [near.shift(i).over("rank", "stream") for i in shifts], separator=" > "
        )

    return compute.select(
        "rank",
        "name",
        before=side(range(CONTEXT, 0, -1)),
        after=side(range(-1, -CONTEXT - 1, -1)),
        dur=pl.col("end_ns") - pl.col("start_ns"),
        overlapped=_covered(compute, comm),
    )


def _elsewhere(rows: pl.DataFrame, sites: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, name), its overlapped kernels at call sites never compared (never seen
    alone), at the name's slowdown over its compared sites (their overlapped time over that
    time at alone speed, less 1): `measured` false."""
    keys = ["rank", "name", "before", "after"]
    by_name = (
        sites.group_by("rank", "name")
        .agg(
            _ns=pl.col("overlapped_ns").sum(),
            _alone_ns=(pl.col("overlapped_ns") / (1.0 + pl.col("slowdown"))).sum(),
        )
        .with_columns(slowdown=pl.col("_ns") / pl.col("_alone_ns") - 1.0)
        .filter(pl.col("slowdown") > 0)
        .select("rank", "name", "slowdown")
    )
    rest = (
        rows.filter(pl.col("overlapped"))
        .join(sites.select(keys), on=keys, how="anti", nulls_equal=True)
        .join(by_name, on=["rank", "name"], how="inner")
        .group_by("rank", "name")
        .agg(
            overlapped=pl.len().cast(pl.Int64),
            overlapped_median_ns=pl.col("dur").median().round().cast(pl.Int64),
            overlapped_ns=pl.col("dur").sum(),
            slowdown=pl.col("slowdown").first(),
        )
    )
    s = pl.col("slowdown")
    return (
        rest.with_columns(
            alone=pl.lit(0, dtype=pl.Int64),
            alone_median_ns=pl.lit(None, dtype=pl.Int64),
            extra_ns=(pl.col("overlapped_ns") * (s / (1.0 + s))).round().cast(pl.Int64),
            before=pl.lit(None, dtype=pl.String),
            after=pl.lit(None, dtype=pl.String),
            measured=pl.lit(False),
        )
        .join(steps, on="rank", how="left")
        .with_columns(extra_ns_per_step=pl.col("extra_ns") // pl.col("steps").clip(lower_bound=1))
    )


def interference(kernels: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """The `interference` rows (SCHEMA) of the ranks in `kernels` (KERNEL_COLUMNS, each
    rank's rows in start order, as the kernels table holds them) and `calls` (CALL_COLUMNS,
    the same ranks' collectives)."""
    k = kernels.filter((pl.col("device") >= 0) & (pl.col("end_ns") > pl.col("start_ns")))
    compute = k.filter(pl.col("kind") == "compute")
    comm = k.filter(pl.col("kind") == "communication")
    if compute.height == 0 or comm.height == 0:
        return empty()
    # Steps per rank: the numbered steps its compute kernels were launched in (1 without).
    steps = compute.group_by("rank").agg(
        steps=pl.col("step")
        .filter(pl.col("step") >= 0)
        .n_unique()
        .clip(lower_bound=1)
        .cast(pl.Int64)
    )
    rows = _sites(compute, comm)
    sites = _compare(rows, ["name", "before", "after"], steps)
    parts = [sites.with_columns(measured=pl.lit(True)), _elsewhere(rows, sites, steps)]
    parts = [
        p.with_columns(
            kind=pl.lit("compute"),
            process_group=pl.lit(None, dtype=pl.String),
            bytes=pl.lit(None, dtype=pl.Int64),
        )
        for p in parts
    ]
    c = calls.filter(pl.col("end_ns") > pl.col("start_ns")).join(
        compute.select("rank").unique(), on="rank", how="semi"
    )
    if c.height:
        calls_rows = c.select(
            "rank",
            name=pl.col("collective"),
            process_group=pl.col("process_group").cast(pl.String).fill_null("?"),
            bytes=pl.col("bytes").cast(pl.Int64),
            dur=pl.col("end_ns") - pl.col("start_ns"),
            overlapped=_covered(c, compute),
        )
        parts.append(
            _compare(calls_rows, ["name", "process_group", "bytes"], steps).with_columns(
                kind=pl.lit("communication"),
                before=pl.lit(None, dtype=pl.String),
                after=pl.lit(None, dtype=pl.String),
                measured=pl.lit(True),
            )
        )
    out = pl.concat([p.select(list(SCHEMA)) for p in parts], how="vertical_relaxed").cast(SCHEMA)
    order = ["rank", "kind", "extra_ns", "name"]
    return out.sort(order, descending=[False, False, True, False], nulls_last=True)


def job_interference(kernels: RankStore, calls: RankStore) -> pl.DataFrame:
    """interference() over every rank of the stores, a few whole ranks at a time."""
    if kernels.height == 0 or not set(KERNEL_COLUMNS) <= set(kernels.columns):
        return empty()
    have_calls = calls.height > 0 and set(CALL_COLUMNS) <= set(calls.columns)
    out = []
    for batch in kernels.batches(columns=KERNEL_COLUMNS):
        ranks = batch["rank"].unique().to_list()
        if have_calls:
            parts = list(calls.batches(ranks=ranks, columns=CALL_COLUMNS))
            got = pl.concat(parts, how="vertical_relaxed") if parts else None
        else:
            got = None
        if got is None:
            got = pl.DataFrame(schema={c: pl.Int64 for c in CALL_COLUMNS}).with_columns(
                pl.col("collective", "process_group").cast(pl.String)
            )
        out.append(interference(batch, got))
    return pl.concat(out, how="vertical_relaxed") if out else empty()
