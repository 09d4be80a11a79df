"""The per-rank device timeline: one row per kernel, memcpy or memset.

Columns (`KERNEL_SCHEMA`; times are integer nanoseconds):
    rank, device, stream       where it ran (device -1 = the host timeline of a CPU-only trace)
    name                       kernel name as written in the trace
    kind                       compute | communication | memcpy | memset
    start_ns, end_ns           when it ran
    correlation, external_id   links to the launching runtime call and CPU op
    launch_ns, launch_tid      when and on which CPU thread it was launched (null if unknown)
    step                       ProfilerStep number whose CPU window holds the launch (-1: none)

CPU-only traces (gloo) have no device: their `gloo:*` spans become communication rows and
the CPU ops of the other threads compute rows, on a host timeline, so the same overlap
arithmetic applies.
"""

from __future__ import annotations

import polars as pl

from kineto_comm.analysis.overlap import subtract_intervals
from kineto_comm.lazy import collect
from kineto_comm.load.decode import HOST_SPANS, RawTrace, parse_int
from kineto_comm.model.names import comm_kernel_expr

KERNEL_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "device": pl.Int64(),
    "stream": pl.Int64(),
    "name": pl.String(),
    "kind": pl.String(),
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "correlation": pl.Int64(),
    "external_id": pl.Int64(),
    "launch_ns": pl.Int64(),
    "launch_tid": pl.String(),
}
KERNEL_COLUMNS = tuple(KERNEL_SCHEMA) + ("step",)
KINDS = ("compute", "communication", "memcpy", "memset")
# Collective metadata carried along for the collectives table (dropped from `kernels`).
ARG_COLUMNS = (
    "collective",
    "in_nelems",
    "out_nelems",
    "group_size",
    "dtype",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "seq",
    "src_rank",
    "dst_rank",
)


def build_kernels(raw: RawTrace, comm_patterns: tuple[str, ...] = ()) -> pl.DataFrame:
    """Device activity of the ranks in `raw` (their host timelines when it has no device
    activity), in (rank, start) order.

    `raw`'s tables carry a `rank` column (per_rank.stack: several files are modelled in one
    set of queries). The result has KERNEL_SCHEMA's columns plus `arg_*` columns (collective
    metadata found on the event itself) used by the collectives table.
    """
    if raw.gpu.height == 0:
        return host_timeline(raw)
    gpu = raw.gpu  # launch_ns and launch_tid: decode.RawTrace
    kind = (
        pl.when(pl.col("cat").is_in(["gpu_memcpy", "Memcpy"]))
        .then(pl.lit("memcpy"))
        .when(pl.col("cat").is_in(["gpu_memset", "Memset"]))
        .then(pl.lit("memset"))
        .when(comm_kernel_expr(pl.col("name"), comm_patterns))
        .then(pl.lit("communication"))
        .otherwise(pl.lit("compute"))
    )
    query = gpu.lazy().select(
        "rank",
        pl.coalesce(pl.col("device"), parse_int(pl.col("pid"))).alias("device"),
        pl.coalesce(pl.col("stream"), parse_int(pl.col("tid"))).alias("stream"),
        pl.col("name").fill_null(""),
        kind.alias("kind"),
        "start_ns",
        "end_ns",
        "correlation",
        "external_id",
        "launch_ns",
        "launch_tid",
        *[pl.col(c).alias(f"arg_{c}") for c in ARG_COLUMNS],
        pl.lit(None, dtype=pl.String).alias("arg_input_dims"),
        pl.lit(None, dtype=pl.String).alias("arg_input_type"),
    )
    return collect(query.sort("rank", "start_ns", maintain_order=True))


