"""MODEL101 model-deviation."""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Edit,
    Finding,
    Option,
    Severity,
    Tables,
    make_finding,
    mean_step_ns,
    replay_saving,
    rule,
)


@rule(
    code="MODEL101",
    name="model-deviation",
    summary="Measured communication differs from what the model configuration implies.",
    tables=("model_comparison", "collectives", "kernels", "steps"),
    options=(
        Option("threshold_pct", 10.0, "Flag a role whose bytes or calls per step differ more."),
    ),
)
def model_deviation(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Reads the expected-vs-measured table (analytical formulas per group role: data, tensor,
    pipeline, expert parallel, FSDP/ZeRO) of the configuration `report --model CONFIG` states,
    else of the one inferred from the trace (its `inferred_config` table), and reports
    each role and collective whose bytes or calls per step differ from the configuration by
    more than `threshold_pct`, with the likely causes. The impact is the replayed saving of
    that collective's transfers shortened by the share of its volume the model does not
    account for (none when the trace moves less than expected). On an inferred configuration
    every finding is info and only volume beyond the model is reported: what was inferred
    agrees by construction, what the trace moves less of is what the inference cannot see.

    Why is this bad?
    Volume the configuration does not call for is pure overhead: fp32 gradients where bf16
    was intended double the all-reduce, a duplicate all-gather or activation recompute add
    collectives, a different bucket size changes how many calls run and how well they hide.
    Volume missing from the trace usually means the configuration is not what ran.

    How to fix:
    Follow the causes listed: reduce gradients in the training dtype (DDP comm hook
    bf16_compress_hook, FSDP MixedPrecision(reduce_dtype=bfloat16), Megatron
    --grad-reduce-in-bf16), remove the duplicate gather (FSDP reshard_after_forward for the
    last unit, ZeRO-3 prefetch settings), use selective instead of full recompute, or fix the
    configuration file so it matches the job.
    """
    table = tables["model_comparison"]
    if table.height == 0 or "bytes_dev_pct" not in table.columns:
        return []
    limit = float(options["threshold_pct"])
    flagged = table.filter(
        (pl.col("bytes_dev_pct").abs() > limit)
        | (pl.col("calls_dev_pct").abs() > limit)
        | pl.col("measured_bytes_per_step").fill_null(0).eq(0)
        | pl.col("expected_bytes_per_step").fill_null(0).eq(0)
    )
    inferred = "model_source" in table.columns and (table["model_source"] == "inferred").any()
    if inferred:
        # A configuration read back from this trace: what the trace moves beyond it (duplicate
        # gathers, extra calls, a role it has no place for), never what it moves less of
        # (what the inference cannot see, such as a unit kept gathered after forward).
        flagged = flagged.filter(
            pl.col("measured_bytes_per_step").fill_null(0)
            > pl.col("expected_bytes_per_step").fill_null(0) * (1 + limit / 100)
        )
    if flagged.height == 0:
        return []
    step_ns = mean_step_ns(tables)
    calls = tables.has("collectives")

    findings = []
    for row in flagged.iter_rows(named=True):  # one row per role and collective
        groups = [g.strip() for g in (row["process_groups"] or "").split(",") if g.strip()]
        measured = row["measured_bytes_per_step"] or 0.0
        expected = row["expected_bytes_per_step"] or 0.0
        excess = 0.0 if measured <= 0 else max(0.0, 1.0 - expected / measured)
        impact = 0.0
        edit = None
        if excess > 0 and calls:
            # The bytes the model does not expect, removed: that share of the collective's
            # exposed transfers (the model of time's replay).
            edit = Edit(
                f"{row['collective']} of groups {', '.join(groups) or '?'} moving only the "
                f"model's bytes ({excess:.0%} less transfer time)",
                (pl.col("category") == "transfer")
                & (pl.col("collective") == row["collective"])
                & pl.col("process_group").fill_null("?").is_in(groups or ["?"]),
                excess,
            )
            impact = replay_saving(tables, edit)
        dev = row["bytes_dev_pct"]
        what = (
            "missing from the trace"
            if not measured
            else "not in the model"
            if not expected
            else f"{dev:+.0f}% bytes, {row['calls_dev_pct'] or 0:+.0f}% calls per step"
        )
        causes = [c for c in (row["causes"] or "").split("; ") if c]
        findings.append(
            make_finding(
                model_deviation,
                Severity.info if inferred or abs(dev or 100.0) <= 2 * limit else Severity.warning,
                f"{row['role']} {row['collective']} differs from the model: {what}",
                ("The configuration inferred from this trace" if inferred else "The configuration")
                + (
                    f" implies {expected / 1e6:,.1f} MB in "
                    f"{row['expected_calls_per_step'] or 0:.0f} calls per step; the trace moves "
                    f"{measured / 1e6:,.1f} MB in {row['measured_calls_per_step'] or 0:.0f}."
                    + (f" Likely: {'; '.join(causes)}." if causes else "")
                ),
                impact_ns_per_step=impact,
                step_ns=step_ns,
                process_group=", ".join(groups) or None,
                evidence={
                    **{k: v for k, v in row.items() if k not in ("flagged",)},
                    "saving_method": f"replay: {edit.name}" if edit else "none: no excess bytes",
                },
                advice=tuple(causes),
                edit=edit,
            )
        )
    return findings
