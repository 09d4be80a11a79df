"""Each call with the time the model of time charges to it: what its fix can take out.

Why: a call's duration is not what it costs the step; compute may hide it, an earlier call
may already hold the same time, and part of it is a wait for late ranks. The blame's pass
(model_of_time.py) measures, per call, the time nothing else on its rank hides; this module
joins it onto every call with its waits (waits.py), in memory or as a lazy query that streams
the calls of a big job. Summed over a rank's calls in a step, it is the step's transfer and
pipeline_bubble blame (with the waits: every communication row).
"""

from __future__ import annotations

import polars as pl

from kineto_comm.analysis.model_of_time import exposed_per_call
from kineto_comm.analysis.view import TableView
from kineto_comm.analysis.waits import CALL_KEY, collective_waits_lazy


def collective_exposure(tables: TableView, transfer_only: bool = True) -> pl.DataFrame:
    """collective_waits() plus `exposed_ns`: the time of each call that the model of time
    charges to it (steptime.rank_time; docs/tables.md `step_blame`): inside a step window,
    with no compute or memory kernel running on its rank, and not already held by an
    earlier call on the rank. With `transfer_only`, only the call's last `transfer_ns`
    count (the time it moved data, not the time it sat waiting for late ranks). Summed
    over a rank's calls in a step, it is that step's transfer and pipeline_bubble blame
    (with the waits: every communication row). Every rank's rows in one DataFrame: rules
    that must stay within memory on big jobs use `collective_exposure_lazy`."""
    if not tables.has("collectives"):
        return tables["collectives"].with_columns(exposed_ns=pl.lit(0, dtype=pl.Int64))
    return tables.collect(collective_exposure_lazy(tables, transfer_only))


def collective_exposure_lazy(tables: TableView, transfer_only: bool = True) -> pl.LazyFrame:
    """collective_exposure() as a lazy query (see Tables.lazy): the calls stream through a
    join with their exposure, which the blame's pass computed (kept in files on a big
    job)."""
    if not tables.has("collectives"):
        return collective_exposure(tables, transfer_only).lazy()
    exposure = exposed_per_call(tables).select(
        "rank",
        *CALL_KEY,
        "last_call",
        exposed_ns="exposed_ns" if transfer_only else "exposed_all_ns",
        _window="step",
    )
    calls = collective_waits_lazy(tables)
    schema = calls.collect_schema()
    exposure = exposure.with_columns(
        pl.col(c).cast(schema[c]) for c in ("rank", *CALL_KEY) if c in schema
    )
    step = schema.get("step", pl.Int64)
    return (
        calls.join(
            exposure, on=["rank", *CALL_KEY], how="left", nulls_equal=True, maintain_order="left"
        )
        .with_columns(
            pl.col("exposed_ns").fill_null(0),
            # The step whose window the call ends in, as the blame counts it.
            step=pl.coalesce(pl.col("_window").cast(step), pl.col("step"))
            if "step" in schema
            else pl.col("_window"),
        )
        .drop("_window")
    )
