"""COMM103 uneven-all-to-all: an all-to-all's receivers get unequal loads."""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Edit,
    Finding,
    Option,
    Tables,
    collective_exposure_lazy,
    cost_fit,
    group_roles,
    make_finding,
    mean_step_ns,
    replay_saving,
    rule,
)

from ._common import SHARE_OPTIONS, share_severity

# How to even out what each rank receives, by the group's role (process_groups).
_HOW = {
    "expert": "Balance the tokens per expert: a load-balancing (auxiliary) loss, a capacity "
    "factor that drops or re-routes overflow tokens, or expert placement that spreads hot "
    "experts over the ranks.",
    "embedding": "Balance the rows per rank: shard the embedding tables by measured lookups "
    "and feature statistics (torchrec's planner) so that each rank receives the same number "
    "of rows.",
}
_HOW_GENERIC = (
    "Even out what each rank receives: whatever the group carries (the load of each expert, "
    "each rank's shard of the embedding tables, its batch), the same amount on every rank."
)


@rule(
    code="COMM103",
    name="uneven-all-to-all",
    summary="An all-to-all's busiest receiver gets more than the mean: every call waits on it.",
    tables=("all_to_all_loads", "collectives", "steps", "process_groups"),
    options=(
        Option(
            "min_imbalance",
            1.05,
            "A group's all-to-alls are uneven when its mean exchange's busiest receiver gets "
            "at least this multiple of the mean receiver's load.",
        ),
        *SHARE_OPTIONS,
    ),
)
def uneven_all_to_all(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Reads the `all_to_all_loads` table (kineto_comm.analysis.alltoall: per all-to-all
    exchange of a group, what each rank received, from the calls' sizes and split sizes)
    and, per group whose mean exchange's `imbalance` (busiest receiver's load over the mean
    receiver's) is at least `min_imbalance`, states each rank's load per step, the
    imbalance, and the saving of balancing it, replayed on the model of time: each call's
    transfer, which lasts as long as its heaviest receiver's, scaled down to the mean load:
    the part of it that moves bytes (its transfer less the group's fitted latency,
    rules_api.cost_fit) loses the share 1 - mean / max of its exchange, taken out of its
    exposed transfer time and the tail chain's. Only the transfers are modelled: the compute
    that more tokens cost the busiest rank (its expert's) and the waits it causes are
    SYNC101's and SYNC104's.

    Why is this bad?
    An all-to-all ends when its busiest receiver has received all of its rows: with uneven
    loads every rank of the group waits for the one that receives most, and the link time of
    the others goes unused. In a mixture-of-experts layer the busiest receiver's expert
    also computes the most tokens, so the next exchange waits for it again.

    How to fix:
    Even out what each rank receives: for experts a load-balancing loss, a capacity factor
    or expert placement that spreads hot experts; for embeddings a sharding by measured
    lookups (torchrec's planner).
    """
    loads = tables["all_to_all_loads"]
    if loads.height == 0 or "imbalance" not in loads.columns:
        return []
    exchanges = loads.group_by("process_group", "call_index").agg(
        pl.col("imbalance").first(), pl.col("step").first(), pl.col("call").first()
    )
    groups = (
        exchanges.group_by("process_group")
        .agg(imbalance=pl.col("imbalance").mean(), steps=pl.col("step").n_unique())
        .filter(pl.col("imbalance") >= options["min_imbalance"])
        .sort("process_group")
    )
    if groups.height == 0:
        return []
    step_ns = mean_step_ns(tables)
    roles = dict(group_roles(tables).select("process_group", "role").iter_rows())
    # Each call's share of its transfer that balancing removes (1 - mean / max of its
    # exchange), weighted by its exposed transfer per rank, step and group: the blame's rows.
    cut = exchanges.select(
        "process_group",
        "call_index",
        _cut=pl.when(pl.col("imbalance") > 1).then(1 - 1 / pl.col("imbalance")).otherwise(0.0),
    )
    # Only the part of a call that moves bytes scales with its load: the cost fit's
    # latency (rules_api.cost_fit) stays.
    fit = cost_fit(tables).filter(pl.col("collective") == "all_to_all")
    latency = fit.select(pl.col("process_group").cast(pl.String), _latency="latency_ns")
    moving = (1 - pl.col("_latency").fill_null(0.0) / pl.col("transfer_ns")).clip(0.0, 1.0)
    calls = tables.collect(
        collective_exposure_lazy(tables)
        .filter(pl.col("collective") == "all_to_all")
        .select(
            pl.col("rank").cast(pl.Int64),
            pl.col("step").cast(pl.Int64),
            pl.col("process_group").cast(pl.String),
            "collective",
            pl.col("call_index").cast(pl.Int64),
            "exposed_ns",
            "transfer_ns",
        )
        .join(cut.lazy(), on=["process_group", "call_index"], how="inner")
        .join(latency.lazy(), on="process_group", how="left")
        .with_columns(
            _cut=pl.col("_cut") * pl.when(pl.col("transfer_ns") > 0).then(moving).otherwise(1.0)
        )
    )
    shares = calls.group_by("rank", "step", "process_group", "collective").agg(
        fraction=pl.when(pl.col("exposed_ns").sum() > 0)
        .then((pl.col("exposed_ns") * pl.col("_cut")).sum() / pl.col("exposed_ns").sum())
        .otherwise(pl.col("_cut").mean())
    )
    out = []
    for g in groups.iter_rows(named=True):
        pg = g["process_group"]
        mine = loads.filter(pl.col("process_group") == pg)
        per_rank = (
            mine.group_by("rank")
            .agg(per_step=pl.col("received_bytes").sum() / max(1, g["steps"]))
            .sort("rank")
        )
        mean = per_rank["per_step"].mean() or 0.0
        most = per_rank["per_step"].max() or 0.0
        by_call = (
            mine.group_by("call")
            .agg(pl.col("imbalance").mean())
            .sort("imbalance", "call", descending=[True, False], nulls_last=True)
        )
        worst = by_call.row(0, named=True)
        busiest = per_rank.filter(pl.col("per_step") == most)["rank"].to_list()
        edit = Edit(
            f"group {pg}'s all-to-alls balanced: each call's transfer (less the fitted "
            "latency) scaled down from its busiest receiver's load to the mean",
            (pl.col("category") == "transfer")
            & (pl.col("process_group") == pg)
            & (pl.col("collective") == "all_to_all"),
            shares.filter(pl.col("process_group") == pg),
            shortens=True,
        )
        saving = replay_saving(tables, edit)
        share = saving / step_ns if step_ns else 0.0
        sev = share_severity(share, options)
        if sev is None:
            continue
        role = roles.get(pg) or "unknown"
        loads_text = ", ".join(
            f"{r}: {_size(b)}" for r, b in per_rank.select("rank", "per_step").iter_rows()
        )
        out.append(
            make_finding(
                uneven_all_to_all,
                sev,
                f"Uneven all-to-all on group {pg}: the busiest receiver gets "
                f"{g['imbalance']:.2f}x the mean; balanced, the step is {saving / 1e6:.2f} ms "
                "shorter",
                f"The all-to-alls on group {pg} ({role}) are uneven: per step its ranks "
                f"receive {loads_text} (rank {busiest[0]} the most, "
                f"{most / mean if mean else 1.0:.2f}x the mean rank); in the mean exchange "
                f"the busiest receiver gets {g['imbalance']:.2f}x the mean receiver's load "
                f"(exchange {worst['call']} of each step the most: {worst['imbalance']:.2f}x). "
                f"With each call's transfer (less the group's fitted latency) scaled down from "
                f"its busiest receiver's load to the mean, the step would be "
                f"{saving / 1e6:.2f} ms shorter ({share:.1%} of {step_ns / 1e6:.2f} ms).",
                impact_ns_per_step=saving,
                step_ns=step_ns,
                ranks=busiest,
                process_group=pg,
                evidence={
                    "role": role,
                    "received_bytes_per_step": {
                        str(r): round(b) for r, b in per_rank.select("rank", "per_step").iter_rows()
                    },
                    "load_max_over_mean": round(most / mean, 3) if mean else None,
                    "call_imbalance": round(g["imbalance"], 3),
                    "imbalance_by_call": {
                        str(c): round(i, 3)
                        for c, i in by_call.sort("call").iter_rows()
                        if i is not None
                    },
                    "step_ns": step_ns,
                    "saving_method": f"replay: {edit.name}",
                },
                edit=edit,
                advice=(_HOW.get(role, _HOW_GENERIC),),
            )
        )
    return out


def _size(n: float) -> str:
    """Bytes for a sentence: 10.0 KiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
