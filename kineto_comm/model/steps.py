"""Training steps: `ProfilerStep#N` CPU windows, and the device time they account for.

A kernel belongs to the step whose CPU window holds its launch (as HTA maps kernels to
iterations through correlation). A step's device window starts at its first kernel and ends
where the next step's first kernel starts (the last step ends at its last kernel), so the
windows tile the device timeline and idle time between steps is charged to the step before.
With no step markers the whole trace is one window, step -1.

Columns of the steps table (`STEP_SCHEMA`):
    rank, step
    cpu_start_ns, cpu_end_ns   the ProfilerStep annotation (null for step -1)
    start_ns, end_ns           the device window
"""

from __future__ import annotations

import polars as pl

from kineto_comm.lazy import collect
from kineto_comm.load.decode import RawTrace

NO_STEP = -1
STEP_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "step": pl.Int64(),
    "cpu_start_ns": pl.Int64(),
    "cpu_end_ns": pl.Int64(),
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
}


def cpu_steps(raw: RawTrace, rank: int) -> pl.DataFrame:
    """The ProfilerStep#N annotations of one rank: rank, step, cpu_start_ns, cpu_end_ns."""
    marks = raw.ops.lazy().filter(pl.col("name").str.starts_with("ProfilerStep#"))
    return collect(
        marks.select(
            step=pl.col("name").str.extract(r"^ProfilerStep#(\d+)", 1).cast(pl.Int64),
            cpu_start_ns=pl.col("start_ns"),
            cpu_end_ns=pl.col("end_ns"),
        )
        .drop_nulls("step")
        .group_by("step")
        .agg(pl.col("cpu_start_ns").min(), pl.col("cpu_end_ns").max())
        .with_columns(rank=pl.lit(rank, dtype=pl.Int64))
        .select("rank", "step", "cpu_start_ns", "cpu_end_ns")
        .sort("cpu_start_ns")
    )


def assign_steps(kernels: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Add a `step` column: the step whose CPU window holds the launch (or start) of each row.

    The windows are looked up by binary search over their sorted starts, so the (wide)
    kernel table is neither sorted nor copied.
    """
    if steps.height == 0 or kernels.height == 0:
        return kernels.with_columns(step=pl.lit(NO_STEP, dtype=pl.Int64))
    marks = steps.select("step", "cpu_start_ns", "cpu_end_ns").sort("cpu_start_ns")
    at = kernels.select(pl.coalesce("launch_ns", "start_ns")).to_series()
    # The last window starting at or before each row's time (-1: before every window).
    found = marks["cpu_start_ns"].search_sorted(at, side="right").cast(pl.Int64) - 1
    where = found.clip(lower_bound=0)
    inside = (found >= 0) & (at <= marks["cpu_end_ns"].gather(where))
    step = (
        pl.select(
            pl.when(inside).then(marks["step"].gather(where)).otherwise(NO_STEP).fill_null(NO_STEP)
        )
        .to_series()
        .alias("step")
    )
    return kernels.with_columns(step)


def device_windows(kernels: pl.DataFrame, steps: pl.DataFrame, rank: int) -> pl.DataFrame:
    """The steps table of one rank: CPU windows plus the device windows they tile."""
    if steps.height == 0:
        if kernels.height == 0:
            return pl.DataFrame(schema=STEP_SCHEMA)
        return pl.DataFrame(
            {
                "rank": [rank],
                "step": [NO_STEP],
                "cpu_start_ns": [None],
                "cpu_end_ns": [None],
                "start_ns": [kernels["start_ns"].min()],
                "end_ns": [kernels["end_ns"].max()],
            },
            schema=STEP_SCHEMA,
        )
    spans = (
        kernels.lazy()
        .filter(pl.col("step") != NO_STEP)
        .group_by("step")
        .agg(first=pl.col("start_ns").min(), last=pl.col("end_ns").max())
    )
    table = steps.lazy().join(spans, on="step", how="left").sort("cpu_start_ns")
    start = pl.coalesce("first", "cpu_start_ns")
    next_start = start.shift(-1)
    end = pl.coalesce(next_start, pl.col("last"), pl.col("cpu_end_ns"))
    return collect(
        table.with_columns(start_ns=start, end_ns=pl.max_horizontal(end, start)).select(
            list(STEP_SCHEMA)
        )
    )
