"""COMM101 exposed-communication and COMM102 sharded-collective-exposed."""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Edit,
    Finding,
    Platform,
    Severity,
    Tables,
    job_platform,
    launch_floor,
    make_finding,
    mean_step_ns,
    replay_saving,
    rule,
    step_blame,
    step_times,
)

from ._common import (
    SHARDED,
    SHARE_OPTIONS,
    exposure_by_cause,
    fit_words,
    free_compute,
    hideable_transfers,
    merge_fix,
    share_severity,
    single_call_steps,
    where_from,
)
from ._framework import fit_advice
from .bandwidth import replay_at_hardware
from .capture import contention

NVLINK_TP = "Keep tensor-parallel groups inside one NVLink domain (one host)."
TP_OVERLAP = (
    "Megatron-LM: --sequence-parallel and --tp-comm-overlap to overlap tensor-parallel "
    "communication with the GEMMs."
)
ADVICE: dict[tuple[str, str], tuple[str, ...]] = {
    ("data_parallel", "all_reduce"): (
        "DDP: make sure gradients are all-reduced during backward (no manual all-reduce after "
        "loss.backward()); tune bucket_cap_mb (smaller buckets start earlier) and set "
        "gradient_as_bucket_view=True.",
        "Megatron-LM: --overlap-grad-reduce (with --use-distributed-optimizer).",
        "DeepSpeed ZeRO: overlap_comm: true and a smaller reduce_bucket_size.",
        "With gradient accumulation, skip the all-reduce of all but the last micro-batch "
        "(DDP no_sync()).",
    ),
    ("tensor_parallel", "all_reduce"): (
        TP_OVERLAP,
        NVLINK_TP,
    ),
    ("expert", "all_to_all"): (
        "Overlap expert dispatch/combine with compute (e.g. DeepEP, Megatron "
        "--moe-shared-expert-overlap); lower the capacity factor.",
    ),
    ("embedding", "all_to_all"): (
        "torchrec: pipeline the sparse-feature all-to-all with the previous batch's dense "
        "compute (TrainPipelineSparseDist), so the embedding exchange overlaps it.",
        "Re-shard the embedding tables (torchrec's planner: table-, row- or column-wise) to "
        "cut and balance the all-to-all volume; quantize the exchange (qcomms: fp16/bf16 "
        "forward and backward).",
    ),
    ("fsdp", "all_gather"): (
        "FSDP: forward_prefetch=True and backward_prefetch=BackwardPrefetch.BACKWARD_PRE so "
        "the next unit's parameters are gathered during the current unit's compute; "
        "limit_all_gathers=True to avoid allocator stalls.",
        "FSDP2: reshard_after_forward=False for the last blocks; bigger wrapping units.",
        "DeepSpeed ZeRO-3: overlap_comm: true, stage3_prefetch_bucket_size, allgather_bucket_size.",
    ),
    ("fsdp", "reduce_scatter"): (
        "FSDP: wrap each transformer block as its own unit, so that its gradients are "
        "reduce-scattered while the earlier blocks' backward runs (one unit for the whole "
        "model scatters everything after backward); with gradient accumulation use no_sync() "
        "(FSDP2: set_requires_gradient_sync(False)) on all but the last micro-batch.",
        "DeepSpeed ZeRO: overlap_comm: true and a smaller reduce_bucket_size so gradients "
        "are reduce-scattered while backward runs.",
        "Megatron-LM: --overlap-grad-reduce with --use-distributed-optimizer.",
    ),
}
# Gloo runs FSDP's gradient reduce-scatter as an all_reduce: the same advice.
ADVICE[("fsdp", "all_reduce")] = ADVICE[("fsdp", "reduce_scatter")]
# The setting that merges a latency-bound cause's calls, per (role, collective): a merge
# finding's advice. {n}, {m}: calls per rank and step now and merged; {size}: their median
# size.
MERGE_ADVICE: dict[tuple[str, str], str] = {
    ("data_parallel", "all_reduce"): "DDP: raise bucket_cap_mb (default 25) so the {n} "
    "buckets of ~{size} a step become {m}: each bucket pays the fixed latency of a call, "
    "whatever its size; manual all-reduces: torch.distributed.all_reduce_coalesced, or "
    "flatten the tensors into one call.",
    ("fsdp", "all_gather"): "FSDP: wrap bigger units (several blocks per FSDP unit, or a "
    "larger min_num_params in the auto-wrap policy; FSDP2: fully_shard a group of blocks), "
    "so the {n} gathers of ~{size} a step become {m}.",
    ("fsdp", "reduce_scatter"): "FSDP: wrap bigger units (several blocks per FSDP unit, or a "
    "larger min_num_params in the auto-wrap policy; FSDP2: fully_shard a group of blocks), "
    "so the {n} gradient reductions of ~{size} a step become {m}.",
}
MERGE_ADVICE[("fsdp", "all_reduce")] = MERGE_ADVICE[("fsdp", "reduce_scatter")]
MERGE_GENERIC = (
    "Merge the {n} calls of ~{size} a step into {m}: coalesce them "
    "(torch.distributed.all_reduce_coalesced, or flatten the tensors into one call), or "
    "raise the framework's bucket size (DDP bucket_cap_mb, ZeRO reduce_bucket_size, "
    "Megatron-LM --ddp-bucket-size)."
)
# Causes whose calls a setting can merge: not tensor-parallel all-reduces (their size is
# batch x sequence x hidden) nor expert all-to-alls (one per layer and direction).
MERGEABLE = ("all_reduce", "all_gather", "reduce_scatter")
# DDP's bucket advice where its calls are not latency-bound, and where they are.
SMALLER_BUCKETS = "tune bucket_cap_mb (smaller buckets start earlier)"
BIGGER_BUCKETS = (
    "keep bucket_cap_mb at or above the default 25 (these buckets are latency-bound: "
    "smaller ones would cost more)"
)
GENERIC = (
    "Launch this communication earlier, on its own stream, so compute can hide it.",
    "If it cannot be hidden, make it cheaper: bigger messages, NCCL_ALGO/NCCL_PROTO tuning, "
    "or a faster interconnect.",
)
# Lines that differ where the job runs on gloo (none of NCCL's knobs) or on CPUs alone (no
# streams, no NVLink to keep a group inside).
GLOO_LINES = {
    GENERIC[1]: "If it cannot be hidden, make it cheaper: fewer, bigger messages; gloo moves "
    "data over TCP, so the fastest network interface (GLOO_SOCKET_IFNAME), or the NCCL "
    "backend on GPUs.",
    # Megatron's --tp-comm-overlap (Transformer Engine's userbuffers) runs on NCCL and GPUs
    # only: on gloo the overlap has to be issued by hand (expert review, gloo tp-dp-4).
    TP_OVERLAP: "Overlap tensor-parallel communication with compute by hand: issue each "
    "all-reduce with async_op=True and wait for it only where its result is needed, or split "
    "the matmul into chunks whose all-reduces run while the next chunk computes (Megatron-LM's "
    "--tp-comm-overlap needs GPUs and the NCCL backend).",
}
HOST_LINES = {
    GENERIC[0]: "Launch this communication earlier and asynchronously (async_op=True), "
    "waiting for it only where its result is needed, so compute can hide it.",
    NVLINK_TP: "Keep tensor-parallel groups inside one host.",
}


