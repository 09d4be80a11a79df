"""The model of time read off a job's tables: step times, blame, replay, exposure per call.

Why: every finding's saving and every share "of the step" come from one model
(docs/model-of-time.md). `analysis/steptime.py` holds its pure functions over one batch of
ranks' frames; this module runs them over a job's `Tables` a few ranks at a time (bounded
memory on a big job), once per rules run: one pass over each rank's kernels and calls gives
the blame rows, each call's exposed time and the replay's timeline together. The rules, the
report's model tables (rules_engine.step_model) and `replay_saving` read them from here,
through the registry of derived tables (derived.py).
"""

from __future__ import annotations

import polars as pl

from kineto_comm.analysis import steptime
from kineto_comm.analysis.roles import call_roles
from kineto_comm.analysis.view import TableView, memo
from kineto_comm.analysis.waits import (
    CALL_KEY,
    P2P,
    alone_ranks,
    arrival_waits,
    call_durations,
    call_last,
    instance_last,
    named_by_instance,
    rank_waits,
    waits_for_group,
    whole_instances,
    with_waits,
)
from kineto_comm.lazy import collect


def step_time_ns(tables: TableView) -> int:
    """The job's step time: the one every rule's share and saving is "of the step"."""
    return steptime.job_step_ns(step_times(tables))


def step_times(tables: TableView) -> pl.DataFrame:
    """Per step: step, step_ns (the longest rank's window), critical_rank (that rank),
    ranks, complete (counts toward the job's step time). Computed once per rules run from
    the steps table's windows."""

    def compute() -> pl.DataFrame:
        if tables.has("steps", "rank", "step", "wall_ns"):
            wall = pl.col("wall_ns")
        elif tables.has("steps", "rank", "step", "start_ns", "end_ns"):
            wall = pl.col("end_ns") - pl.col("start_ns")
        else:
            return pl.DataFrame(schema=steptime.STEP_TIMES_SCHEMA)
        walls = tables.collect(
            tables.lazy("steps", ["rank", "step", "start_ns", "end_ns", "wall_ns"]).select(
                pl.col("rank").cast(pl.Int64),
                pl.col("step").cast(pl.Int64),
                wall_ns=wall.clip(lower_bound=0).cast(pl.Int64),
            )
        )
        return steptime.step_times(walls)

    return memo(tables, "step_times", compute)


def critical_blame(tables: TableView) -> pl.DataFrame:
    """The step_blame table (the critical rank's rows of each step) from rank_blame."""
    times = step_times(tables)
    if times.height == 0:
        return pl.DataFrame(schema=steptime.BLAME_SCHEMA)
    return steptime.critical_blame(blame_frame(tables), times)


def rank_blame(tables: TableView) -> pl.LazyFrame:
    """Every rank's step windows split into blame categories (docs/tables.md `step_blame`;
    kineto_comm.analysis.steptime): rank, step, category, collective, process_group, role,
    late_rank, last_call, calls, ns; per (rank, step) the ns sum to the window exactly. Built a few
    ranks at a time, once per rules run (kept in files on a big job), as a lazy query."""
    rows = model_of_time(tables)
    return rows.filter(pl.col("_call_row").is_null() & pl.col("_chain").is_null()).select(
        list(steptime.BLAME_SCHEMA)
    )


def blame_frame(tables: TableView) -> pl.DataFrame:
    """rank_blame, collected once per rules run: what the replay and the critical rank's
    blame read."""
    return memo(tables, "rank_blame", lambda: tables.collect(rank_blame(tables)), "frame")


def replay_timeline(tables: TableView) -> pl.LazyFrame:
    """What the replay re-times (steptime.CHAIN_SCHEMA, in the blame's columns; `part`):
    per rank and step its window ("window": `at_ns`, `end_ns`), its communication, launch
    and queued pieces at their times ("event"; `sync` marks the exposed waits for another
    rank), and the tail chain ("chain": the calls queued back to back up to the step's
    last call, `span_ns` their whole time, hidden parts included). From the same pass as
    the blame."""
    rows = model_of_time(tables)
    return rows.filter(pl.col("_chain").fill_null(False)).select(list(steptime.CHAIN_SCHEMA))


def exposed_per_call(tables: TableView) -> pl.LazyFrame:
    """rank, process_group, collective, call_index, exposed_ns, exposed_all_ns, step (the
    window the call ends in), last_call: the time the blame charges to each call and where
    (steptime.rank_time), from the same pass."""
    rows = model_of_time(tables)
    return rows.filter(pl.col("_call_row").is_not_null()).select(
        "rank", *CALL_KEY, "exposed_ns", "exposed_all_ns", "step", "last_call"
    )