def _blocked(training: pl.LazyFrame, wrappers: pl.Expr, comm: pl.DataFrame) -> pl.LazyFrame:
    """Where a training thread waits on communication that runs on another thread: after a
    c10d call returns, the rest of the op that made it (its innermost enclosing op: the
    tensor-parallel `_ReduceFromTP`, a wait in user code), less the other ops it runs then,
    while a communication span of the rank runs. Time an op spends so is communication, not
    compute (gloo and other host backends run the transfer on their own threads). An
    asynchronous call (DDP's bucketed all-reduce) returns into ops that keep computing: none
    of its time is taken."""
    by = ["rank", "pid", "tid"]
    span = ["start_ns", "end_ns"]
    calls = training.filter(pl.col("name").str.starts_with("c10d::")).select(
        *by, c_start="start_ns", c_end="end_ns"
    )
    ops = training.filter(~wrappers).select(*by, *span)
    # The innermost op enclosing each call: the latest start, then the earliest end.
    parents = (
        calls.join(ops, on=by)
        .filter((pl.col("start_ns") <= pl.col("c_start")) & (pl.col("end_ns") >= pl.col("c_end")))
        .sort([*by, "c_start", "start_ns", "end_ns"], descending=[False] * 4 + [True, False])
        .unique([*by, "c_start"], keep="first", maintain_order=True)
        .select(*by, start_ns="c_end", end_ns="end_ns")
        .filter(pl.col("end_ns") > pl.col("start_ns"))
    )
    # The ops the waiting op runs after the call (work done meanwhile is not waiting).
    inside = (
        parents.join(ops, on=by, suffix="_op")
        .filter(
            (pl.col("start_ns_op") >= pl.col("start_ns"))
            & (pl.col("end_ns_op") <= pl.col("end_ns"))
        )
        .select(*by, start_ns="start_ns_op", end_ns="end_ns_op")
    )
    # Collected: the plan would otherwise compute it (and all above) once per use below.
    waiting = collect(subtract_intervals(parents, inside, by)).lazy()
    # ... only while the rank's communication runs, on whichever thread.
    threads = waiting.select(*by).unique()
    running = comm.lazy().select("rank", *span).join(threads, on="rank")
    elsewhere = subtract_intervals(waiting, running, by)
    return subtract_intervals(waiting, elsewhere, by)


def host_timeline(raw: RawTrace) -> pl.DataFrame:
    """Host-side communication spans and the CPU work beside them, as kernel-like rows."""
    comm = raw.ops.filter(pl.col("name").str.starts_with(HOST_SPANS[0]))
    for prefix in HOST_SPANS[1:]:
        comm = pl.concat([comm, raw.ops.filter(pl.col("name").str.starts_with(prefix))])
    if comm.height == 0:
        return pl.DataFrame(schema=KERNEL_SCHEMA).with_columns(
            *[pl.lit(None, dtype=raw.ops.schema[c]).alias(f"arg_{c}") for c in ARG_COLUMNS],
            arg_input_dims=pl.lit(None, dtype=pl.String),
            arg_input_type=pl.lit(None, dtype=pl.String),
        )
    # Compute is the CPU work of the training threads: not the backend's own worker threads
    # (e.g. `pt_gloo_runloop`), and not the c10d wrappers that wait on communication.
    workers = (
        raw.threads.lazy()
        .filter(
            (pl.col("kind") == "thread_name") & pl.col("label").str.contains("(?i)gloo|ucc|mpi")
        )
        .select("rank", "pid", "tid")
    )
    training = collect(  # used by several queries below: computed once
        raw.host.lazy()
        .join(comm.lazy().select("rank").unique(), on="rank", how="semi")  # ranks with comm
        .join(workers, on=["rank", "pid", "tid"], how="anti")
    ).lazy()
    wrappers = pl.col("name").str.starts_with("c10d::") | (pl.col("name") == "record_param_comms")
    ops = training.filter(~wrappers)
    # A thread blocked in a communication span is not computing, whatever op encloses it:
    # a span on the thread itself, or one on the backend's thread while the op that issued
    # it waits (_blocked).
    by = ["rank", "pid", "tid"]
    blocked = pl.concat(
        [comm.lazy().select(*by, "start_ns", "end_ns"), _blocked(training, wrappers, comm)],
        how="vertical_relaxed",
    )
    compute = subtract_intervals(ops, blocked, by)
    args = [*ARG_COLUMNS, "input_dims", "input_type"]
    rows = pl.concat(
        [
            comm.lazy()
            .select("rank", "tid", "name", "start_ns", "end_ns", *args)
            .with_columns(kind=pl.lit("communication")),
            compute.select("rank", "tid", "start_ns", "end_ns").with_columns(
                name=pl.lit("cpu_op"), kind=pl.lit("compute")
            ),
        ],
        how="diagonal",
    )
    query = rows.select(
        "rank",
        pl.lit(-1, dtype=pl.Int64).alias("device"),
        parse_int(pl.col("tid")).alias("stream"),
        "name",
        "kind",
        "start_ns",
        "end_ns",
        pl.lit(None, dtype=pl.Int64).alias("correlation"),
        pl.lit(None, dtype=pl.Int64).alias("external_id"),
        pl.lit(None, dtype=pl.Int64).alias("launch_ns"),
        pl.col("tid").alias("launch_tid"),
        *[pl.col(c).alias(f"arg_{c}") for c in args],
    )
    return collect(query.sort("rank", "start_ns", maintain_order=True))
