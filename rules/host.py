"""SYNC102 host-bound-communication, SYNC103 blocking-synchronisation, SYNC105
device-contention and SYNC106 launch-bound: the device waits for the host, or for work the
trace does not show."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    LAUNCH_LATENCY_NS,
    Edit,
    Finding,
    Option,
    Severity,
    Tables,
    impact_per_step,
    in_rank_order,
    make_finding,
    mean_step_ns,
    queue_shift,
    replay_saving,
    replay_timeline,
    rule,
    severity_for,
    step_blame,
    step_times,
)

from ._common import SHARE_OPTIONS, STORM_MAX_BYTES, STORM_MIN_CALLS, share_severity, storm_keys
from ._framework import cpu_holders, markers, uses
from .capture import contention

OPTIONS = (
    Option("min_gap_ns", 5_000, "Ignore device gaps shorter than this (launch latency)."),
    Option("warn_share", 0.05, "Warn when the gaps cost this share of step time."),
    Option("error_share", 0.15, "Error at this share of step time."),
)


# The kernels' columns the timeline reads, and the timeline's own columns.
KERNEL_COLUMNS = (
    "rank",
    "step",
    "kind",
    "start_ns",
    "end_ns",
    "launch_ns",
    "launch_end_ns",
    "waited_ns",
)
TIMELINE_SCHEMA = {
    "rank": pl.Int64,
    "step": pl.Int64,
    "kind": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "launch_ns": pl.Int64,
    "busy_through": pl.Int64,
    "busy_until": pl.Int64,
    "prev_kind": pl.String,
    "prev_step": pl.Int64,
    "next_start": pl.Int64,
    "next_launch": pl.Int64,
    "next_launched": pl.Int64,
    "next_waited": pl.Int64,
    "in_storm": pl.Boolean,
}


def _timeline(tables: Tables) -> pl.LazyFrame:
    """Communication kernels per rank in start order, with what ran before and after each
    and whether the call is part of a message storm; built once per rules run for both
    rules of this module, a few ranks at a time (kept in files on a big job)."""
    storms = storm_keys(tables, STORM_MAX_BYTES, STORM_MIN_CALLS)
    return tables.derived(
        ("builtin", "host", "timeline"),
        "kernels",
        lambda k: _build_timeline(tables, k, storms),
        KERNEL_COLUMNS,
    )


def _build_timeline(tables: Tables, k: pl.DataFrame, storms: pl.DataFrame) -> pl.DataFrame:
    """_timeline's rows for a batch of whole ranks' kernels."""
    for column in ("launch_end_ns", "waited_ns"):  # not in a table built without them
        if column not in k.columns:
            k = k.with_columns(pl.lit(None, dtype=pl.Int64).alias(column))
    if k.width < len(KERNEL_COLUMNS):  # kernels without the columns (an empty table)
        return pl.DataFrame(schema=TIMELINE_SCHEMA)
    # Kernels are stored in (rank, start) order: sorting them again was a third of this
    # rule's time on a big job.
    k = in_rank_order(k.filter(pl.col("start_ns").is_not_null()))
    # Neighbours within the rank by plain shifts (rows are sorted by rank).
    prev = pl.col("rank").shift(1) == pl.col("rank")
    after = pl.col("rank").shift(-1) == pl.col("rank")
    around = (
        k.with_columns(busy_through=pl.col("end_ns").cum_max().over("rank"))
        .with_columns(
            busy_until=pl.when(prev).then(pl.col("busy_through").shift(1)),
            prev_kind=pl.when(prev).then(pl.col("kind").shift(1)),
            prev_step=pl.when(prev).then(pl.col("step").shift(1)),
            next_start=pl.when(after).then(pl.col("start_ns").shift(-1)),
            next_launch=pl.when(after).then(pl.col("launch_ns").shift(-1)),
            # When the CPU was done launching it (its launch call's end where known).
            next_launched=pl.when(after).then(pl.coalesce("launch_end_ns", "launch_ns").shift(-1)),
            # Where the CPU that launched it last waited for the device (kernels.waited_ns).
            next_waited=pl.when(after).then(pl.col("waited_ns").shift(-1)),
        )
        .filter(pl.col("kind") == "communication")
    )
    # The calls of a storm, by their kernel's start (the same ranks' calls only).
    ranks = around["rank"].unique().sort().to_list()
    cols = ("rank", "start_ns", "process_group", "collective")
    calls = [c for c in tables.rank_batches("collectives", cols, ranks) if c.width == len(cols)]
    in_storm = (
        pl.concat(calls, how="vertical_relaxed")
        .with_columns(pl.col("process_group").cast(pl.String))
        .join(storms, on=["process_group", "collective"], how="semi")
        .select("rank", "start_ns", in_storm=pl.lit(True))
        .unique(["rank", "start_ns"])
        if calls and storms.height
        else pl.DataFrame(schema={"rank": pl.Int64, "start_ns": pl.Int64, "in_storm": pl.Boolean})
    )
    return (
        around.join(in_storm, on=["rank", "start_ns"], how="left", maintain_order="left")
        .with_columns(pl.col("in_storm").fill_null(False))
        .select(list(TIMELINE_SCHEMA))
        .cast(TIMELINE_SCHEMA)
    )


def _report(
    rule_: Any,
    tables: Tables,
    rows: Callable[[Tables], pl.LazyFrame],
    options: dict[str, Any],
    what: str,
    advice: tuple[str, ...],
    where: pl.Expr | None = None,
) -> list[Finding]:
    """The finding for the gaps `rows(tables)` gives (a function of the tables, so that
    impact_per_step reads a few ranks at a time)."""

    def gaps(view: Tables) -> pl.LazyFrame:
        return rows(view).filter(pl.col("gap") >= options["min_gap_ns"])

    impact = impact_per_step(gaps, "gap", tables=tables)
    if impact.height == 0:
        return []
    imp = impact.row(0, named=True)
    step_ns = mean_step_ns(tables)
    # The model of time's launch gaps (step_blame, category "launch"; `where` narrows them)
    # hold these gaps and others: this fix removes its share of them.
    where = pl.col("category") == "launch" if where is None else where
    mine = tables.collect(gaps(tables).select(pl.col("gap").sum())).item() or 0
    launch = tables.collect(step_blame(tables).filter(where).select(pl.col("ns").sum())).item() or 0
    fraction = min(1.0, mine / launch) if launch else 0.0
    edit = Edit(f"remove the CPU launch gaps of: {what.lower()}", where, fraction)
    saving = replay_saving(tables, edit)
    share = saving / step_ns if step_ns else 0.0
    sev = severity_for(share, options["warn_share"], options["error_share"])
    if sev is None:
        sev = Severity.info if share >= 0.01 else None
    if sev is None:
        return []
    first, last, largest = tables.collect(
        gaps(tables).select(pl.col("start_ns").min(), pl.col("end_ns").max(), pl.col("gap").max())
    ).row(0)
    return [
        make_finding(
            rule_,
            sev,
            f"{what}: {saving / 1e6:.2f} ms per step",
            f"{what} leaves the GPU idle {imp['impact_ns'] / 1e6:.2f} ms per step on the "
            f"worst rank, {imp['calls']} gap(s) per step; without these gaps the step would "
            f"be {saving / 1e6:.2f} ms shorter ({share:.1%} of step time).",
            impact_ns_per_step=saving,
            step_ns=step_ns,
            ranks=imp["ranks"] or [],
            steps=imp["steps"] or [],
            window_ns=(int(first), int(last)),
            evidence={
                "gaps_per_step": imp["calls"],
                "idle_ns_per_step": int(imp["impact_ns"]),
                "largest_gap_ns": int(largest),
                "launch_gap_share": round(fraction, 4),
                "step_ns": step_ns,
                "saving_method": f"replay: {edit.name}",
            },
            edit=edit,
            advice=advice,
        )
    ]


@rule(
    code="SYNC102",
    name="host-bound-communication",
    summary="The GPU idles before collectives because the CPU launched them late.",
    tables=("kernels", "steps"),
    options=OPTIONS,
)
def host_bound_communication(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    For every communication kernel, looks at the device just before it: if every earlier
    kernel had finished (the GPU was idle) and the CPU launched the collective only after
    that (kernels.launch_ns), the idle time from the end of the previous work to the launch
    is host-bound. Summed per rank and step; gaps after another collective are SYNC103's,
    gaps before the calls of a message storm COMM201's.
    The gap before a step's first kernel is left out, whichever kernel that is: there the
    device waits for the host's work between steps (the previous step's synchronisation,
    the data loader, zero_grad), not for a collective's launch path.
    The impact is the replayed saving of the model of time's launch gaps before collectives
    without this rule's share of them.

    Why is this bad?
    The GPU waits for Python: slow collective launch paths (per-tensor all-reduce calls,
    hooks, Python overhead, CPU contention, the GIL held by a data loader thread) put CPU time
    on the critical path of every step.

    How to fix:
    Launch fewer, bigger collectives (bucketing, coalescing); reduce CPU overhead (CUDA graphs,
    torch.compile, fewer hooks); pin the process to free cores; enable DDP static_graph and
    avoid find_unused_parameters=True.
    """

    def rows(view: Tables) -> pl.LazyFrame:
        return (
            _timeline(view)
            .filter(
                pl.col("launch_ns").is_not_null()
                & pl.col("busy_until").is_not_null()
                & (pl.col("prev_kind") != "communication")
                # Not a step's first kernel: that gap is the host's between steps.
                & (pl.col("prev_step") == pl.col("step"))
                # A storm's launches are COMM201's (merging its calls removes them).
                & ~pl.col("in_storm")
            )
            .with_columns(
                gap=(pl.min_horizontal("launch_ns", "start_ns") - pl.col("busy_until")).clip(
                    lower_bound=0
                )
            )
        )

    return _report(
        host_bound_communication,
        tables,
        rows,
        options,
        "Collectives launched late by the CPU",
        where=(pl.col("category") == "launch") & pl.col("collective").is_not_null(),
        advice=(
            "Launch fewer, larger collectives (DDP bucketing, coalesced all-reduce).",
            "Cut CPU overhead on the launch path: CUDA graphs / torch.compile, fewer Python "
            "hooks, DDP static_graph=True, no find_unused_parameters.",
            "Make sure the training process has free CPU cores (no oversubscribed data "
            "loader workers; numactl / taskset binding).",
        ),
    )


