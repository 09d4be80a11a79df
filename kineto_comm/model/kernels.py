"""The per-rank device timeline: one row per kernel, memcpy or memset.

Columns (`KERNEL_SCHEMA`; times are integer nanoseconds):
    rank, device, stream       where it ran (device -1 = the host timeline of a CPU-only trace)
    name                       kernel name as written in the trace
    kind                       compute | communication | memcpy | memset
    start_ns, end_ns           when it ran
    correlation, external_id   links to the launching runtime call and CPU op
    launch_ns, launch_tid      when and on which CPU thread it was launched (null if unknown)
    launch_end_ns              when that launching runtime call returned
    waits_for                  the kernel of another stream a recorded stream wait holds it
                               behind (its correlation; -1: unresolved; null: none)
    waited_ns                  where on the device its launching thread last waited for the
                               device before the launch (null: it never did)
    step                       ProfilerStep number whose CPU window holds the launch (-1: none)

CPU-only traces (gloo) have no device: `gloo:*` spans become communication rows and the other
threads' CPU ops compute rows, on a host timeline, so the same overlap arithmetic applies.
In full: docs/tables.md, "kernels".
"""

from __future__ import annotations

import numpy as np
import polars as pl

from kineto_comm.analysis.overlap import subtract_intervals
from kineto_comm.lazy import collect
from kineto_comm.load.decode import (
    HOST_SPANS,
    MTIA_CAT,
    STREAM_WAIT,
    SYNC_CAT,
    RawTrace,
    parse_int,
)
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
    "launch_end_ns": pl.Int64(),
    "waits_for": pl.Int64(),
    "waited_ns": pl.Int64(),
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
    # launch_ns and launch_tid: decode.RawTrace; the CUDA sync events are no device work.
    sync = (pl.col("cat") == SYNC_CAT).fill_null(False)
    synced = raw.gpu.select(sync.any()).item()
    gpu = raw.gpu.filter(~sync) if synced else raw.gpu
    if gpu.height == 0:
        return host_timeline(raw)
    # MTIA's DMA transfers (dma_request) are its copies, and the rest of its device events
    # compute, as HTA's breakdown has them (its memory kernels are the names starting "dma").
    dma = (pl.col("cat") == MTIA_CAT) & pl.col("name").str.starts_with("dma")
    kind = (
        pl.when(pl.col("cat").is_in(["gpu_memcpy", "Memcpy"]) | dma.fill_null(False))
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
        pl.col("launch_end_ns")
        if "launch_end_ns" in gpu.columns
        else pl.lit(None, dtype=pl.Int64).alias("launch_end_ns"),
        *[pl.col(c).alias(f"arg_{c}") for c in ARG_COLUMNS],
        pl.lit(None, dtype=pl.String).alias("arg_input_dims"),
        pl.lit(None, dtype=pl.String).alias("arg_input_type"),
    )
    if synced:
        waits = raw.gpu.lazy().filter(sync & (pl.col("name") == STREAM_WAIT))
        query = _with_waits(
            query,
            waits.select(
                "rank",
                pl.coalesce(pl.col("device"), parse_int(pl.col("pid"))).alias("device"),
                "stream",
                "correlation",
                "wait_on_stream",
                "wait_on_corr",
            ),
        )
    else:
        query = query.with_columns(waits_for=pl.lit(None, dtype=pl.Int64))
    return _with_waited(collect(query.sort("rank", "start_ns", maintain_order=True)), raw.waits)


# Polls of the device by one thread (cudaEventQuery, cudaStreamQuery) at most this far apart
# are one wait: a loop until the work is done (HTA's trace_diff/control polls every 13 us
# for up to 715 us at a time).
POLL_GAP_NS = 100_000


