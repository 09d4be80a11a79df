"""Algorithm and bus bandwidth of collectives, by the nccl-tests definitions.

algbw = size / time, where size is the message size nccl-tests reports (the `bytes` column:
the full buffer for all_gather / reduce_scatter / all_to_all; for an uneven all-to-all, the
larger of what the rank sent and received). busbw = algbw x factor, the factor making busbw
comparable to the link speed whatever the collective and group size n (PARAM's all_to_allv
uses the all_to_all factor):
    all_reduce                            2 (n - 1) / n
    all_gather, reduce_scatter, all_to_all    (n - 1) / n
    broadcast, reduce, send, recv, send_recv  1
Results are in GB/s with 1 GB = 1e9 bytes.
"""

from __future__ import annotations

import polars as pl


def busbw_factor(collective: pl.Expr, n: pl.Expr) -> pl.Expr:
    """nccl-tests' bus-bandwidth factor for a collective over n ranks (null if unknown n)."""
    n = n.cast(pl.Float64)
    return (
        pl.when(collective == "all_reduce")
        .then(2.0 * (n - 1.0) / n)
        .when(collective.is_in(["all_gather", "reduce_scatter", "all_to_all"]))
        .then((n - 1.0) / n)
        .otherwise(pl.lit(1.0))
    )


def group_size() -> pl.Expr:
    """The n of a call's bus bandwidth: its group's size (`group_size`), else the ranks that
    ran it (`ranks_seen`) when more than one; null otherwise, for one rank alone is no
    measure of its group (a busbw of 0, not an unknown one)."""
    return pl.coalesce("group_size", pl.when(pl.col("ranks_seen") > 1).then("ranks_seen"))


def algbw_gbps(size_bytes: pl.Expr, time_ns: pl.Expr) -> pl.Expr:
    """Bytes per nanosecond is GB/s (1e9 bytes per second); null for zero or missing time."""
    t = time_ns.cast(pl.Float64)
    return pl.when(t > 0).then(size_bytes.cast(pl.Float64) / t).otherwise(None)


def busbw_gbps(size_bytes: pl.Expr, time_ns: pl.Expr, collective: pl.Expr, n: pl.Expr) -> pl.Expr:
    """Bus bandwidth in GB/s."""
    return algbw_gbps(size_bytes, time_ns) * busbw_factor(collective, n)
