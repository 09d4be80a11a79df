"""SYNC101 straggler and SYNC104 arrival-imbalance: ranks that reach collectives late."""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Finding,
    Option,
    Severity,
    Tables,
    collective_exposure_lazy,
    collective_waits_lazy,
    make_finding,
    mean_step_ns,
    n_steps,
    rule,
    severity_for,
)

from ._common import (
    P2P,
    SHARE_OPTIONS,
    STORM_MAX_BYTES,
    STORM_MIN_CALLS,
    share_severity,
    storm_keys,
)


def _lateness(tables: Tables) -> pl.DataFrame:
    """_late, once per rules run (SYNC101 and SYNC104 both read it)."""
    return tables.once(("builtin", "lateness"), lambda: _late(tables))


def _late(tables: Tables) -> pl.DataFrame:
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


def _exposed_waits(tables: Tables) -> pl.DataFrame:
    """Per step (numbered steps only, when there are any): `wait_ns`, the time ranks sat in
    collectives waiting for late ones with no compute running, summed over ranks, and
    `ranks`, the ranks with calls in the step. Point-to-point calls (no group to wait for)
    and message storms (COMM201 counts their waits) are left out."""
    empty = pl.DataFrame(schema={"step": pl.Int64, "wait_ns": pl.Float64, "ranks": pl.Int64})
    if not tables.has("collectives"):
        return empty
    storms = storm_keys(tables, STORM_MAX_BYTES, STORM_MIN_CALLS)
    used = ["rank", "step", "process_group", "collective", "ranks_seen", "exposed_ns"]

    def per_step(transfer_only: bool) -> pl.LazyFrame:
        rows = (
            collective_exposure_lazy(tables, transfer_only=transfer_only)
            .select(used)
            .filter(~pl.col("collective").is_in(P2P) & (pl.col("ranks_seen") > 1))
            .with_columns(pl.col("process_group").cast(pl.String))
            .join(storms.lazy(), on=["process_group", "collective"], how="anti")
        )
        return rows.group_by("step").agg(
            _sum=pl.col("exposed_ns").sum(), ranks=pl.col("rank").n_unique()
        )

    # The whole call's exposed time less its transfer's: the exposed part of the wait.
    whole, transfer = tables.collect(per_step(False)), tables.collect(per_step(True))
    steps = whole.join(transfer.select("step", _moved="_sum"), on="step", how="left").select(
        pl.col("step").cast(pl.Int64),
        wait_ns=(pl.col("_sum") - pl.col("_moved").fill_null(0)).cast(pl.Float64),
        ranks=pl.col("ranks").cast(pl.Int64),
    )
    if (steps["step"] >= 0).any():
        steps = steps.filter(pl.col("step") >= 0)
    return steps if steps.height else empty


@rule(
    code="SYNC104",
    name="arrival-imbalance",
    summary="Ranks reach collectives out of step, no one rank to blame: all wait in turn.",
    tables=("collectives", "kernels", "steps", "storms"),
    options=(
        Option(
            "straggler_share",
            0.5,
            "One rank causing this share of all arrival lateness is SYNC101's straggler: "
            "its lateness is not counted here.",
        ),
        *SHARE_OPTIONS,
    ),
)
def arrival_imbalance(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Measures the time ranks spend inside collectives waiting for the group's late ranks
    with no compute running (each call's duration less the shortest duration of the same
    call on the group's ranks, clock-independent), per step, averaged over ranks: what the
    step would lose if every rank did the mean rank's work. When one rank causes most of the
    arrival lateness (`straggler_share`), its lateness is SYNC101's and is taken off; what
    remains are waits no one rank is to blame for: the ranks take turns arriving last.
    Point-to-point calls and message storms are left to PIPE101 and COMM201.

    Why is this bad?
    A collective finishes only when its last rank arrives, so every step runs at the pace
    of whichever rank was slowest in it. Jitter that averages out on one rank (uneven
    batches, garbage collection, OS noise, CPU contention, a data loader that sometimes
    stalls) adds up across many ranks: the more ranks, the more likely one is late at
    every call.

    How to fix:
    Equal work per rank and step (sequence packing or length bucketing), a data loader that
    never starts a step empty, garbage collection at the same step on every rank
    (gc.freeze(), manual gc; Megatron-LM --manual-gc), each rank pinned to its own CPU cores
    and NUMA node with cores to spare for NCCL's proxy threads.
    """
    waits = _exposed_waits(tables)
    if waits.height == 0:
        return []
    late = _lateness(tables)
    total = late["lateness_ns"].sum() if late.height else 0
    if not total or total <= 0:
        return []
    # Ties go to the lowest rank, and the sums run in step order: the same finding however
    # the tables were gathered.
    top = late.sort(["lateness_ns", "rank"], descending=[True, False]).row(0, named=True)
    top_share = top["lateness_ns"] / total
    waits = waits.sort("step")
    per_rank = waits.select(pl.col("wait_ns") / pl.col("ranks").clip(lower_bound=1))
    waited = float(per_rank.to_series().sum()) / waits.height
    # A straggler's own lateness is SYNC101's time: only the rest of the waits count here.
    blamed = top["lateness_ns"] / n_steps(tables) if top_share >= options["straggler_share"] else 0
    impact = max(0.0, waited - blamed)
    step_ns = mean_step_ns(tables)
    share = impact / step_ns if step_ns else 0.0
    sev = share_severity(share, options)
    if sev is None:
        return []
    lasts = late.filter(pl.col("times_last") > 0)
    culprit = (
        f"rank {top['rank']} caused {top_share:.0%} of the lateness, and its "
        f"{blamed / 1e6:.2f} ms per step are SYNC101's (not counted here)."
        if blamed
        else f"no one rank is to blame (rank {top['rank']}, the most late, caused "
        f"{top_share:.0%} of the lateness)."
    )
    return [
        make_finding(
            arrival_imbalance,
            sev,
            f"Ranks reach collectives out of step: each waits {impact / 1e6:.2f} ms per step "
            "for late ranks",
            f"A rank waits {impact / 1e6:.2f} ms per step ({share:.1%} of "
            f"{step_ns / 1e6:.2f} ms) inside collectives for the group's late ranks, with no "
            f"compute to hide it. {lasts.height} of {late.height} ranks arrived last at "
            f"some call; {culprit}",
            impact_ns_per_step=impact,
            step_ns=step_ns,
            ranks=lasts.sort("rank")["rank"].to_list(),
            steps=waits["step"].to_list(),
            evidence={
                "exposed_wait_ns_per_step": int(waited),
                "straggler_lateness_ns_per_step": int(blamed),
                "ranks_ever_last": lasts.height,
                "ranks": late.height,
                "most_late_rank": top["rank"],
                "most_late_share": round(top_share, 3),
                "step_ns": step_ns,
            },
            advice=(
                "Give every rank the same work per step: pack sequences or bucket them by "
                "length so that each rank's batch holds the same number of tokens; keep the "
                "data loader ahead (num_workers, pin_memory, prefetch_factor).",
                "Collect garbage at the same step on every rank: gc.freeze() after start-up "
                "and gc.disable() with a gc.collect() every N steps (Megatron-LM: "
                "--manual-gc --manual-gc-interval N).",
                "Pin each rank to its own CPU cores and NUMA node (numactl, taskset), with "
                "cores to spare for NCCL's proxy threads and the data loader workers; run no "
                "more ranks on a host than it has cores for.",
            ),
        )
    ]
