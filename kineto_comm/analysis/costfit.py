"""What a collective costs per call: latency + bytes / bandwidth, fitted per group, and what
merging its calls would save.

Why: a collective that cannot be hidden can only be made cheaper, and whether fewer, bigger
calls help depends on where its time goes. A call of a few hundred KB that takes 18 ms is
almost all fixed cost (latency, synchronisation, a device shared with other ranks): merging
four of them into one saves three latencies. One that moves its bytes near the link's speed
gains nothing from merging. The fit says which, and how much: `cost_fit` per
(process_group, collective) over each call's transfer time, `merge_removal` the replay of
"merge these n calls into m" per rank and step; `job_cost_fit` and `job_merge_removal` run
them over a job's tables (derived table `cost_fit`). In full: docs/analyses.md, "The cost fit".
"""

from __future__ import annotations

import polars as pl

from kineto_comm.analysis.bandwidth import busbw_factor, group_size
from kineto_comm.analysis.exposure import collective_exposure_lazy
from kineto_comm.analysis.platform import job_platform
from kineto_comm.analysis.sizes import UNKNOWN_GROUP
from kineto_comm.analysis.view import TableView, memo

# Message sizes must span this ratio for the slope of the fit to mean anything.
SPREAD = 2.0
# Without sizes: the quantile of the per-call transfer times taken as the latency, and the
# multiple of it above which a call is taken as moving bulk data (not merged).
TIMES_QUANTILE = 0.25
LARGE_FACTOR = 4.0
KEYS = ["process_group", "collective"]
FIT_SCHEMA: dict[str, pl.DataType] = {
    "process_group": pl.String(),
    "collective": pl.String(),
    "calls": pl.Int64(),
    "sizes": pl.Int64(),
    "median_bytes": pl.Float64(),
    "median_ns": pl.Float64(),
    "latency_ns": pl.Float64(),
    "busbw_gbps": pl.Float64(),
    "latency_share": pl.Float64(),
    "method": pl.String(),
}


def cost_fit(calls: pl.DataFrame | pl.LazyFrame, prior_busbw_gbps: float) -> pl.DataFrame:
    """Per (process_group, collective): the fit of FIT_SCHEMA (module doc). `calls` has
    process_group, collective, bytes (null: unknown), n (the group's size) and transfer_ns;
    `latency_share` is the latency's share of the median call's time (0..1)."""
    c = (
        calls.lazy()
        .select(
            pl.col("process_group").cast(pl.String),
            pl.col("collective").cast(pl.String),
            pl.col("bytes").cast(pl.Float64),
            pl.col("transfer_ns").cast(pl.Float64),
            _f=busbw_factor(pl.col("collective"), pl.col("n")).fill_null(1.0),
        )
        .filter(pl.col("transfer_ns") > 0)
    )
    whole = c.group_by(KEYS).agg(
        calls=pl.len().cast(pl.Int64),
        sizes=pl.col("bytes").drop_nulls().n_unique().cast(pl.Int64),
        median_bytes=pl.col("bytes").median(),
        median_ns=pl.col("transfer_ns").median(),
        _floor=pl.col("transfer_ns").quantile(TIMES_QUANTILE),
    )
    x, y = pl.col("x"), pl.col("t")
    points = (
        c.filter(pl.col("bytes").is_not_null())
        .group_by(*KEYS, "bytes")
        .agg(t=pl.col("transfer_ns").median(), x=(pl.col("bytes") * pl.col("_f")).median())
    )
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    line = points.group_by(KEYS).agg(
        _slope=pl.when((x.min() > 0) & (x.max() >= SPREAD * x.min())).then(slope),
        _xm=x.mean(),
        _ym=y.mean(),
        _seen=(x / y).max(),
    )
    fitted = (pl.col("_slope") > 0).fill_null(False)
    bw = (
        pl.when(fitted)
        .then(1.0 / pl.col("_slope"))
        .otherwise(pl.max_horizontal(pl.lit(float(prior_busbw_gbps)), pl.col("_seen")))
    )
    per = line.with_columns(busbw_gbps=bw)
    beyond = (
        points.join(per.select(*KEYS, "busbw_gbps"), on=KEYS)
        .group_by(KEYS)
        .agg(_beyond=(y - x / pl.col("busbw_gbps")).median())
    )
    per = per.join(beyond, on=KEYS, how="left").with_columns(
        latency_ns=pl.when(fitted)
        .then(pl.col("_ym") - pl.col("_slope") * pl.col("_xm"))
        .otherwise(pl.col("_beyond"))
        .clip(lower_bound=0.0),
        method=pl.when(fitted).then(pl.lit("fit")).otherwise(pl.lit("prior bandwidth")),
    )
    out = whole.join(
        per.select(*KEYS, "latency_ns", "busbw_gbps", "method"), on=KEYS, how="left"
    ).with_columns(
        latency_ns=pl.coalesce("latency_ns", "_floor"),
        method=pl.coalesce("method", pl.lit("times")),
    )
    return (
        out.with_columns(
            latency_share=pl.when(pl.col("median_ns") > 0)
            .then((pl.col("latency_ns") / pl.col("median_ns")).clip(0.0, 1.0))
            .otherwise(0.0)
        )
        .select(list(FIT_SCHEMA))
        .collect()
        .cast(FIT_SCHEMA)
    )


