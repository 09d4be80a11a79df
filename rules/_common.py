"""Shared pieces of the built-in rules (built on the public rules API only)."""

from __future__ import annotations

import polars as pl

from kineto_comm.rules_api import (
    Edit,
    Option,
    Severity,
    Tables,
    attribution,
    call_roles,
    collective_exposure_lazy,
    cost_fit,
    impact_per_step,
    median_of_counts,
    merge_removal,
    saving_severity,
)

# A (process group, collective) whose calls are this small and this many per rank and step
# is a latency-bound storm: COMM201 reports it, the exposure rules leave it out.
STORM_MAX_BYTES = 256 * 1024
STORM_MIN_CALLS = 50
# Where no call has a size: a call this short (median) is its fixed cost (NCCL's latency is
# 10-50 us), so that many of them per rank and step are a storm too.
STORM_MAX_NS = 50_000
# The collectives of an fsdp group that COMM102 reports: its parameter gathers and gradient
# reductions (a reduce-scatter, or the all_reduce gloo runs in its place, as the group's
# role evidence says: kineto_comm.analysis.roles).
SHARDED = ("all_gather", "reduce_scatter", "all_reduce")
P2P = ("send", "recv", "send_recv")
# The severity ladder of the rules whose finding is a share of the step time.
SHARE_OPTIONS = (
    Option("warn_share", 0.10, "Warn when the cause costs this share of the step time."),
    Option("error_share", 0.25, "Error at this share of the step time."),
    Option("info_share", 0.02, "Report as info from this share (below: no finding)."),
)


def free_compute(tables: Tables) -> pl.LazyFrame | None:
    """rank, step, free_ns: per window, the compute no communication overlaps yet (the
    steps table's compute_ns less overlap_ns): what communication can still be hidden
    behind. None where the steps table lacks those columns."""
    if not tables.has("steps", "rank", "step", "compute_ns", "overlap_ns"):
        return None
    return tables.lazy("steps", ["rank", "step", "compute_ns", "overlap_ns"]).select(
        pl.col("rank").cast(pl.Int64),
        pl.col("step").cast(pl.Int64),
        free_ns=(pl.col("compute_ns").fill_null(0) - pl.col("overlap_ns").fill_null(0))
        .clip(lower_bound=0)
        .cast(pl.Int64),
    )


def share_severity(share: float, options: dict) -> Severity | None:
    """A finding's severity on SHARE_OPTIONS' ladder; None below `info_share`."""
    return saving_severity(share, options)


# The bucket a merge aims for: DDP's default bucket_cap_mb (25 MiB), which ZeRO's and
# Megatron's buckets are of the order of; FSDP units of that size hold a few blocks.
MERGE_TARGET_BYTES = 25 * 1024 * 1024
# A cause's calls are latency-bound when the fit's latency is at least this share of its
# median call: merging its calls is then what makes it cheaper.
LATENCY_BOUND_SHARE = 0.5


