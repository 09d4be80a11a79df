"""Message-size histograms of collectives and point-to-point transfers, all ranks together.

Why: latency, not bandwidth, bounds collectives of a few KiB (an NCCL call costs ~10-20 us
whatever its size), so a job whose communication time sits in small messages wants larger
buckets or fused calls rather than faster links. These tables show where calls and time fall.

`message_sizes` is a log2 histogram of the `bytes` column (nccl-tests' message size) per
(process_group, collective): bucket k holds sizes in [2**k, 2**(k+1)); zero-byte calls
(barriers) go in bucket -1 with `bucket_min_bytes` 0; calls whose size is unknown (null
`bytes`) go in a bucket with null `log2_bucket` and `bucket_min_bytes`, so that every call and
all of its time is counted somewhere. `message_size_summary` gives, per (process_group,
collective), the share of calls and of time below 64 KiB and below 1 MiB; calls of unknown size
count in the denominators only, and where no call has a size, `bytes` and the shares are null
(unknown, not zero). A null process group (traces without `pg_name`) is "?".
"""

from __future__ import annotations

import polars as pl

from kineto_comm.lazy import collect
from kineto_comm.model.names import POINT_TO_POINT
from kineto_comm.rank_store import RankStore, as_store

SMALL_BYTES = 64 * 1024  # below this a call is latency-bound on any interconnect
MEDIUM_BYTES = 1024 * 1024  # at and above this it approaches the link bandwidth
UNKNOWN_GROUP = "?"

MESSAGE_SIZES_SCHEMA: dict[str, pl.DataType] = {
    "process_group": pl.String(),
    "collective": pl.String(),
    "p2p": pl.Boolean(),
    "log2_bucket": pl.Int64(),
    "bucket_min_bytes": pl.Int64(),
    "calls": pl.Int64(),
    "bytes": pl.Int64(),
    "time_ns": pl.Int64(),
}
SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "process_group": pl.String(),
    "collective": pl.String(),
    "p2p": pl.Boolean(),
    "calls": pl.Int64(),
    "bytes": pl.Int64(),
    "time_ns": pl.Int64(),
    "calls_lt_64k_share": pl.Float64(),
    "time_lt_64k_share": pl.Float64(),
    "calls_lt_1m_share": pl.Float64(),
    "time_lt_1m_share": pl.Float64(),
}


def group_key() -> pl.Expr:
    """The process group name with null (no `pg_name` in the trace) spelled "?"."""
    return pl.col("process_group").fill_null(UNKNOWN_GROUP).alias("process_group")


def is_p2p(collective: pl.Expr) -> pl.Expr:
    """True for point-to-point transfers (send, recv, send_recv)."""
    return collective.is_in(list(POINT_TO_POINT))


def log2_bucket(size: pl.Expr) -> pl.Expr:
    """floor(log2(size)) exactly (integer-corrected); -1 for 0 bytes; null for null/negative."""
    size = size.cast(pl.Int64)
    positive = pl.when(size > 0).then(size).cast(pl.Float64)
    guess = positive.log(2.0).floor().cast(pl.Int64)
    low = pl.lit(2, dtype=pl.Int64).pow(guess)
    # Float log2 may land one off near large powers of two: correct with integer powers.
    fixed = (
        pl.when(low > size).then(guess - 1).when(low <= size // 2).then(guess + 1).otherwise(guess)
    )
    return pl.when(size == 0).then(pl.lit(-1, dtype=pl.Int64)).when(size > 0).then(fixed)


def message_sizes(collectives: pl.DataFrame | RankStore) -> pl.DataFrame:
    """Log2 histogram of message sizes per (process_group, collective): calls, bytes, time."""
    if collectives.height == 0:
        return pl.DataFrame(schema=MESSAGE_SIZES_SCHEMA)
    bucket = log2_bucket(pl.col("bytes"))
    return collect(
        as_store(collectives)
        .lazy(["process_group", "collective", "bytes", "duration_ns"])
        .select(
            group_key(),
            "collective",
            pl.col("bytes").cast(pl.Int64),
            pl.col("duration_ns").cast(pl.Int64),
            log2_bucket=bucket,
        )
        .group_by("process_group", "collective", "log2_bucket")
        .agg(
            calls=pl.len().cast(pl.Int64),
            bytes=pl.col("bytes").sum(),
            time_ns=pl.col("duration_ns").sum(),
        )
        .with_columns(
            p2p=is_p2p(pl.col("collective")),
            bucket_min_bytes=pl.when(pl.col("log2_bucket") >= 0)
            .then(pl.lit(2, dtype=pl.Int64).pow(pl.col("log2_bucket")))
            .when(pl.col("log2_bucket") == -1)
            .then(pl.lit(0, dtype=pl.Int64)),
        )
        .sort("process_group", "collective", "log2_bucket", nulls_last=True)
        .select(list(MESSAGE_SIZES_SCHEMA))
        .cast(MESSAGE_SIZES_SCHEMA),
        collectives.height,
    )


def message_size_summary(collectives: pl.DataFrame | RankStore) -> pl.DataFrame:
    """Per (process_group, collective): totals and the shares of calls/time below 64 KiB, 1 MiB."""
    if collectives.height == 0:
        return pl.DataFrame(schema=SUMMARY_SCHEMA)
    size = pl.col("bytes")
    dur = pl.col("duration_ns")
    total_time = dur.sum()

    sized = size.is_not_null().any()

    def shares(limit: int, tag: str) -> list[pl.Expr]:
        below = (size < limit).fill_null(False)
        return [
            pl.when(sized).then(below.mean()).alias(f"calls_lt_{tag}_share"),
            pl.when(sized & (total_time > 0))
            .then(pl.when(below).then(dur).sum() / total_time)
            .otherwise(None)
            .alias(f"time_lt_{tag}_share"),
        ]

    return collect(
        as_store(collectives)
        .lazy(["process_group", "collective", "bytes", "duration_ns"])
        .select(group_key(), "collective", "bytes", "duration_ns")
        .group_by("process_group", "collective")
        .agg(
            pl.len().cast(pl.Int64).alias("calls"),
            pl.when(sized).then(size.sum()).cast(pl.Int64).alias("bytes"),
            total_time.cast(pl.Int64).alias("time_ns"),
            *shares(SMALL_BYTES, "64k"),
            *shares(MEDIUM_BYTES, "1m"),
        )
        .with_columns(p2p=is_p2p(pl.col("collective")))
        .sort("process_group", "collective")
        .select(list(SUMMARY_SCHEMA))
        .cast(SUMMARY_SCHEMA),
        collectives.height,
    )


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
