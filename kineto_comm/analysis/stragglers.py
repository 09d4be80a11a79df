"""Which rank makes the others wait, by how much, and how sure we are.

For every matched collective call seen by two or more ranks, the last rank to arrive is
charged with its own lateness (its arrival minus the second-latest arrival, less the time
its own earlier calls had held it up without compute) and with the waits of all the others;
point-to-point calls name no one (their order is the pipeline schedule's). A rank's delay
per step is the largest lateness it caused in that step, averaged over steps (`delay_ns`:
the step time its lateness costs). `late_share` is its share of all lateness;
`confidence` (share of steps it was the most late x `late_share`) is near 1 for a rank
consistently late, near 0 when the last arrival moves around. Calls whose arrival skew is
below `noise_ns` name no one.

This table is the one home of the verdict: SYNC101 names the `is_straggler` ranks with their
`delay_ns`, SYNC104 takes that delay off, the text report prints them.
In full: docs/analyses.md, "Stragglers".
"""

from __future__ import annotations

import polars as pl

from kineto_comm.analysis.overlap import disjoint_pieces, uncovered_ns
from kineto_comm.lazy import collect
from kineto_comm.model.names import POINT_TO_POINT
from kineto_comm.rank_store import RankStore, SpillFolder, as_store, keep

P2P = POINT_TO_POINT  # send, recv, send_recv: calls with one peer
# Calls whose arrival skew is below this name no one last (the report's "most often last"
# counts the same calls).
NOISE_NS = 5_000
STRAGGLER_COLUMNS = (
    "rank",
    "instances",
    "times_last",
    "last_share",
    "caused_wait_ns",
    "caused_wait_ns_per_step",
    "delay_ns",
    "late_share",
    "is_straggler",
    "confidence",
)


def stragglers(
    instances: pl.DataFrame,
    waits: pl.DataFrame | RankStore,
    kernels: pl.DataFrame | RankStore | None = None,
    *,
    noise_ns: int = NOISE_NS,
    min_delay_ns: int = 20_000,
    min_confidence: float = 0.5,
) -> pl.DataFrame:
    """One row per rank (docs/tables.md `stragglers`).

    kernels (rank, kind, start_ns, end_ns; the waits' clock): a rank's earlier calls count
    as holding it up only where no compute or memory kernel of it ran (a call on a side
    stream overlapping the rank's compute holds up nothing); without them, their waits.

    Every pass over the waits (a row per call and rank) aggregates into few groups or joins
    with a table of calls: on a big job the streaming engine runs them in bounded memory."""
    waits = as_store(waits)
    if waits.height == 0:
        return pl.DataFrame(schema=_schema())
    # Point-to-point calls are left out: which pipeline stage arrives last at a send/recv is
    # the schedule's order (PIPE101's), not a rank's lateness. Their waits still count below.
    is_p2p = (
        pl.col("collective").is_in(P2P).fill_null(False)
        if "collective" in instances.columns
        else pl.lit(False)
    )
    shared = instances.filter((pl.col("ranks_seen") > 1) & ~is_p2p).select(
        "instance", "step", "last_rank", "arrival_skew_ns", "last_start_ns"
    )
    n_steps = max(shared["step"].n_unique(), 1)
    # Per call, how long its rank had waited for others earlier in the step (`_before`: its
    # earlier calls' waits, point-to-point included): a rank held up by another arrives late
    # without being late itself.
    steps = instances.lazy().select("instance", "step")
    # `_keep` holds the held-up rows' files (a big job's) while the queries below read them.
    held, _keep = _held_up(waits, kernels)
    calls = (
        held.join(steps, on="instance", how="left")
        .with_columns(
            _before=(pl.col("_w").cum_sum() - pl.col("_w")).over(
                ["rank", "step"], order_by=["start_ns", "instance"]
            )
        )
        .drop("step", "_w")
    )
    # The second-latest arrival: the latest again if two ranks share it, else the latest
    # of the earlier ones, with how long it had waited before. Each pass over the calls is
    # collected on its own (lazy.py).
    start, latest = pl.col("start_ns"), pl.col("last_start_ns")
    earlier = start < latest
    second = collect(
        calls.join(
            shared.lazy().select("instance", "last_start_ns"),
            on="instance",
            build_side="force_right",
        )
        .group_by("instance")
        .agg(
            _ties=(start == latest).sum(),
            _latest=latest.first(),
            _earlier=pl.when(earlier).then(start).max(),
            _earlier_before=pl.col("_before").filter(earlier).sort_by(start.filter(earlier)).last(),
        )
        .select(
            "instance",
            second_ns=pl.when(pl.col("_ties") > 1)
            .then(pl.col("_latest"))
            .otherwise(pl.col("_earlier")),
            second_before_ns=pl.col("_earlier_before"),
        ),
        waits.height,
    )
    # Per call, its last rank's lateness (the calls, the bigger side, stream through the join):
    # its arrival after the second-latest, less what it had waited for others beyond what
    # that rank had (a delay it passed on, not its own).
    arrived = pl.col("start_ns") - pl.col("second_ns")
    passed_on = (pl.col("_before") - pl.col("second_before_ns").fill_null(0)).clip(lower_bound=0)
    late = collect(
        calls.select("instance", "rank", "start_ns", "_before")
        .join(
            shared.lazy().join(second.lazy(), on="instance"),
            left_on=["instance", "rank"],
            right_on=["instance", "last_rank"],
            build_side="force_right",
        )
        .with_columns(
            last_rank=pl.col("rank"),
            lateness_ns=(arrived - pl.min_horizontal(passed_on, arrived)).clip(lower_bound=0),
        )
        .filter(pl.col("arrival_skew_ns") >= noise_ns)
        .drop("_before", "second_before_ns"),
        waits.height,
    ).lazy()
    caused = collect(
        calls.join(late.select("instance", "last_rank"), on="instance", build_side="force_right")
        .filter(pl.col("rank") != pl.col("last_rank"))
        .group_by("last_rank")
        .agg(caused_wait_ns=pl.col("wait_ns").sum())
        .rename({"last_rank": "rank"}),
        waits.height,
    ).lazy()
    per_step = late.group_by("last_rank", "step").agg(
        step_late_ns=pl.col("lateness_ns").max(), total_late_ns=pl.col("lateness_ns").sum()
    )
    # Ties (two ranks as late in a step) go to the lowest rank: the same job, the same table.
    winners = per_step.group_by("step").agg(
        winner=pl.col("last_rank")
        .sort_by(["total_late_ns", "last_rank"], descending=[True, False])
        .first()
    )
    # Summed over the ranks, the ranks' lateness is all the lateness (1 when there is none).
    rank_late = pl.col("_late")
    all_late = pl.when(rank_late.sum() == 0).then(1).otherwise(rank_late.sum())
    by_rank = (
        per_step.group_by("last_rank")
        .agg(
            delay_ns=(pl.col("step_late_ns").sum() / n_steps).round().cast(pl.Int64),
            _late=pl.col("total_late_ns").sum(),
        )
        .with_columns(late_share=rank_late / all_late)
        .drop("_late")
        .join(
            winners.group_by("winner").agg(won=pl.len()),
            left_on="last_rank",
            right_on="winner",
            how="left",
        )
        .rename({"last_rank": "rank"})
    )
    is_shared = pl.col("instance").is_in(shared["instance"].implode())
    counts = collect(
        calls.group_by("rank").agg(instances=is_shared.sum().cast(pl.Int64)), waits.height
    ).lazy()
    lasts = (
        late.group_by("last_rank")
        .agg(times_last=pl.len().cast(pl.Int64))
        .rename({"last_rank": "rank"})
    )
    table = (
        counts.join(lasts, on="rank", how="left")
        .join(caused, on="rank", how="left")
        .join(by_rank, on="rank", how="left")
        .with_columns(
            times_last=pl.col("times_last").fill_null(0),
            caused_wait_ns=pl.col("caused_wait_ns").fill_null(0),
            delay_ns=pl.col("delay_ns").fill_null(0),
            late_share=pl.col("late_share").fill_null(0.0),
            confidence=(pl.col("won").fill_null(0) / n_steps * pl.col("late_share").fill_null(0)),
        )
        .with_columns(
            last_share=pl.when(pl.col("instances") > 0)
            .then(pl.col("times_last") / pl.col("instances"))
            .otherwise(0.0),
            caused_wait_ns_per_step=(pl.col("caused_wait_ns") / n_steps).round().cast(pl.Int64),
            is_straggler=(pl.col("confidence") >= min_confidence)
            & (pl.col("delay_ns") >= min_delay_ns),
        )
    )
    return collect(table.select(STRAGGLER_COLUMNS).sort("rank"), waits.height)