def merge_fix(
    tables: Tables, collective: str, groups: list[str], target_bytes: int = MERGE_TARGET_BYTES
) -> tuple[Edit, dict] | None:
    """The fix "merge the cause's calls into fewer, bigger ones", as an edit: per rank and
    step, its calls on `groups` below `target_bytes` merged into calls of about that size
    (rules_api.merge_removal on the cost fit's latency), which takes out of its transfer
    rows the latencies saved and out of its launch gaps the share of the calls merged away
    (one launch a call: the CPU issues m calls instead of n). With the facts for the
    finding's text (calls and merged calls per rank and step, the fit's latency, bandwidth,
    latency share and method), or None where the calls are not latency-bound
    (LATENCY_BOUND_SHARE) or nothing merges."""
    fit = cost_fit(tables).filter(
        (pl.col("collective") == collective) & pl.col("process_group").is_in(groups)
    )
    # Latency-bound: the fit's latency is most of the median call; or, sizes unknown, the
    # median call is no longer than a call's fixed cost.
    bound = fit.filter(
        (pl.col("latency_share") >= LATENCY_BOUND_SHARE)
        | ((pl.col("method") == "times") & (pl.col("median_ns") <= STORM_MAX_NS))
    )
    if bound.height == 0:
        return None
    keys = ["rank", "step", "process_group", "collective"]
    rows = merge_removal(tables, target_bytes).join(
        bound.select("process_group", "collective"), on=["process_group", "collective"]
    )
    rows = rows.filter((pl.col("m") < pl.col("n")) & (pl.col("step") >= 0))
    if rows.height == 0:
        return None
    transfer = rows.select(
        *keys,
        category=pl.lit("transfer"),
        fraction=pl.when(pl.col("transfer_ns") > 0)
        .then(pl.col("removed_ns") / pl.col("transfer_ns"))
        .otherwise(0.0),
    )
    launch = rows.select(*keys, category=pl.lit("launch"), fraction=1.0 - pl.col("m") / pl.col("n"))
    n, m = float(rows["n"].mean() or 0), float(rows["m"].mean() or 0)
    edit = Edit(
        f"merge the {collective} calls into fewer, bigger ones (about {n:.0f} into "
        f"{m:.0f} per rank and step): each merged call pays the fitted latency once, and the "
        "CPU launches m calls instead of n",
        pl.col("category").is_in(["transfer", "launch"]),
        pl.concat([transfer, launch]),
        shortens=True,
    )
    facts = {
        "calls_per_step": round(n, 1),
        "merged_calls_per_step": round(m, 1),
        "latency_ns": int(bound["latency_ns"].max() or 0),
        "busbw_gbps": None if bound["busbw_gbps"].is_null().all() else bound["busbw_gbps"].max(),
        "latency_share": round(float(bound["latency_share"].max() or 0), 4),
        "fit_method": str(bound["method"][0]),
        "median_bytes": None
        if bound["median_bytes"].is_null().all()
        else int(bound["median_bytes"].median() or 0),
        "target_bytes": int(target_bytes),
    }
    return edit, facts


def fit_words(facts: dict) -> str:
    """The cost fit behind a merge in words: latency, bandwidth, how it was found."""
    lat = facts["latency_ns"] / 1e3
    size = facts["median_bytes"]
    if facts["fit_method"] == "times":
        return (
            f"its message sizes are unknown; its smallest calls take {lat:.0f} us, the "
            "fixed cost of a call"
        )
    how = (
        "fitted over its message sizes"
        if facts["fit_method"] == "fit"
        else "its messages are of about one size, so the bandwidth is taken as at least "
        f"{facts['busbw_gbps']:.2g} GB/s and the rest of each call as latency: a lower bound"
    )
    return (
        f"{lat / 1e3:.2f} ms of fixed latency + bytes at {facts['busbw_gbps']:.3g} GB/s bus "
        f"bandwidth ({how}): at its {size / 1024:.0f} KiB messages "
        f"{facts['latency_share']:.0%} of a call is latency"
    )


