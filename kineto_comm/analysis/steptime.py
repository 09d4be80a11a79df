"""The one model of step time: what a step is, where its time went (blame), and replay.

- A step: the job's step s lasts as long as its longest rank's device window
  (`step_times`: step_ns, critical_rank); the job's step time is the mean over the complete
  steps. Every rule, share and table that says "of the step" uses it (`job_step_ns`).
- Blame: every (rank, step) window is split, in integer ns, into categories (compute,
  memory, transfer, wait, pipeline_bubble, launch, queued, other_idle) that sum to it
  exactly; `step_blame` is the critical rank's rows of each step.
- Replay: an edit removes a share of some blame rows (and may shorten ranks' windows); each
  rank's timeline is re-timed by a shift that crosses to the awaited rank at each exposed
  wait, in the order the waits ended (_sweep.c where built); the saving is the job step time
  less the new one. The tail chain and each kernel's launch bound what a fix can take out.

Why one model: every finding's saving is a replay of its fix on it, so savings, shares and
the blame cannot disagree, and all fixes together never save more than the step. The full
statement (each category's rule, the shift, the tail chain, launch floors) is
docs/model-of-time.md; the tables' columns are docs/tables.md. Pure functions of tables:
Polars in, Polars out, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from kineto_comm.analysis.overlap import disjoint_pieces, uncovered_ns
from kineto_comm.model.names import POINT_TO_POINT

try:  # the sweep over the waits, compiled (_sweep.c); optional: the Python loop is the same.
    from kineto_comm.analysis import _sweep as _compiled
except ImportError:  # pragma: no cover - where no compiler built it
    _compiled = None  # type: ignore[assignment]

CATEGORIES = (
    "compute",
    "memory",
    "transfer",
    "wait",
    "pipeline_bubble",
    "launch",
    "queued",
    "other_idle",
)
# The blame table's columns (docs/tables.md `step_blame`).
BLAME_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "step": pl.Int64(),
    "category": pl.String(),
    "collective": pl.String(),
    "process_group": pl.String(),
    "role": pl.String(),
    "late_rank": pl.Int64(),
    "last_call": pl.Boolean(),
    "step_start": pl.Boolean(),
    "calls": pl.Int64(),
    "ns": pl.Int64(),
}
STEP_TIMES_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "step_ns": pl.Int64(),
    "critical_rank": pl.Int64(),
    "ranks": pl.Int64(),
    "complete": pl.Boolean(),
}
P2P = POINT_TO_POINT  # send, recv, send_recv: calls with one peer
# How long after its launch call returns (kernels.launch_end_ns; its start where the trace
# has no end) a kernel may start on an idle device and still be delayed by its launch: 1-8
# us on every real single-process trace here (A100, V100, H100, MI250: median 1-7 us, the
# most 8.2 us), while the call itself may last seconds (a first launch loads its module).
# A kernel that starts later than this waited for something the trace does not show
# (another process on a shared GPU, events left out of a sampled trace): that is queued.
LAUNCH_LATENCY_NS = 20_000
# A call that starts at most this long after the previous call of its group ended was queued
# behind it (a stream's kernels run 1-5 us apart back to back): the two are one chain.
CHAIN_GAP_NS = 5_000
# The rows that wait for another rank (`late_rank`): a collective's late rank, or the
# neighbouring pipeline stage; a rank that gains shortens them.
WAITS = ("wait", "pipeline_bubble")
# The rows the replay re-times at their times (rank_time's events); the others (compute,
# memory, other_idle) come out at the window's end.
TIMED = ("transfer", "wait", "pipeline_bubble", "launch", "queued")
_KEYS = ["category", "collective", "process_group", "role", "late_rank", "last_call"]


def _as(frame: pl.DataFrame | pl.LazyFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """`frame`'s columns of `schema` in its order and types, those it lacks null."""
    return _as_lazy(frame, schema).collect()


def _as_lazy(frame: pl.DataFrame | pl.LazyFrame, schema: dict[str, pl.DataType]) -> pl.LazyFrame:
    """`_as`, as a query (a step of a bigger plan)."""
    have = frame.collect_schema().names()
    return frame.lazy().select(
        *[
            pl.col(n).cast(t) if n in have else pl.lit(None, dtype=t).alias(n)
            for n, t in schema.items()
        ]
    )


def _empty_blame() -> pl.DataFrame:
    return pl.DataFrame(schema=BLAME_SCHEMA)


