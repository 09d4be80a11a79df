"""Expected vs measured communication per group role, with likely causes of deviations.

`compare(expected_table, report, roles=None)` sets `expected(config)` beside
`measured(report, roles)`: the report's `collectives` inside profiler steps, each rank's
calls and bytes (the full buffer, as record_param_comms reports it) per step, averaged over
the analysed ranks, so both sides are per rank and step. A `send_recv` of known size counts
as the send of its `in_bytes` and the recv of its `out_bytes`, as the model counts them.
A group's role comes from ``roles``, else from ``report.process_groups``, else ``unknown``
(``fsdp`` is compared as ``data_parallel``).

Rows are matched on (role, collective), a row of one side only kept. Deviations are
(measured - expected) / expected in percent; a row is flagged when bytes, calls or message
size deviate by more than ``threshold_pct`` (10) or it exists on one side only, and
``causes`` lists the likely reasons (rules in `_causes`).
In full: docs/analytic-model.md, "Expected vs measured".
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from kineto_comm.analysis.inferred_config import tag_roles
from kineto_comm.findings import Finding, Severity
from kineto_comm.lazy import collect
from kineto_comm.model.steps import steps_per_rank

ROLES = ("data_parallel", "tensor_parallel", "pipeline", "expert", "fsdp", "unknown")
ROLE_ALIASES = {"dp": "data_parallel", "tp": "tensor_parallel", "pp": "pipeline", "ep": "expert"}
MEASURED_SCHEMA = {
    "role": pl.String,
    "collective": pl.String,
    "calls_per_step": pl.Float64,
    "bytes_per_step": pl.Float64,
    "message_bytes": pl.Float64,
    "dtype": pl.String,
    "process_groups": pl.String,
}


def _canon_role(role: str) -> str:
    """A role in the process_groups vocabulary, with fsdp folded into data_parallel."""
    r = ROLE_ALIASES.get(role, role)
    if r not in ROLES:
        raise ValueError(f"roles: unknown role {role!r}; use one of {', '.join(ROLES)}")
    return "data_parallel" if r == "fsdp" else r


def _role_table(report, roles: Mapping[str, str] | None) -> pl.DataFrame:
    """process_group -> role from the explicit mapping, else report.process_groups."""
    if roles is not None:
        pairs = {str(k): _canon_role(v) for k, v in roles.items()}
        return pl.DataFrame(
            {"process_group": list(pairs), "role": list(pairs.values())},
            schema={"process_group": pl.String, "role": pl.String},
        )
    pg = report.process_groups
    if pg.height and {"process_group", "role"} <= set(pg.columns):
        return pg.select(
            pl.col("process_group").cast(pl.String),
            pl.col("role")
            .cast(pl.String)
            .replace(ROLE_ALIASES)
            .replace({"fsdp": "data_parallel"})
            .fill_null("unknown"),
        ).unique("process_group", keep="first")
    return pl.DataFrame(schema={"process_group": pl.String, "role": pl.String})


SIDES = ("in_bytes", "out_bytes")


def _sends_and_recvs(calls: pl.LazyFrame) -> pl.LazyFrame:
    """`calls` with each send_recv of known size split into its send and its recv (a part
    that moved nothing left out); the in/out columns dropped."""
    keep = ["rank", "step", "collective", "process_group", "dtype", "bytes"]
    both = (pl.col("collective") == "send_recv") & (
        pl.col("in_bytes").is_not_null() | pl.col("out_bytes").is_not_null()
    )
    parts = [
        calls.filter(both & (pl.col(side) > 0)).with_columns(
            collective=pl.lit(name), bytes=pl.col(side)
        )
        for name, side in (("send", "in_bytes"), ("recv", "out_bytes"))
    ]
    return pl.concat([calls.filter(~both), *parts]).select(keep)


def measured(report, roles: Mapping[str, str] | None = None) -> pl.DataFrame:
    """Measured calls, bytes and mean message size per rank and step, per (role, collective).

    See the module doc for the averaging; ``dtype`` is the most frequent dtype and
    ``process_groups`` the comma-separated groups that contributed.
    """
    store = report.rank_collectives
    if store.height == 0:
        return pl.DataFrame(schema=MEASURED_SCHEMA)
    # Aggregations over the calls (a row per call and rank, kept in files on a big job).
    rows = store.height
    sides = set(SIDES) <= set(store.columns)  # tables built without them: as they are
    coll = store.lazy(
        ["rank", "step", "collective", "process_group", "dtype", "bytes", *(SIDES if sides else ())]
    )
    if sides:
        coll = _sends_and_recvs(coll)
    in_steps = collect(coll.select((pl.col("step") >= 0).any()), rows).item()
    if in_steps:
        coll = coll.filter(pl.col("step") >= 0)
        steps = steps_per_rank(report.rank_steps)
    else:  # no step markers: the whole trace is one step
        steps = collect(coll.select(pl.col("rank").unique()), rows).with_columns(
            n_steps=pl.lit(1, pl.UInt32)
        )
    pg = report.process_groups
    if roles is None and pg.height and "pooled_collective" in pg.columns:
        # The process_groups table's roles, a pooled group's calls ("?": gloo names no
        # group per call) by their kind and size where roles.py split the pool.
        tagged = tag_roles(coll, pg).with_columns(
            pl.col("process_group").cast(pl.String),
            pl.col("role").replace(ROLE_ALIASES).replace({"fsdp": "data_parallel"}),
        )
    else:
        role_of = _role_table(report, roles)
        tagged = (
            coll.with_columns(pl.col("process_group").cast(pl.String))
            .join(role_of.lazy(), on="process_group", how="left", build_side="force_right")
            .with_columns(pl.col("role").fill_null("unknown"))
        )
    # One small table per (rank, role, collective, process group, dtype): the rest from it.
    counts = collect(
        tagged.group_by("rank", "role", "collective", "process_group", "dtype").agg(
            calls=pl.len(), nbytes=pl.col("bytes").sum()
        ),
        rows,
    )
    n_ranks = report.ranks.height or counts["rank"].n_unique()
    per_rank = (
        counts.group_by("rank", "role", "collective")
        .agg(pl.col("calls").sum(), pl.col("nbytes").sum())
        .join(steps, on="rank", how="left")
        .with_columns(n_steps=pl.col("n_steps").fill_null(1).cast(pl.Float64))
    )
    out = per_rank.group_by("role", "collective").agg(
        calls_per_step=(pl.col("calls") / pl.col("n_steps")).sum() / n_ranks,
        bytes_per_step=(pl.col("nbytes") / pl.col("n_steps")).sum() / n_ranks,
    )
    # The most frequent dtype (ties: the first by name) and the contributing groups.
    dtypes = (
        counts.filter(pl.col("dtype").is_not_null())
        .group_by("role", "collective", "dtype")
        .agg(n=pl.col("calls").sum())
        .sort("n", "dtype", descending=[True, False])
        .group_by("role", "collective", maintain_order=True)
        .agg(dtype=pl.col("dtype").first())
    )
    groups = counts.group_by("role", "collective").agg(
        process_groups=pl.col("process_group").drop_nulls().unique().sort().str.join(",")
    )
    extra = groups.join(dtypes, on=["role", "collective"], how="left")
    return (
        out.join(extra, on=["role", "collective"], how="left")
        .with_columns(message_bytes=pl.col("bytes_per_step") / pl.col("calls_per_step"))
        .select(list(MEASURED_SCHEMA))
        .cast(MEASURED_SCHEMA)
        .sort("role", "collective")
    )


def _near(x: pl.Expr, target: float, tol: float = 0.1) -> pl.Expr:
    """x within ``tol`` (relative) of ``target``."""
    return (x - target).abs() <= tol * target


def _causes(threshold: float) -> pl.Expr:
    """Likely causes of a deviation, as '; '-joined text (null when nothing is flagged).

    Rules, over rb = measured/expected bytes, rc = calls ratio, rm = message-size ratio:
    one side missing; rb ~ 2 with float32 -> fp32 gradients; rc ~ k >= 2 with rm ~ 1 ->
    the same collective repeated k times (duplicate all-gather, gradient sync on every
    micro-batch); all_gather with rb ~ 1.5 or 2 -> duplicate all-gather; tensor-parallel or
    expert rb ~ 1.5 -> recompute collectives (or SP's backward re-gather); bytes match but
    calls differ -> bucket size / wrapping differs; rb ~ 0.5 -> 16-bit or compressed
    communication, or a model half the size; otherwise a generic size mismatch.
    """
    rb = pl.col("measured_bytes_per_step") / pl.col("expected_bytes_per_step")
    rc = pl.col("measured_calls_per_step") / pl.col("expected_calls_per_step")
    rm = pl.col("measured_message_bytes") / pl.col("expected_message_bytes")
    coll = pl.col("collective")
    role = pl.col("role")
    tol = threshold / 100.0
    bytes_ok = (rb - 1).abs() <= tol
    calls_ok = (rc - 1).abs() <= tol
    k = rc.round(0)
    missing = pl.col("measured_bytes_per_step").fill_null(0) == 0
    unexpected = pl.col("expected_bytes_per_step").fill_null(0) == 0
    both = ~missing & ~unexpected
    rules = [
        pl.when(unexpected & ~missing).then(
            pl.format(
                "not in the model: {} on {} groups (an extra synchronisation, a layer the "
                "model leaves out, or a wrong role mapping)",
                coll,
                role,
            )
        ),
        pl.when(missing & ~unexpected).then(
            pl.format(
                "missing from the trace: no {} on {} groups (role not identified: pass roles; "
                "or a different parallel setup than the config)",
                coll,
                role,
            )
        ),
        pl.when(both & _near(rb, 2.0) & (pl.col("measured_dtype") == "float32")).then(
            pl.lit(
                "2x the bytes in float32: fp32 gradients/communication (e.g. gradients "
                "reduced in fp32) where the config says 16-bit"
            )
        ),
        pl.when(both & (k >= 2) & _near(rc, k, 0.05) & _near(rm, 1.0)).then(
            pl.format(
                "{}x the calls at the same message size: the collective is repeated (duplicate "
                "all-gather, or gradients synchronised on every micro-batch without no_sync)",
                k.cast(pl.Int64),
            )
        ),
        pl.when(both & (coll == "all_gather") & (_near(rb, 1.5) | _near(rb, 2.0))).then(
            pl.lit(
                "duplicate all-gather: parameters gathered again (resharded after forward, "
                "wrapped twice, or no prefetch reuse)"
            )
        ),
        pl.when(both & role.is_in(["tensor_parallel", "expert"]) & _near(rb, 1.5)).then(
            pl.lit(
                "1.5x: recompute collectives (full activation recompute repeats the forward "
                "collectives: 6 instead of 4 per layer; with sequence parallelism also the "
                "backward re-gather of layer inputs)"
            )
        ),
        pl.when(both & bytes_ok & ~calls_ok).then(
            pl.lit(
                "bucket size differs: calls differ but bytes match (DDP bucket_cap_mb, ZeRO "
                "bucket size or FSDP wrapping differs from the config's bucket_mb/units)"
            )
        ),
        pl.when(both & _near(rb, 0.5)).then(
            pl.lit(
                "half the bytes: 16-bit or compressed communication where the config says "
                "fp32, or half the parameters (check params, tp, pp)"
            )
        ),
        pl.when(
            both
            & ~bytes_ok
            & ~_near(rb, 2.0)
            & ~_near(rb, 1.5)
            & ~_near(rb, 0.5)
            & ~((k >= 2) & _near(rc, k, 0.05))
        ).then(
            pl.format(
                "volume off by {}%: check the model size (params, layers, hidden, vocab), the "
                "degrees, micro-batches and dtype in the config",
                pl.col("bytes_dev_pct").round(1),
            )
        ),
    ]
    return pl.concat_str(rules, separator="; ", ignore_nulls=True)


def compare(
    expected_table: pl.DataFrame,
    report,
    roles: Mapping[str, str] | None = None,
    threshold_pct: float = 10.0,
) -> pl.DataFrame:
    """Expected vs measured per (role, collective): calls, bytes and message size per step.

    Columns: role, collective, expected_/measured_calls_per_step, calls_dev_pct,
    expected_/measured_bytes_per_step, bytes_dev_pct, expected_/measured_message_bytes,
    message_dev_pct, measured_dtype, process_groups, flagged, causes. Full contract in the
    module doc.
    """
    exp = (
        expected_table.group_by("role", "collective")
        .agg(
            expected_calls_per_step=pl.col("calls_per_step").sum(),
            expected_bytes_per_step=pl.col("bytes_per_step").sum().cast(pl.Float64),
        )
        .with_columns(
            expected_message_bytes=pl.col("expected_bytes_per_step")
            / pl.col("expected_calls_per_step")
        )
    )
    mea = measured(report, roles).rename(
        {
            "calls_per_step": "measured_calls_per_step",
            "bytes_per_step": "measured_bytes_per_step",
            "message_bytes": "measured_message_bytes",
            "dtype": "measured_dtype",
        }
    )
    joined = exp.join(mea, on=["role", "collective"], how="full", coalesce=True)

    def dev(name: str) -> pl.Expr:
        e, m = pl.col(f"expected_{name}"), pl.col(f"measured_{name}")
        return pl.when(e > 0).then(100.0 * (m.fill_null(0) - e) / e).otherwise(None)

    out = joined.with_columns(
        calls_dev_pct=dev("calls_per_step"),
        bytes_dev_pct=dev("bytes_per_step"),
        message_dev_pct=dev("message_bytes"),
    )
    over = [
        pl.col(c).abs().fill_null(0) > threshold_pct
        for c in ("calls_dev_pct", "bytes_dev_pct", "message_dev_pct")
    ]
    one_side = (pl.col("expected_bytes_per_step").fill_null(0) == 0) | (
        pl.col("measured_bytes_per_step").fill_null(0) == 0
    )
    out = out.with_columns(flagged=pl.any_horizontal(*over) | one_side)
    out = out.with_columns(
        causes=pl.when(pl.col("flagged")).then(_causes(threshold_pct)).otherwise(None)
    )
    return out.select(
        "role",
        "collective",
        "expected_calls_per_step",
        "measured_calls_per_step",
        "calls_dev_pct",
        "expected_bytes_per_step",
        "measured_bytes_per_step",
        "bytes_dev_pct",
        "expected_message_bytes",
        "measured_message_bytes",
        "message_dev_pct",
        "measured_dtype",
        "process_groups",
        "flagged",
        "causes",
    ).sort("role", "collective")


def comparison_findings(table: pl.DataFrame) -> list[Finding]:
    """One warning Finding per flagged row of `compare` (code ``model_deviation``).

    Impact is not estimated (0): the comparison tells what differs from the configuration,
    not what it costs; evidence carries the row's numbers. Iterates over the comparison's
    few rows (one per role and collective), never over trace rows.
    """
    out = []
    for row in table.filter(pl.col("flagged")).iter_rows(named=True):
        dev = row["bytes_dev_pct"]
        what = (
            "not in the trace"
            if not row["measured_bytes_per_step"]
            else (
                "not in the model" if not row["expected_bytes_per_step"] else f"{dev:+.1f}% bytes"
            )
        )
        out.append(
            Finding(
                code="model_deviation",
                severity=Severity.warning,
                title=f"{row['role']} {row['collective']}: {what} vs the analytical model",
                message=row["causes"] or "",
                evidence={k: v for k, v in row.items() if k not in ("flagged", "causes")},
                advice=tuple((row["causes"] or "").split("; ")),
                rule="analytic_model",
                process_group=row["process_groups"],
            )
        )
    return out


__all__ = ["MEASURED_SCHEMA", "ROLES", "compare", "comparison_findings", "measured"]