# The tables COMM101 and COMM102 read (one function, _findings, serves both).
TABLES = (
    "collectives",
    "kernels",
    "steps",
    "process_groups",
    "storms",
    "framework",
    "expected_busbw",
    "hardware",
)


def advice_for(platform: Platform, lines: tuple[str, ...]) -> tuple[str, ...]:
    """`lines` of advice for the job's platform: NCCL's tuning knobs only where the job runs
    NCCL, streams and NVLink only where it runs on GPUs."""
    if platform.backend == "gloo":
        lines = tuple(GLOO_LINES.get(line, line) for line in lines)
    if platform.host:
        lines = tuple(HOST_LINES.get(line, line) for line in lines)
    return lines


def _hideable(tables: Tables, where: pl.Expr) -> pl.DataFrame | float:
    """rank, step, fraction: per rank and step, the share of the blame rows `where` selects
    (a cause's exposed transfers) that compute can hide: at most the step's compute time
    that no communication overlaps yet (the steps table's compute_ns less overlap_ns). A
    transfer hidden behind compute runs while compute runs: a rank whose step holds less
    compute than the transfers to hide (a job bound by slow links) can hide only that much,
    whatever the order of its kernels. Without the steps' compute: every row (1.0)."""
    free = free_compute(tables)
    if free is None:
        return 1.0
    exposed = (
        step_blame(tables).filter(where).group_by("rank", "step").agg(_exposed=pl.col("ns").sum())
    )
    return tables.collect(
        exposed.join(free, on=["rank", "step"], how="left").select(
            "rank",
            "step",
            fraction=pl.when(pl.col("_exposed") > 0)
            .then(
                pl.min_horizontal(pl.lit(1.0), pl.col("free_ns").fill_null(0) / pl.col("_exposed"))
            )
            .otherwise(0.0),
        )
    )


