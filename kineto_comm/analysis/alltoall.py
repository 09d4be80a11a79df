"""All-to-all exchanges: who sends how much to whom, each receiver's load, the imbalance.

An exchange is one all-to-all of a group as all its ranks made it: their calls with the same
`call_index`; `call` numbers the group's exchanges within their step from 0, so the same
exchange of every step (a mixture-of-experts layer's dispatch, its return) shares a `call`.

Pair bytes come from the sender's split sizes (`in_splits`, rows per destination rank): rank
src sends dst `rows` x in_bytes / sum(in_splits) bytes; an even split ("[]") sends in_bytes
/ n to each. Without split sizes there are no pairs; the loads still hold (out_bytes).

A receiver's load is what it received; an exchange's `imbalance` is its busiest receiver's
load over the mean receiver's: the exchange ends when the busiest receiver is done, so
balancing it saves each call's transfer time in that ratio (COMM103). Only groups whose
every rank is in the traces. In full: docs/analyses.md, "All-to-all exchanges".
"""

from __future__ import annotations

import polars as pl

from kineto_comm.analysis.view import TableView, memo

# The collectives columns read here.
COLUMNS = (
    "rank",
    "step",
    "call_index",
    "collective",
    "process_group",
    "group_size",
    "pg_ranks",
    "in_bytes",
    "out_bytes",
    "in_splits",
)
PAIRS_SCHEMA: dict[str, pl.DataType] = {
    "process_group": pl.String(),
    "step": pl.Int64(),
    "call": pl.Int64(),
    "call_index": pl.Int64(),
    "src_rank": pl.Int64(),
    "dst_rank": pl.Int64(),
    "rows": pl.Int64(),
    "bytes": pl.Int64(),
}
LOADS_SCHEMA: dict[str, pl.DataType] = {
    "process_group": pl.String(),
    "step": pl.Int64(),
    "call": pl.Int64(),
    "call_index": pl.Int64(),
    "rank": pl.Int64(),
    "sent_bytes": pl.Int64(),
    "received_bytes": pl.Int64(),
    "mean_bytes": pl.Float64(),
    "max_bytes": pl.Int64(),
    "imbalance": pl.Float64(),
}
VOLUME_SCHEMA: dict[str, pl.DataType] = {
    "process_group": pl.String(),
    "rank": pl.Int64(),
    "calls": pl.Int64(),
    "sent_bytes": pl.Int64(),
    "received_bytes": pl.Int64(),
    "received_vs_mean": pl.Float64(),
    "call_imbalance": pl.Float64(),
}


def _exchanges(calls: pl.LazyFrame) -> pl.LazyFrame:
    """The all-to-all calls of whole groups (every rank traced, size known; the unnamed
    group is one group) that carry a received size, each with its exchange's `step` (the
    lowest of its ranks') and `call` (its order among the group's exchanges of the step)."""
    a2a = calls.select(COLUMNS).filter(
        (pl.col("collective") == "all_to_all") & pl.col("out_bytes").is_not_null()
    )
    group = "process_group"
    size = pl.col("group_size").max().over(group)
    whole = size.is_not_null() & (size <= pl.col("rank").n_unique().over(group))
    a2a = a2a.with_columns(pl.col(group).cast(pl.String), pl.col("rank").cast(pl.Int64)).filter(
        whole
    )
    key = [group, "call_index"]
    step = pl.col("step").min().over(key)
    return a2a.with_columns(step=step).with_columns(
        call=pl.col("call_index").rank("dense").over(group, "step").cast(pl.Int64) - 1
    )