# The columns of a call's exposure rows in model_of_time's table.
CALL_COLUMNS: dict[str, pl.DataType] = {
    "_call_row": pl.UInt32(),
    "call_index": pl.Int64(),
    "exposed_ns": pl.Int64(),
    "exposed_all_ns": pl.Int64(),
}


def model_of_time(tables: TableView) -> pl.LazyFrame:
    """One table per rules run, built a few ranks at a time from one read of their kernels
    and calls (steptime.rank_time): the blame rows (`_call_row` null) and, per call, its
    exposed time (`_call_row` set; rank and the call's key in the blame's columns)."""
    schema = {
        **steptime.BLAME_SCHEMA,
        **CALL_COLUMNS,
        "_chain": pl.Boolean(),
        "part": pl.String(),
        "span_ns": pl.Int64(),
        "at_ns": pl.Int64(),
        "end_ns": pl.Int64(),
        "sync": pl.Boolean(),
    }
    if not tables.has("steps", "step", "start_ns", "end_ns"):
        return pl.DataFrame(schema=schema).lazy()
    has_calls = tables.has("collectives")
    durations = call_durations(tables) if has_calls else None
    late = call_last(tables) if has_calls else None
    last = instance_last(tables) if has_calls else None
    kcols: tuple[str, ...] = ("rank", "kind", "start_ns", "end_ns", "launch_ns")
    if tables.has("kernels", "launch_end_ns"):
        kcols += ("launch_end_ns",)
    ccols = (*CALL_KEY, "rank", "start_ns", "end_ns", "duration_ns", "launch_ns", "peer")
    # A pooled group's calls take their kind's role, an all_reduce's by its size.
    sized = tables.has("collectives", "bytes")
    if sized:
        ccols += ("bytes",)
    whole = whole_instances(tables) if has_calls else None
    alone = alone_ranks(tables)

    def build(windows: pl.DataFrame) -> pl.DataFrame:
        ranks = windows["rank"].unique().sort().to_list()
        kernels = pl.concat(
            [b for b in tables.rank_batches("kernels", kcols, ranks) if b.width == len(kcols)]
            or [pl.DataFrame(schema={c: pl.Int64 for c in kcols} | {"kind": pl.String})],
            how="vertical_relaxed",
        )
        if has_calls and durations is not None and late is not None:
            calls = pl.concat(
                list(tables.rank_batches("collectives", ccols, ranks)), how="vertical_relaxed"
            )
            waits = rank_waits(tables, ranks) if last is not None else None
            arrivals = (
                None if waits is None or whole is None else arrival_waits(waits.lazy(), whole)
            )
            calls = collect(
                with_waits(calls.lazy(), durations, arrivals, alone)
                .join(late.lazy(), on=CALL_KEY, how="left", nulls_equal=True)
                # A point-to-point call waits for, or receives from, its peer; a call
                # kept alone, for no one.
                .with_columns(
                    late_rank=pl.when(pl.col("collective").is_in(P2P))
                    .then(pl.col("peer").cast(pl.Int64))
                    .when(waits_for_group(alone))
                    .then(pl.col("late_rank"))
                )
                .with_columns(pl.col("process_group").cast(pl.String))
                .pipe(lambda frame: call_roles(tables, frame))
                .drop("bytes", strict=False)
            )
            if last is not None and waits is not None:
                calls = named_by_instance(calls, waits, last)
        else:
            calls = pl.DataFrame(
                schema={
                    "rank": pl.Int64,
                    "start_ns": pl.Int64,
                    "end_ns": pl.Int64,
                    "transfer_ns": pl.Int64,
                }
                | {c: pl.String for c in CALL_KEY[:2]}
                | {"call_index": pl.Int64}
            )
        blame, exposure, chain = steptime.rank_time(kernels, calls, windows)
        per_call = exposure.join(
            calls.with_row_index("_call_row").select(
                "_call_row",
                pl.col("rank").cast(pl.Int64),
                *[pl.col(c).cast(pl.String) for c in CALL_KEY[:2]],
                pl.col("call_index").cast(pl.Int64),
            ),
            on="_call_row",
        )
        return pl.concat(
            [blame, per_call, chain.with_columns(_chain=pl.lit(True))], how="diagonal_relaxed"
        ).select(*[pl.col(n).cast(t) for n, t in schema.items()])

    return tables.derived(
        ("derived", "model_of_time"), "steps", build, ("rank", "step", "start_ns", "end_ns")
    )


def rank_lateness(tables: TableView, where: pl.Expr | None = None) -> pl.DataFrame:
    """rank, step, remove_ns: per step, the longest wait any rank had for this rank (the
    model of time's `late_rank` waits, and the tail chain's, hidden parts included, that
    held back the calls queued behind them): the time its window loses when it does the
    mean rank's work. For an Edit's `rank_ns`. `where`: only the wait rows it keeps (an
    expression over the step_blame columns), e.g. the calls another rule owns left out."""
    blame, chain = rank_blame(tables), replay_timeline(tables)
    if where is not None:
        blame, chain = blame.filter(where), chain.filter(where)
    return tables.collect(steptime.lateness(blame, chain))


