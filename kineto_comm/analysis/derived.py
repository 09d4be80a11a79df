"""The registry of derived tables: each declared once (name, what it reads, how it is built).

Why: a derived quantity (step times, blame, waits, exposure, roles, the cost fit, ...) is
built by one function in its home under analysis/ and read by name everywhere else: `Tables`
(the rules' view, kineto_comm.tables) serves `tables[name]` from here, the rule API's readers
(`step_times(tables)`, ...) and the report's model of time (rules_engine.step_model) call
`read`. A builder takes a `TableView` and is computed once per rules run (its home memoises
it under ("derived", name)); a `lazy` one returns a query over a store built a few ranks at
a time, so a big job's memory stays bounded. docs/tables.md lists the public ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from kineto_comm.analysis import (
    alltoall,
    attribution,
    costfit,
    exposure,
    model_of_time,
    roles,
    steptime,
    waits,
)
from kineto_comm.analysis.view import TableView


@dataclass(frozen=True)
class Derived:
    """One derived table: `name`, the tables it `reads`, its `build` (TableView -> frame),
    a one-line `doc`, the `columns` it always has (more where its source has more), whether
    it is a lazy query, and whether rules may read it by name (`public`; the others are
    steps of a public one)."""

    name: str
    reads: tuple[str, ...]
    build: Callable[[TableView], Any]
    doc: str
    columns: tuple[str, ...] = ()
    lazy: bool = False
    public: bool = True


_WAITS = ("wait_ns", "transfer_ns", "ranks_seen", "arrived_last")
_CALLS = ("collectives", "ranks", "collective_instances", "collective_waits")
_TIME = ("steps", "kernels", *_CALLS, "process_groups")

DERIVED: dict[str, Derived] = {
    d.name: d
    for d in (
        Derived(
            "step_times",
            ("steps",),
            model_of_time.step_times,
            "per step: step_ns (the longest rank's window), critical_rank, ranks, complete",
            tuple(steptime.STEP_TIMES_SCHEMA),
        ),
        Derived(
            "step_blame",
            _TIME,
            model_of_time.critical_blame,
            "the critical rank's blame rows of each step (sum to its step_ns)",
            tuple(steptime.BLAME_SCHEMA),
        ),
        Derived(
            "rank_blame",
            _TIME,
            model_of_time.rank_blame,
            "every rank's step windows split into blame categories",
            tuple(steptime.BLAME_SCHEMA),
            lazy=True,
        ),
        Derived(
            "replay_timeline",
            _TIME,
            model_of_time.replay_timeline,
            "what the replay re-times: windows, events, tail chains",
            tuple(steptime.CHAIN_SCHEMA),
            lazy=True,
        ),
        Derived(
            "call_waits",
            _CALLS,
            waits.collective_waits_lazy,
            "collectives + wait_ns, transfer_ns, ranks_seen, arrived_last",
            _WAITS,
            lazy=True,
        ),
        Derived(
            "call_exposure",
            _TIME,
            exposure.collective_exposure_lazy,
            "call_waits + exposed_ns: the transfer time the model of time charges to each call",
            (*_WAITS, "exposed_ns", "step"),
            lazy=True,
        ),
        Derived(
            "group_roles",
            ("process_groups", "collectives"),
            roles.group_roles,
            "process_group -> role, size, ranks",
            ("process_group", "role", "size", "ranks"),
        ),
        Derived(
            "cost_fit",
            _TIME,
            costfit.job_cost_fit,
            "per (process_group, collective): latency + bytes / bandwidth",
            tuple(costfit.FIT_SCHEMA),
        ),
        Derived(
            "all_to_all_volume",
            ("all_to_all_loads", "collectives"),
            alltoall.job_all_to_all_volume,
            "per group and rank: all-to-all bytes sent and received, how uneven",
            tuple(alltoall.VOLUME_SCHEMA),
        ),
        Derived(
            "queue_shift",
            _TIME,
            model_of_time.queue_shift,
            "per window with queued time: what moving the device's other work off takes out",
            tuple(model_of_time.SHARE_SCHEMA),
        ),
        Derived(
            "attribution",
            (*_TIME, "ops"),
            attribution.job_attribution,
            "per phase x module x role x collective: exposed, wait and bubble ns per step",
            tuple(attribution.ATTRIBUTION_SCHEMA),
        ),
        # Steps of the public tables.
        Derived(
            "model_of_time",
            _TIME,
            model_of_time.model_of_time,
            "the blame's one pass: blame, per-call exposure and replay rows together",
            lazy=True,
            public=False,
        ),
        Derived(
            "exposed_per_call",
            _TIME,
            model_of_time.exposed_per_call,
            "per call: exposed_ns, exposed_all_ns, the step it ends in",
            lazy=True,
            public=False,
        ),
        Derived(
            "call_durations",
            ("collectives", "ranks"),
            waits.call_durations,
            "per matched call: its shortest duration over the ranks, how many ran it",
            public=False,
        ),
        Derived(
            "call_last",
            ("collectives", "ranks"),
            waits.call_last,
            "per matched call: the rank whose call was the shortest",
            public=False,
        ),
        Derived(
            "whole_instances",
            ("collective_instances", "collective_waits"),
            waits.whole_instances,
            "the instances every member of the group ran",
            public=False,
        ),
        Derived(
            "instance_last",
            ("collective_instances", "collective_waits"),
            waits.instance_last,
            "per instance: its last rank and when it started",
            public=False,
        ),
    )
}


def read(tables: TableView, name: str) -> Any:
    """Derived table `name` of `tables`, as its builder gives it (a lazy query for a lazy
    one; None for a step that has no inputs); KeyError for a name not declared."""
    return DERIVED[name].build(tables)


def frame(tables: TableView, name: str) -> pl.DataFrame | None:
    """Derived table `name` as one DataFrame (a lazy one collected by `tables.collect`)."""
    value = read(tables, name)
    return tables.collect(value) if isinstance(value, pl.LazyFrame) else value