def _with_waited(kernels: pl.DataFrame, waits: pl.DataFrame) -> pl.DataFrame:
    """`kernels` with `waited_ns` (KERNEL_SCHEMA), from the host waits (`waits`: rank, tid,
    name, start_ns, end_ns of the synchronising and polling runtime calls, RawTrace.waits)
    and the kernels' own blocking copies. A wait, or a run of polls, waited for the device
    when device work of the rank ended while it lasted: the CPU went on when the last such
    work was done. A copy whose launching call returned only after the copy ended held the
    CPU until then. Each kernel gets the device time of the last such wait of the thread
    that launched it, before the launch. Sorted searches per rank and thread (a few of
    them), not a sort of every kernel."""
    by = ["rank", "tid"]
    poll = pl.col("name").str.ends_with("Query").fill_null(False)
    calls = (
        waits.lazy()
        .select(pl.col("rank").cast(pl.Int64), "tid", "start_ns", "end_ns", _poll=poll)
        .drop_nulls(["tid", "start_ns", "end_ns"])
        .sort(*by, "start_ns")
    )
    # A poll after a poll of the same thread, soon after it: the same wait.
    joined = (
        pl.col("_poll")
        & pl.col("_poll").shift(1).over(by)
        & (pl.col("start_ns") - pl.col("end_ns").shift(1).over(by) <= POLL_GAP_NS)
    ).fill_null(False)
    spans = collect(
        calls.with_columns(_run=(~joined).cum_sum().over(by))
        .group_by(*by, "_run")
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
    )
    copies = kernels.filter(
        pl.col("launch_ns").is_not_null()
        & pl.col("launch_tid").is_not_null()
        & (pl.col("launch_end_ns") >= pl.col("end_ns"))
    ).select("rank", tid="launch_tid", _back="launch_end_ns", _done="end_ns")
    waited = np.zeros(kernels.height, dtype=np.int64)
    found = np.zeros(kernels.height, dtype=bool)
    if spans.height or copies.height:
        rank = kernels["rank"].to_numpy()
        ends = kernels["end_ns"].to_numpy()
        launch = kernels["launch_ns"].fill_null(-(2**62)).to_numpy()
        for r in pl.concat([spans["rank"], copies["rank"]]).unique().to_list():
            mine = np.flatnonzero(rank == r)
            done = np.sort(ends[mine])
            sp = spans.filter(pl.col("rank") == r)
            # The last device work of the rank that ended by each wait's end, if after its start.
            at = np.searchsorted(done, sp["end_ns"].to_numpy(), side="right") - 1
            seen = np.where(at >= 0, done[np.maximum(at, 0)], -(2**62))
            held = pl.concat(
                [
                    sp.select("tid", _back="end_ns")
                    .with_columns(_done=pl.Series(seen))
                    .filter(pl.col("_done") > sp["start_ns"]),
                    copies.filter(pl.col("rank") == r).select("tid", "_back", "_done"),
                ]
            ).sort("_back")
            tids = kernels["launch_tid"].gather(mine)
            for tid in held["tid"].unique().to_list():
                h = held.filter(pl.col("tid") == tid)
                ks = mine[(tids == tid).fill_null(False).to_numpy()]
                at = np.searchsorted(h["_back"].to_numpy(), launch[ks], side="right") - 1
                hit = at >= 0
                waited[ks[hit]] = h["_done"].to_numpy()[at[hit]]
                found[ks[hit]] = True
    return kernels.with_columns(
        waited_ns=pl.when(pl.Series(found)).then(pl.Series(waited)).otherwise(None)
    )


def _with_waits(kernels: pl.LazyFrame, waits: pl.LazyFrame) -> pl.LazyFrame:
    """`kernels` with `waits_for`, from the trace's stream waits (`waits`: rank, device,
    stream, correlation of the cudaStreamWaitEvent, wait_on_stream and wait_on_corr, the
    stream and the cudaEventRecord call of the event waited on). CUDA orders a stream's work
    by enqueueing, which the correlation ids number across the process's threads: the event
    holds the work enqueued on its stream before it was recorded, so its kernel is the last
    one there with a smaller correlation than the record; the wait holds back the next work
    enqueued on the waiting stream, the first kernel there with a larger correlation than
    the wait. A kernel held by several waits waits for the one whose kernel ends last; one
    held only by waits whose event the trace does not resolve (-1 in both fields, as newer
    CUDA stacks write them) gets -1."""
    keys = ["rank", "device", "stream"]
    ids = kernels.filter(pl.col("correlation").is_not_null()).select(*keys, "correlation", "end_ns")
    waits = waits.filter(pl.col("stream") != pl.col("wait_on_stream"))
    # The kernel each wait holds back ...
    consumer = (
        waits.sort("correlation")
        .join_asof(
            ids.select(*keys, _consumer="correlation").sort("_consumer"),
            left_on="correlation",
            right_on="_consumer",
            by=keys,
            strategy="forward",
            allow_exact_matches=False,
            check_sortedness=False,  # sorted above, within each group too
        )
        .filter(pl.col("_consumer").is_not_null())
    )
    resolved = (pl.col("wait_on_stream") >= 0) & (pl.col("wait_on_corr") >= 0)
    # ... and the kernel its event was recorded after.
    producer = (
        consumer.filter(resolved)
        .sort("wait_on_corr")
        .join_asof(
            ids.select(
                "rank", "device", wait_on_stream="stream", _producer="correlation", _end="end_ns"
            ).sort("_producer"),
            left_on="wait_on_corr",
            right_on="_producer",
            by=["rank", "device", "wait_on_stream"],
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
        .filter(pl.col("_producer").is_not_null())
    )
    unresolved = consumer.filter(~resolved.fill_null(False)).with_columns(
        _producer=pl.lit(-1, dtype=pl.Int64), _end=pl.lit(None, dtype=pl.Int64)
    )
    edges = (
        pl.concat([producer, unresolved], how="diagonal_relaxed")
        .group_by("rank", "device", "_consumer")
        .agg(waits_for=pl.col("_producer").sort_by("_end", nulls_last=False).last())
        .rename({"_consumer": "correlation"})
    )
    return kernels.join(
        edges, on=["rank", "device", "correlation"], how="left", maintain_order="left"
    )


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
        pl.lit(None, dtype=pl.Int64).alias("launch_end_ns"),
        pl.lit(None, dtype=pl.Int64).alias("waits_for"),
        pl.lit(None, dtype=pl.Int64).alias("waited_ns"),
        *[pl.col(c).alias(f"arg_{c}") for c in args],
    )
    return collect(query.sort("rank", "start_ns", maintain_order=True))