def _launched(
    tables: Tables, cause: dict[str, Any], fraction: pl.DataFrame | float
) -> pl.DataFrame:
    """`fraction` (per rank and step, the share of a cause's exposed transfers that hiding
    takes: _hideable's) scaled by what the CPU's launches let each window lose: the compute
    after a hidden transfer starts earlier only as far as its kernels were launched (the
    same CPU issues the same kernels; rules_api.launch_floor, each call's hidden time taken
    out at its end). On the generator's FSDP job the gathers' saving was 21% above the
    job with the gathers made free, whose compute then waits for its launches."""
    calls = hideable_transfers(tables, cause["role"], cause["collective"], cause["groups"] or [])
    shares = (
        calls.select("rank", "step").unique().with_columns(fraction=pl.lit(fraction))
        if isinstance(fraction, float)
        else fraction
    )
    floor = launch_floor(
        tables,
        calls.join(shares, on=["rank", "step"], how="inner").select(
            "rank", "step", at_ns="end_ns", remove_ns=pl.col("exposed_ns") * pl.col("fraction")
        ),
    )
    return shares.join(
        floor.select("rank", "step", "share"), on=["rank", "step"], how="left"
    ).select("rank", "step", fraction=pl.col("fraction") * pl.col("share").fill_null(1.0))


def hideable_calls(tables: Tables, cause: dict[str, Any]) -> tuple[pl.Expr, bool]:
    """The blame rows of a cause that hiding it can take: all but those nothing later in
    the step can hide (the blame's `last_call`: each rank's last call of a step and an
    FSDP group's last two gradient reductions), unless such a call is the cause's only one
    in the step (`single_call_steps`); and whether any such lone call is taken."""
    alone = single_call_steps(tables).filter(
        (pl.col("role") == cause["role"]) & (pl.col("collective") == cause["collective"])
    )
    if alone.height == 0:
        return ~pl.col("last_call"), False
    keys = alone.select(pl.struct(pl.col("rank").cast(pl.Int64), pl.col("step").cast(pl.Int64)))
    lone = pl.struct("rank", "step").is_in(keys.to_series().implode())
    return ~pl.col("last_call") | lone, True


def where_all(collective: str, groups: list[str], role: str) -> pl.Expr:
    """The blame rows of a cause's transfers: its collective on its groups, of its role (a
    pooled group's calls of another kind, split off with a role of their own, are another
    cause's: `rules_api.call_roles`)."""
    return (
        (pl.col("category") == "transfer")
        & (pl.col("collective") == collective)
        & pl.col("process_group").is_in(groups)
        & (pl.col("role").fill_null("unknown") == role)
    )


