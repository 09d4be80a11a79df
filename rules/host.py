"""SYNC102 host-bound-communication and SYNC103 blocking-synchronisation."""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Finding,
    Option,
    Severity,
    Tables,
    impact_per_step,
    make_finding,
    mean_step_ns,
    rule,
    severity_for,
)

from ._common import STORM_MAX_BYTES, STORM_MIN_CALLS, storm_keys

OPTIONS = (
    Option("min_gap_ns", 5_000, "Ignore device gaps shorter than this (launch latency)."),
    Option("warn_share", 0.05, "Warn when the gaps cost this share of step time."),
    Option("error_share", 0.15, "Error at this share of step time."),
)


def _timeline(tables: Tables) -> pl.DataFrame:
    """Communication kernels per rank in start order, with what ran before and after each;
    built once per rules run for both rules of this module."""
    return tables.once(("builtin", "host", "timeline"), lambda: _build_timeline(tables))


def _build_timeline(tables: Tables) -> pl.DataFrame:
    """_timeline, read a few ranks at a time (the kernels of a big job never all at once)."""
    found = []
    need = ("rank", "step", "kind", "name", "start_ns", "end_ns", "launch_ns")
    for k in tables.rank_batches("kernels", need):
        if k.height == 0 or k.width < len(need):
            continue
        k = k.filter(pl.col("start_ns").is_not_null()).sort("rank", "start_ns")
        # Neighbours within the rank by plain shifts (rows are sorted by rank): a shift
        # .over() would copy every row's name, and the rows kept would hold those copies.
        prev = pl.col("rank").shift(1) == pl.col("rank")
        after = pl.col("rank").shift(-1) == pl.col("rank")
        around = k.with_columns(busy_through=pl.col("end_ns").cum_max().over("rank")).with_columns(
            busy_until=pl.when(prev).then(pl.col("busy_through").shift(1)),
            prev_kind=pl.when(prev).then(pl.col("kind").shift(1)),
            next_start=pl.when(after).then(pl.col("start_ns").shift(-1)),
            next_launch=pl.when(after).then(pl.col("launch_ns").shift(-1)),
            next_name=pl.when(after).then(pl.col("name").shift(-1)),
        )
        found.append(around.filter(pl.col("kind") == "communication"))
    return pl.concat(found) if found else pl.DataFrame()


def _report(
    rule_: Any,
    tables: Tables,
    rows: pl.DataFrame,
    options: dict[str, Any],
    what: str,
    advice: tuple[str, ...],
) -> list[Finding]:
    rows = rows.filter(pl.col("gap") >= options["min_gap_ns"])
    if rows.height == 0:
        return []
    imp = impact_per_step(rows, "gap").row(0, named=True)
    step_ns = mean_step_ns(tables)
    share = imp["impact_ns"] / step_ns if step_ns else 0.0
    sev = severity_for(share, options["warn_share"], options["error_share"])
    if sev is None:
        sev = Severity.info if share >= 0.01 else None
    if sev is None:
        return []
    return [
        make_finding(
            rule_,
            sev,
            f"{what}: {imp['impact_ns'] / 1e6:.2f} ms per step",
            f"{what} leaves the GPU idle {imp['impact_ns'] / 1e6:.2f} ms per step "
            f"({share:.1%} of step time) on the worst rank, {imp['calls']} gap(s) per step.",
            impact_ns_per_step=imp["impact_ns"],
            step_ns=step_ns,
            ranks=imp["ranks"] or [],
            steps=imp["steps"] or [],
            window_ns=(int(rows["start_ns"].min()), int(rows["end_ns"].max())),
            evidence={
                "gaps_per_step": imp["calls"],
                "idle_ns_per_step": int(imp["impact_ns"]),
                "largest_gap_ns": int(rows["gap"].max()),
                "step_ns": step_ns,
            },
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
    is host-bound. Summed per rank and step; gaps after another collective are SYNC103's.

    Why is this bad?
    The GPU waits for Python: slow collective launch paths (per-tensor all-reduce calls,
    hooks, Python overhead, CPU contention, the GIL held by a data loader thread) put CPU time
    on the critical path of every step.

    How to fix:
    Launch fewer, bigger collectives (bucketing, coalescing); reduce CPU overhead (CUDA graphs,
    torch.compile, fewer hooks); pin the process to free cores; enable DDP static_graph and
    avoid find_unused_parameters=True.
    """
    t = _timeline(tables)
    if t.height == 0:
        return []
    rows = t.filter(
        (pl.col("kind") == "communication")
        & pl.col("launch_ns").is_not_null()
        & pl.col("busy_until").is_not_null()
        & (pl.col("prev_kind") != "communication")
    ).with_columns(
        gap=(pl.min_horizontal("launch_ns", "start_ns") - pl.col("busy_until")).clip(lower_bound=0)
    )
    return _report(
        host_bound_communication,
        tables,
        rows,
        options,
        "Collectives launched late by the CPU",
        (
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
    CPU only after the collective had finished: the CPU waited for it (work.wait() on the
    host, torch.cuda.synchronize(), .item()/.cpu() on its result, a blocking barrier). The
    idle time until the next kernel is counted per rank and step.

    Why is this bad?
    A host-side wait empties the GPU's queue: after the collective the GPU idles for the
    CPU's wake-up, Python and launch latency, and nothing can overlap the collective.

    How to fix:
    Keep the CPU ahead of the GPU: use async_op=True and wait on the stream
    (work.wait() without host sync), avoid .item()/.cpu()/print of reduced values every step
    (log every N steps), drop torch.cuda.synchronize() and CUDA_LAUNCH_BLOCKING=1, and let
    NCCL_BLOCKING_WAIT / TORCH_NCCL_BLOCKING_WAIT stay unset in production.
    """
    t = _timeline(tables)
    if t.height == 0:
        return []
    rows = t.filter(
        (pl.col("kind") == "communication")
        & pl.col("next_launch").is_not_null()
        & (pl.col("busy_through") == pl.col("end_ns"))
        & (pl.col("next_launch") >= pl.col("end_ns"))
        & (pl.col("next_start") > pl.col("end_ns"))
    ).with_columns(gap=pl.col("next_start") - pl.col("end_ns"))
    # In a storm of tiny collectives the CPU trails the GPU anyway: COMM201's time.
    storms = storm_keys(tables, STORM_MAX_BYTES, STORM_MIN_CALLS)
    coll = tables["collectives"]
    if storms.height and coll.height:
        in_storm = coll.with_columns(pl.col("process_group").cast(pl.String)).join(
            storms, on=["process_group", "collective"], how="semi"
        )
        rows = rows.join(in_storm.select("rank", "start_ns"), on=["rank", "start_ns"], how="anti")
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
