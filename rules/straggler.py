"""SYNC101 straggler."""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Finding,
    Option,
    Severity,
    Tables,
    collective_waits_lazy,
    make_finding,
    mean_step_ns,
    n_steps,
    rule,
    severity_for,
)

from ._common import P2P


def _lateness(tables: Tables) -> pl.DataFrame:
    """Per rank: calls, times_last, lateness_ns (per step, the most it trailed the group).

    A rank that is late once in a step (slow data, a slow kernel) stays late for the rest
    of the step's collectives: the delay shifts them all, it does not add up. So each step
    counts the largest lateness, not the sum. Computed from duration-matched calls (no
    clock alignment needed).
    """
    empty = pl.DataFrame(
        schema={
            "rank": pl.Int64,
            "instances": pl.Int64,
            "times_last": pl.Int64,
            "lateness_ns": pl.Float64,
        }
    )
    if not tables.has("collectives"):
        return empty
    key = ["process_group", "collective", "call_index"]
    waits = (
        collective_waits_lazy(tables)
        .filter(~pl.col("collective").is_in(P2P) & (pl.col("ranks_seen") > 1))
        .select(*key, "rank", "step", "wait_ns")
    )
    # Per call: the rank that arrived last (the lowest of those that did not wait) and how
    # late it was: the wait of the second-latest arrival, i.e. 0 when several ranks did not
    # wait (they were last together), else the smallest wait.
    waited = pl.col("wait_ns") > 0
    calls = tables.collect(
        waits.group_by(key).agg(
            _last=pl.when(~waited).then(pl.col("rank")).min(),
            _ties=(~waited).sum(),
            _second=pl.when(waited).then(pl.col("wait_ns")).min(),
        )
    )
    if calls.height == 0:
        return empty
    last = pl.col("rank") == pl.col("_last")
    late = pl.when(pl.col("_ties") > 1).then(0).otherwise(pl.col("_second"))
    # Only the rows of the rank that came last (one per call) are kept per (rank, step): a
    # state per rank and step of every rank would grow with ranks x steps.
    per_step = tables.collect(
        waits.join(calls.lazy(), on=key, how="left", nulls_equal=True, build_side="force_right")
        .filter(last.fill_null(False))
        .group_by("rank", "step")
        .agg(times_last=pl.len(), late=late.max())
    )
    counts = tables.collect(waits.group_by("rank").agg(instances=pl.len()))
    lasts = per_step.group_by("rank").agg(
        times_last=pl.col("times_last").sum(), lateness_ns=pl.col("late").sum()
    )
    return (
        counts.join(lasts, on="rank", how="left")
        .with_columns(pl.col("times_last", "lateness_ns").fill_null(0))
        .cast({"instances": pl.Int64, "times_last": pl.Int64, "lateness_ns": pl.Float64})
        .select(list(empty.columns))
    )


@rule(
    code="SYNC101",
    name="straggler",
    summary="One rank arrives last at collectives and makes the others wait.",
    tables=("stragglers", "collective_waits", "collectives", "steps"),
    options=(
        Option("min_lateness_share", 0.5, "Share of all lateness one rank must cause."),
        Option("warn_share", 0.05, "Warn when the delay costs this share of step time."),
        Option("error_share", 0.15, "Error at this share of step time."),
    ),
)
def straggler(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    For every collective call matched across its group, finds the rank that arrived last and
    by how much it trailed the second-latest one; per rank and step the largest such lateness
    is the time the job waited for it (a late rank stays late for the rest of the step: the
    delay shifts, it does not add up). A rank causing most of the job's lateness
    (`min_lateness_share`) is a straggler. When the analysis provides the stragglers table,
    its verdict is added to the evidence.

    Why is this bad?
    Collectives are synchronous: every rank waits in the collective until the last one
    arrives, so one slow rank (slow data loading, a throttled GPU, a noisy neighbour, extra
    work on rank 0) slows every step of the whole job.

    How to fix:
    Find what delays that rank before the collective: data loader (more workers,
    pin_memory, prefetch), logging/checkpointing only on rank 0, thermal or clock
    throttling (nvidia-smi -q -d PERFORMANCE), an unbalanced data or pipeline split.
    """
    late = _lateness(tables)
    if late.height == 0:
        return []
    total = late["lateness_ns"].sum()
    if not total or total <= 0:
        return []
    steps = n_steps(tables)
    verdicts: dict[int, dict[str, Any]] = {}
    if tables.has("stragglers", "rank"):
        keep = [
            c
            for c in ("is_straggler", "confidence", "caused_wait_ns_per_step")
            if c in tables["stragglers"].columns
        ]
        verdicts = {
            row.pop("rank"): row
            for row in tables["stragglers"].select("rank", *keep).iter_rows(named=True)
        }
    step_ns = mean_step_ns(tables)
    out = []
    for r in late.sort("lateness_ns", descending=True).iter_rows(named=True):
        share_of_late = r["lateness_ns"] / total
        if share_of_late < options["min_lateness_share"]:
            continue
        impact = r["lateness_ns"] / steps
        share = impact / step_ns if step_ns else 0.0
        sev = severity_for(share, options["warn_share"], options["error_share"])
        if sev is None:
            sev = Severity.info if share >= 0.01 else None
        if sev is None:
            continue
        out.append(
            make_finding(
                straggler,
                sev,
                f"Rank {r['rank']} is a straggler: the job waits {impact / 1e6:.2f} ms per step",
                f"Rank {r['rank']} arrived last at {r['times_last']} of {r['instances']} "
                f"collective calls and caused {share_of_late:.0%} of all arrival lateness: "
                f"{impact / 1e6:.2f} ms per step ({share:.1%} of step time).",
                impact_ns_per_step=impact,
                step_ns=step_ns,
                ranks=[r["rank"]],
                evidence={
                    **verdicts.get(r["rank"], {}),
                    "times_last": r["times_last"],
                    "instances": r["instances"],
                    "lateness_ns_per_step": int(impact),
                    "lateness_share": round(share_of_late, 3),
                    "step_ns": step_ns,
                },
                advice=(
                    f"Profile rank {r['rank']}'s CPU side before its first collective of a step:"
                    " data loading (num_workers, pin_memory, prefetch_factor), rank-0-only "
                    "logging, evaluation or checkpointing.",
                    "Check the GPU of that rank for throttling (nvidia-smi -q -d PERFORMANCE) "
                    "and the host for other load.",
                    "Balance the work: equal sequence lengths/packing per rank, balanced "
                    "pipeline stages.",
                ),
            )
        )
    return out