def _split_by_size(tables: Tables, collective: str, groups: list[str]) -> bool:
    """A pooled group whose calls of this collective the process_groups table splits by
    size into causes of their own (roles.py): the cost fit, per group and collective, would
    pool their calls again, so no merge is offered for one of them."""
    if not tables.has("process_groups", "process_group", "pooled_collective", "pooled_bytes"):
        return False
    split = tables["process_groups"].filter(
        pl.col("process_group").is_in(groups)
        & (pl.col("pooled_collective") == collective)
        & pl.col("pooled_bytes").is_not_null()
    )
    return split.height > 1


def _size(n: float | None) -> str:
    """A message size in words (KiB or MiB); "unknown size" where it is not known."""
    if n is None:
        return "unknown size"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"


def _critical_share(tables: Tables, where: pl.Expr) -> float:
    """The share of the job's step time the blame rows `where` take on each complete step's
    critical rank: the `step_blame` table's rows, which the reports' step-time table shows."""
    times = step_times(tables).filter(pl.col("complete"))
    total = int(times["step_ns"].sum()) if times.height else 0
    if total <= 0:
        return 0.0
    rows = tables["step_blame"].join(times.select("step"), on="step", how="semi").filter(where)
    return min(1.0, int(rows["ns"].sum()) / total)


def _span(ranks: list[int]) -> str:
    """Ranks as ranges: [0, 1, 2, 3, 8] -> '0-3, 8'."""
    spans: list[list[int]] = []
    for r in sorted(set(ranks)):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def cause_text(tables: Tables, collective: str, role: str, groups: list[str]) -> str:
    """A cause as a title names it: its collective on groups of its role, or, where no role
    was inferred (gloo names no group per call, no annotation names experts), on the groups
    themselves and their ranks, with the role said to be unknown, never "unknown groups"."""
    if role != "unknown":
        return f"{collective} on {role.replace('_', '-')} groups"
    named = [g for g in groups if g not in (None, "", "?")]
    if not named:
        return f"{collective} on groups the trace does not name (role unknown)"
    pgs = tables["process_groups"] if tables.has("process_groups") else None
    ranks: list[int] = []
    if pgs is not None and pgs.height and "ranks" in pgs.columns:
        for r in pgs.filter(pl.col("process_group").is_in(named))["ranks"].to_list():
            ranks += r or []
    which = ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
    of = f"ranks {_span(ranks)}, " if ranks else ""
    return f"{collective} on group{'s' if len(named) > 1 else ''} {which} ({of}role unknown)"


