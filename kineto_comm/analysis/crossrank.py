"""Cross-rank analysis over the merged per-rank tables: one function, one direction of flow.

match calls across ranks -> estimate clock offsets -> put every table on rank 0's clock ->
per-call instances and waits -> stragglers, message sizes, group roles, pipeline bubbles,
small-message storms, all-to-all pairs and loads, overlap's interference. Returns the tables
to place on the Report, keyed by their names in docs/tables.md.
"""

from __future__ import annotations

from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import polars as pl

from kineto_comm.analysis.align import fit_offsets, hosts, no_offsets
from kineto_comm.analysis.alltoall import COLUMNS as ALL_TO_ALL_COLUMNS
from kineto_comm.analysis.alltoall import all_to_all_loads, all_to_all_pairs
from kineto_comm.analysis.interference import job_interference
from kineto_comm.analysis.match import instances, keyed_calls, waits
from kineto_comm.analysis.pipeline import pipeline
from kineto_comm.analysis.roles import process_groups
from kineto_comm.analysis.sizes import message_size_summary, message_sizes
from kineto_comm.analysis.storms import storms
from kineto_comm.analysis.stragglers import stragglers
from kineto_comm.lazy import collect
from kineto_comm.rank_store import TIME_COLUMNS, SpillFolder
from kineto_comm.timeshift import shift


def cross_rank(
    tables: dict[str, Any],
    *,
    align: bool = True,
    folder: SpillFolder | None = None,
    ranks_per_host: int | None = None,
    ungrouped: Collection[int] = (),
) -> dict[str, Any]:
    """Aligned per-rank tables plus the cross-rank tables, from merged per-rank tables.

    `kernels`, `collectives` and `steps` are stores (kineto_comm.rank_store), shifted as
    they are read; the derived tables with a row per call and rank (the keyed calls, the
    waits) are kept in `folder` when given (a big job), so that the parent holds none of
    them whole. `ranks_per_host`: the user's word on which ranks share a clock
    (kineto_comm.analysis.align.hosts), else it is read from the traces. The tables are
    of one job (another job's files are left out before: kineto_comm.analysis.jobs).
    `ungrouped`: the ranks whose calls without a group are matched with no other rank's
    (match.ranks_in_several_groups)."""
    ranks = tables["ranks"]["rank"].to_list() if tables["ranks"].height else []
    calls = tables["collectives"]
    # The pipeline table and the groups' roles compare no times across ranks (each rank's
    # own clock is enough: positions inside a rank's own step windows, its own gaps): they
    # read the tables before alignment. On a small job (nothing in files) they run in
    # threads beside the steps below from the start: each step there is mostly the fixed
    # cost of a few queries, which then overlap (bench/README.md, twenty-fifth,
    # thirty-eighth and thirty-ninth sessions). On a big job they come after them, so that
    # their transients never add up.
    pipeline_of = partial(pipeline, tables["kernels"], calls, tables["steps"])
    roles_of = partial(process_groups, calls, tables["steps"], tables["ranks"])
    with ThreadPoolExecutor(2) as side:
        stages = side.submit(pipeline_of) if folder is None else None
        roles = side.submit(roles_of) if folder is None else None
        keyed = keyed_calls(calls, folder, ungrouped)
        devices = collect(keyed.lazy(["rank", "device"]).unique(), keyed.height)
        grouping = hosts(tables["ranks"], devices, ranks_per_host)
        offsets = fit_offsets(keyed, ranks, grouping) if align else no_offsets(ranks, grouping)
        out: dict[str, Any] = {"totals": shift(tables["totals"], offsets, TIME_COLUMNS)}
        out["steps"] = tables["steps"].with_offsets(offsets)
        out["kernels"] = tables["kernels"].with_offsets(offsets)
        out["collectives"] = collectives = calls.with_offsets(offsets)
        keyed = keyed.with_offsets(offsets)
        table = instances(keyed)
        per_rank_waits = waits(keyed, table, folder)
        keyed.discard()
        out.update(
            offsets=offsets,
            collective_instances=table,
            collective_waits=per_rank_waits,
            stragglers=stragglers(table, per_rank_waits, out["kernels"]),
            message_sizes=message_sizes(collectives),
            message_size_summary=message_size_summary(collectives),
            storms=storms(collectives),
            interference=job_interference(out["kernels"], collectives),
        )
        # Who sent whom how much in each all-to-all, and each receiver's load: the all-to-all
        # calls only, read once (no times: shifted or not, the same).
        if collectives.height and set(ALL_TO_ALL_COLUMNS) <= set(collectives.columns):
            a2a = collect(
                collectives.lazy(
                    list(ALL_TO_ALL_COLUMNS), where=pl.col("collective") == "all_to_all"
                ),
                collectives.height,
            )
            out["all_to_all_pairs"] = all_to_all_pairs(a2a)
            out["all_to_all_loads"] = all_to_all_loads(a2a)
        out["pipeline"] = pipeline_of() if stages is None else stages.result()
        out["process_groups"] = roles_of() if roles is None else roles.result()
    return out
