"""The step blame and the findings, reconciled: what each large cost of the step is, which
findings take it out, and why what they save differs, or why none does.

Why: the step blame charges the median step's time to categories (queued, wait, transfer,
pipeline_bubble, ...) and the findings give replayed savings; side by side, "67.7% queued"
and a contention finding that saves 7% read as a contradiction unless the report says how
they relate. Each account is one line: the category's time on the median step's critical
rank, the findings whose edits remove some of those very rows (the edits the replay uses:
no second guess of which rule covers what), how much of the time they take out, what the
replay says that buys, and the reason for the gap; without a finding, why there is none:
the replayed ceiling (every rank's rows of the category removed) when even that buys
little, else what the time is and that no rule models a fix for it.

The accounts cover the largest non-compute category of the median complete step and every
other non-compute category of at least ACCOUNT_SHARE of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import polars as pl

from kineto_comm.analysis import steptime

# Non-compute categories at least this share of the median step get an account (the
# largest one always does).
ACCOUNT_SHARE = 0.10
# A ceiling below this share of the step is too little for a finding (the rules' info
# floor: PIPE101's and the share options' lowest).
SMALL_SHARE = 0.02
ACCOUNTS_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "rank": pl.Int64(),
    "category": pl.String(),
    "ns": pl.Int64(),
    "share": pl.Float64(),
    "codes": pl.List(pl.String()),
    "removed_ns": pl.Int64(),
    "saving_ns": pl.Int64(),
    "ceiling_ns": pl.Int64(),
    "text": pl.String(),
}

# What each category's time is (the blame's own definition, docs/tables.md step_blame).
_WHAT = {
    "memory": "memory copies and sets with no compute running",
    "transfer": "collectives moving data with no compute running",
    "wait": "collectives waiting for a late rank",
    "pipeline_bubble": "pipeline send/recv calls waiting for or receiving from a neighbour stage",
    "launch": "the device idle while the CPU launched the next kernel",
    "queued": "launched kernels waiting on a device that ran nothing of this rank's",
    "other_idle": "the device idle with nothing launched (the CPU busy elsewhere)",
}
# The rules that model a fix for each category (their edits remove its rows).
_COVERED_BY = {
    "queued": ("SYNC105",),
    "transfer": ("COMM101", "COMM102", "COMM201", "NET101"),
    "wait": ("SYNC101", "SYNC104"),
    "pipeline_bubble": ("PIPE101",),
    "launch": ("SYNC102", "SYNC106"),
}
# What remains of a category once the findings' fixes took their part out.
_REST = {
    "transfer": "the rest is data moving with no compute to hide it behind: only cheaper "
    "calls (fewer, larger or faster) remove it",
    "wait": "the rest is waiting no finding traces to a cause",
    "pipeline_bubble": "the rest is stages waiting for neighbours held up by other work",
    "launch": "the rest is before kernels the fixes do not cover",
    "queued": "the rest moves with the kernels launched after it, which the CPU launched no "
    "earlier",
    "other_idle": "the rest is host time the trace does not explain",
    "memory": "the rest is copies no fix covers",
}


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms"


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def _pipeline_reason(pipeline: pl.DataFrame | None, compute_share: float) -> str:
    """The pipeline table's bubble against (p-1)/(m+p-1), and what that says."""
    if pipeline is None or pipeline.height == 0 or "bubble_fraction" not in pipeline.columns:
        return ""
    staged = pipeline.filter(pl.col("stages") > 1)
    if staged.height == 0:
        return ""
    row = staged.select(
        bubble=pl.col("bubble_fraction").mean(),
        theory=pl.col("theory_fraction").drop_nulls().first(),
        p=pl.col("stages").max(),
        m=pl.col("micro_batches").drop_nulls().first(),
    ).row(0, named=True)
    if row["bubble"] is None:
        return ""
    if row["theory"] is None:
        return f"; the stages are idle {row['bubble']:.0%} of their step (micro-batches unknown)"
    text = (
        f"; the stages are idle {row['bubble']:.0%} of their step against the "
        f"{row['theory']:.0%} that (p-1)/(m+p-1) gives for p={row['p']}, m={row['m']}"
    )
    if row["bubble"] - row["theory"] > 0.25:
        text += (
            f", and compute is {_pct(compute_share)} of the step: the stages wait on each "
            "other's transfers and whatever holds those up, not on the schedule, which is all "
            "more micro-batches (PIPE101) shrink"
        )
    return text