@rule(
    code="SYNC103",
    name="blocking-synchronisation",
    summary="The CPU blocks until a collective finishes before launching more work.",
    tables=("kernels", "steps"),
    options=OPTIONS,
)
def blocking_synchronisation(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Finds collectives after which the GPU goes idle and the next kernel was launched by the
    CPU only after it had waited for the collective to finish (a host wait of the
    launching thread that outlasted it, kernels.waited_ns: work.wait() with blocking wait,
    torch.cuda.synchronize(), .item()/.cpu() on its result, a blocking barrier). A CPU that
    launched late without waiting was busy elsewhere: SYNC106's launch gaps. The
    idle time until the next kernel is counted per rank and step, up to the end of its
    launch call and the launch's way to the device (rules_api.LAUNCH_LATENCY_NS; a longer
    wait is SYNC105's).
    The impact is the replayed saving of the model of time's launch gaps without this
    rule's share of them.

    Why is this bad?
    A host-side wait empties the GPU's queue: after the collective the GPU idles for the
    CPU's wake-up, Python and launch latency, and nothing can overlap the collective.

    How to fix:
    Keep the CPU ahead of the GPU: use async_op=True and wait on the stream
    (work.wait() without host sync), avoid .item()/.cpu()/print of reduced values every step
    (log every N steps), drop torch.cuda.synchronize() and CUDA_LAUNCH_BLOCKING=1, and let
    NCCL_BLOCKING_WAIT / TORCH_NCCL_BLOCKING_WAIT stay unset in production.
    """
    # In a storm of tiny collectives the CPU trails the GPU anyway: COMM201's time.

    def rows(view: Tables) -> pl.LazyFrame:
        return (
            _timeline(view)
            .filter(
                pl.col("next_launch").is_not_null()
                & (pl.col("busy_through") == pl.col("end_ns"))
                & (pl.col("next_launch") >= pl.col("end_ns"))
                & (pl.col("next_start") > pl.col("end_ns"))
                # The CPU waited until the collective was done (not merely busy elsewhere).
                & (pl.col("next_waited") >= pl.col("end_ns")).fill_null(False)
                & ~pl.col("in_storm")
            )
            .with_columns(
                gap=pl.min_horizontal("next_start", pl.col("next_launched") + LAUNCH_LATENCY_NS)
                - pl.col("end_ns")
            )
        )

    return _report(
        blocking_synchronisation,
        tables,
        rows,
        options,
        "Host waits for collectives",
        (
            "Use async_op=True and let the stream wait (work.wait() without host sync).",
            "Do not read reduced values on the host every step (.item(), .cpu(), print): "
            "log every N steps.",
            "Remove torch.cuda.synchronize() / CUDA_LAUNCH_BLOCKING=1 and "
            "TORCH_NCCL_BLOCKING_WAIT=1 from production runs.",
        ),
    )


def _replayed(
    tables: Tables, edit: Edit, options: dict[str, Any]
) -> tuple[int, int, float, Severity | None]:
    """The edit's replayed saving, the job's mean step, the saving's share of it and the
    severity that share earns (SHARE_OPTIONS)."""
    saving = replay_saving(tables, edit)
    step_ns = mean_step_ns(tables)
    share = saving / step_ns if step_ns else 0.0
    return saving, step_ns, share, share_severity(share, options)


def _per_rank(tables: Tables, where: pl.Expr) -> pl.DataFrame:
    """rank, ns, steps, kernels: per rank, the step_blame rows `where` selects over the
    job's complete steps (their time, the steps that hold them, the kernels they delay)."""
    complete = step_times(tables).filter(pl.col("complete"))["step"]
    return tables.collect(
        step_blame(tables)
        .filter(where & pl.col("step").is_in(complete.implode()))
        .group_by("rank")
        .agg(ns=pl.col("ns").sum(), steps=pl.col("step").n_unique(), kernels=pl.col("calls").sum())
    ).sort("rank")


@rule(
    code="SYNC105",
    name="device-contention",
    summary="Launched kernels wait on a device that runs nothing of this rank's.",
    tables=("kernels", "steps", "offsets", "framework"),
    options=SHARE_OPTIONS,
)
def device_contention(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Measures the model of time's `queued` time: the device runs nothing of this rank's, the
    next kernel's launch call returned more than rules_api.LAUNCH_LATENCY_NS before, and it
    has not started. The device was running work the trace does not show. The impact is
    the replayed saving of that time removed (the device given to this rank alone). When
    most of that time lies before the rank's own CUDA graph nodes (several kernels of one
    launch correlation), the finding says so and names their launching threads instead of
    another process. Where the ranks share one GPU, CAPT101 reports this time and this rule
    stands down.

    Why is this bad?
    Another process on the same GPU (several ranks on one device, a second job, an
    evaluation or data process using CUDA, MPS clients) time-slices the device with the
    training step: each rank's kernels wait their turn, and every collective waits for the
    slowest rank's turn.

    How to fix:
    One training process per GPU (torchrun --nproc-per-node equal to the GPUs, LOCAL_RANK
    for torch.cuda.set_device); no other process on the training GPUs (nvidia-smi lists
    them); if ranks must share a device, NVIDIA MPS. A sampled or filtered trace, with
    events left out, shows such gaps too: profile again without sampling. Queued CUDA graph
    nodes wait on the graph's own dependencies: trace the nodes (nsys
    --cuda-graph-trace=node) and what the launching thread's graph waits for.
    """
    queued = pl.col("category") == "queued"
    # No kernel starts before its launch, and a queue before a step's first kernel moves
    # the step's start with it (rules_api.queue_shift).
    shift = queue_shift(tables)
    edit = Edit(
        "the device's other work moved off it: each rank alone on its GPU (kernels no "
        "earlier than their launch; a step's start moves with its first kernel)",
        queued,
        shift.select("rank", "step", fraction="share"),
    )
    c = contention(tables)
    if c is not None and c.kind == "device":
        # Ranks sharing one GPU: CAPT101 reports this time (the other ranks held the
        # device), its saving replayed with the waits it causes.
        return []
    saving, step_ns, share, sev = _replayed(tables, edit, options)
    if sev is None:
        return []
    per = _per_rank(tables, queued)
    graph = _own_graphs(tables)
    worst = per.sort("ns", descending=True).row(0, named=True) if per.height else None
    shared = tables.has("offsets", "host_source") and bool(
        (tables["offsets"]["host_source"] == "shared_device").any()
    )
    own = graph["share"] >= 0.5
    sampled = (
        "A sampled or filtered trace leaves events out and shows such gaps: profile again "
        "without sampling before acting on this."
    )
    if own:
        # The waiting kernels are the rank's own graph's: no other process to look for.
        advice: tuple[str, ...] = (
            "Most of the waiting kernels are nodes of this rank's own graphs (many kernels "
            f"from one cudaGraphLaunch, launched from thread(s) {graph['threads']}): the graph's "
            "nodes wait for each other and for the events they depend on, not for another "
            "process. Trace the graph's nodes (nsys --cuda-graph-trace=node) and look at what "
            "the launching thread's graph waits for (cudaStreamWaitEvent, work on other "
            "streams); a graph replayed from a side thread runs when that thread gets to it.",
            sampled,
        )
    else:
        advice = (
            (
                "Every rank here runs on the same device id: if they share one GPU, give each "
                "rank its own (one process per GPU: torchrun --nproc-per-node = GPUs, "
                "torch.cuda.set_device(LOCAL_RANK)), or run them under NVIDIA MPS.",
            )
            if shared
            else ()
        ) + (
            "Look for other processes on the training GPUs (nvidia-smi): another job, an "
            "evaluation or data-loading process using CUDA.",
            sampled,
        )
    # What holds the CPU meanwhile: a copy that waits for the queue, a long phase.
    advice += _cpu_line(tables, per["rank"].to_list(), step_ns)
    per_step = worst["ns"] / max(1, worst["steps"]) if worst else 0.0
    return [
        make_finding(
            device_contention,
            sev,
            (
                f"Kernels of the rank's own CUDA graphs wait to start: {saving / 1e6:.2f} ms "
                "per step"
                if own
                else f"Kernels wait on a device that runs nothing of this rank's: "
                f"{saving / 1e6:.2f} ms per step"
            ),
            f"Kernels whose launch returned more than {LAUNCH_LATENCY_NS / 1e3:.0f} us before "
            f"wait to start on a device running none of this rank's work, "
            f"{per_step / 1e6:.2f} ms per step "
            f"on the worst rank (rank {worst['rank'] if worst else '-'}): "
            + (
                f"{graph['share']:.0%} of it before kernels of the rank's own CUDA graphs "
                f"(launched from thread(s) {graph['threads']}), which wait for the graph's "
                "other nodes and events, not for another process"
                if own
                else "the device runs work the trace does not show"
            )
            + f". Without it the step would be {saving / 1e6:.2f} ms "
            f"shorter ({share:.1%} of {step_ns / 1e6:.2f} ms)"
            + (
                "; the kernels after the queues hold the rest, as the CPU launched them no earlier."
                if saving < per_step / 2
                else "."
            ),
            impact_ns_per_step=saving,
            step_ns=step_ns,
            ranks=per["rank"].to_list(),
            evidence={
                "queued_ns_per_step_worst_rank": int(per_step),
                "worst_rank": worst["rank"] if worst else None,
                "shared_device_id": shared,
                "own_graph_share": round(graph["share"], 3),
                "own_graph_threads": graph["threads"],
                "step_ns": step_ns,
                "saving_method": f"replay: {edit.name}",
            },
            edit=edit,
            advice=advice,
        )
    ]


def _own_graphs(tables: Tables) -> dict[str, Any]:
    """Of the model of time's queued pieces (replay_timeline's `queued` events, each ending
    where the kernel it delays starts), the `share` of their time before kernels of the
    rank's own CUDA graphs (a launch correlation shared by several kernels: one
    cudaGraphLaunch), and the launching `threads` of those kernels, most queued first."""
    none: dict[str, Any] = {"share": 0.0, "threads": ""}
    if not tables.has("kernels", "rank", "start_ns", "correlation", "launch_tid"):
        return none
    pieces = tables.collect(
        replay_timeline(tables)
        .filter((pl.col("part") == "event") & (pl.col("category") == "queued"))
        .select(pl.col("rank").cast(pl.Int64), "end_ns", "ns")
    )
    if pieces.height == 0 or pieces["ns"].sum() <= 0:
        return none
    ranks = pieces["rank"].unique().implode()
    kernels = tables.lazy("kernels", ["rank", "start_ns", "correlation", "launch_tid"]).filter(
        pl.col("rank").cast(pl.Int64).is_in(ranks) & pl.col("correlation").is_not_null()
    )
    rows = tables.collect(
        kernels.with_columns(
            pl.col("rank").cast(pl.Int64),
            graph=pl.len().over("rank", "correlation") > 1,
        ).select("rank", end_ns="start_ns", graph="graph", tid=pl.col("launch_tid").cast(pl.String))
    ).unique(["rank", "end_ns"], keep="first")
    hit = pieces.join(rows, on=["rank", "end_ns"], how="left").filter(
        pl.col("graph").fill_null(False)
    )
    threads = (
        hit.group_by("tid").agg(ns=pl.col("ns").sum()).sort("ns", "tid", descending=[True, False])
    )
    return {
        "share": float(hit["ns"].sum()) / float(pieces["ns"].sum()),
        "threads": ", ".join(t for t in threads["tid"].drop_nulls().to_list()),
    }


@rule(
    code="SYNC106",
    name="launch-bound",
    summary="The device idles while the CPU is still launching its next compute kernel.",
    tables=("kernels", "steps", "framework"),
    options=SHARE_OPTIONS,
)
def launch_bound(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Measures the model of time's `launch` time before compute and memory kernels: every
    kernel of the rank has finished, and the CPU returns from launching the next one only
    later (kernels.launch_end_ns, plus rules_api.LAUNCH_LATENCY_NS for its way to the
    device). Gaps before collectives are SYNC102's; the gap before a step's first kernel
    is left out (step_blame's `step_start` rows): there the device waits for the host's
    work between steps (the previous step's synchronisation, the data loader, the
    optimizer), not for the launch path. The impact is the replayed saving of those gaps
    removed: the step if the CPU always ran ahead of the device inside the step, an upper
    bound on what a faster launch path buys.

    Why is this bad?
    A launch-bound step runs at the speed of Python and the CUDA launch path, not of the
    GPU: small kernels (a small model, a small micro-batch), many kernels per layer, host
    work between launches. Faster communication or compute cannot shorten it.

    How to fix:
    Launch the step as a CUDA graph (torch.compile mode="reduce-overhead",
    torch.cuda.make_graphed_callables); fuse kernels (torch.compile, fused optimizers:
    fused=True / foreach=True); give each kernel more work (a larger micro-batch); keep
    host work off the launching thread (DataLoader workers, pin_memory, no per-step
    .item() or logging). The advice first names what holds the CPU in the step (the
    framework table: the optimizer step, a copy that blocked the thread, the largest other
    CPU phase); on TorchRec it advises no CUDA graph (its all-to-alls move data-dependent
    sizes), and no fused optimizer where the one in use is fused.
    """
    launch = (
        (pl.col("category") == "launch")
        & pl.col("collective").is_null()
        & ~pl.col("step_start").fill_null(False)
    )
    edit = Edit(
        "the CPU always ahead of the device inside the step: no launch gaps before its "
        "compute kernels",
        launch,
    )
    saving, step_ns, share, sev = _replayed(tables, edit, options)
    if sev is None:
        return []
    per = _per_rank(tables, launch)
    if per.height == 0:  # no launch gap in a complete step (thresholds at zero)
        return []
    worst = per.sort("ns", descending=True).row(0, named=True)
    n = max(1, worst["steps"])
    return [
        make_finding(
            launch_bound,
            sev,
            f"The device waits for kernel launches: {share:.0%} of step time",
            f"On the worst rank (rank {worst['rank']}) the device sits idle "
            f"{worst['ns'] / n / 1e6:.2f} ms per step before {worst['kernels'] / n:.0f} "
            "kernels per step that the CPU had not yet launched; if the CPU always ran "
            f"ahead, the step would be {saving / 1e6:.2f} ms shorter ({share:.1%} of "
            f"{step_ns / 1e6:.2f} ms). Gaps before collectives are SYNC102's; the gap "
            "before a step's first kernel (the host's work between steps) is left out.",
            impact_ns_per_step=saving,
            step_ns=step_ns,
            ranks=per["rank"].to_list(),
            evidence={
                "launch_ns_per_step_worst_rank": int(worst["ns"] / n),
                "late_kernels_per_step_worst_rank": round(worst["kernels"] / n, 1),
                "worst_rank": worst["rank"],
                "step_ns": step_ns,
                "saving_method": f"replay: {edit.name}",
            },
            edit=edit,
            advice=_launch_advice(tables, per["rank"].to_list(), step_ns),
        )
    ]