def _findings(rule_: Any, tables: Tables, options: dict[str, Any], sharded: bool) -> list[Finding]:
    """Findings per (role, collective), for the sharded (FSDP/ZeRO) causes or the others."""
    causes = exposure_by_cause(tables)
    if causes.height == 0:
        return []
    is_sharded = (pl.col("role") == "fsdp") & pl.col("collective").is_in(SHARDED)
    causes = causes.filter(is_sharded if sharded else ~is_sharded)
    step_ns = mean_step_ns(tables)
    # Ranks time-slicing one GPU (CAPT101) pay each call's turn on the device, which the cost
    # fit would read as the call's latency: merging calls is not offered on such a capture.
    capture = contention(tables)
    shared_device = capture is not None and capture.kind == "device"
    platform = job_platform(tables)
    out = []
    for c in causes.sort("impact_ns", descending=True).iter_rows(named=True):
        groups = c["groups"] or []
        what = cause_text(tables, c["collective"], c["role"], groups)
        # Tensor-parallel all-reduces sit between dependent GEMMs: no reordering hides them,
        # only splitting them to overlap with the GEMMs (sequence parallelism, TP comm
        # overlap); the saving is what that would hide at best.
        how = (
            "overlap the {what} with the GEMMs (sequence parallelism and TP communication "
            "overlap; at best: they sit between dependent GEMMs)"
            if c["role"] == "tensor_parallel"
            else "hide the {what} behind compute"
        ).format(what=what)
        hideable, lone = hideable_calls(tables, c)
        where = where_all(c["collective"], groups, c["role"]) & hideable
        behind = _hideable(tables, where)
        edit = Edit(
            f"{how} (each rank's last call of a step, and an FSDP group's last two gradient "
            "reductions, excepted unless it is the step's only one, which split into buckets "
            "hides all but its last; at most the compute "
            "time of the rank's step that no communication overlaps yet; the CPU's "
            "launches unchanged)",
            where,
            fraction=_launched(tables, c, behind),
        )
        saving = replay_saving(tables, edit)
        exposed_share = _critical_share(tables, where_all(c["collective"], groups, c["role"]))
        # Too little compute to hide it behind (the cap cuts the saving to under half of
        # hiding it all): the cost stands, with what hiding can buy and the advice to make
        # the communication cheaper instead.
        unbound = replay_saving(tables, Edit("hide it all", where))
        capped = replay_saving(tables, Edit("hide it behind the compute", where, behind))
        bound = unbound > 0 and capped < unbound / 2
        # Cheaper instead: its calls merged into fewer, bigger ones, where the cost fit says
        # they are latency-bound; the finding is the fix that buys more.
        merge = (
            merge_fix(tables, c["collective"], groups)
            if c["collective"] in MERGEABLE
            and c["role"] != "tensor_parallel"
            and not shared_device
            and not _split_by_size(tables, c["collective"], groups)
            else None
        )
        merged = replay_saving(tables, merge[0]) if merge else 0
        facts = merge[1] if merge else None
        hide_saving = saving
        if merge and merged > saving:
            edit, saving = merge[0], merged
        share = saving / step_ns if step_ns else 0.0
        sev = share_severity(share, options)
        if sev is None and bound and exposed_share >= options["info_share"]:
            # Its fix buys little, yet the cause holds much of the step: said, as info,
            # with the advice to make it cheaper (the step-time table's row has its reason).
            sev = Severity.info
        if sev is None:
            continue
        detail = (
            f"{c['collective']} ({c['role']}, groups {', '.join(groups)}) runs with no "
            f"compute to hide it for {c['impact_ns'] / 1e6:.2f} ms per step on the worst "
            f"rank, not counting waits for late ranks; on the steps' critical ranks its "
            f"transfers take {exposed_share * step_ns / 1e6:.2f} ms per step "
            f"({exposed_share:.0%} of the step: the step-time table's transfer rows). "
        )
        if facts and edit is merge[0]:
            title = (
                f"Merge the latency-bound {what}: {facts['calls_per_step']:.0f} calls per "
                f"step into {facts['merged_calls_per_step']:.0f}"
            )
            size = _size(facts["median_bytes"])
            detail += (
                f"Its cost per call: {fit_words(facts)}. Merged into about "
                f"{facts['merged_calls_per_step']:.0f} call(s) per rank and step (of up to "
                f"{_size(facts['target_bytes'])}), the step would be {saving / 1e6:.2f} ms "
                f"shorter ({share:.1%} of {step_ns / 1e6:.2f} ms); hiding it behind compute "
                f"would save {hide_saving / 1e6:.2f} ms."
            )
            words = {
                "n": f"{facts['calls_per_step']:.0f}",
                "m": f"{facts['merged_calls_per_step']:.0f}",
                "size": size,
            }
            first = MERGE_ADVICE.get((c["role"], c["collective"]), MERGE_GENERIC)
            advice = (first.format(**words), *advice_for(platform, (GENERIC[1],)))
        elif bound:
            title = f"Exposed {what}: too little compute to hide it behind"
            detail += (
                f"The ranks' steps hold too little compute that no communication overlaps "
                f"to hide it behind: hiding it would save only {saving / 1e6:.2f} ms per step "
                f"({share:.1%} of {step_ns / 1e6:.2f} ms). Make it cheaper instead."
            )
            if facts is None:
                detail += " Its calls are not latency-bound: fewer, bigger ones would not help."
            advice = (
                *advice_for(platform, (GENERIC[1],)),
                "Compare its bus bandwidth with the link's (NET101, the collectives' "
                "speed_of_light): a slow link or transport costs the time, not the order.",
            )
        else:
            title = f"Hide the exposed {what} behind compute: {share:.0%} of step time"
            detail += (
                f"Hidden, it would save {saving / 1e6:.2f} ms per step ({share:.1%} of "
                f"{step_ns / 1e6:.2f} ms)."
            )
            if lone:
                detail += (
                    " In some steps it is one call after the rest of the step's work: split "
                    "into buckets that start during the backward, all but the last bucket "
                    "hide, so the saving is a bound (the last bucket stays exposed)."
                )
            advice = advice_for(platform, ADVICE.get((c["role"], c["collective"]), GENERIC))
            if facts is not None:
                # Latency-bound buckets: smaller ones would cost more, not start earlier.
                advice = tuple(a.replace(SMALLER_BUCKETS, BIGGER_BUCKETS) for a in advice)
            # Only what fits the framework the trace shows (rules/_framework.py).
            advice = fit_advice(tables, c["ranks"], c["role"], c["collective"], advice)
        # Cheaper, in numbers: the step with its calls at what the hardware table gives
        # their link (a replay, as NET101's), where the table knows the link.
        fast = None if shared_device else replay_at_hardware(tables, groups, c["collective"])
        if fast is not None:
            advice = (
                *advice,
                f"At {fast[2]} (nccl-tests; docs/hardware.md), its calls of 16 MiB and more "
                f"would make the step {fast[0] / 1e6:.2f} ms shorter "
                f"({fast[0] / step_ns if step_ns else 0.0:.1%}): a faster link buys at most "
                "that.",
            )
        # Where in the code it comes from (the attribution table).
        where_text, places = where_from(tables, collective=c["collective"], role=c["role"])
        if where_text:
            detail += " " + where_text
        out.append(
            make_finding(
                rule_,
                sev,
                title,
                detail,
                impact_ns_per_step=saving,
                step_ns=step_ns,
                ranks=c["ranks"] or [],
                steps=c["steps"] or [],
                process_group=groups[0] if len(groups) == 1 else None,
                evidence={
                    "collective": c["collective"],
                    "role": c["role"],
                    "process_groups": groups,
                    "exposed_ns_per_step": int(c["impact_ns"]),
                    "calls_per_step": c["calls"],
                    "mean_bytes": None if c["bytes_per_call"] is None else int(c["bytes_per_call"]),
                    "step_ns": step_ns,
                    "compute_bound_saving": bound,
                    "exposed_share": round(exposed_share, 4),
                    "hide_saving_ns": int(hide_saving),
                    "merge": facts,
                    "single_call_steps": lone,
                    "saving_method": f"replay: {edit.name}",
                    # Where the hardware table knows the link (none: left out, not null).
                    **(
                        {}
                        if fast is None
                        else {"at_hardware_saving_ns": int(fast[0]), "expected_busbw_gbps": fast[1]}
                    ),
                    "where": places,
                },
                advice=advice,
                edit=edit,
            )
        )
    return out


