"""Storms: long runs of small, back-to-back collectives that are bound by latency, not bandwidth.

Why: a collective of a few KiB costs roughly the fixed latency of a call (launch, NCCL/gloo
setup, a network round trip), so thousands of them in a row — DDP with tiny buckets,
per-parameter all-reduces, unfused point-to-point exchanges — take far longer than the same
bytes in a few large calls. A storm row says how long such a run held the rank, what bandwidth
it achieved and how much of its time was latency.

A run (per rank, step, process_group and collective, in start order) is a maximal sequence of
consecutive small calls (`bytes` < `small_bytes`, 64 KiB), each starting soon after the
previous one ends; runs of at least `min_calls` calls are storms (the `storms` table,
docs/tables.md). The run's rule and each column in full: docs/analyses.md.
"""

from __future__ import annotations

import polars as pl

from kineto_comm.analysis.bandwidth import busbw_factor, busbw_gbps
from kineto_comm.analysis.sizes import MEDIUM_BYTES, SMALL_BYTES, group_key
from kineto_comm.lazy import collect, sample
from kineto_comm.rank_store import RankStore, as_store

# In full: docs/analyses.md, "Small-message storms".

STORM_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "process_group": pl.String(),
    "collective": pl.String(),
    "step": pl.Int64(),
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "calls": pl.Int64(),
    "bytes": pl.Int64(),
    "time_ns": pl.Int64(),
    "busbw_gbps": pl.Float64(),
    "reference_busbw_gbps": pl.Float64(),
    "latency_bound_share": pl.Float64(),
}
_KEY = ["rank", "step", "process_group", "collective"]


def reference_busbw(
    collectives: pl.DataFrame | RankStore, large_quantile: float = 0.9
) -> pl.DataFrame:
    """Per (process_group, collective): the busbw its large messages reach (see module doc).

    Above SAMPLE_ROWS calls, the quantile is taken over every k-th call of each rank (by
    `call_index`): a quantile holds its values whole, the sample a bounded number of them."""
    store = as_store(collectives)
    size = pl.col("bytes")
    bw = busbw_gbps(size, pl.col("duration_ns"), pl.col("collective"), pl.col("group_size"))
    keys = ["process_group", "collective"]
    calls = store.lazy([*keys, "bytes", "duration_ns", "group_size", "call_index"]).select(
        group_key(), "collective", "bytes", "call_index", _bw=bw
    )
    large = (
        sample(calls, store.height, "call_index")
        .filter(size >= MEDIUM_BYTES)
        .group_by(keys)
        .agg(_large=pl.col("_bw").quantile(large_quantile))
    )
    best = calls.group_by(keys).agg(_best=pl.when(size >= SMALL_BYTES).then(pl.col("_bw")).max())
    return collect(
        best.join(large, on=keys, how="left").select(
            *keys, reference_busbw_gbps=pl.coalesce("_large", "_best").cast(pl.Float64)
        ),
        store.height,
    )


def storms(
    collectives: pl.DataFrame | RankStore,
    min_calls: int = 32,
    small_bytes: int = SMALL_BYTES,
    gap_factor: float = 4.0,
    min_gap_ns: int = 20_000,
) -> pl.DataFrame:
    """Runs of >= min_calls small back-to-back calls per rank, step and (group, collective),
    found a batch of whole ranks at a time."""
    store = as_store(collectives)
    if store.height == 0:
        return pl.DataFrame(schema=STORM_SCHEMA)
    columns = [*_KEY, "start_ns", "end_ns", "duration_ns", "bytes", "group_size"]
    found = [
        _runs(batch, min_calls, small_bytes, gap_factor, min_gap_ns)
        for batch in store.batches(columns=columns)
    ]
    runs = found[0] if len(found) == 1 else pl.concat(found)
    if runs.height == 0:
        return pl.DataFrame(schema=STORM_SCHEMA)
    coll, n = pl.col("collective"), pl.col("_n")
    ref = pl.col("reference_busbw_gbps")
    ideal_ns = pl.col("bytes").cast(pl.Float64) * busbw_factor(coll, n) / ref
    return (
        runs.join(reference_busbw(store), on=["process_group", "collective"], how="left")
        .with_columns(
            busbw_gbps=busbw_gbps(pl.col("bytes"), pl.col("time_ns"), coll, n),
            latency_bound_share=pl.when((ref > 0) & (pl.col("time_ns") > 0))
            .then((1.0 - ideal_ns / pl.col("time_ns")).clip(0.0, 1.0))
            .otherwise(None),
        )
        .sort("rank", "step", "start_ns")
        .select(list(STORM_SCHEMA))
        .cast(STORM_SCHEMA)
    )


def _runs(
    collectives: pl.DataFrame,
    min_calls: int,
    small_bytes: int,
    gap_factor: float,
    min_gap_ns: int,
) -> pl.DataFrame:
    """The storms of whole ranks' calls, before their bandwidth is known."""
    # Rows sorted by key and start: the previous call of the same key is the previous row,
    # unless the key changed there (shifts masked at key boundaries; windows over 100,000s of
    # small keys are slow).
    same_key = pl.all_horizontal(pl.col(k).eq_missing(pl.col(k).shift(1)) for k in _KEY)

    def previous(x: pl.Expr) -> pl.Expr:
        return pl.when(same_key).then(x.shift(1))

    dur = pl.col("duration_ns")
    gap = pl.col("start_ns") - previous(pl.col("end_ns"))
    limit = pl.max_horizontal(gap_factor * (dur + previous(dur)) / 2.0, pl.lit(min_gap_ns))
    small = (pl.col("bytes") < small_bytes).fill_null(False)
    prev_small = previous(small)
    # A new run starts at the first call of a key, after a large call, or after a long gap.
    starts = prev_small.is_null() | ~prev_small | (gap > limit).fill_null(True)
    calls = (
        collectives.select(*_KEY, "start_ns", "end_ns", "duration_ns", "bytes", "group_size")
        .with_columns(group_key())
        .sort([*_KEY, "start_ns"])
        .with_columns(_small=small, _run=starts.cast(pl.Int64).cum_sum())
        .filter(pl.col("_small"))
    )
    return (
        calls.group_by([*_KEY, "_run"])
        .agg(
            start_ns=pl.col("start_ns").min(),
            end_ns=pl.col("end_ns").max(),
            calls=pl.len().cast(pl.Int64),
            bytes=pl.col("bytes").sum().cast(pl.Int64),
            _n=pl.col("group_size").drop_nulls().mode().min(),
        )
        .filter(pl.col("calls") >= min_calls)
        .with_columns(time_ns=pl.col("end_ns") - pl.col("start_ns"))
    )