def with_roles(tables: Tables, frame: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame | pl.LazyFrame:
    """`frame` (with process_group) plus the group's role (unknown when not known)."""
    frame = frame.with_columns(pl.col("process_group").cast(pl.String))
    return call_roles(tables, frame).with_columns(pl.col("role").fill_null("unknown"))


def storm_keys(tables: Tables, max_bytes: int, min_calls: int) -> pl.DataFrame:
    """(process_group, collective) pairs that are message storms.

    From the storms table when the analysis produced it, else: median message <= max_bytes
    and at least min_calls calls per rank and step. Once per rules run (four rules ask).
    """
    return tables.once(
        ("builtin", "storm_keys_all", max_bytes, min_calls),
        lambda: _storm_keys(tables, max_bytes, min_calls),
    )


def _storm_keys(tables: Tables, max_bytes: int, min_calls: int) -> pl.DataFrame:
    """`storm_keys`, computed."""
    storms = tables["storms"]
    if tables.has("storms", "process_group", "collective"):
        found = storms.select(pl.col("process_group").cast(pl.String), "collective").unique()
    else:
        # Read over every call: once per rules run (four rules ask).
        found = tables.once(
            ("builtin", "storm_keys", max_bytes, min_calls),
            lambda: _storms_from_calls(tables, max_bytes, min_calls),
        )
    timed = tables.once(
        ("builtin", "time_storms", min_calls), lambda: _time_storms(tables, min_calls)
    )
    return pl.concat([found, timed]).unique(maintain_order=True)


def _time_storms(tables: Tables, min_calls: int) -> pl.DataFrame:
    """(process_group, collective) pairs of calls with no size that are storms by their
    times: at least min_calls calls per rank and step (the median rank-step) whose median
    duration is at most STORM_MAX_NS."""
    empty = pl.DataFrame(schema={"process_group": pl.String, "collective": pl.String})
    cols = ("process_group", "collective", "rank", "step", "bytes", "duration_ns")
    if not tables.has("collectives", *cols):
        return empty
    keys = ["process_group", "collective"]
    per = (
        tables.lazy("collectives", list(cols))
        .filter(pl.col("step") >= 0)
        .with_columns(pl.col("process_group").cast(pl.String).fill_null("?"))
        .group_by(*keys, "rank", "step")
        .agg(
            n=pl.len(),
            sized=pl.col("bytes").is_not_null().any(),
            median=pl.col("duration_ns").median(),
        )
    )
    found = per.group_by(keys).agg(
        n=pl.col("n").median(), sized=pl.col("sized").any(), median=pl.col("median").median()
    )
    return tables.collect(
        found.filter(
            ~pl.col("sized") & (pl.col("n") >= min_calls) & (pl.col("median") <= STORM_MAX_NS)
        ).select(keys)
    )


def _storms_from_calls(tables: Tables, max_bytes: int, min_calls: int) -> pl.DataFrame:
    """storm_keys without the analysis' storms table."""
    empty = pl.DataFrame(schema={"process_group": pl.String, "collective": pl.String})
    if not tables.has("collectives"):
        return empty
    coll = tables.lazy("collectives", ["process_group", "collective", "rank", "step", "bytes"])
    in_steps = coll.filter(pl.col("step") >= 0).select(pl.col("step").n_unique())
    steps = max(1, tables.collect(in_steps).item())
    keys = ["process_group", "collective", "rank"]
    counts = tables.collect(coll.group_by(*keys, "bytes").agg(_n=pl.len()))
    per = (
        counts.group_by(keys)
        .agg(calls=pl.col("_n").sum())
        .join(median_of_counts(counts, keys, "bytes", "_n"), on=keys, nulls_equal=True)
    )
    return (
        per.group_by("process_group", "collective")
        .agg(calls=pl.col("calls").max(), median=pl.col("median").max())
        .filter((pl.col("calls") / steps >= min_calls) & (pl.col("median") <= max_bytes))
        .select(pl.col("process_group").cast(pl.String), "collective")
    )


def exposure_by_cause(tables: Tables, exclude_last: bool = True) -> pl.DataFrame:
    """Exposed data-moving time per (role, collective): impact_ns, ranks, steps, groups.

    Waiting for late ranks is left out (that is the straggler rules' time), and so is the
    last collective of each rank's step when `exclude_last`: nothing is left to hide it
    behind, unless it is its cause's only call of the step (`single_call_steps`). Storm
    collectives and point-to-point calls are left to their own rules. Computed once per
    rules run (COMM101 and COMM102 both read it).
    """
    return tables.once(
        ("builtin", "exposure_by_cause", exclude_last), lambda: _by_cause(tables, exclude_last)
    )


def single_call_steps(tables: Tables) -> pl.DataFrame:
    """role, collective, rank, step: the ranks' steps in which a cause (role, collective) made
    one call. When that call is the step's last, it is still hideable: one call after the
    backward (a gradient all-reduce after a pipeline flush, DDP with one bucket) split into
    buckets launched during the backward hides all but its last bucket (Megatron-LM
    --overlap-grad-reduce; DDP's bucket_cap_mb), where a cause's last call after earlier ones
    is bound to the end of the work before it."""
    return tables.once(("builtin", "single_call_steps"), lambda: _single(tables))


def _single(tables: Tables) -> pl.DataFrame:
    """single_call_steps, computed."""
    keys = ["role", "collective", "rank", "step"]
    if not tables.has("collectives"):
        return pl.DataFrame(schema=dict.fromkeys(keys, pl.String)).cast(
            {"rank": pl.Int64, "step": pl.Int64}
        )
    calls = _transfers(tables, tables).group_by(keys).agg(_n=pl.len())
    return tables.collect(calls.filter(pl.col("_n") == 1).select(keys))


_USED = (
    "rank",
    "step",
    "process_group",
    "collective",
    "end_ns",
    "bytes",
    "exposed_ns",
    "last_call",
)


def _transfers(tables: Tables, view: Tables) -> pl.LazyFrame:
    """Per call of `view` (a few ranks of `tables`, or all): its exposed transfer time and
    its group's role; storms and point-to-point calls left out."""
    storms = storm_keys(tables, STORM_MAX_BYTES, STORM_MIN_CALLS)
    # Only the columns used: the query reads a row per call on every rank.
    exp = collective_exposure_lazy(view, transfer_only=True).select(_USED)
    exp = exp.filter(~pl.col("collective").is_in(P2P))
    exp = exp.with_columns(pl.col("process_group").cast(pl.String))
    exp = exp.join(
        storms.lazy(), on=["process_group", "collective"], how="anti", build_side="force_right"
    )
    return with_roles(tables, exp)


def _hideable_rows(tables: Tables, view: Tables) -> pl.LazyFrame:
    """_transfers of `view` with the calls nothing later in the step hides given no
    exposed time, unless such a call is its cause's only call of the step
    (`single_call_steps`). Those are the blame's (`last_call`: the call of the rank's step
    window that ends last, and an FSDP group's last two gradient reductions of the step),
    which the replay excepts too."""
    single = single_call_steps(tables).with_columns(_alone=pl.lit(True))
    keys = ["role", "collective", "rank", "step"]
    exp = _transfers(tables, view).join(single.lazy(), on=keys, how="left", nulls_equal=True)
    last = pl.col("last_call").fill_null(False) & pl.col("_alone").is_null()
    return exp.with_columns(exposed_ns=pl.when(last).then(0).otherwise(pl.col("exposed_ns"))).drop(
        "_alone"
    )


def hideable_transfers(
    tables: Tables, role: str, collective: str, groups: list[str]
) -> pl.DataFrame:
    """rank, step, end_ns, exposed_ns: a cause's calls (its role and collective on its
    groups) with the exposed transfer time hiding them behind compute can take, the
    blame's last calls of a step given none unless such a call is the cause's only one
    (exposure_by_cause's rule); calls with none left out. Every cause's calls are read
    once per rules run (COMM101 and COMM102 ask for each of their causes)."""

    def every_cause() -> pl.DataFrame:
        return tables.collect(
            _hideable_rows(tables, tables)
            .filter(pl.col("exposed_ns") > 0)
            .select(
                "role",
                "collective",
                "process_group",
                pl.col("rank").cast(pl.Int64),
                pl.col("step").cast(pl.Int64),
                pl.col("end_ns").cast(pl.Int64),
                pl.col("exposed_ns").cast(pl.Int64),
            )
        )

    rows = tables.once(("builtin", "hideable_transfers"), every_cause)
    return rows.filter(
        (pl.col("role") == role)
        & (pl.col("collective") == collective)
        & pl.col("process_group").is_in(groups)
    ).select("rank", "step", "end_ns", "exposed_ns")


def _by_cause(tables: Tables, exclude_last: bool) -> pl.DataFrame:
    """exposure_by_cause, computed."""
    schema = {"role": pl.String, "collective": pl.String, "exposed_ns": pl.Int64}
    if not tables.has("collectives"):
        return impact_per_step(
            pl.DataFrame(schema={**schema, "rank": pl.Int64, "step": pl.Int64}),
            "exposed_ns",
            ["role", "collective"],
        ).with_columns(
            groups=pl.lit(None, dtype=pl.List(pl.String)),
            bytes_per_call=pl.lit(None, dtype=pl.Float64),
        )

    def exposed(view: Tables) -> pl.LazyFrame:
        return _hideable_rows(tables, view) if exclude_last else _transfers(tables, view)

    impact = impact_per_step(exposed, "exposed_ns", ["role", "collective"], tables=tables)
    # Per group first (few rows), so the streaming engine never holds a list per row.
    per_group = tables.collect(
        _transfers(tables, tables)
        .group_by("role", "collective", "process_group")
        .agg(_sum=pl.col("bytes").sum(), _count=pl.col("bytes").count())
    )
    extra = per_group.group_by("role", "collective").agg(
        groups=pl.col("process_group").drop_nulls().unique().sort(),
        bytes_per_call=pl.when(pl.col("_count").sum() > 0).then(
            pl.col("_sum").sum() / pl.col("_count").sum()
        ),
    )
    return impact.join(extra, on=["role", "collective"], how="left")


# How each module_source reads in a finding (kineto_comm.analysis.attribution).
_MODULE_FROM = {
    "fsdp_annotation": "FSDP's annotation",
    "nn_module": "nn.Module",
    "record_function": "record_function",
    "hook": "a backward hook; its parameters are not one module's",
}


def where_from(
    tables: Tables,
    *,
    collective: str | None = None,
    role: str | None = None,
    kind: str = "exposed",
    top: int = 2,
) -> tuple[str, list[dict]]:
    """Where in the code a cost comes from, read from the report's attribution table (never
    recomputed): the sentence "Where: in backward of `blocks.1` (FSDP's annotation): 1.88 ms
    of its 3.56 ms per step; ..." for the largest places of its calls (`collective` and
    `role`; None: any) on the steps' critical ranks, `kind` exposed, wait or bubble; and the
    places as evidence rows. ("", []) where the calls have no place the trace shows."""
    table = attribution(tables)
    column = f"critical_{kind}_ns"
    if table.height == 0 or column not in table.columns:
        return "", []
    if collective is not None:
        table = table.filter(pl.col("collective") == collective)
    if role is not None:
        table = table.filter(pl.col("role") == role)
    total = int(table.get_column(column).sum() or 0)
    if total <= 0:
        return "", []
    rows = table.filter(pl.col(column) > 0).sort(column, descending=True, maintain_order=True)
    places = []
    parts = []
    for r in rows.head(top).iter_rows(named=True):
        if r["phase"] == "other" and r["module"] == "unknown":
            continue
        where = r["phase"] if r["module"] == "unknown" else f"{r['phase']} of `{r['module']}`"
        how = _MODULE_FROM.get(r["module_source"])
        if r["module"] == "hook":
            where = f"{r['phase']} ({how})"
        elif how:
            where += f" ({how})"
        what = "" if collective is not None else f"{r['collective']} "
        parts.append(
            f"{what}in {where}: {r[column] / 1e6:.2f} ms of its {total / 1e6:.2f} ms per step"
        )
        places.append(
            {
                "phase": r["phase"],
                "module": r["module"],
                "module_source": r["module_source"],
                "collective": r["collective"],
                "role": r["role"],
                f"{kind}_ns_per_step": int(r[column]),
                f"of_{kind}_ns_per_step": total,
            }
        )
    if not parts:
        return "", []
    return "Where (critical rank): " + "; ".join(parts) + ".", places
