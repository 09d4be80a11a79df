"""The step time a cause costs: a rule's rows (calls, pieces of the blame) summed per rank and
step, the worst rank per step, averaged over the job's complete steps.

Why: a synchronous job waits for its slowest rank, so a cause costs the step what it costs
its worst rank in each step, and "per step" must mean the steps the step time is measured
over (model_of_time.step_times), or a share of the step is not a share of the same number.
A function of the tables that gives each few ranks' rows keeps memory bounded on a big job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import polars as pl

from kineto_comm.analysis.model_of_time import step_times
from kineto_comm.analysis.view import TableView
from kineto_comm.lazy import collect


def impact_per_step(
    rows: pl.DataFrame | pl.LazyFrame | Callable[[TableView], pl.LazyFrame],
    value: str,
    by: Sequence[str] = (),
    steps: int | None = None,
    tables: TableView | None = None,
) -> pl.DataFrame:
    """Step time a cause costs: `value` summed per (by, rank, step), the worst rank taken per
    (by, step) (a synchronous job waits for its slowest rank), averaged over `steps` (default:
    with `tables`, the job's complete steps, as the step time and every replayed saving are
    (step_times; a step without the cause counts as 0); without, the steps present). Returns
    by + impact_ns, ranks (list), steps (list) and calls (mean rows per rank and step with a
    cost), of those steps.

    `rows` may be a lazy query over every call (collective_exposure_lazy), collected by
    `tables.collect` when `tables` is given; then its sums per (by, rank, step) are held at
    once. A function from a Tables to that query keeps memory bounded whatever the rank
    count: it is called on `tables` (to plan; nothing is run) and then on each of
    `tables.rank_slices()`, and only a few ranks' sums are held at a time. The function
    reads the per-rank tables through the Tables it gets, and treats ranks apart: a join on
    (rank, step) with an aggregation of its own rows is fine, a statistic over every rank
    comes from the whole tables."""
    by = list(by)
    if callable(rows):
        if tables is None:
            raise ValueError("impact_per_step: rows given as a function need `tables`")
        names = rows(tables).collect_schema()
        queries = ((view, rows(view)) for view in tables.rank_slices())
    else:
        names = rows.lazy().collect_schema()
        queries = iter([(tables, rows.lazy())])
    schema = {
        **{c: names.get(c, pl.String) for c in by},
        "impact_ns": pl.Float64,
        "ranks": pl.List(pl.Int64),
        "steps": pl.List(pl.Int64),
        "calls": pl.Int64,
    }
    # The job's complete steps: where the step time and the savings are measured.
    done = None
    if tables is not None and steps is None:
        times = step_times(tables).filter(pl.col("complete"))
        done = times["step"].cast(pl.Int64).implode() if times.height else None
    # Per view of a few ranks, state per (by, step) and per (by, rank), not per rank and step.
    per_step, per_rank = [], []
    for view, query in queries:
        query = query.group_by([*by, "rank", "step"]).agg(
            v=pl.col(value).sum(), calls=pl.len().cast(pl.Int64)
        )
        if done is not None:
            query = query.filter(pl.col("step").cast(pl.Int64).is_in(done))
        sums = view.collect(query) if view is not None else collect(query)
        cost = pl.col("v") > 0
        per_step.append(
            sums.group_by([*by, "step"]).agg(
                v=pl.col("v").max(),
                _calls=pl.when(cost).then(pl.col("calls")).sum(),
                _n=cost.sum().cast(pl.Int64),
            )
        )
        numbered = pl.col("step") >= 0
        per_rank.append(sums.filter(cost).select(*by, "rank", _numbered=numbered).unique())
    step = pl.concat(per_step)
    if step.height == 0:
        return pl.DataFrame(schema=schema)
    ranks = pl.concat(per_rank)
    if (step["step"] >= 0).any():
        step = step.filter(pl.col("step") >= 0)
        ranks = ranks.filter(pl.col("_numbered"))
    n = steps or (done.list.len().item() if done is not None else step["step"].n_unique())
    n = max(1, n)
    key = by or ["_all"]
    if not by:
        step = step.with_columns(_all=pl.lit(0))
        ranks = ranks.with_columns(_all=pl.lit(0))
    step = (
        step.group_by([*key, "step"])
        .agg(pl.col("v").max(), pl.col("_calls").sum(), pl.col("_n").sum())
        .sort([*key, "step"], nulls_last=True)
    )
    totals = step.group_by(key, maintain_order=True).agg(impact_ns=pl.col("v").sum() / n)
    members = (
        step.filter(pl.col("_n") > 0)
        .group_by(key)
        .agg(
            steps=pl.col("step").unique().sort(),
            calls=(pl.col("_calls").sum() / pl.col("_n").sum()).round().cast(pl.Int64),
        )
        .join(
            ranks.group_by(key).agg(ranks=pl.col("rank").unique().sort()),
            on=key,
            how="left",
            nulls_equal=True,
        )
    )
    return (
        totals.join(members, on=key, how="left", nulls_equal=True)
        .drop("_all", strict=False)
        .select(list(schema))
    )
