"""PIPE101 pipeline-bubble."""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Edit,
    Finding,
    Option,
    Severity,
    Tables,
    group_roles,
    job_platform,
    make_finding,
    mean_step_ns,
    replay_saving,
    rule,
    severity_for,
    step_blame,
    step_times,
)

from ._common import free_compute, where_from
from ._framework import SCHEDULES, p2p_together, schedule

BUBBLE = ("pipeline_bubble", "other_idle")
# The calls that receive a micro-batch's data: each transfer is counted once, where the
# data arrives (the sender's time in the same transfer is the same time: counted on both
# ends, the replay doubled it against synth jobs whose transfers were made free).
RECEIVES = ("recv", "send_recv")
# The share of the step hiding the transfers must buy back for PIPE101 to advise it.
HIDE_SHARE = 0.01


def _transfer_ns(tables: Tables, ranks: list[int], groups: list[str]) -> pl.DataFrame:
    """rank, step, transfer_ns: per window, the time the pipeline's receiving calls
    (RECEIVES) spent moving data once both ends were there (the report's collective_waits:
    a call's duration less its wait for its peer, so a receive's transfer runs from its
    send's start to its end). A call matched with no peer (a batched kernel of several
    ops) is given the shortest time any call of its group, kind and size took. This, not
    the whole bubble above theory, is what overlapping the transfers with compute can
    hide: a stage that waits for a neighbour held up by something else waits as long."""
    cols = ["rank", "step", "process_group", "collective", "start_ns", "duration_ns", "bytes"]
    if not tables.has("collectives", *cols):
        return pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "transfer_ns": pl.Int64})
    calls = tables.lazy("collectives", cols).filter(
        pl.col("collective").is_in(RECEIVES)
        & pl.col("rank").is_in(ranks)
        & pl.col("process_group").cast(pl.String).is_in(groups)
    )
    if tables.has("collective_waits", "rank", "start_ns", "wait_ns"):
        waits = (
            tables.lazy("collective_waits", ["rank", "start_ns", "wait_ns"])
            .select(pl.col("rank", "start_ns", "wait_ns").cast(pl.Int64))
            .group_by("rank", "start_ns")
            .agg(pl.col("wait_ns").max())
        )
        calls = calls.with_columns(pl.col("rank", "start_ns").cast(pl.Int64)).join(
            waits, on=["rank", "start_ns"], how="left"
        )
    else:
        calls = calls.with_columns(wait_ns=pl.lit(None, dtype=pl.Int64))
    shortest = pl.col("duration_ns").min().over("process_group", "collective", "bytes")
    return tables.collect(
        calls.select(
            pl.col("rank").cast(pl.Int64),
            pl.col("step").cast(pl.Int64),
            transfer=pl.when(pl.col("wait_ns").is_not_null())
            .then((pl.col("duration_ns") - pl.col("wait_ns")).clip(lower_bound=0))
            .otherwise(shortest),
        )
        .group_by("rank", "step")
        .agg(transfer_ns=pl.col("transfer").sum().cast(pl.Int64))
    )


def _bubble_ns(tables: Tables, ranks: list[int]) -> float:
    """Mean ns per (rank, step) of the pipeline ranks' bubble in the model of time
    (step_blame categories pipeline_bubble and other_idle), over the complete steps."""
    complete = step_times(tables).filter(pl.col("complete")).select("step")
    rows = tables.collect(
        step_blame(tables)
        .filter(pl.col("rank").is_in(ranks) & pl.col("category").is_in(BUBBLE))
        .join(complete.lazy(), on="step", how="semi")
        .group_by("rank", "step")
        .agg(pl.col("ns").sum())
        .select(pl.col("ns").mean())
    )
    return float(rows.item() or 0.0)


