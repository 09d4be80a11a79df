"""An example custom rule for kineto-comm (see docs/rules.md); run it with

    kineto-comm report traces/ --rules docs/custom-rule-example.py

or list it in the config (`[tool.kineto-comm] rules = ["docs/custom-rule-example.py"]`), after
which `kineto-comm rules` lists it and `kineto-comm explain XMPL101` documents it.

It flags process groups that issue more collective calls per rank and step than `limit`,
and charges them the fixed latency those calls pay: its own estimate, with no edit for the
model of time to replay, so the report caps it at the step and says it is "claimed by the
rule" (docs/rules.md). It uses only kineto_comm.rules_api and Polars expressions (no Python
loop over trace rows).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Finding,
    Option,
    Severity,
    Tables,
    make_finding,
    mean_step_ns,
    rule,
    severity_for,
)


@rule(
    code="XMPL101",
    name="too-many-collectives",
    summary="A process group issues more collective calls per step than a limit.",
    tables=("collectives", "steps"),
    options=(
        Option("limit", 200, "Calls per rank and step that are still fine."),
        Option("latency_ns", 15_000, "Fixed cost charged per call above the limit."),
    ),
)
def too_many_collectives(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Counts collective calls per process group, rank and step; a group above `limit` is
    reported with `latency_ns` per call above the limit as its cost.

    Why is this bad?
    Every collective pays a fixed launch and synchronisation latency; thousands per step
    add up to milliseconds whatever their size.

    How to fix:
    Bucket or coalesce the tensors (DDP bucket_cap_mb, ZeRO reduce_bucket_size).
    """
    if not tables.has("collectives"):
        return []
    # A lazy aggregation over every rank's calls: on a big job they stay in their per-rank
    # files and only the counts per (group, rank, step) are held (tables["collectives"]
    # would read every call into one DataFrame).
    per = tables.collect(
        tables.lazy("collectives", ["process_group", "rank", "step"])
        .filter(pl.col("step") >= 0)
        .group_by("process_group", "rank", "step")
        .agg(calls=pl.len())
    )
    per = (
        per.group_by("process_group")
        .agg(calls=pl.col("calls").max(), ranks=pl.col("rank").unique().sort())
        .filter(pl.col("calls") > options["limit"])
    )
    step_ns = mean_step_ns(tables)
    findings = []
    for g in per.iter_rows(named=True):  # one row per process group, not per trace row
        impact = (g["calls"] - options["limit"]) * options["latency_ns"]
        share = impact / step_ns if step_ns else 0.0
        findings.append(
            make_finding(
                too_many_collectives,
                severity_for(share, 0.05, 0.20) or Severity.info,
                f"{g['calls']} collectives per step on group {g['process_group']}",
                f"Group {g['process_group']} issues up to {g['calls']} collective calls per "
                f"rank and step (limit {options['limit']}).",
                impact_ns_per_step=impact,
                step_ns=step_ns,
                ranks=g["ranks"],
                process_group=g["process_group"],
                evidence={"calls_per_step": g["calls"], "limit": options["limit"]},
                advice=("Raise DDP bucket_cap_mb or coalesce the calls.",),
            )
        )
    return findings
