"""Shared pieces of the built-in rules (built on the public rules API only)."""

from __future__ import annotations

import polars as pl

from kineto_comm.rules_api import (
    Option,
    Severity,
    Tables,
    call_roles,
    collective_exposure_lazy,
    impact_per_step,
    median_of_counts,
    severity_for,
)

# A (process group, collective) whose calls are this small and this many per rank and step
# is a latency-bound storm: COMM201 reports it, the exposure rules leave it out.
STORM_MAX_BYTES = 256 * 1024
STORM_MIN_CALLS = 50
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
    sev = severity_for(share, options["warn_share"], options["error_share"])
    if sev is None and share >= options["info_share"]:
        sev = Severity.info
    return sev


def with_roles(tables: Tables, frame: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame | pl.LazyFrame:
    """`frame` (with process_group) plus the group's role (unknown when not known)."""
    frame = frame.with_columns(pl.col("process_group").cast(pl.String))
    return call_roles(tables, frame).with_columns(pl.col("role").fill_null("unknown"))


def storm_keys(tables: Tables, max_bytes: int, min_calls: int) -> pl.DataFrame:
    """(process_group, collective) pairs that are message storms.

    From the storms table when the analysis produced it, else: median message <= max_bytes
    and at least min_calls calls per rank and step.
    """
    storms = tables["storms"]
    if tables.has("storms", "process_group", "collective"):
        return storms.select(pl.col("process_group").cast(pl.String), "collective").unique()
    # Read over every call: once per rules run (four rules ask).
    return tables.once(
        ("builtin", "storm_keys", max_bytes, min_calls),
        lambda: _storms_from_calls(tables, max_bytes, min_calls),
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