def _stage_steps(tables: Tables) -> pl.DataFrame:
    """Per pipeline and step: span, mean/max busy, stages, micro_batches, ranks.

    The span of a step is the time from the pipeline's first kernel of the step to its last
    one over all stages (clock-aligned with the offsets table when present): the interval the
    GPipe/1F1B bubble formula (p-1)/(m+p-1) is a fraction of. Stages and micro-batches come from
    the pipeline table when present, else from the pipeline groups' size and send calls.
    """
    roles = group_roles(tables).filter(
        (pl.col("role") == "pipeline") & pl.col("ranks").is_not_null()
    )
    pipe = tables["pipeline"]
    if roles.height == 0 or not tables.has("steps"):
        return pl.DataFrame()
    members = roles.select(
        pipeline="process_group", stages=pl.col("ranks").list.len(), rank=pl.col("ranks")
    ).explode("rank")
    # Only the pipelines' ranks' steps: a big job's steps table has a row per rank and step.
    steps = tables.collect(
        tables.lazy("steps", ["rank", "step", "start_ns", "end_ns", "compute_ns"]).join(
            members.lazy().select(pl.col("rank").cast(pl.Int64)).unique(), on="rank", how="semi"
        )
    )
    if tables.has("pipeline", "rank", "step", "busy_ns", "stages", "micro_batches"):
        per_rank = pipe.select("rank", "step", busy="busy_ns", m="micro_batches", p_stages="stages")
    else:
        sends = tables.collect(
            tables.lazy("collectives", ["rank", "step", "process_group", "collective"])
            .filter(pl.col("collective").is_in(["send", "send_recv"]))
            .with_columns(pl.col("process_group").cast(pl.String))
            .join(
                members.lazy().select("pipeline", "rank"),
                left_on=["process_group", "rank"],
                right_on=["pipeline", "rank"],
                how="semi",
                build_side="force_right",
            )
            .group_by("rank", "step")
            .agg(m=pl.len())
        )
        per_rank = (
            steps.select("rank", "step", busy="compute_ns")
            .join(sends, on=["rank", "step"], how="left")
            .with_columns(p_stages=pl.lit(None, dtype=pl.Int64))
        )
    offsets = tables["offsets"]
    aligned = (
        steps.join(offsets.select("rank", "offset_ns"), on="rank", how="left")
        if tables.has("offsets", "rank", "offset_ns")
        else steps.with_columns(offset_ns=pl.lit(0))
    ).with_columns(pl.col("offset_ns").fill_null(0))
    rows = (
        aligned.filter(pl.col("step") >= 0)
        .select(
            "rank",
            "step",
            start=pl.col("start_ns") - pl.col("offset_ns"),
            end=pl.col("end_ns") - pl.col("offset_ns"),
        )
        .join(members, on="rank", how="inner")
        .join(per_rank, on=["rank", "step"], how="left")
    )
    if rows.height == 0:
        return pl.DataFrame()
    if rows["step"].n_unique() > 1:  # the last step's window is cut at its last kernel
        rows = rows.filter(pl.col("step") < rows["step"].max())
    return rows.group_by("pipeline", "step").agg(
        wall=pl.col("end").max() - pl.col("start").min(),
        busy=pl.col("busy").mean(),
        busy_max=pl.col("busy").max(),
        stages=pl.coalesce(pl.col("p_stages").max(), pl.col("stages").max()),
        m=pl.col("m").min(),
        ranks=pl.col("rank").unique().sort(),
    )


