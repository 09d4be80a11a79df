"""SYNC101 straggler and SYNC104 arrival-imbalance: ranks that reach collectives late."""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Edit,
    Finding,
    Option,
    Severity,
    Tables,
    all_to_all_volume,
    collective_exposure_lazy,
    group_roles,
    job_platform,
    make_finding,
    mean_step_ns,
    rank_lateness,
    replay_saving,
    rule,
    severity_for,
    step_times,
)

from ._common import (
    P2P,
    SHARE_OPTIONS,
    STORM_MAX_BYTES,
    STORM_MIN_CALLS,
    share_severity,
    storm_keys,
    where_from,
)
from .capture import Contention, contention, queued_per_step


def _stragglers(tables: Tables) -> pl.DataFrame:
    """The analysis' stragglers table (docs/tables.md), the one home of who is late and by
    how much: both rules read it, neither recomputes it. Empty when it is absent."""
    if not tables.has("stragglers", "is_straggler"):
        return pl.DataFrame(schema={"rank": pl.Int64, "is_straggler": pl.Boolean})
    return tables["stragglers"]


@rule(
    code="SYNC101",
    name="straggler",
    summary="One rank arrives last at collectives and makes the others wait.",
    tables=("stragglers", "steps", "process_groups"),
    options=(
        Option("warn_share", 0.05, "Warn when the delay costs this share of step time."),
        Option("error_share", 0.15, "Error at this share of step time."),
    ),
)
def straggler(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Names every rank the stragglers table marks `is_straggler`; its cost is the replayed
    saving (the model of time) of that table's `delay_ns` removed from the rank, the
    others' waits for it shrinking as much. There, for every collective call matched
    across its group, the rank that arrived last is charged its lateness behind the
    second-latest one; per step its largest lateness is the time the job waited for it (a
    late rank stays late for the rest of the step: the delay shifts, it does not add up),
    averaged over the steps. A rank is a straggler when it caused the most lateness in most
    steps and most of all
    lateness (`confidence` >= 0.5) and its delay is at least 20 us. The finding is an
    error or a warning by the delay's share of step time, else information. When the
    rank's own queued time (its launched kernels waiting on a device running none of its
    work) is at least half its delay, or it shares its hardware with ranks of the same work
    (CAPT101) and has less compute than one of them, its lateness is not its own work: the
    finding says so and gives the capture's advice, not the data loader's (information
    where CAPT101's ranks have the same work).

    Why is this bad?
    Collectives are synchronous: every rank waits in the collective until the last one
    arrives, so one slow rank (slow data loading, a throttled GPU, a noisy neighbour, extra
    work on rank 0) slows every step of the whole job.

    How to fix:
    Find what delays that rank before the collective: data loader (more workers,
    pin_memory, prefetch), logging/checkpointing only on rank 0, thermal or clock
    throttling (nvidia-smi -q -d PERFORMANCE), an unbalanced data or pipeline split. When
    the rank is among the busiest receivers of an uneven all-to-all (more tokens for its
    experts), the advice says so first.
    """
    named = _stragglers(tables).filter(pl.col("is_straggler"))
    if named.height == 0:
        return []
    step_ns = mean_step_ns(tables)
    uneven = uneven_all_to_all(tables)
    capture = contention(tables)
    queued = queued_per_step(tables)
    out = []
    for r in named.sort("delay_ns", "rank", descending=[True, False]).iter_rows(named=True):
        edit = straggler_fixed(r["rank"], r["delay_ns"])
        # The straggler is among the busiest receivers of an uneven all-to-all: more work
        # arrives at it, the likelier cause than its CPU side.
        busiest = uneven.filter(pl.col("ranks").list.contains(r["rank"]))
        impact = replay_saving(tables, edit)
        share = impact / step_ns if step_ns else 0.0
        sev = severity_for(share, options["warn_share"], options["error_share"]) or Severity.info
        why = _not_its_work(r["rank"], r["delay_ns"], queued.get(r["rank"], 0), capture)
        if why and capture is not None and capture.same_work:
            sev = Severity.info  # the capture's turns, not the rank's work: CAPT101 leads
        out.append(
            make_finding(
                straggler,
                sev,
                f"Rank {r['rank']} is a straggler: the job waits {impact / 1e6:.2f} ms per step",
                f"Rank {r['rank']} arrived last at {r['times_last']} of {r['instances']} "
                f"shared collective calls and caused {r['late_share']:.0%} of all arrival "
                f"lateness: {impact / 1e6:.2f} ms per step ({share:.1%} of step time; "
                f"confidence {r['confidence']:.2f})." + (f" {why}" if why else ""),
                impact_ns_per_step=impact,
                step_ns=step_ns,
                ranks=[r["rank"]],
                evidence={
                    **r,
                    "step_ns": step_ns,
                    "uneven_all_to_all": _uneven_evidence(busiest),
                    "queued_ns_per_step": queued.get(r["rank"], 0),
                    "capture_contention": capture.kind if capture else None,
                    "saving_method": f"replay: {edit.name}",
                },
                edit=edit,
                advice=(
                    (_capture_line(capture) if capture else why,)
                    if why
                    else (
                        *(_uneven_line(g) for g in busiest.iter_rows(named=True)),
                        f"Profile rank {r['rank']}'s CPU side before its first collective of "
                        "a step: data loading (num_workers, pin_memory, prefetch_factor), "
                        "rank-0-only logging, evaluation or checkpointing.",
                        _check_the_rank(job_platform(tables).host),
                        _balance_line(tables),
                    )
                ),
            )
        )
    return out


def _not_its_work(rank: int, delay_ns: int, queued_ns: int, c: Contention | None) -> str:
    """Why a late rank's lateness is not its own work, in a sentence; "" when it may be:
    its own queued time (its launched kernels waited on a device running none of its work)
    is at least half its delay, or it shares the hardware with ranks of the same work
    (CAPT101) and has less compute than another of them."""
    if queued_ns * 2 >= delay_ns > 0:
        held = (
            "the other ranks on its GPU held it"
            if c and c.kind == "device"
            else ("other work held it")
        )
        return (
            f"Its lateness is its own queued time: its launched kernels waited "
            f"{queued_ns / 1e6:.2f} ms per step for a device running none of its work ({held}),"
            " not its data loader or its CPU side."
        )
    if c is not None and c.same_work and rank in c.ranks:
        mine = c.compute_ns.get(rank, 0)
        most = max(c.compute_ns.get(r, 0) for r in c.ranks)
        if mine < most:
            return (
                f"Its lateness is not its own work: it runs the same work as the others with "
                f"less compute ({mine / 1e6:.1f} ms against up to {most / 1e6:.1f} ms), and "
                f"{c.words()} (CAPT101)."
            )
    return ""


def _capture_line(c: Contention, before: str = "profiling this rank") -> str:
    """The advice for lateness the capture explains: capture again, then act (`before`)."""
    if c.kind == "device":
        return (
            f"Capture again with one rank per GPU (torchrun --nproc-per-node = GPUs) before "
            f"{before}: on a shared GPU the ranks are late in the device's turns (CAPT101)."
        )
    return (
        f"Capture again with no more ranks per host than it has cores to spare before "
        f"{before}: the ranks compete for the host's cores (CAPT101)."
    )


def _balance_line(tables: Tables) -> str:
    """SYNC101's work-balancing line: sequence packing, except where every group is
    tensor-parallel (its ranks share one batch)."""
    roles = set(group_roles(tables)["role"].drop_nulls().to_list())
    if roles == {"tensor_parallel"}:
        return _TENSOR_PARALLEL
    return "Balance the work: equal sequence lengths/packing per rank, balanced pipeline stages."


def _check_the_rank(host: bool) -> str:
    """Where a late rank's time may go besides its own work: its GPU, unless the job has
    none (CPU-only traces), and its host."""
    if host:
        return (
            "Check that rank's host for other load: other processes on its cores, CPU "
            "frequency scaling or thermal throttling."
        )
    return (
        "Check the GPU of that rank for throttling (nvidia-smi -q -d PERFORMANCE) and the "
        "host for other load."
    )


def _comm_threads(backend: str | None) -> str:
    """The communication backend's own CPU threads, which a rank's cores must leave room for."""
    return "gloo's communication threads" if backend == "gloo" else "NCCL's proxy threads"


def straggler_fixed(rank: int, delay_ns: int) -> Edit:
    """The edit of a straggler fixed: its windows shorter by its lateness (`delay_ns`, the
    stragglers table's); the replay shortens the others' waits for it by as much."""
    return Edit(
        f"rank {rank}'s lateness removed ({delay_ns / 1e6:.2f} ms per step; the others' "
        "waits for it shrink as much)",
        pl.lit(False),
        0.0,
        pl.DataFrame({"rank": [int(rank)], "remove_ns": [int(delay_ns)]}),
    )


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


# A group's all-to-alls are uneven when the mean call's busiest receiver, or some rank over
# the trace, gets more than this share above the mean rank.
UNEVEN = 0.05
# How to give every rank the same work, by what its groups do (process-group roles): the
# first role present wins; a job whose groups' purpose is unknown gets the generic line.
_BALANCE = (
    (
        "embedding",
        "Balance the embedding work per rank: shard the tables by measured lookup and "
        "feature statistics (torchrec's planner) so that each rank's all-to-all carries the "
        "same number of rows, and give every rank batches with the same number of sparse ids.",
    ),
    (
        "expert",
        "Balance the tokens per expert: a load-balancing (auxiliary) loss, a capacity factor "
        "that drops or re-routes overflow tokens, or expert placement that spreads hot experts.",
    ),
    (
        ("data_parallel", "tensor_parallel", "fsdp", "pipeline"),
        "Give every rank the same work per step: pack sequences or bucket them by length so "
        "that each rank's batch holds the same number of tokens.",
    ),
)
_BALANCE_GENERIC = (
    "Give every rank the same work per step: the same batch size and input shapes on every "
    "rank (what the groups exchange is not known from the trace)."
)


def uneven_all_to_all(tables: Tables) -> pl.DataFrame:
    """Per group whose all-to-alls are uneven (rules_api.all_to_all_volume: the mean call's
    busiest receiver, or some rank over the trace, gets more than UNEVEN above the mean
    rank): process_group, role, `imbalance` (the mean call's busiest receiver over the
    call's mean), `ranks` (those that receive more than UNEVEN above the mean rank over
    the trace, most first; none when the busiest rank changes from call to call) and
    `excess` (the first of them over the mean rank)."""
    volume = all_to_all_volume(tables)
    heavy = pl.col("received_vs_mean") > 1 + UNEVEN
    groups = (
        volume.sort(["received_vs_mean", "rank"], descending=[True, False])
        .group_by("process_group", maintain_order=True)
        .agg(
            imbalance=pl.col("call_imbalance").first(),
            ranks=pl.col("rank").filter(heavy),
            excess=pl.col("received_vs_mean").first(),
        )
        .filter((pl.col("imbalance") > 1 + UNEVEN) | (pl.col("ranks").list.len() > 0))
    )
    roles = group_roles(tables).select("process_group", "role")
    return (
        groups.join(roles, on="process_group", how="left")
        .with_columns(pl.col("role").fill_null("unknown"))
        .sort("process_group")
        .select("process_group", "role", "imbalance", "ranks", "excess")
    )


def _uneven_line(group: dict[str, Any]) -> str:
    """What an uneven all-to-all group's calls show, and how to even them by its role."""
    how = {
        "expert": "the tokens per expert (a load-balancing loss, a capacity factor, expert "
        "placement that spreads hot experts)",
        "embedding": "the rows per rank (shard the tables by measured lookups: torchrec's planner)",
    }.get(
        group["role"],
        "whatever the group carries (the load of each expert, each rank's shard of the "
        "embedding tables, or its batch), the same amount on every rank",
    )
    ranks = group["ranks"]
    who = (
        f"; over the trace rank(s) {', '.join(map(str, ranks))} receive the most (up to "
        f"{group['excess'] - 1:.0%} above the mean rank)"
        if ranks
        else "; the busiest rank changes from call to call"
    )
    return (
        f"The all-to-all on group {group['process_group']} is uneven: in the mean call the "
        f"busiest rank receives {group['imbalance'] - 1:.0%} more than the mean rank{who}. "
        f"Even out what each rank receives: {how}."
    )


_TENSOR_PARALLEL = (
    "The waits are on tensor-parallel groups, whose ranks share one batch (no sequence "
    "packing evens them): what differs is each rank's shard (heads, vocabulary, experts "
    "split unevenly) or its host (CPU launch speed, contention, rank-0-only work): shard "
    "evenly and give each rank's process the same CPU room."
)


def _balance_advice(
    tables: Tables, uneven: pl.DataFrame, waited: pl.DataFrame | None = None
) -> tuple[str, ...]:
    """The work-balancing advice that fits the job: what its uneven all-to-alls show, then
    the line for the roles of the groups the ranks wait in (`waited`'s process_group; all
    the job's groups without it). Tensor-parallel ranks share one batch: packing sequences
    cannot even them."""
    lines = tuple(_uneven_line(g) for g in uneven.iter_rows(named=True))
    roles_of = group_roles(tables).select("process_group", "role")
    if waited is not None and waited.height and "process_group" in waited.columns:
        groups = waited["process_group"].cast(pl.String).unique().implode()
        roles_of = roles_of.filter(pl.col("process_group").cast(pl.String).is_in(groups))
    roles = set(roles_of["role"].drop_nulls().to_list())
    if roles == {"tensor_parallel"}:
        return (*lines, _TENSOR_PARALLEL)
    for wanted, text in _BALANCE:
        if roles & ({wanted} if isinstance(wanted, str) else set(wanted)):
            return lines if wanted in ("expert", "embedding") and lines else (*lines, text)
    return lines or (_BALANCE_GENERIC,)


def _uneven_evidence(uneven: pl.DataFrame) -> list[dict[str, Any]]:
    """uneven_all_to_all's groups as a finding's `evidence.uneven_all_to_all`."""
    return [
        {
            "process_group": g,
            "call_imbalance": round(i, 3),
            "busiest_ranks": list(r),
            "busiest_received_vs_mean": round(e, 3),
        }
        for g, i, r, e in uneven.select("process_group", "imbalance", "ranks", "excess").iter_rows()
    ]


@rule(
    code="SYNC104",
    name="arrival-imbalance",
    summary="Ranks reach collectives out of step, no one rank to blame: all wait in turn.",
    tables=("collectives", "kernels", "steps", "storms", "stragglers", "process_groups"),
    options=SHARE_OPTIONS,
)
def arrival_imbalance(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Measures the time ranks spend inside collectives waiting for the group's late ranks
    with no compute running (each call's wait in the rule API's collective_waits: from its
    arrival to the last member's where the whole group was traced), per step, averaged over
    ranks. The impact is what the step would lose if every rank did the mean rank's work,
    replayed on the model of time: each late rank sheds (n-1)/n of its lateness and the
    others' waits for it shrink as much. A straggler (the stragglers table's `is_straggler`
    ranks) is SYNC101's and is left out, and so is the time its fix saves (the saving is
    what the edit adds to SYNC101's fixes: a straggler's delay passed on to the ranks
    waiting for it is its own); what remains are waits no one rank is to blame for: the
    ranks take turns arriving last.
    Point-to-point calls and message storms are left to PIPE101 and COMM201. On a capture
    CAPT101 judges contended (ranks on one GPU, or on too few cores) the advice opens with
    capturing again; where those ranks have the same work, they are late in the hardware's
    turns, not by their work: the finding is information, says so, and advises no
    balancing.

    Why is this bad?
    A collective finishes only when its last rank arrives, so every step runs at the pace
    of whichever rank was slowest in it. Jitter that averages out on one rank (uneven
    batches, garbage collection, OS noise, CPU contention, a data loader that sometimes
    stalls) adds up across many ranks: the more ranks, the more likely one is late at
    every call.

    How to fix:
    Equal work per rank and step (sequence packing or length bucketing, except where the
    waits are on tensor-parallel groups only, whose ranks share one batch; where a group's
    all-to-alls are uneven, the advice names its busiest receivers and how to even out the
    tokens per expert or the embedding rows per rank), a data loader that
    never starts a step empty, garbage collection at the same step on every rank
    (gc.freeze(), manual gc; Megatron-LM --manual-gc), each rank pinned to its own CPU cores
    and NUMA node with cores to spare for NCCL's proxy threads.
    """
    # The complete steps' waits: those of the step time the saving is replayed on.
    done = step_times(tables).filter(pl.col("complete"))["step"].cast(pl.Int64)
    waits = _exposed_waits(tables).filter(pl.col("step").cast(pl.Int64).is_in(done.implode()))
    if waits.height == 0:
        return []
    late = _stragglers(tables)
    if "delay_ns" not in late.columns or late["late_share"].sum() <= 0:
        return []
    # Ties are listed, all of them (as the skew table lists the ranks tied for most often
    # last), the lowest first; the sums run in step order: the same finding however the
    # tables were gathered.
    top = late.sort(["late_share", "rank"], descending=[True, False]).row(0, named=True)
    top_share = top["late_share"]
    tied = late.filter(pl.col("late_share") == top_share)["rank"].sort().to_list()
    waits = waits.sort("step")
    per_rank = waits.select(pl.col("wait_ns") / pl.col("ranks").clip(lower_bound=1))
    waited = float(per_rank.to_series().sum()) / waits.height
    # A straggler's own delay is SYNC101's time: only the rest of the waits count here.
    named = late.filter(pl.col("is_straggler"))
    blamed = float(named["delay_ns"].sum())
    others = ~pl.col("late_rank").is_in(named["rank"].cast(pl.Int64).implode()).fill_null(False)
    # Equal work: a late rank's extra work spread over the n ranks, so each late rank
    # sheds (n-1)/n of its lateness and the others' waits shrink as much.
    n = max(1, int(step_times(tables)["ranks"].max() or 1))
    keep = (n - 1) / n
    # The waits it measures, and no others: message storms' waits are COMM201's (merging
    # the calls removes them), point-to-point calls are the pipeline's.
    storms = storm_keys(tables, STORM_MAX_BYTES, STORM_MIN_CALLS)
    storm = pl.concat_str("process_group", "collective", separator="\x00").is_in(
        storms.select(pl.concat_str("process_group", "collective", separator="\x00"))
        .to_series()
        .implode()
    )
    measured = ~pl.col("collective").is_in(P2P).fill_null(False) & ~storm.fill_null(False)
    edit = Edit(
        "the late ranks' extra work spread evenly over the ranks (their lateness and the "
        "others' waits for them shrink by (n-1)/n)"
        + (", the stragglers' excepted" if named.height else ""),
        (pl.col("category") == "wait") & others & measured,
        keep,
        rank_lateness(tables, measured)
        .filter(~pl.col("rank").is_in(named["rank"].cast(pl.Int64).implode()))
        .with_columns(remove_ns=(pl.col("remove_ns") * keep).round().cast(pl.Int64)),
    )
    # What it saves beyond SYNC101's fixes: a straggler's delay reaches the ranks that wait
    # for it, and theirs the next ones (a pipeline stage behind it arrives late at its own
    # data-parallel calls); those waits are the straggler's time, not an imbalance.
    fixed = [straggler_fixed(r, d) for r, d in named.select("rank", "delay_ns").iter_rows()]
    before = replay_saving(tables, *fixed) if fixed else 0
    impact = max(0, replay_saving(tables, *fixed, edit) - before)
    step_ns = mean_step_ns(tables)
    share = impact / step_ns if step_ns else 0.0
    sev = share_severity(share, options)
    if sev is None:
        return []
    # Ranks that share their hardware (CAPT101) with the same work arrive late in the
    # hardware's turns: no work to balance; the finding stays, qualified, as information.
    capture = contention(tables)
    turns = capture is not None and capture.same_work
    if turns:
        sev = Severity.info
    lasts = late.filter(pl.col("times_last") > 0)
    uneven = uneven_all_to_all(tables)
    culprit = (
        f"rank(s) {', '.join(map(str, named['rank'].sort()))} are SYNC101's stragglers, and"
        f" their {blamed / 1e6:.2f} ms per step are not counted here."
        if named.height
        else f"no one rank is to blame (rank {top['rank']}, the most late, caused "
        f"{top_share:.0%} of the lateness)."
        if len(tied) == 1
        else f"no one rank is to blame (ranks {', '.join(map(str, tied))}, tied for the most "
        f"late, caused {top_share:.0%} of the lateness each)."
    )
    # Where in the code the waits are (the attribution table).
    where_text, places = where_from(tables, kind="wait")
    return [
        make_finding(
            arrival_imbalance,
            sev,
            f"Ranks reach collectives out of step: waiting for late ranks costs "
            f"{impact / 1e6:.2f} ms per step",
            f"A rank waits {waited / 1e6:.2f} ms per step on average inside collectives for "
            f"the group's late ranks, with no compute to hide it; with the late ranks' extra "
            f"work spread evenly over the {n} ranks (their lateness and the waits for them "
            f"shrink by (n-1)/n), the step would be {impact / 1e6:.2f} ms shorter ({share:.1%} of "
            f"{step_ns / 1e6:.2f} ms). {lasts.height} of {late.height} ranks arrived last at "
            f"some call; {culprit}"
            + (
                f" But {capture.words()} (CAPT101), and every rank has the same work: the late "
                "ranks are late in the hardware's turns, not by their work, and no balancing "
                "buys this time back."
                if turns and capture is not None
                else ""
            )
            + (" " + where_text if where_text else ""),
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
                "most_late_ranks": tied,
                "most_late_share": round(top_share, 3),
                "step_ns": step_ns,
                "uneven_all_to_all": _uneven_evidence(uneven),
                "capture_contention": capture.kind if capture else None,
                "saving_method": f"replay: {edit.name}",
                "where": places,
            },
            edit=edit,
            advice=(
                *((_capture_line(capture, "balancing the work"),) if capture else ()),
                *(
                    ()
                    if turns
                    else (
                        *_balance_advice(tables, uneven, waits),
                        "Keep the data loader ahead of the step on every rank (num_workers, "
                        "pin_memory, prefetch_factor).",
                        "Collect garbage at the same step on every rank: gc.freeze() after "
                        "start-up and gc.disable() with a gc.collect() every N steps "
                        "(Megatron-LM: --manual-gc --manual-gc-interval N).",
                        "Pin each rank to its own CPU cores and NUMA node (numactl, taskset), "
                        f"with cores to spare for {_comm_threads(job_platform(tables).backend)}"
                        " and the data loader workers; run no more ranks on a host than it has "
                        "cores for.",
                    )
                ),
            ),
        )
    ]
