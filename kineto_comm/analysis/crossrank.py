"""Cross-rank analysis over the merged per-rank tables: one function, one direction of flow.

match calls across ranks -> estimate clock offsets -> put every table on rank 0's clock ->
per-call instances and waits -> stragglers, message sizes, group roles, pipeline bubbles,
small-message storms. Returns the tables to place on the Report, keyed by their names in
docs/tables.md.
"""

from __future__ import annotations

from typing import Any

from kineto_comm.analysis.align import estimate_offsets, no_offsets, shift
from kineto_comm.analysis.match import instances, match_keys, waits
from kineto_comm.analysis.pipeline import pipeline
from kineto_comm.analysis.roles import process_groups
from kineto_comm.analysis.sizes import message_size_summary, message_sizes
from kineto_comm.analysis.storms import storms
from kineto_comm.analysis.stragglers import stragglers

TIME_COLUMNS = ["start_ns", "end_ns", "launch_ns", "cpu_start_ns", "cpu_end_ns"]
MATCH_COLUMNS = (
    "rank",
    "device",
    "process_group",
    "collective",
    "peer",
    "seq",
    "call_index",
    "step",
    "group_size",
    "bytes",
    "start_ns",
    "end_ns",
    "duration_ns",
)


def cross_rank(tables: dict[str, Any], *, align: bool = True) -> dict[str, Any]:
    """Aligned per-rank tables plus the cross-rank tables, from merged per-rank tables
    (`kernels`: a RankKernels store, shifted as it is read)."""
    ranks = tables["ranks"]["rank"].to_list() if tables["ranks"].height else []
    # Only what matching, offsets, instances and waits read: the keyed copy of every call
    # is the parent's largest transient on big jobs.
    calls = tables["collectives"]
    keyed = match_keys(calls.select(c for c in MATCH_COLUMNS if c in calls.columns))
    offsets = estimate_offsets(keyed, ranks) if align else no_offsets(ranks)
    out: dict[str, Any] = {
        name: shift(tables[name], offsets, TIME_COLUMNS)
        for name in ("collectives", "steps", "totals")
    }
    out["kernels"] = tables["kernels"].with_offsets(offsets)
    keyed = shift(keyed, offsets, TIME_COLUMNS)
    table = instances(keyed)
    per_rank_waits = waits(keyed, table)
    collectives = out["collectives"]
    out.update(
        offsets=offsets,
        collective_instances=table,
        collective_waits=per_rank_waits,
        stragglers=stragglers(table, per_rank_waits),
        message_sizes=message_sizes(collectives),
        message_size_summary=message_size_summary(collectives),
        process_groups=process_groups(collectives, out["steps"], tables["ranks"]),
        pipeline=pipeline(out["kernels"], collectives, out["steps"]),
        storms=storms(collectives),
    )
    return out
