"""COMM201 small-message-storm."""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Edit,
    Finding,
    Option,
    Tables,
    busbw_factor,
    collective_exposure_lazy,
    impact_per_step,
    make_finding,
    mean_step_ns,
    median_of_counts,
    replay_saving,
    rule,
)

from ._common import (
    STORM_MAX_BYTES,
    STORM_MIN_CALLS,
    fit_words,
    merge_fix,
    share_severity,
    storm_keys,
    with_roles,
)

# All-reduces of no known size, one per tensor after the backward: DDP's reducer is the fix.
STORM_OVERLAP = (
    "Use DDP (or its reducer): it buckets the gradients into ~25 MB all-reduces launched "
    "during the backward, instead of one all-reduce per tensor after it; for manual "
    "all-reduces, torch.distributed.all_reduce_coalesced or one call on flattened tensors.",
)


@rule(
    code="COMM201",
    name="small-message-storm",
    summary="Many tiny, latency-bound collectives per step instead of a few large ones.",
    tables=("collectives", "kernels", "steps", "storms", "process_groups"),
    options=(
        Option(
            "max_bytes",
            STORM_MAX_BYTES,
            "Median message size at or below which calls count as small.",
        ),
        Option("min_calls", STORM_MIN_CALLS, "Calls per rank and step from which it is a storm."),
        Option(
            "reference_busbw_gbps",
            0.0,
            "Bus bandwidth large messages reach (GB/s); "
            "0: ignore the bandwidth cost the same bytes keep once bucketed.",
        ),
        Option("warn_share", 0.05, "Warn at this share of step time."),
        Option("error_share", 0.20, "Error at this share of step time."),
        Option("info_share", 0.01, "Report as info from this share (below: no finding)."),
    ),
)
def small_message_storm(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Finds process groups that issue many small collectives per step (median message at or
    below `max_bytes`, at least `min_calls` per rank and step; or the analysis' storms
    table). The storms of one role's groups (the DP groups of each TP rank or pipeline stage)
    are one cause, one setting away from fixed; a group of unknown role is its own. Calls
    of no known size are a storm by their times: at least `min_calls` per rank and step,
    the median call no longer than 50 us (a call's fixed cost). The
    saving is replayed on the model of time: the calls merged into one of their
    summed size at the group's large-message bandwidth (the storms table's
    latency-bound share of their transfer, wait and launch-gap time is removed); with no
    large-message bandwidth known, the cost fit's merge (rules_api.cost_fit: without sizes,
    the latency-sized calls merged into one, their latencies and that share of the launch
    gaps removed; SYNC102 leaves a storm's launch gaps to this rule), else all of that time
    (a heuristic, said so in evidence).

    Why is this bad?
    Every collective pays a fixed latency (launch, synchronisation, protocol handshakes of
    ~10-50 us) whatever its size. Thousands of small calls are latency-bound: the link idles,
    and each call waits on the slowest launcher of the group.

    How to fix:
    Bucket gradients into larger messages: DDP bucket_cap_mb (default 25), ZeRO
    reduce_bucket_size / allgather_bucket_size, Megatron --ddp-bucket-size; coalesce manual
    collectives (torch.distributed all_reduce_coalesced or flatten tensors); wrap bigger
    FSDP units; per-tensor all-reduces after the backward: DDP's bucketed reduction, which
    also overlaps them with the backward.
    """
    storms = storm_keys(tables, options["max_bytes"], options["min_calls"])
    if storms.height == 0:
        return []
    used = ("rank", "step", "process_group", "collective", "bytes", "group_size", "exposed_ns")
    ref = float(options["reference_busbw_gbps"])

    def storm_calls(view: Tables) -> pl.LazyFrame:
        exp = collective_exposure_lazy(view, transfer_only=False).select(used)
        exp = exp.with_columns(pl.col("process_group").cast(pl.String)).join(
            storms.lazy(), on=["process_group", "collective"], how="semi", build_side="force_right"
        )
        if ref > 0:
            floor = pl.col("bytes") * busbw_factor(pl.col("collective"), pl.col("group_size")) / ref
            exp = exp.with_columns(
                exposed_ns=(pl.col("exposed_ns") - floor.fill_null(0)).clip(lower_bound=0)
            )
        return with_roles(tables, exp)

    # One cause per role and collective: the DP groups of a tp-dp or pp-dp job are peers
    # that one setting buckets (bucket_cap_mb), and their calls couple the ranks (one group
    # merged alone leaves its ranks waiting for the other groups'); a group of unknown role
    # is a cause of its own.
    cause = (
        pl.when(pl.col("role") == "unknown")
        .then(pl.lit("group ") + pl.col("process_group"))
        .otherwise(pl.col("role"))
    )
    keys = ["_cause", "collective"]

    def cause_calls(view: Tables) -> pl.LazyFrame:
        return storm_calls(view).with_columns(_cause=cause)

    causes = impact_per_step(cause_calls, "exposed_ns", keys, tables=tables)
    exp = cause_calls(tables)
    # Message sizes repeat: the median comes from counts per size (exact, a few rows).
    counts = tables.collect(
        exp.group_by("_cause", "collective", "role", "process_group", "bytes").agg(_n=pl.len())
    )
    sizes = median_of_counts(counts, keys, "bytes", "_n", "median_bytes").join(
        counts.group_by(keys).agg(
            role=pl.col("role").first(),
            groups=pl.col("process_group").drop_nulls().unique().sort(),
        ),
        on=keys,
        nulls_equal=True,
    )
    causes = causes.join(sizes, on=keys, how="left")
    latency = _latency_shares(tables, exp, ref)
    step_ns = mean_step_ns(tables)
    out = []
    for c in causes.sort("impact_ns", "_cause", descending=[True, False]).iter_rows(named=True):
        groups = list(c["groups"] or [])
        rows = latency.filter(
            pl.col("process_group").is_in(groups) & (pl.col("collective") == c["collective"])
        ).filter(pl.col("share").is_not_null())
        known = rows.height == len(groups) and rows.height > 0
        # Per group its latency-bound share (the storms table's); 1 when unknown.
        share_of = dict(rows.select("process_group", "share").iter_rows()) if known else {}
        fraction = (
            pl.col("process_group").replace_strict(share_of, default=1.0, return_dtype=pl.Float64)
            if known
            else 1.0
        )
        mean_share = sum(share_of.values()) / len(share_of) if known else 1.0
        # No storms-table share (calls of unknown size, storms by their times): the cost
        # fit's merge (rules/_common.merge_fix) where it finds them latency-bound.
        # Calls of known size that the storms table holds no share for keep the heuristic.
        unsized = c["median_bytes"] is None
        merge = merge_fix(tables, c["collective"], groups) if not known and unsized else None
        method = (
            "replay: merge the run's calls into one call of their summed size at the group's "
            "large-message bandwidth"
            if known
            else "replay: remove the run's exposed time (heuristic: no large-message "
            "bandwidth known to time the merged call)"
        )
        edit = Edit(
            method.removeprefix("replay: "),
            pl.col("category").is_in(["transfer", "wait", "launch"])
            & pl.col("process_group").is_in(groups)
            & (pl.col("collective") == c["collective"]),
            fraction,
            shortens=known,
        )
        facts = None
        if merge is not None:
            edit, facts = merge
            method = f"replay: {edit.name}"
            mean_share = facts["latency_share"]
        saving = replay_saving(tables, edit)
        share = saving / step_ns if step_ns else 0.0
        sev = share_severity(share, options)
        if sev is None:
            continue
        med = int(c["median_bytes"] or 0)
        size = f"a median of {med / 1024:.0f} KiB" if c["median_bytes"] is not None else "no size"
        where = (
            ("the unnamed group" if groups[0] == "?" else f"group {groups[0]}")
            if len(groups) == 1
            else f"the {len(groups)} {c['role']} groups ({', '.join(groups)})"
        )
        out.append(
            make_finding(
                small_message_storm,
                sev,
                f"Merge the {c['calls']} small {c['collective']} calls per step on {where}",
                f"{where[0].upper() + where[1:]} ({c['role']}) issue {c['calls']} "
                f"{c['collective']} calls per rank and step with {size}; they cost "
                f"{c['impact_ns'] / 1e6:.2f} ms per step on the worst rank"
                + (f" ({fit_words(facts)})" if facts else ", mostly fixed latency")
                + f"; merged, the step would be {saving / 1e6:.2f} ms shorter ({share:.1%}).",
                impact_ns_per_step=saving,
                step_ns=step_ns,
                ranks=c["ranks"] or [],
                steps=c["steps"] or [],
                process_group=groups[0] if len(groups) == 1 else None,
                evidence={
                    "collective": c["collective"],
                    "role": c["role"],
                    "process_groups": groups,
                    "calls_per_step": c["calls"],
                    "median_bytes": med,
                    "exposed_ns_per_step": int(c["impact_ns"]),
                    "latency_share": round(mean_share, 4),
                    "step_ns": step_ns,
                    "saving_method": method,
                    "merge": facts,
                },
                edit=edit,
                advice=(
                    *(STORM_OVERLAP if c["collective"] == "all_reduce" and facts else ()),
                    "DDP: raise bucket_cap_mb (default 25 MB) so gradients travel in a few "
                    "large buckets; do not split tensors into tiny all-reduces.",
                    "DeepSpeed ZeRO: raise reduce_bucket_size / allgather_bucket_size; "
                    "Megatron-LM: --ddp-bucket-size.",
                    "Coalesce manual collectives (flatten tensors, or use "
                    "torch.distributed's coalescing manager) and wrap larger FSDP units.",
                ),
            )
        )
    return out


def _latency_shares(tables: Tables, exp: pl.LazyFrame, ref: float) -> pl.DataFrame:
    """Per storm (process_group, collective): `share`, the part of its calls' time a single
    call of their summed size would not need (latency): from the storms table's
    `latency_bound_share` (time-weighted), else from `reference_busbw_gbps` when set, else
    null (unknown)."""
    keys = ["process_group", "collective"]
    if tables.has("storms", "latency_bound_share", "time_ns"):
        st = tables["storms"].with_columns(pl.col("process_group").cast(pl.String))
        known = pl.col("latency_bound_share").is_not_null()
        return st.group_by(keys).agg(
            share=pl.when(pl.when(known).then(pl.col("time_ns")).sum() > 0).then(
                (pl.col("latency_bound_share") * pl.col("time_ns")).filter(known).sum()
                / pl.when(known).then(pl.col("time_ns")).sum()
            )
        )
    if ref > 0:
        # exposed_ns here is already less the bandwidth floor: the share left is latency.
        return tables.collect(exp.group_by(keys).agg(share=pl.lit(1.0)))
    return pl.DataFrame(
        schema={"process_group": pl.String, "collective": pl.String, "share": pl.Float64}
    )
