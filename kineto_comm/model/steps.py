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

from typing import TYPE_CHECKING

import polars as pl

from kineto_comm.lazy import collect
from kineto_comm.load.decode import RawTrace

if TYPE_CHECKING:
    from kineto_comm.rank_store import RankStore

NO_STEP = -1
STEP_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "step": pl.Int64(),
    "cpu_start_ns": pl.Int64(),
    "cpu_end_ns": pl.Int64(),
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
}


def cpu_steps(raw: RawTrace) -> pl.DataFrame:
    """The ProfilerStep#N annotations of the ranks in `raw` (its tables carry a `rank`
    column): rank, step, cpu_start_ns, cpu_end_ns, in (rank, start) order."""
    marks = raw.ops.lazy().filter(pl.col("name").str.starts_with("ProfilerStep#"))
    return collect(
        marks.select(
            "rank",
            # A number beyond int64 is damage, not a step: no step (strict=False).
            step=pl.col("name").str.extract(r"^ProfilerStep#(\d+)", 1).cast(pl.Int64, strict=False),
            cpu_start_ns=pl.col("start_ns"),
            cpu_end_ns=pl.col("end_ns"),
        )
        .drop_nulls("step")
        .group_by("rank", "step")
        .agg(pl.col("cpu_start_ns").min(), pl.col("cpu_end_ns").max())
        .select("rank", "step", "cpu_start_ns", "cpu_end_ns")
        .sort("rank", "cpu_start_ns")
    )


def assign_steps(kernels: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Add a `step` column: the step of the row's rank whose CPU window holds the launch (or
    start) of each row.

    Only the rows' rank and time are sorted to look the windows up: the (wide) kernel table
    is neither sorted nor copied.
    """
    if steps.height == 0 or kernels.height == 0:
        return kernels.with_columns(step=pl.lit(NO_STEP, dtype=pl.Int64))
    marks = steps.lazy().select("rank", "step", "cpu_start_ns", "cpu_end_ns").sort("cpu_start_ns")
    at = kernels.lazy().select(
        "rank", _t=pl.coalesce("launch_ns", "start_ns"), _row=pl.int_range(pl.len())
    )
    # The last window of the rank starting at or before each row's time.
    found = at.sort("_t").join_asof(
        marks,
        left_on="_t",
        right_on="cpu_start_ns",
        by="rank",
        strategy="backward",
        check_sortedness=False,
    )
    inside = pl.col("_t") <= pl.col("cpu_end_ns")
    step = found.sort("_row").select(
        step=pl.when(inside).then(pl.col("step")).otherwise(NO_STEP).fill_null(NO_STEP)
    )
    return kernels.hstack(collect(step).get_columns())


def device_windows(kernels: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """The steps table of the ranks in `kernels`: CPU windows plus the device windows they
    tile, in (rank, CPU start) order; a rank without step markers has one window, step -1,
    over all its device activity."""
    lazy = kernels.lazy()
    unmarked = (
        lazy.join(steps.lazy(), on="rank", how="anti")
        .group_by("rank")
        .agg(
            step=pl.lit(NO_STEP, dtype=pl.Int64),
            cpu_start_ns=pl.lit(None, dtype=pl.Int64),
            cpu_end_ns=pl.lit(None, dtype=pl.Int64),
            start_ns=pl.col("start_ns").min(),
            end_ns=pl.col("end_ns").max(),
        )
    )
    spans = (
        lazy.filter(pl.col("step") != NO_STEP)
        .group_by("rank", "step")
        .agg(first=pl.col("start_ns").min(), last=pl.col("end_ns").max())
    )
    table = steps.lazy().join(spans, on=["rank", "step"], how="left").sort("rank", "cpu_start_ns")
    start = pl.coalesce("first", "cpu_start_ns")
    next_start = start.shift(-1).over("rank")
    end = pl.coalesce(next_start, pl.col("last"), pl.col("cpu_end_ns"))
    marked = table.with_columns(start_ns=start, end_ns=pl.max_horizontal(end, start))
    windows = pl.concat(
        [marked.select(list(STEP_SCHEMA)), unmarked.select(list(STEP_SCHEMA))], how="vertical"
    )
    return collect(windows.sort("rank", maintain_order=True))


def steps_per_rank(steps: RankStore, numbered_only: bool = True) -> pl.DataFrame:
    """rank, n_steps: each rank's distinct steps in the merged steps table (only numbered
    ones, step >= 0, unless `numbered_only` is False). Counted a window of ranks at a time:
    over every rank at once the count holds every (rank, step) pair."""
    kept = pl.col("step") >= 0 if numbered_only else pl.lit(True)
    return steps.per_window(
        lambda view: (
            view.lazy(["rank", "step"])
            .filter(kept)
            .group_by("rank")
            .agg(n_steps=pl.col("step").n_unique())
        )
    )


def job_steps(steps: RankStore) -> int:
    """How many distinct numbered steps (step >= 0) the job's ranks hold together: the
    steps the model of time takes the job's step over (steptime.step_times)."""
    if steps.height == 0:
        return 0
    found = steps.per_window(lambda view: view.lazy(["step"]).filter(pl.col("step") >= 0).unique())
    return found.get_column("step").n_unique() if found.height else 0


def one_step_warning(steps: RankStore) -> list[str]:
    """A warning when the job has fewer than two complete steps: every per-step figure
    (means, savings per step, shares of the step) then rests on one step, whose noise
    nothing averages out. A step is complete as steptime.step_times counts it: numbered,
    and not the last of several (cut at its last kernel), so two profiled steps leave one
    (`kineto-comm capture --steps 2` did)."""
    n = job_steps(steps)
    if n == 1:
        return [
            "the trace holds one profiled step per rank: every per-step figure rests on that "
            "one step (profile 3 or more, e.g. schedule(active=3), for averages)"
        ]
    if n == 2:
        return [
            "the trace holds two profiled steps, one complete (the last, cut at its last "
            "kernel, is left out): every per-step figure rests on that one step (profile 3 "
            "or more, e.g. schedule(active=3) or kineto-comm capture --steps 3, for averages)"
        ]
    return []