def _held_up(
    waits: RankStore, kernels: pl.DataFrame | RankStore | None
) -> tuple[pl.LazyFrame, RankStore | None]:
    """instance, rank, start_ns, wait_ns and `_w`: how long the call held its rank up: the
    part of it (waiting or moving data: a slow link holds a rank up as much as a late peer)
    during which no compute or memory kernel of its rank ran, a batch of whole ranks at a
    time; its wait without `kernels`. As a lazy query, with the store that holds its rows
    (in files, like the waits, on a big job: the caller keeps it while it reads them)."""
    columns = ["instance", "rank", "start_ns", "wait_ns"]
    if kernels is None:
        return waits.lazy(columns).with_columns(_w=pl.col("wait_ns").clip(lower_bound=0)), None
    columns.append("end_ns")
    kernels = as_store(kernels)
    # Kept like the waits: in files on a big job (a row per call and rank).
    folder = SpillFolder() if waits.spilled else None
    parts = []
    for batch in waits.batches(columns=columns):
        ranks = batch["rank"].unique().to_list()
        busy = [
            k.filter(pl.col("kind") != "communication").select(
                pl.col("rank").cast(pl.Int64), "start_ns", "end_ns"
            )
            for k in kernels.batches(ranks=ranks, columns=["kind", "start_ns", "end_ns"])
        ]
        # Each rank's kernels come in start order (the kernels table's): no sort.
        busy_all = pl.concat(busy) if busy else pl.DataFrame(schema=_SPAN)
        cover = disjoint_pieces(busy_all, ordered=True)
        spans = batch.select(pl.col("rank").cast(pl.Int64), "start_ns", "end_ns")
        parts.append(keep(batch.with_columns(_w=uncovered_ns(spans, cover).cast(pl.Int64)), folder))
    if not parts:
        return waits.lazy(columns).with_columns(_w=pl.lit(0, dtype=pl.Int64)), None
    store = RankStore(parts, folder=folder)
    return store.lazy(), store


_SPAN = {"rank": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64}


def _schema() -> dict[str, pl.DataType]:
    schema: dict[str, pl.DataType] = {c: pl.Int64() for c in STRAGGLER_COLUMNS}
    schema["last_share"] = pl.Float64()
    schema["late_share"] = pl.Float64()
    schema["confidence"] = pl.Float64()
    schema["is_straggler"] = pl.Boolean()
    return schema