def launch_floor(tables: TableView, removals: pl.DataFrame) -> pl.DataFrame:
    """rank, step, removed_ns, allowed_ns, share: per window, what a fix that leaves the
    CPU's launches where they are can take out of it (steptime.launch_floor: no kernel
    starts before its launch, but a launch after the CPU waited for the device moves with
    what is taken out before that wait), from `removals` (rank, step, at_ns, remove_ns: time the
    fix takes out at `at_ns`, a call's end); `share` = allowed / removed, to scale an
    Edit's per-window fraction. Reads the kernels of those ranks only."""
    if removals.height == 0 or not tables.has("kernels", "launch_ns"):
        return pl.DataFrame(schema=SHARE_SCHEMA)
    ranks = removals["rank"].cast(pl.Int64).unique().implode()
    cols = [c for c in ("waited_ns",) if tables.has("kernels", c)]
    kernels = tables.lazy("kernels", ["rank", "step", "start_ns", "launch_ns", *cols]).filter(
        pl.col("rank").cast(pl.Int64).is_in(ranks)
    )
    return with_share(tables.collect(steptime.launch_floor(kernels, removals)))


# launch_floor's and queue_shift's columns.
SHARE_SCHEMA = {
    "rank": pl.Int64,
    "step": pl.Int64,
    "removed_ns": pl.Float64,
    "allowed_ns": pl.Float64,
    "share": pl.Float64,
}


def with_share(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` (rank, step, removed_ns, allowed_ns) with share = allowed / removed (1 where
    nothing is removed), in SHARE_SCHEMA."""
    return frame.with_columns(
        share=pl.when(pl.col("removed_ns") > 0)
        .then(pl.col("allowed_ns") / pl.col("removed_ns"))
        .otherwise(1.0)
    ).select(*[pl.col(c).cast(t) for c, t in SHARE_SCHEMA.items()])


def queue_shift(tables: TableView) -> pl.DataFrame:
    """The derived table `queue_shift`: `_queue_shift`, once per rules run."""
    return memo(tables, "queue_shift", lambda: _queue_shift(tables))


def _queue_shift(tables: TableView) -> pl.DataFrame:
    """rank, step, removed_ns, allowed_ns, share: per window that holds queued time (the
    step_blame rows of category `queued`), what moving the device's other work off the
    rank takes out of it (steptime.queue_shift: no kernel starts before its launch, and a
    step's start moves with its first kernel's queue); `share` = allowed / removed, an
    Edit's fraction of those rows. Reads the kernels of the ranks with queued time only, a
    few ranks at a time."""
    if not tables.has("kernels", "launch_ns") or not tables.has("steps", "start_ns", "end_ns"):
        return pl.DataFrame(schema=SHARE_SCHEMA)
    ranks = tables.collect(
        rank_blame(tables).filter(pl.col("category") == "queued").select(pl.col("rank").unique())
    )["rank"].sort()
    cols = ["rank", "step", "start_ns", "end_ns", "launch_ns", "launch_end_ns"]
    parts = [pl.DataFrame(schema=SHARE_SCHEMA)]
    for kernels in tables.rank_batches("kernels", cols, ranks.to_list() if ranks.len() else []):
        if kernels.height == 0:
            continue
        mine = (
            pl.col("rank").cast(pl.Int64).is_in(kernels["rank"].cast(pl.Int64).unique().implode())
        )
        windows = tables.collect(
            tables.lazy("steps", ["rank", "step", "start_ns", "end_ns"]).filter(mine)
        )
        parts.append(with_share(steptime.queue_shift(kernels.lazy(), windows)))
    return pl.concat(parts)


def replay_saving(tables: TableView, *edits: steptime.Edit) -> int:
    """The step time (ns per step) the edits save, replayed together on the model of time
    (kineto_comm.analysis.steptime): each rank's windows lose what the edits remove, each
    step lasts as long as its longest rank's new window, and the saving is the job's step
    time less the new one. Never more than the step; several edits never save more than
    the largest share each row loses to one of them (overlaps are not added up)."""
    if not edits:
        return 0
    line = memo(
        tables,
        "replay_timeline",
        lambda: steptime.timeline(tables.collect(replay_timeline(tables))),
        "line",
    )
    return steptime.saving(blame_frame(tables), step_times(tables), edits, line)


def n_steps(tables: TableView) -> int:
    """Number of distinct steps (at least 1 when there is any step row)."""
    if not tables.has("steps", "step"):
        return 1
    query = tables.lazy("steps", ["step"]).select(pl.col("step").n_unique())
    return max(1, int(tables.collect(query).item()))
