"""What each rank of a group sends and receives in its all-to-alls, and how uneven each call is.

Why: in a mixture-of-experts layer what a rank receives at dispatch is the tokens its experts
compute: a rank that receives more works longer and reaches the group's next call later, and
a call ends when its busiest receiver is done. The derived table `all_to_all_volume`, from
the calls' input and output sizes (PyTorch's all_to_allv moves what its split sizes say).
"""

from __future__ import annotations

import polars as pl

from kineto_comm.analysis.view import TableView, memo

VOLUME_SCHEMA: dict[str, pl.DataType] = {
    "process_group": pl.String(),
    "rank": pl.Int64(),
    "calls": pl.Int64(),
    "sent_bytes": pl.Int64(),
    "received_bytes": pl.Int64(),
    "received_vs_mean": pl.Float64(),
    "call_imbalance": pl.Float64(),
}


def all_to_all_volume(tables: TableView) -> pl.DataFrame:
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
    schema = VOLUME_SCHEMA
    need = ("rank", "process_group", "collective", "call_index", "group_size")
    need += ("in_bytes", "out_bytes")
    if not tables.has("collectives", *need):
        return pl.DataFrame(schema=schema)
    return memo(tables, "all_to_all_volume", lambda: _volume(tables, need, schema))


def _volume(tables: TableView, need: tuple[str, ...], schema: dict) -> pl.DataFrame:
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