@rule(
    code="PIPE101",
    name="pipeline-bubble",
    summary="Pipeline stages idle in warm-up/cool-down: too few micro-batches or imbalance.",
    tables=("pipeline", "process_groups", "collectives", "steps", "offsets", "framework"),
    options=(
        Option("target_micro_batches", 0, "Micro-batches to aim for; 0: 4 x stages."),
        Option("imbalance_tolerance", 0.10, "Busy-time spread between stages tolerated."),
        Option("warn_share", 0.10, "Warn when the excess bubble costs this share of step."),
        Option("error_share", 0.25, "Error at this share of step time."),
    ),
)
def pipeline_bubble(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    For each pipeline, compares the measured bubble (the pipeline table's bubble fraction,
    the title's percentage) with the theory (p-1)/(m+p-1) for p stages and m
    micro-batches, named after the schedule the trace shows (the framework table: GPipe
    or 1F1B, which share it). The saving is replayed on the model of time (step_blame's
    pipeline_bubble and other_idle time of the pipeline ranks): `target_micro_batches` (default
    4p) shrink the schedule's bubble (p-1) x busy / m to (p-1) x busy / m'. Hiding the
    point-to-point transfers behind compute is replayed too, and advised where it saves 1%
    of the step: it removes the transfers' own time (each counted where its data arrives,
    from its send's start to the receive's end; at most the window's compute that no
    communication overlaps), not the whole bubble above theory (`bubble_above_theory`),
    since a stage that waits for a neighbour held up by other work (a straggler, a
    host-bound stage) waits as long; that advice comes first when it saves more. Both are
    removed from each (rank, step) window's own bubble (a stage's first window, which
    starts when its first micro-batch arrives, holds less of it). Each advice names its
    own replayed saving.

    Why is this bad?
    During a pipeline's warm-up and cool-down, stages wait for activations or gradients.
    With m close to p most of the step is bubble; an overloaded stage adds its excess to
    every micro-batch of every other stage.

    How to fix:
    More micro-batches per step (gradient accumulation; smaller micro-batch, same global
    batch); interleaved (virtual) pipeline stages (Megatron
    --num-layers-per-virtual-pipeline-stage) divide the bubble by the number of virtual
    stages; balance layers between stages (Megatron --decoder-first/last-pipeline-num-layers,
    the embedding and loss on lighter stages); zero-bubble schedules. The advice fits what
    the trace shows: GPipe is told of 1F1B; batch_isend_irecv is not advised where sends
    and receives already go together; Megatron's --overlap-p2p-communication only on the
    interleaved schedule, the only one that honours it (it replaces batched p2p).
    """
    per = _stage_steps(tables)
    if per.height == 0:
        return []
    target = int(options["target_micro_batches"])
    per = (
        per.with_columns(
            p=pl.col("stages").cast(pl.Float64),
            m=pl.col("m").cast(pl.Float64),
        )
        .with_columns(
            mt=pl.max_horizontal(
                pl.col("m"), pl.lit(float(target)) if target else 4.0 * pl.col("p")
            )
        )
        .with_columns(
            theory=(pl.col("p") - 1) / (pl.col("m") + pl.col("p") - 1),
            theory_target=(pl.col("p") - 1) / (pl.col("mt") + pl.col("p") - 1),
            measured=1.0 - pl.col("busy") / pl.col("wall"),
            imbalance=pl.col("busy_max") / pl.col("busy") - 1.0,
        )
        .with_columns(
            impact=(pl.col("wall") - pl.col("busy") / (1.0 - pl.col("theory_target"))).clip(
                lower_bound=0
            )
        )
    )
    step_ns = mean_step_ns(tables)
    # Neighbouring stages' fast links: NVLink where the job has GPUs.
    links = "same host" if job_platform(tables).host else "same host, NVLink"
    out = []
    # All pipeline replicas share one schedule: one finding, the worst replica per step.
    worst = pl.col("impact") == pl.col("impact").max().over("step")
    per = (
        per.with_columns(
            groups=pl.col("pipeline").unique().sort().implode(),
            all_ranks=pl.col("ranks").list.explode().unique().sort().implode(),
        )
        .filter(worst)
        .unique("step", keep="first")
    )
    for pipe in [per]:
        s = pipe.select(
            pl.col(
                "impact", "measured", "theory", "theory_target", "imbalance", "wall", "busy"
            ).mean(),
            pl.col("p", "m", "mt").max(),
            ranks=pl.col("all_ranks").first(),
            steps=pl.col("step").unique().sort().implode(),
            groups=pl.col("groups").first(),
        ).row(0, named=True)
        p, m = int(s["p"]), int(s["m"] or 0)
        theory = s["theory"]
        ranks = [int(r) for r in s["ranks"]]
        # The model of time's bubble on the pipeline ranks, and the parts of it each fix
        # removes: more micro-batches shrink the schedule's (p-1) x busy / m to
        # (p-1) x busy / m'; hiding the transfers removes their own time.
        bubble_ns = _bubble_ns(tables, ranks)
        busy = float(s["busy"] or 0.0)
        more_mb_ns = (
            busy * (p - 1) * (1.0 / m - 1.0 / float(s["mt"])) if theory is not None and m else 0.0
        )
        pipe_table = tables["pipeline"]
        if tables.has("pipeline", "bubble_fraction", "stages", "rank"):
            in_pipe = pipe_table.filter((pl.col("stages") > 1) & pl.col("rank").is_in(ranks))[
                "bubble_fraction"
            ].mean()
            if in_pipe is not None:
                s["measured"] = float(in_pipe)  # the pipeline table's own fraction
        excess = s["measured"] - theory if theory is not None else 0.0
        where = pl.col("rank").is_in(ranks) & pl.col("category").is_in(BUBBLE)
        # Each fix removes time from every window's own bubble: more micro-batches the
        # schedule's difference, spread over the window's bubble rows; hiding the transfers
        # their own time (_transfer_ns) from the point-to-point rows. Per window, not as a
        # share of the mean bubble: a stage's first window, which starts when its first
        # micro-batch arrives, holds less bubble than the others.
        windows = tables.collect(
            step_blame(tables)
            .filter(where)
            .group_by("rank", "step")
            .agg(
                _bubble=pl.col("ns").sum(),
                _p2p=pl.col("ns").filter(pl.col("category") == "pipeline_bubble").sum(),
            )
        )
        free = free_compute(tables)
        free = (
            pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "free_ns": pl.Int64})
            if free is None
            else tables.collect(free.filter(pl.col("rank").is_in(ranks)))
        )
        windows = (
            windows.join(
                _transfer_ns(tables, ranks, list(s["groups"])), on=["rank", "step"], how="left"
            )
            .join(free, on=["rank", "step"], how="left")
            .with_columns(pl.col("transfer_ns").fill_null(0))
            .with_columns(
                # Hidden behind compute: at most the window's compute that no communication
                # overlaps yet (a host-bound stage has little to hide them behind).
                _hideable=pl.min_horizontal(
                    "transfer_ns", pl.col("free_ns").fill_null(pl.col("transfer_ns"))
                )
            )
            .with_columns(
                _mb=pl.when(pl.col("_bubble") > 0)
                .then(more_mb_ns / pl.col("_bubble"))
                .otherwise(0.0),
                _hide=pl.when(pl.col("_p2p") > 0)
                .then(pl.col("_hideable") / pl.col("_p2p"))
                .otherwise(0.0),
            )
        )
        transfers_ns = float(windows["transfer_ns"].sum()) / max(windows.height, 1)
        hideable_ns = float(windows["_hideable"].sum()) / max(windows.height, 1)

        def shares(mb: bool, hidden: bool, windows: pl.DataFrame = windows) -> pl.DataFrame:
            """rank, step, category, fraction: the bubble rows' share each fix removes."""
            mb_share = pl.col("_mb") if mb else pl.lit(0.0)
            hide_share = pl.col("_hide") if hidden else pl.lit(0.0)
            return pl.concat(
                [
                    windows.select(
                        "rank",
                        "step",
                        category=pl.lit("pipeline_bubble"),
                        fraction=mb_share + hide_share,
                    ),
                    windows.select(
                        "rank", "step", category=pl.lit("other_idle"), fraction=mb_share
                    ),
                ]
            )

        step_ns = step_ns or int(s["wall"])
        saved_mb = replay_saving(tables, Edit("more micro-batches", where, shares(True, False)))
        saved_hide = replay_saving(tables, Edit("hidden transfers", where, shares(False, True)))
        # Hiding the transfers is advised where it buys back a share of the step worth
        # saying (HIDE_SHARE), whatever the bubble above theory: that excess may be waits
        # for a late stage, which hiding does not buy back.
        hide = saved_hide >= HIDE_SHARE * step_ns
        fixes = (
            f"{m} -> {int(s['mt'])} micro-batches" if more_mb_ns > 0 else "",
            "transfers between micro-batches hidden" if hide else "",
        )
        edit = Edit(
            "pipeline bubble: " + ", ".join(f for f in fixes if f)
            if any(fixes)
            else "pipeline bubble: no modelled fix",
            where,
            shares(True, hide),
        )
        impact = replay_saving(tables, edit)
        s["impact"] = impact
        wall = step_ns
        share = impact / wall if wall else 0.0
        sev = severity_for(share, options["warn_share"], options["error_share"])
        if sev is None:
            sev = Severity.info if share >= 0.02 else None
        if sev is None:
            continue
        advice = []
        # What the trace shows in use: never advised again, nor what the schedule rejects.
        seen = schedule(tables, s["ranks"])
        named = SCHEDULES.get(seen or "", "GPipe/1F1B")
        together = p2p_together(tables, s["ranks"])
        # Micro-batches unknown (e.g. one stage's file alone): no theory to compare with.
        theory = s["theory"]
        if theory is not None and theory - s["theory_target"] > 0.02:
            advice.append(
                f"Raise micro-batches per step from {m} to at least {int(s['mt'])} (same "
                f"global batch, smaller micro-batch): theory bubble {s['theory']:.0%} -> "
                f"{s['theory_target']:.0%}, about {saved_mb / 1e6:.2f} ms per step."
            )
            if seen != "interleaved":
                advice.append(
                    "Use interleaved (virtual) pipeline stages: Megatron "
                    "--num-layers-per-virtual-pipeline-stage divides the bubble by the "
                    "virtual stages per GPU."
                )
        if s["imbalance"] > options["imbalance_tolerance"]:
            advice.append(
                f"Balance the stages: the busiest is {s['imbalance']:.0%} above the mean "
                "(move layers; Megatron --decoder-first-pipeline-num-layers / "
                "--decoder-last-pipeline-num-layers; the embedding and loss are heavy); "
                "not in the saving above: no replay models moving layers between stages."
            )
        if hide:
            # Hiding the transfers buys back their own time only: the rest of a bubble
            # above theory is waiting for neighbours held up by other work.
            above_ns = max(excess, 0.0) * float(s["wall"])
            p2p = (
                f"The bubble is {excess:.0%} of the step above {named} theory; more "
                "micro-batches shrink only the schedule's part of it. "
                if excess > 0.05
                else ""
            ) + (
                "The point-to-point transfers take "
                f"{transfers_ns / 1e6:.2f} ms per stage and step where their data arrives: "
                + _overlap_advice(seen, together)
                + f"; keep neighbouring stages on fast links ({links}): about "
                f"{saved_hide / 1e6:.2f} ms per step"
                + (
                    f", as the stages hold only {hideable_ns / 1e6:.2f} ms per step of compute "
                    "no communication overlaps to hide them behind."
                    if hideable_ns < transfers_ns / 2
                    else "."
                )
            )
            if excess > 0.05 and transfers_ns < above_ns / 2:
                p2p += (
                    " The rest of the excess is stages waiting for neighbours held up by "
                    "other work (a late or host-bound stage: the step-time table's critical "
                    "path and the other findings name it), which overlapping does not hide."
                )
            advice.insert(0 if saved_hide > saved_mb else len(advice), p2p)
        advice.append(_next_schedule(seen))
        # Where in the code the bubble's calls are (the attribution table).
        where_text, places = where_from(tables, role="pipeline", kind="bubble")
        out.append(
            make_finding(
                pipeline_bubble,
                sev,
                f"Pipeline bubble {s['measured']:.0%} of the step ({p} stages, "
                + (f"{m} micro-batches)" if theory is not None else "micro-batches unknown)"),
                f"Stages are idle {s['measured']:.0%} of each pipeline step"
                + (
                    f" ({named} theory for p={p}, m={m}: {theory:.0%})"
                    if theory is not None
                    else ""
                )
                + (f", {excess:.0%} of the step above theory" if excess > 0.05 else "")
                + f"; with {int(s['mt'])} micro-batches"
                + (" and the transfers hidden," if hide else ",")
                + f" about {impact / 1e6:.2f} ms per step "
                f"({share:.0%} of {wall / 1e6:.2f} ms) would be regained."
                + (" " + where_text if where_text else ""),
                impact_ns_per_step=impact,
                step_ns=int(wall),
                ranks=s["ranks"],
                steps=s["steps"],
                process_group=s["groups"][0] if len(s["groups"]) == 1 else None,
                evidence={
                    "stages": p,
                    "micro_batches": m if theory is not None else None,
                    "measured_bubble_fraction": round(s["measured"], 4),
                    "theory_bubble_fraction": round(theory, 4) if theory is not None else None,
                    "target_micro_batches": int(s["mt"]),
                    "target_bubble_fraction": round(s["theory_target"], 4),
                    "stage_imbalance": round(s["imbalance"], 4),
                    "bubble_above_theory": round(excess, 4) if theory is not None else None,
                    "pipeline_span_ns": int(s["wall"]),
                    "step_ns": int(wall),
                    "bubble_ns_per_step": int(bubble_ns),
                    "micro_batches_saving_ns": saved_mb,
                    "transfer_ns_per_stage_step": int(transfers_ns),
                    "hidden_transfers_saving_ns": saved_hide,
                    "pipeline_groups": s["groups"],
                    "schedule": seen,
                    "where": places,
                    "p2p_issued_together": together,
                    "saving_method": f"replay: {edit.name}",
                },
                advice=advice,
                edit=edit,
            )
        )
    return out