def _cpu_line(
    tables: Tables, ranks: list[int], step_ns: int, passes: bool = False
) -> tuple[str, ...]:
    """One line naming what holds the CPU of `ranks` in a step (the framework table's
    optimizer steps, blocking copies, phases and, with `passes`, the forward and backward:
    rules/_framework.py), none if nothing does."""
    held = cpu_holders(tables, ranks, step_ns, passes=passes)
    return ("What holds the CPU in the step: " + "; ".join(held) + ".",) if held else ()


def _launch_advice(tables: Tables, ranks: list[int], step_ns: int) -> tuple[str, ...]:
    """SYNC106's advice, fitted to what the trace shows (rules/_framework.py): what holds the
    CPU first (the optimizer step, a blocking copy, the largest other phase); no CUDA graph
    for TorchRec, whose sparse all-to-alls move data-dependent sizes; no fused optimizer
    where the one in use is fused already."""
    advice = list(_cpu_line(tables, ranks, step_ns, passes=True))
    compiled = uses(tables, "in_use", "inductor", ranks)
    if uses(tables, "framework", "torchrec", ranks) or uses(
        tables, "framework", "torchrec_pipeline", ranks
    ):
        advice.append(
            "TorchRec (in the trace): no CUDA graph, its sparse all-to-alls move sizes that "
            "depend on each batch (the KJT splits), which a graph cannot capture; shorten "
            "the CPU phases named above instead."
        )
    elif uses(tables, "in_use", "torch_compile", ranks) and not compiled:
        advice.append(
            "torch.compile is in use (CompiledFunction ops in the trace) but none of its "
            "kernels are Inductor's (no Triton kernels): its backend does not fuse or graph "
            'them; backend="inductor" with mode="reduce-overhead" fuses the kernels and '
            "launches the step as a CUDA graph."
        )
    elif compiled:
        advice.append(
            "Launch the step as a CUDA graph: torch.compile is in use (Triton kernels in the "
            'trace): its mode="reduce-overhead" captures them, or '
            "torch.cuda.make_graphed_callables."
        )
    else:
        advice.append(
            'Launch the step as a CUDA graph: torch.compile(mode="reduce-overhead") or '
            "torch.cuda.make_graphed_callables."
        )
    optimizers = markers(tables, "optimizer", ranks)["name"].unique().to_list()
    fused = bool(optimizers) and all("fused" in n.lower() for n in optimizers)
    foreach = uses(tables, "in_use", "foreach", ranks)
    advice.append(
        "Fewer, bigger kernels: "
        + ("" if compiled else "torch.compile fusion, ")
        + (
            ""
            if fused
            else "fused optimizers (fused=True; foreach is in use already), "
            if foreach
            else "fused optimizers (fused=True, foreach=True), "
        )
        + "a larger micro-batch."
    )
    advice.append(
        "Keep host work off the launching thread: DataLoader workers and pin_memory, no "
        "per-step .item() / .cpu() / logging."
    )
    advice.append(
        "A sampled or filtered trace that leaves kernels out shows such gaps too: confirm on "
        "a trace without sampling."
    )
    return tuple(advice)