@rule(
    code="COMM101",
    name="exposed-communication",
    summary="Communication that no compute hides, by collective and process-group role.",
    tables=TABLES,
    options=SHARE_OPTIONS,
)
def exposed_communication(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Measures, per collective and process-group role (data-parallel all-reduce,
    tensor-parallel all-reduce, expert all-to-all, ...), the time communication kernels move
    data while no compute kernel runs on the rank, per step on the worst rank. Time spent
    waiting for late ranks is left to SYNC101 and SYNC104, the last collective of a step
    (nothing left to overlap it with) is not counted unless it is its cause's only call of
    the step (one gradient all-reduce after the backward: split into buckets, all but the
    last can hide; `single_call_steps` in the evidence), FSDP/ZeRO gathers and scatters are
    COMM102's, storms of tiny messages COMM201's and pipeline send/recv PIPE101's. The
    impact is the replayed saving (the model of time) of those transfers hidden behind
    compute, each rank's last call of a step excepted (but a lone one), and on each rank and
    step at most the compute time no communication overlaps yet (a transfer is hidden only
    while compute runs: a job bound by slow links, with little compute per step, saves
    little by overlap), with the CPU's launches where they are (the compute after a hidden
    transfer starts earlier only as far as its kernels were launched: the rules API's
    launch_floor, as NET101's faster links).
    Where its calls are latency-bound (the cost fit, rules_api.cost_fit: latency + bytes /
    bandwidth per group, the latency at least half the median call), it also replays
    making them cheaper: the calls below 25 MiB merged into calls of about that size, each
    paying the latency once, the CPU launching m calls instead of n; the finding is the fix
    that buys more ("Merge the latency-bound ...: n calls per step into m", with the
    setting: DDP bucket_cap_mb, FSDP wrapping, all_reduce_coalesced; `merge` in evidence);
    not where the ranks time-slice one GPU (CAPT101), whose turns the fit would read as latency.
    When the compute bound cuts the hiding to under half of hiding it all and nothing
    merges, the finding says so (`compute_bound_saving`) and advises making it cheaper; it
    is info at least while the cause's exposed share is above `info_share`. Where the
    hardware table gives the group's link a figure (docs/hardware.md), one more line of
    advice states the replayed saving of its calls of 16 MiB and more at that bus bandwidth
    (`at_hardware_saving_ns`, `expected_busbw_gbps`): what a faster link can buy. The
    severity is what the fix saves; the cause's share of the step on the critical ranks
    (the step-time table's transfer rows) is in the message (`exposed_share`).

    Why is this bad?
    Exposed communication adds straight to step time: the GPU sits idle until it finishes.

    How to fix:
    Overlap it with compute: DDP bucket_cap_mb and gradient_as_bucket_view, Megatron
    --overlap-grad-reduce / --tp-comm-overlap, ZeRO overlap_comm and reduce_bucket_size.
    Latency-bound calls: fewer, bigger ones (raise bucket_cap_mb, wrap bigger FSDP units,
    coalesce). The finding's advice is specific to the collective and group role, and fits
    the framework the trace shows (the framework table: no TrainPipelineSparseDist where it
    runs; no DeepSpeed or Megatron-LM line for a job wrapped in PyTorch's DDP).
    """
    return _findings(exposed_communication, tables, options, sharded=False)


@rule(
    code="COMM102",
    name="sharded-collective-exposed",
    summary="FSDP/ZeRO all-gathers or reduce-scatters that no compute hides.",
    tables=TABLES,
    options=SHARE_OPTIONS,
)
def sharded_collective_exposed(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Measures the exposed time (no compute running, waits for late ranks excluded) of the
    parameter all-gathers and gradient reduce-scatters of fully sharded data parallelism
    (PyTorch FSDP, DeepSpeed ZeRO-3, Megatron distributed optimizer), per collective; on an
    fsdp group, an all_reduce too (gloo runs the reduce-scatter as one). The
    impact is replayed as COMM101's: the transfers hidden behind compute, each rank's last
    call of a step excepted unless it is the collective's only one, at most the step's
    compute that no communication overlaps yet, the CPU's launches where they are. The
    step's last two gradient reductions are excepted too: FSDP reduces a unit's gradients
    after its backward, the root unit's (embedding, output layer) when the backward ends
    and the first block's with only the embedding's short backward after it.

    Why is this bad?
    Sharded training only pays off when the next unit's parameters are gathered while the
    current unit computes and gradients are scattered during backward; an exposed gather
    or scatter stalls the GPU every layer.

    How to fix:
    FSDP forward_prefetch=True, backward_prefetch=BACKWARD_PRE, limit_all_gathers=True;
    FSDP2 (fully_shard) set_modules_to_forward_prefetch / set_modules_to_backward_prefetch,
    reshard_after_forward; ZeRO overlap_comm: true, stage3_prefetch_bucket_size,
    reduce_bucket_size. The advice fits the framework the trace shows (the framework table):
    FSDP2's knobs first and no FSDP1 flag on a fully_shard model, and the reverse.
    """
    return _findings(sharded_collective_exposed, tables, options, sharded=True)