def _overlap_advice(seen: str | None, together: bool) -> str:
    """How to hide the transfers, fitting what the trace shows: batch_isend_irecv is never
    advised where sends and receives already go together, and Megatron's
    --overlap-p2p-communication only on the interleaved schedule (the only one that
    honours it; it replaces batched p2p)."""
    used = (
        "sends and receives already go out together (batch_isend_irecv or isend/irecv in "
        "the trace) and still wait, so "
        if together
        else ""
    )
    if seen == "interleaved":
        return used + (
            "overlap them with the other virtual stage's compute (Megatron-LM "
            "--overlap-p2p-communication, which replaces batched p2p)"
        )
    if seen in ("gpipe", "1f1b"):
        return used + (
            "hiding them needs compute of another micro-batch or virtual stage to run "
            "meanwhile: the interleaved schedule (Megatron "
            "--num-layers-per-virtual-pipeline-stage) overlaps them with the other virtual "
            "stage's compute"
        )
    batch = "" if together else ", torch.distributed.batch_isend_irecv"
    return used + f"overlap them with compute (post the receives early{batch})"


def _next_schedule(seen: str | None) -> str:
    """The schedule to consider next, from the one the trace shows."""
    if seen == "gpipe":
        return (
            "The trace runs GPipe (every forward before any backward): 1F1B has the same "
            "bubble but holds at most p micro-batches' activations instead of m, which "
            "leaves the memory for more micro-batches; then interleaved or zero-bubble "
            "schedules."
        )
    if seen == "interleaved":
        return "Consider a zero-bubble schedule (zero bubble pipeline parallelism, ZB-H1)."
    return "Consider an interleaved 1F1B or zero-bubble schedule."