def _clip_to_windows(pieces: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """`pieces` (rank, start_ns, end_ns, ...; each rank's rows in start order, ranks in any
    order) cut to the rank's step windows, with `step`: the window holding a piece's start,
    and the one holding its end when that is another (windows tile the timeline; a piece
    over three windows loses its middle one to idle). The rows keep their order, the
    second parts of pieces across a window's end last. One plan, collected once."""
    if pieces.height == 0:
        return pieces.with_columns(step=pl.lit(None, dtype=pl.Int64))
    win = (
        windows.lazy()
        .select("rank", "step", _ws=pl.col("start_ns"), _we=pl.col("end_ns"))
        .sort("rank", "_ws")
    )
    base = pieces.lazy().with_columns(pl.col("rank").cast(pl.Int64))

    def at(frame: pl.LazyFrame, column: str) -> pl.LazyFrame:
        # An as-of join by rank needs each rank's rows in time order, not the whole frame's
        # (a global sort of every kernel was most of the blame's time).
        return (
            frame.with_columns(_t=pl.col(column) - (1 if column == "end_ns" else 0))
            .join_asof(
                win,
                left_on="_t",
                right_on="_ws",
                by="rank",
                strategy="backward",
                check_sortedness=False,
            )
            .drop("_t")
        )

    first = at(base, "start_ns")
    # Only a piece running past its window's end has a second window: looked up alone.
    crossing = (
        first.filter(pl.col("end_ns") > pl.col("_we"))
        .drop("step", "_ws", "_we")
        .sort("rank", "end_ns")
    )
    # (None crossing: their part adds no rows.)
    second = at(crossing, "end_ns").filter(pl.col("_ws") > pl.col("start_ns"))
    both = pl.concat([first, second], how="vertical")
    return (
        both.filter(pl.col("step").is_not_null())
        .with_columns(
            start_ns=pl.max_horizontal("start_ns", "_ws"),
            end_ns=pl.min_horizontal("end_ns", "_we"),
        )
        .filter(pl.col("end_ns") > pl.col("start_ns"))
        .drop("_ws", "_we")
        .collect()
    )


def _fsdp_tail() -> pl.Expr:
    """Over a rank's communication pieces in windows: those of the last two gradient
    reductions of a step in an FSDP group (reduce-scatters, or the all-reduces gloo runs
    instead), which nothing later in the step can hide. FSDP reduces a unit's gradients
    once the unit's backward is done: the root unit's (embedding, final norm, output
    layer) when the whole backward is, and the first block's with only the embedding's
    backward (a short scatter-add) after it. Hiding all but these two saves 1.7-2.7% less
    than the simulator's fix of an FSDP job that launches every reduce-scatter after the
    backward (synth exposed-allreduce, 4 and 8 ranks, both models); with the last call
    alone excepted it saved 11-31% more. Where a ZeRO job reduces gradient buckets
    instead, the one before the last may hide behind a bucket's backward: excepting it
    keeps the saving a lower bound."""
    grad = (pl.col("role") == "fsdp") & pl.col("collective").is_in(["reduce_scatter", "all_reduce"])
    last_two = pl.col("_end").filter(grad).unique().sort(descending=True).head(2)
    return grad & pl.col("_end").is_in(last_two.implode()).over("rank", "step", "process_group")


def _launch_gaps(k: pl.DataFrame) -> pl.DataFrame:
    """The kernels of `k` (rank, start_ns, end_ns, _launched: when the CPU was done launching
    it; each rank's rows in start order) that start after the rank's device went idle (at
    `_prev`, the end of all its earlier kernels) and were launched after that
    (`_late_launch`), or were launched before and still started more than
    LAUNCH_LATENCY_NS after it. Before a kernel launched late the idle time is launch time
    until `_cpu` (its launch call's end plus LAUNCH_LATENCY_NS, at most its start); before
    one launched early, `_cpu` is LAUNCH_LATENCY_NS after the device went idle (the time
    before it is idle). After `_cpu` the time is queued. The blame's `launch` and `queued`
    rows, and the queue a replay removes (queue_shift)."""
    late = pl.col("_launched") > pl.col("_prev")
    return (
        k.with_columns(_prev=pl.col("end_ns").cum_max().shift(1).over("rank"))
        .filter(
            pl.col("_prev").is_not_null()
            & pl.col("_launched").is_not_null()  # a CPU op of a CPU-only trace: no launch
            & (pl.col("start_ns") > pl.col("_prev"))
            & (late | (pl.col("start_ns") > pl.col("_prev") + LAUNCH_LATENCY_NS))
        )
        .with_columns(
            _late_launch=late,
            _cpu=pl.when(late)
            .then(pl.min_horizontal("start_ns", pl.col("_launched") + LAUNCH_LATENCY_NS))
            .otherwise(pl.col("_prev") + LAUNCH_LATENCY_NS),
        )
    )


def rank_blame(
    kernels: pl.DataFrame,
    calls: pl.DataFrame,
    windows: pl.DataFrame,
) -> pl.DataFrame:
    """The blame rows (BLAME_SCHEMA) of every (rank, step) window of `windows` (rank_time's
    first table)."""
    return rank_time(kernels, calls, windows)[0]


# Per call, its exposed time as the blame counts it (rank_time's second table).
CALL_EXPOSURE_SCHEMA: dict[str, pl.DataType] = {
    "_call_row": pl.UInt32(),
    "exposed_ns": pl.Int64(),
    "exposed_all_ns": pl.Int64(),
    "step": pl.Int64(),
    "last_call": pl.Boolean(),
}
# What the replay re-times (rank_time's third table), in the blame's columns, by `part`:
# "window", each window's span (`at_ns`, `end_ns`); "event", its communication, launch and
# queued pieces at their times (`sync`: an exposed wait for another rank); "chain", the
# tail chain's rows (`ns` exposed as in the blame, `span_ns` hidden parts included).
CHAIN_SCHEMA: dict[str, pl.DataType] = {
    "part": pl.String(),
    **{n: t for n, t in BLAME_SCHEMA.items() if n not in ("ns",)},
    "ns": pl.Int64(),
    "span_ns": pl.Int64(),
    "at_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "sync": pl.Boolean(),
}


def rank_time(
    kernels: pl.DataFrame,
    calls: pl.DataFrame,
    windows: pl.DataFrame,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The blame rows (BLAME_SCHEMA) of every (rank, step) window of `windows`, and per row
    of `calls` (`_call_row`, its position) the time the blame charges to it: `exposed_ns`,
    of its transfer (its transfer or pipeline_bubble rows' time once it moved data),
    `exposed_all_ns`, of the whole call (its wait included), with `step`, the window it
    ends in, and `last_call`, its `last_call` mark there. A call's exposed time is
    the part of it inside a step window that no compute or memory kernel covers and no
    earlier call on the rank already holds, so the calls' exposed time adds up to the
    blame's communication rows exactly; a call outside every window has none.

    kernels: rank, kind, start_ns, end_ns, launch_ns (and launch_end_ns where known), each
    rank's rows in start order (the kernels table's order; sorted here otherwise).
    Communication rows are read from `calls` instead: rank, start_ns, end_ns, transfer_ns,
    collective, process_group, role, late_rank (one row per communication kernel).
    windows: rank, step, start_ns, end_ns. Per window the blame rows' `ns` sum to
    end_ns - start_ns exactly.
    """
    calls = calls.with_row_index("_call_row")
    if windows.height == 0:
        return (
            _empty_blame(),
            pl.DataFrame(schema=CALL_EXPOSURE_SCHEMA),
            pl.DataFrame(schema=CHAIN_SCHEMA),
        )
    windows = windows.select(
        pl.col("rank").cast(pl.Int64), pl.col("step").cast(pl.Int64), "start_ns", "end_ns"
    ).filter(pl.col("end_ns") >= pl.col("start_ns"))
    # The kernels table's order, (rank, start), is kept: the compute and its cover are made
    # disjoint before they are cut to the windows, without a sort.
    # When the CPU was done launching each kernel: its launch call's end where known.
    launched = pl.col("launch_ns")
    if "launch_end_ns" in kernels.columns:
        launched = pl.coalesce("launch_end_ns", "launch_ns")
    k = kernels.select(
        pl.col("rank").cast(pl.Int64), "kind", "start_ns", "end_ns", _launched=launched
    ).filter(pl.col("end_ns") > pl.col("start_ns"))
    if not k.select((pl.col("start_ns").diff().over("rank") >= 0).all()).item():
        k = k.sort("rank", "start_ns", maintain_order=True)
    busy = k.filter(pl.col("kind") != "communication").select(
        "rank", "start_ns", "end_ns", _compute=pl.col("kind") == "compute"
    )
    compute = disjoint_pieces(busy.filter("_compute").drop("_compute"), ordered=True)
    # What covers a collective: compute or a memory copy, as one disjoint union.
    cover = disjoint_pieces(busy.drop("_compute"), ordered=True)
    memory = disjoint_pieces(busy.filter(~pl.col("_compute")).drop("_compute"), ordered=True)
    compute_in = _clip_to_windows(compute, windows)
    memory_in = _clip_to_windows(memory, windows)
    labels = {
        "collective": pl.String,
        "process_group": pl.String,
        "role": pl.String,
        "late_rank": pl.Int64,
    }
    c = calls.select(
        "_call_row",
        pl.col("rank").cast(pl.Int64),
        "start_ns",
        "end_ns",
        pl.col("transfer_ns").fill_null(pl.col("end_ns") - pl.col("start_ns")),
        pl.col("launch_ns").cast(pl.Int64)
        if "launch_ns" in calls.columns
        else pl.lit(None, dtype=pl.Int64).alias("launch_ns"),
        *[
            pl.col(n).cast(t) if n in calls.columns else pl.lit(None, dtype=t).alias(n)
            for n, t in labels.items()
        ],
        # A point-to-point call that waited for its peer (it arrived first); unknown
        # without instances: a receive is taken to have waited for its send.
        _first=(
            pl.col("first").cast(pl.Boolean)
            if "first" in calls.columns
            else pl.lit(None, dtype=pl.Boolean)
        ).fill_null(pl.col("collective") == "recv"),
    ).filter(pl.col("end_ns") > pl.col("start_ns"))
    split = pl.max_horizontal(pl.col("start_ns"), pl.col("end_ns") - pl.col("transfer_ns"))
    p2p = pl.col("collective").is_in(P2P)
    bubble = p2p & (pl.col("role") == "pipeline")
    moved = c.select(
        "rank",
        start_ns=split,
        end_ns="end_ns",
        category=pl.when(bubble).then(pl.lit("pipeline_bubble")).otherwise(pl.lit("transfer")),
        collective="collective",
        process_group="process_group",
        role="role",
        # A bubble is spent on the neighbouring stage, however the call splits.
        late_rank=pl.when(bubble).then(pl.col("late_rank")),
        _call=pl.lit(1, dtype=pl.Int64),
        _end="end_ns",
        _call_row="_call_row",
        _first="_first",
    )
    waited = c.filter(split > pl.col("start_ns")).select(
        "rank",
        start_ns="start_ns",
        end_ns=split,
        category=pl.when(bubble).then(pl.lit("pipeline_bubble")).otherwise(pl.lit("wait")),
        collective="collective",
        process_group="process_group",
        role="role",
        late_rank=pl.col("late_rank"),
        _call=pl.lit(0, dtype=pl.Int64),
        _end="end_ns",
        _call_row="_call_row",
        _first="_first",
    )
    comm = disjoint_pieces(
        _clip_to_windows(pl.concat([moved, waited]).sort("rank", "start_ns"), windows)
    ).with_columns(
        # What nothing after it in the step can hide: the rank's last call of the step, and
        # an FSDP group's last two gradient reductions.
        last_call=(pl.col("_end") == pl.col("_end").max().over("rank", "step")) | _fsdp_tail()
    )
    # Launch gaps: where nothing runs before a kernel the CPU was still launching when the
    # device went idle (every kernel, communication included, covers the device), up to the
    # launch call's end and the launch's way to the device (LAUNCH_LATENCY_NS); the rest of
    # a longer wait is queued. Both name the kernel they delayed (a collective: its call).
    gaps = _launch_gaps(k).select(
        "rank", "kind", "start_ns", "end_ns", "_prev", "_cpu", "_late_launch"
    )
    named = c.select("rank", "start_ns", "end_ns", "collective", "process_group", "role").unique(
        ["rank", "start_ns", "end_ns"], keep="first", maintain_order=True
    )
    gaps = gaps.join(named, on=["rank", "start_ns", "end_ns"], how="left").with_columns(
        [
            pl.when(pl.col("kind") == "communication").then(pl.col(n)).alias(n)
            for n in ("collective", "process_group", "role")
        ]
    )
    # A gap before a step window's first kernel: the host's time between steps.
    opens = windows.select("rank", "start_ns", step_start=pl.lit(True)).unique()
    gaps = gaps.join(opens, on=["rank", "start_ns"], how="left").with_columns(
        pl.col("step_start").fill_null(False)
    )
    keys = ("rank", "collective", "process_group", "role", "step_start")
    gaps = pl.concat(
        [
            gaps.filter("_late_launch").select(
                *keys, start_ns="_prev", end_ns="_cpu", _cat=pl.lit("launch")
            ),
            gaps.filter(pl.col("start_ns") > pl.col("_cpu")).select(
                *keys, start_ns="_cpu", end_ns="start_ns", _cat=pl.lit("queued")
            ),
        ]
    ).sort("rank", "start_ns")
    gaps = _clip_to_windows(gaps, windows)
    # The blame rows and the calls' exposure: one plan, collected once (issue 81).
    rows: list[pl.LazyFrame] = []
    # Compute made disjoint: its pieces' lengths sum to the union's.
    rows.append(
        compute_in.lazy()
        .group_by("rank", "step")
        .agg(ns=(pl.col("end_ns") - pl.col("start_ns")).sum(), calls=pl.len())
        .with_columns(category=pl.lit("compute"))
    )
    if memory_in.height:
        rows.append(
            memory_in.with_columns(ns=uncovered_ns(memory_in, compute))
            .lazy()
            .group_by("rank", "step")
            .agg(pl.col("ns").sum(), calls=pl.len())
            .with_columns(category=pl.lit("memory"))
        )
    exposure = pl.LazyFrame(schema=CALL_EXPOSURE_SCHEMA)
    chain = pl.DataFrame(schema=CHAIN_SCHEMA)
    if comm.height:
        comm = comm.with_columns(ns=uncovered_ns(comm, cover))
        rows.append(
            comm.lazy()
            .group_by("rank", "step", *_KEYS)
            .agg(pl.col("ns").sum(), calls=pl.col("_call").sum())
        )
        # A call's step is the window it ends in, and it is its step's last call as the
        # blame marks its piece there: the rules' per-step exposure and last calls are
        # the blame's and the replay's (a call launched in one step can run in the next
        # window where the device lags its CPU).
        ending = pl.col("end_ns").arg_max()
        exposure = (
            comm.lazy()
            .group_by("_call_row")
            .agg(
                exposed_ns=pl.col("ns").filter(pl.col("_call") == 1).sum(),
                exposed_all_ns=pl.col("ns").sum(),
                step=pl.col("step").get(ending),
                last_call=pl.col("last_call").get(ending),
            )
        )
        chain = _tail_chain(comm)
    chain = pl.concat([chain, _events(comm, gaps, windows)], how="vertical")
    if gaps.height:
        rows.append(
            gaps.lazy()
            .group_by("rank", "step", "collective", "process_group", "role", "step_start", "_cat")
            .agg(ns=(pl.col("end_ns") - pl.col("start_ns")).sum(), calls=pl.len())
            .rename({"_cat": "category"})
        )
    parts = [_as_lazy(r, BLAME_SCHEMA) for r in rows]
    found = pl.concat(parts, how="vertical") if parts else _empty_blame().lazy()
    found = found.filter(pl.col("ns") > 0)
    used = found.group_by("rank", "step").agg(_used=pl.col("ns").sum())
    idle = (
        windows.lazy()
        .join(used, on=["rank", "step"], how="left")
        .select(
            "rank",
            "step",
            category=pl.lit("other_idle"),
            ns=(pl.col("end_ns") - pl.col("start_ns") - pl.col("_used").fill_null(0)).cast(
                pl.Int64
            ),
        )
        .pipe(_as_lazy, BLAME_SCHEMA)
        .with_columns(calls=pl.lit(0, dtype=pl.Int64))
    )
    blame = pl.concat([found, idle], how="vertical").sort(
        "rank", "step", "category", "process_group", "collective", "late_rank", nulls_last=True
    )
    blame, exposure = pl.collect_all(
        [blame, exposure.select(*[pl.col(n).cast(t) for n, t in CALL_EXPOSURE_SCHEMA.items()])]
    )
    return blame, exposure, chain


def _tail_chain(comm: pl.DataFrame) -> pl.DataFrame:
    """The tail chain's rows (CHAIN_SCHEMA) of every window of `comm` (the communication
    pieces, cut to the windows, with their exposed `ns`): the calls of the group of the
    window's last call that ran back to back up to it, each starting at most CHAIN_GAP_NS
    after the one before it ended (queued behind it), grouped as the blame's rows, with
    `span_ns` their whole time, hidden parts included. One plan, collected once."""
    calls = (
        comm.lazy()
        .group_by("rank", "step", "_call_row", "process_group")
        .agg(_s=pl.col("start_ns").min(), _e=pl.col("end_ns").max())
        .sort("rank", "step", "process_group", "_e")
        .with_columns(
            _brk=(pl.col("_s") > pl.col("_e").shift(1) + CHAIN_GAP_NS)
            .fill_null(True)
            .over("rank", "step", "process_group"),
            _i=pl.int_range(pl.len()).over("rank", "step", "process_group"),
        )
        .with_columns(
            _from=pl.col("_i").filter("_brk").max().over("rank", "step", "process_group"),
            _last=pl.col("_e").max().over("rank", "step", "process_group")
            == pl.col("_e").max().over("rank", "step"),
        )
        .filter(pl.col("_last") & (pl.col("_i") >= pl.col("_from")))
        .select("_call_row", "step")
    )
    return _as(
        comm.lazy()
        .join(calls, on=["_call_row", "step"], how="semi")
        .group_by("rank", "step", *_KEYS)
        .agg(
            pl.col("ns").sum(),
            span_ns=(pl.col("end_ns") - pl.col("start_ns")).sum(),
            calls=pl.col("_call").sum(),
            at_ns=pl.col("start_ns").min(),
            end_ns=pl.col("end_ns").max(),
        )
        .with_columns(part=pl.lit("chain")),
        CHAIN_SCHEMA,
    )


def _events(comm: pl.DataFrame, gaps: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """The "event" rows (CHAIN_SCHEMA) of every window: its communication pieces (with
    their exposed `ns`) and its launch and queued pieces, each at its time (`at_ns`,
    `end_ns`); `sync` marks the exposed part of a wait for another rank (a collective's
    wait, or a pipeline call that waited for its peer): where the rank stood still until
    that rank arrived. And a "window" row per window, its span. What the replay re-times.
    One plan, collected once."""
    parts = [
        windows.select(
            "rank",
            "step",
            at_ns="start_ns",
            end_ns="end_ns",
            part=pl.lit("window"),
            ns=pl.lit(0, dtype=pl.Int64),
            sync=pl.lit(False),
        )
    ]
    if comm.height:
        parts.append(
            comm.filter(pl.col("ns") > 0).select(
                "rank",
                "step",
                *_KEYS,
                "ns",
                at_ns="start_ns",
                end_ns="end_ns",
                calls="_call",
                # A collective's wait; a pipeline call that waited for its peer (it came
                # first), all of it (its transfer too is the peer's: its send).
                sync=pl.col("category").is_in(WAITS)
                & pl.col("late_rank").is_not_null()
                & (
                    (pl.col("_call") == 0)
                    | ((pl.col("category") == "pipeline_bubble") & pl.col("_first"))
                ),
            )
        )
    if gaps.height:
        parts.append(
            gaps.select(
                "rank",
                "step",
                "collective",
                "process_group",
                "role",
                "step_start",
                category="_cat",
                ns=pl.col("end_ns") - pl.col("start_ns"),
                at_ns="start_ns",
                end_ns="end_ns",
                calls=pl.lit(1, dtype=pl.Int64),
                sync=pl.lit(False),
            )
        )
    return (
        pl.concat([_as_lazy(r, CHAIN_SCHEMA) for r in parts])
        .with_columns(part=pl.col("part").fill_null("event"), span_ns=pl.col("ns"))
        .filter((pl.col("ns") > 0) | (pl.col("part") == "window"))
        .collect()
    )


def rank_walls(blame: pl.DataFrame | pl.LazyFrame) -> pl.LazyFrame:
    """rank, step, wall_ns: each rank's window length, the sum of its blame rows."""
    return blame.lazy().group_by("rank", "step").agg(wall_ns=pl.col("ns").sum())


def step_times(walls: pl.DataFrame) -> pl.DataFrame:
    """Per step (STEP_TIMES_SCHEMA): `step_ns`, the longest rank's window; `critical_rank`,
    that rank (the lowest on a tie); `ranks` with a window; `complete`: counts toward the
    job's step time (numbered, and not the last of several)."""
    if walls.height == 0:
        return pl.DataFrame(schema=STEP_TIMES_SCHEMA)
    per = (
        walls.sort("step", pl.col("wall_ns"), "rank", descending=[False, True, False])
        .group_by("step", maintain_order=True)
        .agg(
            step_ns=pl.col("wall_ns").first(),
            critical_rank=pl.col("rank").first(),
            ranks=pl.len(),
        )
        .sort("step")
    )
    numbered = per.filter(pl.col("step") >= 0)
    if numbered.height >= 2:
        last = numbered["step"].max()
        complete = (pl.col("step") >= 0) & (pl.col("step") != last)
    elif numbered.height == 1:
        complete = pl.col("step") >= 0
    else:
        complete = pl.lit(True)
    return per.with_columns(complete=complete).select(
        *[pl.col(n).cast(t) for n, t in STEP_TIMES_SCHEMA.items()]
    )


def job_step_ns(times: pl.DataFrame) -> int:
    """The job's step time: mean `step_ns` over the complete steps (0 without steps)."""
    complete = times["complete"]  # Series operations, no query
    count = int(complete.sum())
    if count == 0:
        return 0
    return int(times["step_ns"].filter(complete).sum() // count)


def median_and_worst(times: pl.DataFrame) -> list[dict]:
    """The steps the reports show (text, Markdown, HTML, JSON's kernel-level path): the
    median and the worst of the complete steps by `step_ns` (the median of an even count
    is the lower one; ties by step), as `times`' rows (dicts) with `which`: "median" then
    "worst" (the same step twice when there is one). Empty without complete steps."""
    if times.height == 0 or "complete" not in times.columns:
        return []
    done = times.filter(pl.col("complete")).sort("step_ns", "step")
    if done.height == 0:
        return []
    median = done.row((done.height - 1) // 2, named=True)
    worst = done.row(done.height - 1, named=True)
    return [{**median, "which": "median"}, {**worst, "which": "worst"}]


def critical_blame(blame: pl.DataFrame, times: pl.DataFrame) -> pl.DataFrame:
    """The blame rows of each step's critical rank: sums to the step's `step_ns`."""
    if times.height == 0:
        return _empty_blame()
    pick = times.select("step", rank="critical_rank")
    return blame.join(pick, on=["step", "rank"], how="semi").sort(
        "step", pl.col("ns"), descending=[False, True]
    )


@dataclass(frozen=True)
class Edit:
    """A change to the job, for replay: which time it removes.

    `where`: the blame rows it touches (a Polars expression over BLAME_SCHEMA's columns);
    `fraction`: the share of each such row's ns removed (a number, an expression, or a
    frame of some of BLAME_SCHEMA's columns and `fraction`, joined to the rows on those
    columns: a share per rank and step, say; a row it does not match loses nothing; clipped
    to 0..1); `rank_ns`: optional fixed time removed from given ranks' windows (columns
    rank, remove_ns, and step when it differs per step; without step, every window of the
    rank), e.g. a straggler's own lateness; `shortens`: the fix makes the calls shorter (a
    faster link, fewer calls), rather than moving them under compute, so the share it
    removes from the tail chain's calls counts hidden parts too (module doc); `name`: what
    it models (named in a finding's evidence)."""

    name: str
    where: pl.Expr = field(default_factory=lambda: pl.lit(False))
    fraction: float | pl.Expr | pl.DataFrame = 1.0
    rank_ns: pl.DataFrame | None = None
    shortens: bool = False


def _shared(rows: pl.LazyFrame, edits: Sequence[Edit]) -> pl.LazyFrame:
    """`rows` (blame or tail-chain rows) with `_share`: the largest share of the row any
    of `edits` removes (0..1)."""
    share = pl.lit(0.0)
    joined = []
    for i, e in enumerate(edits):
        if isinstance(e.fraction, pl.DataFrame):
            # A share per key (rank and step, say): joined to the rows, none where unmatched.
            keys = [c for c in e.fraction.columns if c != "fraction"]
            name = f"_fraction{i}"
            rows = rows.join(
                # One row per key (the largest share): a row of the blame is never doubled.
                e.fraction.lazy()
                .select(
                    *[pl.col(k).cast(BLAME_SCHEMA[k]) for k in keys],
                    pl.col("fraction").cast(pl.Float64).alias(name),
                )
                .group_by(keys)
                .agg(pl.col(name).max()),
                on=keys,
                how="left",
                nulls_equal=True,
                maintain_order="left",
            )
            joined.append(name)
            f = pl.col(name).fill_null(0.0)
        elif isinstance(e.fraction, pl.Expr):
            f = e.fraction
        else:
            f = pl.lit(float(e.fraction))
        this = pl.when(e.where).then(f.cast(pl.Float64).clip(0.0, 1.0)).otherwise(0.0)
        share = pl.max_horizontal(share, this.fill_null(0.0))
    return rows.with_columns(_share=share).drop(joined)


def removed_ns(rows: pl.DataFrame | pl.LazyFrame, edits: Sequence[Edit]) -> int:
    """The ns `edits` take out of these blame rows, each row losing the largest share any
    of them removes (as the replay takes it): which findings cover which of the blame's
    time (kineto_comm.analysis.reconcile)."""
    if not edits:
        return 0
    got = _shared(rows.lazy(), edits).select((pl.col("ns") * pl.col("_share")).sum()).collect()
    return int(round(got.item() or 0))


def removed_ns_each(rows: pl.DataFrame | pl.LazyFrame, edits: Sequence[Edit]) -> list[int]:
    """`removed_ns(rows, [edit])` of each edit, planned together (one call of the engine)."""
    plans = [
        _shared(rows.lazy(), [e]).select((pl.col("ns") * pl.col("_share")).sum()) for e in edits
    ]
    return [int(round(got.item() or 0)) for got in pl.collect_all(plans)] if plans else []


def _chain_gain(chain: pl.LazyFrame, edits: Sequence[Edit]) -> pl.LazyFrame:
    """rank, step, _extra: per window, what the shortening edits take out of its tail
    chain beyond the exposed share the blame rows give: the chain's calls ran back to back
    to the step's end, so each call made shorter, hidden parts included, moves the end
    earlier, until the chain's exposed time is down to the (shortened) transfer of its
    calls nothing can hide (`last_call`), which cannot start before the compute it
    follows ends."""
    rows = _shared(chain, [e for e in edits if e.shortens])
    last = pl.col("last_call").fill_null(False) & (pl.col("category") == "transfer")
    return (
        rows.group_by("rank", "step")
        .agg(
            _cut=(pl.col("span_ns") * pl.col("_share")).sum(),
            _direct=(pl.col("ns") * pl.col("_share")).sum(),
            _exposed=pl.col("ns").sum(),
            _floor=(pl.col("ns") * (1.0 - pl.col("_share"))).filter(last).sum(),
        )
        .select(
            "rank",
            "step",
            _extra=(
                pl.min_horizontal("_cut", pl.col("_exposed") - pl.col("_floor")) - pl.col("_direct")
            )
            .clip(lower_bound=0)
            .round()
            .cast(pl.Int64),
        )
    )


def _chain_waits(chain: pl.LazyFrame) -> pl.LazyFrame:
    """rank, step, late_rank, _chained: per window and late rank, what its lateness holds
    of the window through the tail chain: the chain's waits for it, hidden parts included
    (the calls after them queued behind them), at most the chain's exposed time less the
    transfer of its calls nothing can hide (`last_call`)."""
    last = pl.col("last_call").fill_null(False) & (pl.col("category") == "transfer")
    # Per window: the chain's room and its start and end on the timeline.
    per = chain.group_by("rank", "step").agg(
        _room=pl.col("ns").sum() - pl.col("ns").filter(last).sum(),
        _cs=pl.col("at_ns").min(),
        _ce=pl.col("end_ns").max(),
    )
    return (
        chain.filter((pl.col("category") == "wait") & pl.col("late_rank").is_not_null())
        .group_by("rank", "step", "late_rank")
        .agg(_span=pl.col("span_ns").sum())
        .join(per, on=["rank", "step"])
        .select(
            "rank",
            "step",
            "late_rank",
            "_cs",
            "_ce",
            _chained=pl.min_horizontal("_span", "_room").clip(lower_bound=0),
        )
    )


def _fixed(edits: Sequence[Edit], steps: pl.LazyFrame) -> pl.LazyFrame | None:
    """rank, step, _fixed: the largest fixed time any edit takes out of each window of a
    rank (`rank_ns`; a frame without `step` applies to every step `steps` lists)."""
    fixed = [e.rank_ns for e in edits if e.rank_ns is not None and e.rank_ns.height]
    if not fixed:
        return None
    return (
        pl.concat(
            [
                (f.lazy() if "step" in f.columns else f.lazy().join(steps, how="cross")).select(
                    pl.col("rank").cast(pl.Int64),
                    pl.col("step").cast(pl.Int64),
                    pl.col("remove_ns").cast(pl.Int64),
                )
                for f in fixed
            ]
        )
        .group_by("rank", "step")
        .agg(_fixed=pl.col("remove_ns").max())
    )


def _sweep(
    rank: np.ndarray,
    late: np.ndarray,
    wait: np.ndarray,
    direct: np.ndarray,
    own: np.ndarray,
    theirs: np.ndarray,
    n: int,
    compiled: object = _compiled,
) -> np.ndarray:
    """The rank's shift (how much earlier it runs) right after each of its exposed waits for
    another rank, the waits in the order they ended. A wait ends when the awaited rank
    arrives: as much earlier as that rank's shift then; or, what an edit takes out of the
    wait itself taken out on top of the rank's own shift, whichever is more; but no
    earlier than the waiting rank arrives (its shift before the wait plus the wait).
    `own`/`theirs`: the waiting and the awaited rank's removals so far (cumulative, their
    other rows) at the wait's end. Compiled where _sweep.c was built (a storm of small
    collectives holds hundreds of thousands of waits), else this loop."""
    if compiled is not None:
        ints = [np.ascontiguousarray(a, dtype=np.int64) for a in (rank, late)]
        floats = [np.ascontiguousarray(a, dtype=np.float64) for a in (wait, direct, own, theirs)]
        return np.frombuffer(compiled.sweep(*ints, *floats, n), dtype=np.float64)  # type: ignore[attr-defined]
    base = np.zeros(n)
    seen = np.zeros(n)
    out = np.empty(len(rank))
    for i in range(len(rank)):
        y, x = rank[i], late[i]
        before = base[y] + own[i] - seen[y]
        now = base[x] + theirs[i] - seen[x] if x >= 0 else 0.0
        base[y] = out[i] = min(max(now, before + direct[i]), before + wait[i])
        seen[y] = own[i]
    return out


@dataclass(frozen=True)
class Timeline:
    """What the replay re-times (rank_time's third table), prepared once for many replays:
    `rows`, each rank's events and, per window, a row at its start (its fixed time) and at
    its end (its rows without times), in time order per rank (`_o` 0, 1, 2); `windows`
    (rank, step, _first, _last: those two rows' positions); per row `_start`, its rank's
    first row; the exposed waits in the order they ended (`sync_at`, their rows; `late`,
    the awaited rank; `theirs_at`, the awaited rank's last row ending by then, -1 for
    none; the ranks in `_rank`, numbered 0..`ranks`-1); `tail`, the tail chain's rows and
    `chained`, what their waits hold for each late rank (_chain_waits)."""

    rows: pl.DataFrame
    windows: pl.DataFrame
    start: np.ndarray
    sync_at: np.ndarray
    late: np.ndarray
    theirs_at: np.ndarray
    tail: pl.DataFrame
    chained: pl.DataFrame
    ranks: int


def timeline(frame: pl.DataFrame | pl.LazyFrame) -> Timeline:
    """The Timeline of a replay_timeline frame (CHAIN_SCHEMA rows; missing columns null):
    its tables planned lazily and collected together (issue 81: one call, not one each)."""
    frame = _as(frame, CHAIN_SCHEMA).lazy()
    events = frame.filter(pl.col("part") == "event").with_columns(
        pl.col("sync").fill_null(False), _o=pl.lit(1, dtype=pl.Int8)
    )
    # A window's span: its "window" row, or its events'.
    bounds = (
        pl.concat(
            [
                frame.filter(pl.col("part") == "window").select(
                    "rank", "step", _a="at_ns", _z="end_ns"
                ),
                events.group_by("rank", "step").agg(
                    _a=pl.col("at_ns").min(), _z=pl.col("end_ns").max()
                ),
            ]
        )
        .group_by("rank", "step")
        .agg(pl.col("_a").min(), pl.col("_z").max())
    )
    edge = {"part": pl.lit("edge"), "sync": pl.lit(False), "ns": pl.lit(0, dtype=pl.Int64)}
    rows = (
        pl.concat(
            [
                events,
                bounds.select(
                    "rank", "step", at_ns="_a", end_ns="_a", _o=pl.lit(0, dtype=pl.Int8), **edge
                ),
                bounds.select(
                    "rank", "step", at_ns="_z", end_ns="_z", _o=pl.lit(2, dtype=pl.Int8), **edge
                ),
            ],
            how="diagonal_relaxed",
        )
        .sort("rank", "step", "at_ns", "_o")
        .with_row_index("_row")
        .with_columns(_start=pl.col("_row").min().over("rank"))
        .collect()  # numbered once: every table below reads these row numbers
        .lazy()
    )
    windows = rows.group_by("rank", "step").agg(
        _first=pl.col("_row").min(), _last=pl.col("_row").max()
    )
    syncs = rows.filter("sync").select("_row", "end_ns", "late_rank")
    # Each row by its end, for the as-of joins that find a rank's last row ending by then.
    # (Sorted once: ties on the end keep one order for every join below.)
    ends = (
        rows.select("rank", "_row", _at="end_ns", _event=pl.col("_o") == 1)
        .sort("_at")
        .collect()
        .lazy()
    )
    theirs = (
        syncs.sort("end_ns")
        .join_asof(
            ends.select(late_rank="rank", _at="_at", _their="_row"),
            left_on="end_ns",
            right_on="_at",
            by="late_rank",
            strategy="backward",
            check_sortedness=False,
        )
        .sort("end_ns", "_row")
    )
    # The sweep keeps a state per rank: ranks numbered 0..n-1 in the order they appear (a
    # rank id is any integer a trace gives); an awaited rank without rows is -1 (no shift).
    ids = rows.select(pl.col("rank").unique(maintain_order=True))
    tail = frame.filter(pl.col("part") == "chain")
    chained = _chained_rows(_chain_waits(tail), rows, ends, windows)
    rows, windows, theirs, ids, tail, chained = pl.collect_all(
        [rows, windows, theirs, ids, tail, chained]
    )
    ids = ids.to_series()
    dense = dict(zip(ids.to_list(), range(ids.len()), strict=True))
    theirs = theirs.select(
        "_row",
        pl.col("late_rank").replace_strict(dense, default=-1, return_dtype=pl.Int64).fill_null(-1),
        pl.col("_their").fill_null(-1),
    )
    return Timeline(
        rows=rows.drop("_row").with_columns(
            _rank=pl.col("rank").replace_strict(dense, return_dtype=pl.Int64)
        ),
        windows=windows,
        start=rows["_start"].to_numpy().astype(np.int64),
        sync_at=theirs["_row"].to_numpy().astype(np.int64),
        late=theirs["late_rank"].to_numpy().astype(np.int64),
        theirs_at=theirs["_their"].to_numpy().astype(np.int64),
        tail=tail,
        chained=chained,
        ranks=ids.len(),
    )


def _chained_rows(
    chained: pl.LazyFrame, rows: pl.LazyFrame, ends: pl.LazyFrame, windows: pl.LazyFrame
) -> pl.LazyFrame:
    """`chained` (_chain_waits) with the rows the replay reads shifts at (`ends`: the
    timeline's rows sorted by their end, as `timeline` has them): `_b`, the rank's
    last row starting before the chain; `_c`, its last event ending by the chain's end;
    `_l`, the awaited rank's last row ending by then (-1: none, or a chain without times:
    the replay then takes that rank's window gain); `_first`/`_final`, the window's first
    and last rows."""
    windows = windows.rename({"_last": "_final"})
    has_times = pl.col("_cs").is_not_null() & pl.col("_ce").is_not_null()
    timed = chained.filter(has_times)
    untimed = chained.filter(~has_times).join(windows, on=["rank", "step"], how="inner")
    parts = [untimed.with_columns(_b=pl.col("_first"), _c=pl.col("_first"), _l=pl.lit(-1))]
    # The timed ones (none: no rows, and the same columns after the casts below).
    starts = rows.select("rank", _at="at_ns", _b="_row").sort("_at")
    asof = {"strategy": "backward", "check_sortedness": False}
    parts.append(
        timed.sort("_cs")
        .join_asof(
            starts, left_on="_cs", right_on="_at", by="rank", allow_exact_matches=False, **asof
        )
        .drop("_at")
        .sort("_ce")
        .join_asof(
            ends.filter("_event").select("rank", "_at", _c="_row"),
            left_on="_ce",
            right_on="_at",
            by="rank",
            **asof,
        )
        .drop("_at")
        .join_asof(
            ends.select(late_rank="rank", _at="_at", _l="_row"),
            left_on="_ce",
            right_on="_at",
            by="late_rank",
            **asof,
        )
        .drop("_at")
        .join(windows, on=["rank", "step"], how="inner")
    )
    cols = [*chained.collect_schema().names(), "_b", "_c", "_l", "_first", "_final"]
    return pl.concat([p.select(cols) for p in parts], how="vertical_relaxed").with_columns(
        pl.col("_b").fill_null(pl.col("_first")).cast(pl.Int64),
        pl.col("_c").fill_null(pl.col("_first")).cast(pl.Int64),
        pl.col("_l").fill_null(-1).cast(pl.Int64),
        pl.col("_first").cast(pl.Int64),
        pl.col("_final").cast(pl.Int64),
    )


def _after_wait(line: Timeline, edits: Sequence[Edit], r: np.ndarray) -> np.ndarray:
    """Per exposed wait (`line.sync_at`), the part of its row's removal `r` that comes
    after the wait: what a shortening edit takes out of a pipeline call that waited for its
    peer (one row: the wait, then the transfer, which starts when the peer arrives and so
    ends that much earlier than the peer's arrival). The sweep adds it to the awaited
    rank's shift at that wait."""
    short = [e for e in edits if e.shortens]
    if not short:
        return np.zeros(len(line.sync_at))
    rows = line.rows[line.sync_at]
    lumped = (pl.col("category") == "pipeline_bubble") & (pl.col("calls") > 0)
    part = (
        _shared(rows.lazy(), short)
        .select(
            pl.when(lumped).then(pl.col("ns").cast(pl.Float64) * pl.col("_share")).otherwise(0.0)
        )
        .collect()
        .to_series()
        .to_numpy()
    )
    return np.minimum(part, r[line.sync_at])


def _removed(
    blame: pl.LazyFrame, edits: Sequence[Edit], line: Timeline | None = None
) -> pl.LazyFrame:
    """rank, step, wall_ns, removed_ns: per window, what the edits together take out of it
    (module doc, "Replay"): per row the largest share any edit removes, the largest fixed
    per-rank time at the window's start, what the shortening ones take out of the tail
    chain; re-timed along each rank's timeline, where a wait for another rank ends as much
    earlier as that rank runs earlier when it arrives. Capped at the window."""
    rows = _shared(blame, edits).with_columns(
        _rm=(pl.col("ns").cast(pl.Float64) * pl.col("_share")).round().cast(pl.Int64)
    )
    timed = pl.col("category").is_in(TIMED)
    per = rows.group_by("rank", "step").agg(
        wall_ns=pl.col("ns").sum(),
        # Rows without times (compute, memory, other_idle) come out at the window's end.
        _untimed=pl.col("_rm").filter(~timed).sum(),
        _timed=pl.col("_rm").filter(timed).sum(),
    )
    fixed = _fixed(edits, per.select("step").unique())
    per = (
        per.join(fixed, on=["rank", "step"], how="left")
        if fixed is not None
        else per.with_columns(_fixed=pl.lit(0, dtype=pl.Int64))
    ).with_columns(pl.col("_fixed").fill_null(0))
    if line is not None and line.tail.height and any(e.shortens for e in edits):
        per = (
            per.join(_chain_gain(line.tail.lazy(), edits), on=["rank", "step"], how="left")
            .with_columns(_untimed=pl.col("_untimed") + pl.col("_extra").fill_null(0))
            .drop("_extra")
        )
    per = per.sort("rank", "step")
    flat = (pl.col("_fixed") + pl.col("_untimed") + pl.col("_timed")).cast(pl.Float64)
    if line is None or line.rows.height == 0:
        # No times: every row's share and the fixed time come out, no wait moves.
        return per.select(
            "rank", "step", "wall_ns", removed_ns=pl.min_horizontal(flat, pl.col("wall_ns"))
        )
    # Per row what it loses: its share; a window's first and last rows, its fixed time and
    # its rows without times. The windows, the rows' shares and the windows' ends: one call.
    shares = _shared(line.rows.lazy(), edits).select(
        pl.col("ns").cast(pl.Float64) * pl.col("_share")
    )
    ends = (
        line.windows.lazy()
        .join(per, on=["rank", "step"], how="left")
        .with_columns(pl.col("_fixed", "_untimed").fill_null(0))
    )
    per, shares_frame, ends = pl.collect_all([per, shares, ends])
    r = shares_frame.to_series().to_numpy().copy()
    r[ends["_first"].to_numpy()] = ends["_fixed"].to_numpy()
    r[ends["_last"].to_numpy()] = ends["_untimed"].to_numpy()
    sync = line.rows["sync"].to_numpy()
    ns = line.rows["ns"].to_numpy().astype(np.float64)
    # The rank's removals so far, its waits left out (the sweep re-times them).
    moved = np.where(sync, 0.0, r)
    total = np.cumsum(moved)
    so_far = total - (total[line.start] - moved[line.start])
    shift = so_far
    if len(line.sync_at):
        at, their = line.sync_at, line.theirs_at
        after = _sweep(
            line.rows["_rank"].to_numpy()[at],
            line.late,
            ns[at],
            r[at],
            so_far[at],
            np.where(their >= 0, so_far[np.maximum(their, 0)], 0.0) + _after_wait(line, edits, r),
            line.ranks,
        )
        # The shift after each row: its removals so far, plus what its last wait set it to.
        offset = np.zeros(len(r))
        last = np.full(len(r), -1, dtype=np.int64)
        offset[at] = after - so_far[at]
        last[at] = at
        last = np.maximum.accumulate(last)
        valid = last >= line.start
        shift = so_far + np.where(valid, offset[np.maximum(last, 0)], 0.0)
    first, final = ends["_first"].to_numpy(), ends["_last"].to_numpy()
    # A window loses what its rank's shift grew by from its first row (the fixed time,
    # counted) to its last. The rest is one plan, collected once (issue 81).
    grew = pl.DataFrame(
        [ends["rank"], ends["step"], pl.Series("_e", shift[final] - (shift[first] - r[first]))]
    )
    gained = (
        per.lazy()
        .join(grew.lazy(), on=["rank", "step"], how="left")
        .select(
            "rank",
            "step",
            "wall_ns",
            _t=pl.col("_e").fill_null(flat).clip(0.0, pl.col("wall_ns")),
        )
    )
    if line.chained.height:
        # The tail chain's waits, hidden parts included: the chain ends as much earlier as
        # the awaited rank runs earlier when it ends (at most what its waits hold), after
        # what the rank gained before the chain; then what it gains after it.
        c = line.chained
        b, e, late, first = (c[n].to_numpy() for n in ("_b", "_c", "_l", "_first"))
        s_b, s_e = shift[b], shift[e]
        s_late = np.where(late >= 0, shift[np.maximum(late, 0)], 0.0)
        start = shift[first] - r[first]
        after = np.maximum(s_e, np.minimum(s_late, s_b + c["_chained"].to_numpy()))
        more = (
            pl.DataFrame(
                [
                    *(c[n] for n in ("rank", "step", "late_rank", "_chained")),
                    pl.Series("_abs", after - start + (shift[c["_final"].to_numpy()] - s_e)),
                    pl.Series("_timed", late >= 0),
                ]
            )
            .lazy()
            # An awaited rank without times on the timeline: its window's gain.
            .join(
                gained.select(late_rank="rank", step="step", _gain="_t"),
                on=["late_rank", "step"],
                how="left",
            )
            .select(
                "rank",
                "step",
                _more=pl.when("_timed")
                .then("_abs")
                .otherwise(pl.min_horizontal("_chained", pl.col("_gain").fill_null(0.0))),
            )
            .group_by("rank", "step")
            .agg(pl.col("_more").max())
        )
        gained = gained.join(more, on=["rank", "step"], how="left").with_columns(
            _t=pl.max_horizontal("_t", pl.col("_more").fill_null(0)).clip(
                upper_bound=pl.col("wall_ns")
            )
        )
    return gained.select("rank", "step", "wall_ns", removed_ns=pl.col("_t").round().cast(pl.Int64))


def replay(
    blame: pl.DataFrame | pl.LazyFrame,
    times: pl.DataFrame,
    edits: Sequence[Edit],
    chain: Timeline | pl.DataFrame | pl.LazyFrame | None = None,
) -> int:
    """The job's step time (ns) with `edits` applied (together), on the complete steps of
    `times`: per step the longest rank's window less what the edits remove from it.
    `chain`: what the replay re-times (rank_time's third table, or its Timeline); without
    it, every row's share comes out and no wait moves."""
    complete = int(times["complete"].sum())  # the steps counted: no query
    if complete == 0:
        return 0
    use = times.lazy().filter(pl.col("complete")).select("step")
    line = chain if isinstance(chain, Timeline) or chain is None else timeline(chain)
    new = (
        _removed(blame.lazy(), edits, line)
        .join(use, on="step", how="semi")
        .group_by("step")
        .agg(new=(pl.col("wall_ns") - pl.col("removed_ns")).max())
        .select(pl.col("new").sum())
        .collect()
    )
    return int(new.item() // complete)


def saving(
    blame: pl.DataFrame | pl.LazyFrame,
    times: pl.DataFrame,
    edits: Sequence[Edit],
    chain: Timeline | pl.DataFrame | pl.LazyFrame | None = None,
) -> int:
    """Step time the edits save together: job_step_ns - replay (never negative, never more
    than the step)."""
    base = job_step_ns(times)
    if not edits:
        return 0
    return max(0, min(base, base - replay(blame, times, edits, chain)))


def launch_floor(
    kernels: pl.LazyFrame, removals: pl.DataFrame, host_waits: bool = True
) -> pl.LazyFrame:
    """rank, step, removed_ns, allowed_ns: per window, what a fix that leaves the CPU's
    launches where they are can take out of it. `removals`: rank, step, at_ns, remove_ns,
    time a fix takes out of the window at `at_ns`; `kernels`: rank, step, start_ns,
    launch_ns. What is taken out at p lets the kernels that start at or after p start
    earlier, but none before its launch: a kernel k of slack start_k - launch_k passes on
    at most its slack plus what is taken out after it starts, so the window shrinks by
    min(all removals, min over k of that bound).

    `host_waits`: a kernel whose launching thread last waited for the device at w
    (kernels' `waited_ns`: a synchronisation, a run of polls or a blocking copy that
    outlasted device work ending at w) was launched after the CPU saw that work done: its
    launch moves with what is taken out up to w, and its slack caps only what is taken out
    after w. Without a wait (or the column), every launch stays where it is. False: every
    launch stays where it is (queue_shift: the device's other work, which the CPU waits for
    nowhere)."""
    keys = ["rank", "step"]
    r = removals.lazy().select(
        pl.col("rank").cast(pl.Int64),
        pl.col("step").cast(pl.Int64),
        pl.col("at_ns").cast(pl.Int64),
        pl.col("remove_ns").cast(pl.Float64),
    )
    total = r.group_by(keys).agg(removed_ns=pl.col("remove_ns").sum())
    # What is taken out at or after each point, per window, from the last point back.
    after = (
        r.sort(*keys, "at_ns", descending=[False, False, True])
        .with_columns(_after=pl.col("remove_ns").cum_sum().over(keys))
        .sort("at_ns")
        .select(*keys, "at_ns", "_after")
    )
    # Only a kernel whose slack is below the window's removal can bind: the others are
    # left out before the sort (most, where the CPU runs ahead of the device).
    waited = host_waits and "waited_ns" in kernels.collect_schema().names()
    slack = (
        kernels.filter(pl.col("launch_ns").is_not_null())
        .select(
            pl.col("rank").cast(pl.Int64),
            pl.col("step").cast(pl.Int64),
            "start_ns",
            # Where the launch moves with what is taken out (none: -inf, nothing).
            _waited=pl.col("waited_ns").fill_null(-(2**62)) if waited else pl.lit(-(2**62)),
            _slack=(pl.col("start_ns") - pl.col("launch_ns")).clip(lower_bound=0).cast(pl.Float64),
        )
        .join(total, on=keys, how="inner")
        .filter(pl.col("_slack") < pl.col("removed_ns"))
    )

    def taken_after(frame: pl.LazyFrame, at: str, name: str) -> pl.LazyFrame:
        """`frame` with `name`: what is taken out strictly after its column `at` (read at
        the first point after it)."""
        return (
            frame.sort(at)
            .join_asof(
                after.rename({"_after": name}),
                left_on=at,
                right_on="at_ns",
                by=keys,
                strategy="forward",
                allow_exact_matches=False,
                check_sortedness=False,
            )
            .drop("at_ns")
            .with_columns(pl.col(name).fill_null(0.0))
        )

    bound = taken_after(slack, "start_ns", "_after_start")
    passed = pl.col("_after_start")
    if waited:
        bound = taken_after(bound, "_waited", "_after_waited")
        passed = passed + pl.col("removed_ns") - pl.col("_after_waited")
    bound = bound.group_by(keys).agg(_floor=(pl.col("_slack") + passed).min())
    return (
        total.join(bound, on=keys, how="left")
        .with_columns(
            allowed_ns=pl.min_horizontal("removed_ns", pl.col("_floor").fill_null(float("inf")))
        )
        .drop("_floor")
    )


def queue_shift(kernels: pl.LazyFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """rank, step, removed_ns, allowed_ns: per window (`windows`: rank, step, start_ns,
    end_ns), its queued time (the blame's `queued` rows) and what the device's other work
    moved off it takes out of the window. Each queued kernel starts earlier by its queue
    and passes that on only as far as the later kernels' launches let them move
    (launch_floor). And a window starts with its first kernel: the queue before that
    kernel (the window before holds it; before a rank's first kernel, its start less its
    launch's end and LAUNCH_LATENCY_NS) moves the window's start with it, so it is taken
    off what the window gains: a queue at every step's start moves the steps, it does not
    shorten them. `kernels`: rank, step, start_ns, end_ns, launch_ns, and launch_end_ns
    where the table has it."""
    schema = {
        "rank": pl.Int64,
        "step": pl.Int64,
        "removed_ns": pl.Float64,
        "allowed_ns": pl.Float64,
    }
    names = kernels.collect_schema().names()
    launched = pl.col("launch_ns")
    if "launch_end_ns" in names:
        launched = pl.coalesce("launch_end_ns", "launch_ns")
    k = (
        kernels.select(
            pl.col("rank").cast(pl.Int64),
            pl.col("step").cast(pl.Int64),
            "start_ns",
            "end_ns",
            "launch_ns",
            _launched=launched,
        )
        .filter(pl.col("end_ns") > pl.col("start_ns"))
        .sort("rank", "start_ns", maintain_order=True)
        .collect()
    )
    gaps = _launch_gaps(k).filter(pl.col("start_ns") > pl.col("_cpu"))
    if gaps.height == 0:
        return pl.DataFrame(schema=schema)
    win = windows.select(
        pl.col("rank").cast(pl.Int64),
        pl.col("step").cast(pl.Int64),
        _ws=pl.col("start_ns"),
        _we=pl.col("end_ns"),
    ).sort("_ws")
    # Each queue in the window that holds its last nanosecond (the blame's clipping: a
    # queue before a window's first kernel is the window before's).
    queued = (
        gaps.select("rank", at_ns="start_ns", remove_ns=pl.col("start_ns") - pl.col("_cpu"))
        .with_columns(_last=pl.col("at_ns") - 1)
        .sort("_last")
        .join_asof(win, left_on="_last", right_on="_ws", by="rank", check_sortedness=False)
        .filter(pl.col("_last") < pl.col("_we"))
        .select("rank", "step", "at_ns", "remove_ns")
    )
    # Each window's head: the queue before its first kernel (the window before holds it;
    # before a rank's first kernel, that kernel's start less its launch's end and
    # LAUNCH_LATENCY_NS).
    first = k.group_by("rank").agg(pl.all().first())
    before = pl.concat(
        [
            queued.select("rank", "at_ns", "remove_ns"),
            first.select(
                "rank",
                at_ns="start_ns",
                remove_ns=(pl.col("start_ns") - pl.col("_launched") - LAUNCH_LATENCY_NS).clip(
                    lower_bound=0
                ),
            ).filter(pl.col("remove_ns") > 0),
        ]
    ).cast({"remove_ns": pl.Int64})
    heads = win.join(before, left_on=["rank", "_ws"], right_on=["rank", "at_ns"]).select(
        "rank", "step", at_ns="_ws", remove_ns="remove_ns"
    )
    # The step moves by its head and passes that on, with its own queues, as far as its
    # kernels' launches let it (launch_floor; the launches after a host wait at the step's
    # start move with it); what the window gains is how far its end moves, less its start.
    floor = launch_floor(k.lazy(), pl.concat([queued, heads]), host_waits=False).collect()
    own = queued.group_by("rank", "step").agg(removed_ns=pl.col("remove_ns").sum())
    head = heads.group_by("rank", "step").agg(_head=pl.col("remove_ns").sum())
    return (
        own.join(floor.select("rank", "step", "allowed_ns"), on=["rank", "step"], how="left")
        .join(head, on=["rank", "step"], how="left")
        .select(
            "rank",
            "step",
            "removed_ns",
            allowed_ns=(pl.col("allowed_ns").fill_null(0) - pl.col("_head").fill_null(0)).clip(
                0, pl.col("removed_ns")
            ),
        )
        .cast(schema)
    )


def lateness(
    blame: pl.DataFrame | pl.LazyFrame, chain: pl.DataFrame | pl.LazyFrame | None = None
) -> pl.LazyFrame:
    """rank, step, remove_ns: per step, how late each rank made the others: the longest
    wait (summed per waiting rank) any rank of the step had for it; with `chain` (the tail
    chain's rows), the waits it holds the chain back by, hidden parts included, where that
    is longer. What a rank's window loses when it does the mean rank's work (an Edit's
    `rank_ns`)."""
    waits = (
        blame.lazy()
        .filter((pl.col("category") == "wait") & pl.col("late_rank").is_not_null())
        .group_by("rank", "step", "late_rank")
        .agg(w=pl.col("ns").sum())
    )
    if chain is not None:
        waits = pl.concat(
            [
                waits,
                _chain_waits(chain.lazy().filter(pl.col("part") == "chain")).select(
                    "rank", "step", "late_rank", w="_chained"
                ),
            ],
            how="vertical_relaxed",
        )
    return (
        waits.group_by("late_rank", "step")
        .agg(remove_ns=pl.col("w").max())
        .select(rank="late_rank", step="step", remove_ns="remove_ns")
    )