def all_to_all_loads(calls: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """Per exchange and rank of a whole group (LOADS_SCHEMA): what it sent and received,
    the exchange's mean and busiest receiver's load and its `imbalance` (max / mean; null
    where nothing was received). `calls`: the collectives table."""
    if not set(COLUMNS) <= set(calls.collect_schema().names()):
        return pl.DataFrame(schema=LOADS_SCHEMA)
    key = ["process_group", "call_index"]
    mean = pl.col("out_bytes").mean().over(key)
    most = pl.col("out_bytes").max().over(key)
    return (
        _exchanges(calls.lazy())
        .with_columns(mean_bytes=mean, max_bytes=most)
        .with_columns(
            sent_bytes="in_bytes",
            received_bytes="out_bytes",
            imbalance=pl.when(pl.col("mean_bytes") > 0).then(
                pl.col("max_bytes") / pl.col("mean_bytes")
            ),
        )
        .select([pl.col(c).cast(t) for c, t in LOADS_SCHEMA.items()])
        .sort("process_group", "call_index", "rank")
        .collect()
    )


def all_to_all_pairs(calls: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """Per exchange of a whole group, a row per (src_rank, dst_rank) with the rows and bytes
    src sent dst (PAIRS_SCHEMA; the module doc's derivation). Global ranks: the split's
    j-th entry is the group's j-th rank (`pg_ranks`). `calls`: the collectives table."""
    if not set(COLUMNS) <= set(calls.collect_schema().names()):
        return pl.DataFrame(schema=PAIRS_SCHEMA)
    splits = pl.col("in_splits").str.extract_all(r"\d+").cast(pl.List(pl.Int64))
    members = pl.col("pg_ranks").str.extract_all(r"\d+").cast(pl.List(pl.Int64))
    rows = (
        _exchanges(calls.lazy())
        .filter(pl.col("in_splits").is_not_null() & pl.col("in_bytes").is_not_null())
        .with_columns(_split=splits, _members=members)
        .filter(pl.col("_members").list.len() == pl.col("group_size"))
        .with_columns(
            _even=pl.col("_split").list.len() == 0,
            _total=pl.col("_split").list.sum(),
        )
        .filter(pl.col("_even") | (pl.col("_split").list.len() == pl.col("group_size")))
        .with_columns(
            _split=pl.when(pl.col("_even"))
            .then(
                pl.int_ranges(0, pl.col("group_size")).list.eval(
                    pl.when(pl.element() < 0).then(pl.element())
                )
            )
            .otherwise("_split")
        )
        .explode("_split", "_members")
    )
    share = (
        pl.when(pl.col("_even"))
        .then(pl.col("in_bytes") // pl.col("group_size"))
        .when(pl.col("_total") > 0)
        .then(pl.col("_split") * pl.col("in_bytes") // pl.col("_total"))
        .otherwise(0)
    )
    return (
        rows.with_columns(src_rank="rank", dst_rank="_members", rows="_split", bytes=share)
        .select([pl.col(c).cast(t) for c, t in PAIRS_SCHEMA.items()])
        .sort("process_group", "call_index", "src_rank", "dst_rank")
        .collect()
    )


def all_to_all_volume(loads: pl.DataFrame) -> pl.DataFrame:
    """Per whole group and rank over the trace (VOLUME_SCHEMA), from all_to_all_loads: its
    calls, sent_bytes and received_bytes; received_vs_mean (its received_bytes over the
    group's mean rank's); and call_imbalance, the same on each row of a group: the mean over
    the group's exchanges of their imbalance (1.0: every exchange even)."""
    if loads.height == 0:
        return pl.DataFrame(schema=VOLUME_SCHEMA)
    per_call = (
        loads.group_by("process_group", "call_index")
        .agg(pl.col("imbalance").first())
        .group_by("process_group")
        .agg(call_imbalance=pl.col("imbalance").mean())
    )
    per = loads.group_by("process_group", "rank").agg(
        calls=pl.len(),
        sent_bytes=pl.col("sent_bytes").sum(),
        received_bytes=pl.col("received_bytes").sum(),
    )
    mean = pl.col("received_bytes").mean().over("process_group")
    return (
        per.join(per_call, on="process_group", how="left")
        .with_columns(received_vs_mean=pl.when(mean > 0).then(pl.col("received_bytes") / mean))
        .sort("process_group", "rank")
        .select([pl.col(c).cast(t) for c, t in VOLUME_SCHEMA.items()])
    )


# ---------------------------------------------------------------- the rules' view


def job_all_to_all_volume(tables: TableView) -> pl.DataFrame:
    """What each rank of a group sends and receives in its all-to-alls: process_group,
    rank, calls, sent_bytes and received_bytes over the trace (the calls' input and output
    sizes: an uneven all-to-all, PyTorch's all_to_allv, moves what its split sizes say);
    received_vs_mean, the rank's received_bytes over the group's mean rank's (a rank that
    always receives more); and, the same on each row of a group, call_imbalance: the mean
    over the group's calls of what the call's busiest receiver got over the call's mean
    rank (1.0: every call even; a call ends when its busiest rank is done). In a
    mixture-of-experts layer what a rank receives at dispatch is the tokens its experts
    compute: a rank that receives more works longer and reaches the group's next call
    later. Left out: groups whose all-to-alls carry no sizes, and groups with fewer ranks in
    the traces than their size, or of unknown size. A view of the `all_to_all_loads` table;
    derived table `all_to_all_volume`."""
    return memo(tables, "all_to_all_volume", lambda: all_to_all_volume(_loads(tables)))


def _loads(tables: TableView) -> pl.DataFrame:
    """The report's `all_to_all_loads` table (docs/tables.md); where the tables hold none
    (a Tables of some tables only), the same from their collectives."""
    if "imbalance" in tables["all_to_all_loads"].columns:
        return tables["all_to_all_loads"]
    if not tables.has("collectives", *COLUMNS):
        return pl.DataFrame(schema=LOADS_SCHEMA)
    return memo(
        tables,
        "all_to_all_loads",
        lambda: all_to_all_loads(
            tables.lazy("collectives", list(COLUMNS)).filter(pl.col("collective") == "all_to_all")
        ),
    )