def blame_accounts(
    blame: pl.DataFrame,
    times: pl.DataFrame,
    findings: Sequence[Any],
    replay: Callable[..., int],
    pipeline: pl.DataFrame | None = None,
    rules_run: Sequence[str] | None = None,
) -> pl.DataFrame:
    """The accounts of the median complete step (module doc): `blame` the critical ranks'
    rows (steptime.critical_blame), `times` the step_times, `findings` those of the report
    (their `edit`s), `replay(*edits)` the replayed saving of edits together (ns per step),
    `pipeline` the pipeline table, `rules_run` the codes of the rules that ran (None:
    unknown)."""
    shown = steptime.median_and_worst(times)
    if not shown or blame.height == 0:
        return pl.DataFrame(schema=ACCOUNTS_SCHEMA)
    median = shown[0]
    step, rank, step_ns = int(median["step"]), int(median["critical_rank"]), median["step_ns"]
    job_step = steptime.job_step_ns(times)
    rows = blame.filter((pl.col("step") == step) & (pl.col("rank") == rank))
    cats = rows.group_by("category").agg(pl.col("ns").sum()).sort(["ns", "category"])
    cats = cats.reverse()
    compute = int(cats.filter(pl.col("category") == "compute")["ns"].sum())
    others = cats.filter(pl.col("category") != "compute")
    if others.height == 0 or not step_ns:
        return pl.DataFrame(schema=ACCOUNTS_SCHEMA)
    picked = [
        (c, int(n))
        for i, (c, n) in enumerate(others.iter_rows())
        if i == 0 or n >= ACCOUNT_SHARE * step_ns
    ]
    edited = [f for f in findings if getattr(f, "edit", None) is not None]
    out = []
    for category, ns in picked:
        mine = rows.filter(pl.col("category") == category).lazy()
        removed: dict[str, int] = {}
        takers = []
        each = steptime.removed_ns_each(mine, [f.edit for f in edited])
        for f, n in zip(edited, each, strict=True):
            if n > 0:
                takers.append(f)
                removed[f.code] = max(removed.get(f.code, 0), n)
        share = ns / step_ns
        head = f"{category} {_ms(ns)} ({_pct(share)}) of median step {step} on rank {rank}"
        codes = sorted(removed)
        ceiling = 0
        if takers:
            together = steptime.removed_ns(mine, [f.edit for f in takers])
            saving = (
                int(takers[0].impact_ns_per_step)
                if len(takers) == 1
                else replay(*[f.edit for f in takers])
            )
            text = (
                f"{head}: {', '.join(codes)} take{'s' if len(codes) == 1 else ''} "
                f"{_ms(together)} of it out; replayed, that saves {_ms(saving)} per step"
                + (f" ({_pct(saving / job_step)} of the step)" if job_step else "")
            )
            gaps = []
            if together < ns / 2:
                gaps.append(_REST.get(category, "the rest no finding covers"))
            if saving < together / 2:
                gaps.append(
                    "the replay saves less than the fixes take out: other ranks' windows "
                    "and the kernels' launches hold the step"
                )
            elif saving > together:
                gaps.append(
                    "the replay saves more than they take out of it: the fixes remove other "
                    "time too (waits, other ranks' windows)"
                )
            text += ("; " + "; ".join(gaps) if gaps else "") + "."
        else:
            together = saving = 0
            ceiling = replay(
                steptime.Edit(f"every {category} row removed", pl.col("category") == category)
            )
            text = f"{head}, {_WHAT.get(category, category)}: no finding takes it out"
            if job_step and ceiling < SMALL_SHARE * job_step:
                text += (
                    f": removing it on every rank would save at most {_ms(ceiling)} per step "
                    f"({_pct(ceiling / job_step)}), too little to act on"
                )
            else:
                text += f": removing all of it on every rank would save up to {_ms(ceiling)}"
                ran = [c for c in _COVERED_BY.get(category, ()) if rules_run and c in rules_run]
                named = sorted({f.code for f in findings} & set(ran))
                quiet = [c for c in ran if c not in named]
                if named:
                    text += (
                        f"; {', '.join(named)} report{'s' if len(named) == 1 else ''} it, but "
                        "the fix takes none of it out of this step"
                    )
                if quiet:
                    text += (
                        f"; {', '.join(quiet)}, which model{'s' if len(quiet) == 1 else ''} "
                        "its fix, found none worth a finding"
                    )
                if not ran:
                    text += "; no rule that ran models a fix for it"
                if category == "transfer" and compute < 0.1 * step_ns:
                    text += (
                        f" (compute is {_pct(compute / step_ns)} of the step: nothing to hide "
                        "the calls behind)"
                    )
                if category == "pipeline_bubble":
                    text += _pipeline_reason(pipeline, compute / step_ns)
            text += "."
        out.append(
            {
                "step": step,
                "rank": rank,
                "category": category,
                "ns": ns,
                "share": share,
                "codes": codes,
                "removed_ns": together,
                "saving_ns": saving,
                "ceiling_ns": ceiling,
                "text": text,
            }
        )
    return pl.DataFrame(out, schema=ACCOUNTS_SCHEMA)