def merge_removal(
    calls: pl.DataFrame | pl.LazyFrame, fit: pl.DataFrame, target_bytes: int
) -> pl.DataFrame:
    """rank, step, process_group, collective, n, m, transfer_ns, removed_ns: per rank and
    step, the calls of each fitted (process_group, collective) merged into m (module doc) and
    the transfer time that removes. `calls` has rank, step, process_group, collective, bytes
    and transfer_ns."""
    lat = pl.col("latency_ns")
    t = pl.col("transfer_ns").cast(pl.Float64).clip(lower_bound=0.0)
    sized = pl.col("bytes").is_not_null()
    merged = pl.when(sized).then(pl.col("bytes") < target_bytes).otherwise(t <= LARGE_FACTOR * lat)
    rows = (
        calls.lazy()
        .select(
            "rank",
            "step",
            pl.col("process_group").cast(pl.String),
            pl.col("collective").cast(pl.String),
            "bytes",
            "transfer_ns",
        )
        .join(fit.lazy().select(*KEYS, "latency_ns"), on=KEYS, how="inner")
        .with_columns(_merged=merged.fill_null(False))
    )
    keys = ["rank", "step", *KEYS]
    per = rows.group_by(keys).agg(
        n=pl.len().cast(pl.Int64),
        transfer_ns=t.sum(),
        _k=pl.col("_merged").sum().cast(pl.Int64),
        _lat=pl.when(pl.col("_merged")).then(pl.min_horizontal(t, lat)).otherwise(0.0).sum(),
        _bytes=pl.when(pl.col("_merged")).then(pl.col("bytes")).sum(),
        _sized=(pl.col("_merged") & sized).any(),
        latency_ns=lat.first(),
    )
    m_merged = (
        pl.when(pl.col("_k") == 0)
        .then(0)
        .when(pl.col("_sized"))
        .then((pl.col("_bytes") / target_bytes).ceil().clip(lower_bound=1))
        .otherwise(1)
        .cast(pl.Int64)
    )
    return (
        per.with_columns(_m=m_merged)
        .with_columns(
            m=pl.col("n") - pl.col("_k") + pl.col("_m"),
            removed_ns=(pl.col("_lat") - pl.col("_m") * pl.col("latency_ns")).clip(lower_bound=0.0),
        )
        .select(*keys, "n", "m", "transfer_ns", "removed_ns")
        .collect()
    )


# ---------------------------------------------------------------- a job's fit (the rules' view)

# What any link of the platform moves at least (GB/s of bus bandwidth): NCCL's links (PCIe,
# NVLink, InfiniBand, even 10 GbE) and gloo's TCP. The cost fit's bandwidth where the
# message sizes do not span enough to fit one: a floor, so the latency is not overstated.
PRIOR_BUSBW_GBPS = {"device": 1.0, "host": 0.1}


def fit_calls(tables: TableView) -> pl.LazyFrame:
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


def job_cost_fit(tables: TableView) -> pl.DataFrame:
    """Per (process_group, collective): its calls' cost as latency + bytes / bandwidth
    (`cost_fit` above: calls, sizes, median_bytes, median_ns, latency_ns,
    busbw_gbps, latency_share, method). Where the sizes do not span enough for a fit, the
    bandwidth is at least the platform's PRIOR_BUSBW_GBPS. Computed once per rules run."""
    platform = job_platform(tables)
    gloo = platform.host or platform.backend == "gloo"
    prior = PRIOR_BUSBW_GBPS["host" if gloo else "device"]
    if not tables.has("collectives"):
        return pl.DataFrame(schema=FIT_SCHEMA)
    return memo(tables, "cost_fit", lambda: cost_fit(fit_calls(tables), prior))


def job_merge_removal(tables: TableView, target_bytes: int) -> pl.DataFrame:
    """rank, step, process_group, collective, n, m, transfer_ns, removed_ns: per rank and
    step, each (process_group, collective)'s calls below `target_bytes` merged into calls of
    about that size (without sizes: its latency-sized calls into one), and the transfer time
    the latencies saved remove, on `job_cost_fit`'s latency (`merge_removal` above)."""
    fit = job_cost_fit(tables)
    if fit.height == 0:
        return merge_removal(
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
    return memo(
        tables,
        "merge_removal",
        lambda: merge_removal(fit_calls(tables), fit, target_bytes),
        int(target_bytes),
    )
