"""Pipeline-parallel bubbles: how much of each step a pipeline stage spends without compute.

For every rank that does point-to-point traffic (send, recv, send_recv) the `pipeline` table
(docs/tables.md) gives, per step, the rank's stage, the pipeline depth p, the number of
micro-batches m, and how its step window splits into compute and bubble (warm-up, steady,
cool-down), against the theory (p - 1) / (m + p - 1).

Why: a stage that cannot compute because its input has not arrived is the bubble, whatever
the kernels say, so communication not hidden behind compute counts as idle. Stages come from
the p2p peer graph (else from when each rank's first activation arrives, on its own clock,
immune to clock offsets); micro-batches from stage 0's sends. The definitions, stages,
aggregation and micro-batch count in full: docs/analyses.md.
"""

from __future__ import annotations

import polars as pl

from kineto_comm import rank_store
from kineto_comm.analysis.graph import walk
from kineto_comm.analysis.overlap import breakdown
from kineto_comm.lazy import collect, collect_all
from kineto_comm.model.collectives import parse_ranks
from kineto_comm.model.names import POINT_TO_POINT
from kineto_comm.rank_store import RankStore, as_store

# In full: docs/analyses.md, "Pipeline bubbles".

P2P = POINT_TO_POINT  # send, recv, send_recv: calls with one peer
SENDS = ("send", "send_recv")
RECVS = ("recv", "send_recv")
PIPELINE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "step": pl.Int64(),
    "stage": pl.Int64(),
    "stages": pl.Int64(),
    "micro_batches": pl.Int64(),
    "busy_ns": pl.Int64(),
    "idle_ns": pl.Int64(),
    "warmup_idle_ns": pl.Int64(),
    "steady_idle_ns": pl.Int64(),
    "cooldown_idle_ns": pl.Int64(),
    "wall_ns": pl.Int64(),
    "bubble_fraction": pl.Float64(),
    "theory_fraction": pl.Float64(),
}
# What is read of the calls (those of them a table has).
_READ = ("rank", "step", "collective", "start_ns", "end_ns", "peer", "pg_ranks", "process_group")
_NEEDS = {
    "kernels": ("rank", "kind", "start_ns", "end_ns"),  # checked on DataFrames only
    "collectives": ("rank", "step", "collective", "start_ns", "end_ns", "peer"),
    "steps": ("rank", "step", "start_ns", "end_ns"),
}


def empty_pipeline() -> pl.DataFrame:
    """The pipeline table with no rows (and the documented columns and types)."""
    return pl.DataFrame(schema=PIPELINE_SCHEMA)


def pipeline(
    kernels: pl.DataFrame | RankStore,
    collectives: pl.DataFrame | RankStore,
    steps: pl.DataFrame | RankStore,
) -> pl.DataFrame:
    """The `pipeline` table: per p2p rank and step, stage, p, m and the bubble (module doc).

    kernels, collectives, steps: the report tables of those names (all ranks, one clock or
    each its own: nothing here compares times across ranks), DataFrames or RankStore
    stores. A window of ranks is read at a time (rank_store.SLICE_ROWS calls): a pipeline
    job's point-to-point calls grow with ranks x steps x micro-batches, and only their
    per-rank summaries meet across ranks. Ranks without point-to-point traffic give no
    rows; missing or empty inputs give an empty table.
    """
    if isinstance(kernels, pl.DataFrame):
        if not set(_NEEDS["kernels"]) <= set(kernels.columns):
            return empty_pipeline()
        kernels = RankStore.from_frame(kernels)
    calls, steps = as_store(collectives), as_store(steps)
    tables = {"collectives": calls, "steps": steps}
    if any(not set(_NEEDS[n]) <= set(t.columns) for n, t in tables.items()):
        return empty_pipeline()
    if not _any_p2p(calls):
        return empty_pipeline()
    found = [
        _summaries(kernels.restricted(lo, hi), calls.restricted(lo, hi), steps.restricted(lo, hi))
        for lo, hi in calls.windows(rank_store.SLICE_ROWS)
    ]
    found = [f for f in found if f is not None]
    if not found:
        return empty_pipeline()
    parts = {name: pl.concat([f[name] for f in found]) for name in found[0]}
    found.clear()
    if parts["idle"].height == 0:  # no step windows
        return empty_pipeline()
    stages = _stages(parts["pairs"].unique(), parts["groups"], parts["ranks"], parts["firsts"])
    micro = _micro_batches(parts["counts"], stages)
    idle = parts["idle"]
    p, m = pl.col("stages"), pl.col("micro_batches")
    return (
        idle.join(stages, on="rank", how="inner")
        .join(micro, on=["pipeline", "step"], how="left")
        .with_columns(
            bubble_fraction=pl.when(pl.col("wall_ns") > 0)
            .then(pl.col("idle_ns") / pl.col("wall_ns"))
            .otherwise(None),
            theory_fraction=(p - 1) / (m + p - 1),
        )
        .select([pl.col(c).cast(t) for c, t in PIPELINE_SCHEMA.items()])
        .sort("rank", "step")
    )


def _any_p2p(calls: RankStore) -> bool:
    """Whether some call is point-to-point (a count reads one column of every rank's calls;
    the calls themselves, many more)."""
    query = calls.lazy(["collective"]).select(pl.col("collective").is_in(P2P).any())
    return bool(collect(query, calls.height).item())


def _summaries(
    kernels: RankStore, calls: RankStore, steps: RankStore
) -> dict[str, pl.DataFrame] | None:
    """What the pipeline table needs of some ranks' point-to-point calls: the ranks, their
    peer pairs, calls per (rank, group), sends and recvs per (rank, step), firsts
    (_first_calls), and idle (_idle) over their step windows. None without such calls."""
    names = [c for c in _READ if c in calls.columns]
    where = pl.col("collective").is_in(P2P)
    p2p = collect(_p2p_calls(calls.lazy(names, where=where)), calls.height)
    if p2p.height == 0:
        return None
    # The steps' own compute time and edges, where the per-rank model measured them (a
    # Report's steps): the union of compute kernels in the same windows, where it starts and
    # where it ends, which _idle would otherwise sweep the kernels for again.
    measured = [c for c in _MEASURED if c in steps.columns]
    windows = collect(
        steps.lazy([*_NEEDS["steps"], *measured])
        .select(pl.all().cast(pl.Int64))
        .filter(pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null())
        .join(p2p.lazy().select("rank").unique(), on="rank", how="semi"),
        steps.height,
    )
    is_send, is_recv = pl.col("collective").is_in(SENDS), pl.col("collective").is_in(RECVS)
    calls_of = p2p.lazy()
    # One plan for all of them (each alone is mostly a query's fixed cost).
    queries = {
        "ranks": calls_of.select("rank").unique(),
        "pairs": calls_of.drop_nulls("peer").select(src="rank", dst="peer").unique(),
        "groups": calls_of.group_by("rank", "group").len(),
        "counts": calls_of.group_by("rank", "step").agg(sends=is_send.sum(), recvs=is_recv.sum()),
        "firsts": _first_calls(calls_of, windows.lazy()),
        "idle": _idle(kernels, windows),
    }
    return dict(zip(queries, collect_all(list(queries.values())), strict=True))


# What the per-rank model's sweep measures of each step window (kineto_comm.analysis.overlap),
# by the names this table gives it: compute time, where compute first starts, last ends.
_SWEPT = {"busy_ns": "compute_ns", "first_ns": "compute_start_ns", "last_ns": "compute_end_ns"}
_MEASURED = tuple(_SWEPT.values())


def _p2p_calls(collectives: pl.LazyFrame) -> pl.LazyFrame:
    """The p2p calls: rank, step, collective, start_ns, end_ns, peer, group.

    A null peer is taken from a 2-rank process group (`pg_ranks`): the rank that is not this
    one. `group` is the process group name ("" when unknown), used for ranks without peers.
    """
    cols = collectives.collect_schema().names()
    ranks_text = pl.col("pg_ranks") if "pg_ranks" in cols else pl.lit(None, dtype=pl.String)
    group = pl.col("process_group") if "process_group" in cols else pl.lit(None, pl.String)
    members = parse_ranks(ranks_text)
    first, second = members.list.get(0, null_on_oob=True), members.list.get(1, null_on_oob=True)
    rank = pl.col("rank")
    other = (
        pl.when((members.list.len() == 2) & (first == rank))
        .then(second)
        .when((members.list.len() == 2) & (second == rank))
        .then(first)
        .otherwise(None)
    )
    calls = collectives.filter(pl.col("collective").is_in(P2P)).select(
        rank.cast(pl.Int64),
        pl.col("step").cast(pl.Int64),
        "collective",
        pl.col("start_ns").cast(pl.Int64),
        pl.col("end_ns").cast(pl.Int64),
        peer=pl.coalesce(pl.col("peer").cast(pl.Int64), other),
        group=group.cast(pl.String).fill_null(""),
    )
    return calls.with_columns(
        peer=pl.when(pl.col("peer") == pl.col("rank")).then(None).otherwise(pl.col("peer"))
    ).filter(pl.col("rank").is_not_null())


def _first_calls(p2p: pl.LazyFrame, windows: pl.LazyFrame) -> pl.LazyFrame:
    """Per rank: send_first (share of steps whose first p2p call is a send) and lead_ns.

    lead_ns is the median over steps of (end of the first recv - the rank's window start).
    """
    per_step = (
        p2p.join(windows.rename({"start_ns": "w_start", "end_ns": "w_end"}), on=["rank", "step"])
        .sort("rank", "step", "start_ns", "end_ns")
        .group_by("rank", "step")
        .agg(
            send_first=(pl.col("collective").first() == "send").cast(pl.Float64),
            lead_ns=(
                pl.col("end_ns").filter(pl.col("collective").is_in(RECVS)).first()
                - pl.col("w_start").first()
            ),
        )
    )
    return per_step.group_by("rank").agg(pl.col("send_first").mean(), pl.col("lead_ns").median())


def _adjacency(edges: pl.DataFrame) -> dict[int, list[int]]:
    """Each rank's neighbours in an edge list (src, dst): the peer graph (graph.walk)."""
    links: dict[int, list[int]] = {}
    for src, dst in zip(edges["src"].to_list(), edges["dst"].to_list(), strict=True):
        links.setdefault(src, []).append(dst)
    return links


def _components(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """Connected components (rank, comp = smallest rank in it) of an undirected edge list
    (src, dst, both directions) over `nodes` (rank)."""
    ranks = sorted(nodes["rank"].to_list())
    links = _adjacency(edges)
    comp: dict[int, int] = {}
    for root in ranks:  # ascending: each component is first met at its smallest rank
        if root not in comp:
            comp[root] = root
            comp.update((rank, root) for rank, _ in walk(links, [root]))
    return pl.DataFrame(
        {"rank": ranks, "comp": [comp[r] for r in ranks]},
        schema={"rank": pl.Int64, "comp": pl.Int64},
    )


def _distances(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """Hop distance (rank, dist) from the nodes with `start` set (null where unreached)."""
    ranks = nodes["rank"].to_list()
    starts = nodes.filter(pl.col("start"))["rank"].to_list()
    dist = dict.fromkeys(starts, 0)
    for rank, prev in walk(_adjacency(edges), starts):
        dist[rank] = dist[prev] + 1
    return pl.DataFrame(
        {"rank": ranks, "dist": [dist.get(r) for r in ranks]},
        schema={"rank": pl.Int64, "dist": pl.Int64},
    )


def _stages(
    pairs: pl.DataFrame, groups: pl.DataFrame, ranks: pl.DataFrame, firsts: pl.DataFrame
) -> pl.DataFrame:
    """rank, pipeline (a key), stage, stages for every rank with p2p calls (module doc), from
    the calls' summaries (_summaries): peer pairs, calls per (rank, group), ranks, firsts."""
    edges = pl.concat([pairs, pairs.select(src="dst", dst="src")]).unique()
    main_group = (
        groups.sort("rank", "len", "group", descending=[False, True, False])
        .group_by("rank", maintain_order=True)
        .agg(pl.col("group").first())
    )
    nodes = (
        pl.concat([ranks, edges.select(rank="src")])
        .unique()
        .join(firsts, on="rank", how="left")
        .join(main_group, on="rank", how="left")
        .join(edges.group_by("src").len("degree"), left_on="rank", right_on="src", how="left")
        .with_columns(
            pl.col("degree").fill_null(0).cast(pl.Int64),
            pl.col("send_first").fill_null(0.5),  # a peer without a trace: unknown
            pl.col("group").fill_null(""),
        )
    )
    comps = _components(edges, nodes)
    nodes = nodes.join(comps, on="rank").with_columns(
        size=pl.len().over("comp"),
        is_path=(
            (pl.col("degree") == 1).sum().over("comp").eq(2)
            & (pl.col("degree") <= 2).all().over("comp")
        ),
        lead_key=pl.col("lead_ns").fill_null(pl.col("lead_ns").max() + 1).fill_null(0),
    )
    # Paths: distance from the end that sends first (then the earlier lead, then lower rank).
    ends = nodes.filter(pl.col("is_path") & (pl.col("degree") == 1))
    start = (
        ends.sort("comp", "send_first", "lead_key", "rank", descending=[False, True, False, False])
        .group_by("comp", maintain_order=True)
        .agg(pl.col("rank").first())
    )
    dist = _distances(
        edges, nodes.select("rank", start=pl.col("rank").is_in(start["rank"].implode()))
    )
    on_path = (
        nodes.filter(pl.col("is_path"))
        .join(dist, on="rank")
        .select(
            "rank",
            pipeline=pl.format("c{}", pl.col("comp")),
            stage=pl.col("dist"),
            stages=pl.col("size").cast(pl.Int64),
        )
    )
    # Everyone else: ordered by lead time inside the component, or, without peers, the group.
    rest = nodes.filter(~pl.col("is_path")).with_columns(
        pipeline=pl.when(pl.col("degree") > 0)
        .then(pl.format("c{}", pl.col("comp")))
        .otherwise(pl.format("g{}", pl.col("group")))
    )
    head = pl.col("send_first") > 0.5
    heads = head.sum().over("pipeline")
    d = pl.max_horizontal(heads, pl.lit(1))
    order = pl.int_range(pl.len(), dtype=pl.Int64).over("pipeline", "_head")
    shift = pl.when(heads > 0).then(1).otherwise(0)
    others = pl.len().over("pipeline") - heads
    timed = (
        rest.with_columns(_head=head)
        .sort("pipeline", "lead_key", "rank")
        .with_columns(
            stage=pl.when(head).then(0).otherwise(shift + order // d),
            stages=shift + (others + d - 1) // d,
        )
        .select("rank", "pipeline", pl.col("stage").cast(pl.Int64), pl.col("stages").cast(pl.Int64))
    )
    return pl.concat([on_path, timed]).join(ranks, on="rank", how="semi")


def _micro_batches(counts: pl.DataFrame, stages: pl.DataFrame) -> pl.DataFrame:
    """pipeline, step, micro_batches: forward sends of stage 0, else forward recvs of the last
    (`counts`: sends and recvs per rank and step)."""
    counts = counts.join(stages, on="rank")
    first = pl.col("sends").filter(pl.col("stage") == 0).median()
    last = pl.col("recvs").filter(pl.col("stage") == pl.col("stages") - 1).median()
    per_step = counts.group_by("pipeline", "step").agg(m=pl.coalesce(first, last))
    return per_step.select(
        "pipeline",
        "step",
        micro_batches=pl.coalesce("m", pl.col("m").median().over("pipeline"))
        .round()
        .cast(pl.Int64),
    )


def _idle(kernels: RankStore, windows: pl.DataFrame) -> pl.LazyFrame:
    """rank, step, wall/busy/idle and its warm-up / steady / cool-down split per window."""
    if set(_MEASURED) <= set(windows.columns):  # measured per rank: no kernel is read
        placed = windows.lazy().with_columns(**{k: pl.col(c) for k, c in _SWEPT.items()})
    else:
        ranks = windows["rank"].unique().sort().to_list()
        need = list(_NEEDS["kernels"])
        found = [_compute_edges(batch, windows) for batch in kernels.batches(ranks, need)]
        edges = pl.concat(found) if found else pl.DataFrame(schema=_EDGES)
        placed = windows.lazy().join(edges.lazy(), on=["rank", "step"], how="left")
    out = (
        placed.with_columns(
            pl.col("busy_ns").fill_null(0),
            wall_ns=pl.col("end_ns") - pl.col("start_ns"),
        )
        .with_columns(
            idle_ns=pl.col("wall_ns") - pl.col("busy_ns"),
            warmup_idle_ns=pl.coalesce(pl.col("first_ns") - pl.col("start_ns"), "wall_ns"),
            cooldown_idle_ns=pl.coalesce(pl.col("end_ns") - pl.col("last_ns"), pl.lit(0)),
        )
        .with_columns(
            steady_idle_ns=pl.col("idle_ns") - pl.col("warmup_idle_ns") - pl.col("cooldown_idle_ns")
        )
    )
    return out.select(
        "rank",
        "step",
        "busy_ns",
        "idle_ns",
        "warmup_idle_ns",
        "steady_idle_ns",
        "cooldown_idle_ns",
        "wall_ns",
    )


_EDGES = {
    "rank": pl.Int64,
    "step": pl.Int64,
    "busy_ns": pl.Int64,
    "first_ns": pl.Int64,
    "last_ns": pl.Int64,
}


def _compute_edges(kernels: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per window of the ranks in `kernels`: compute time (busy_ns) and when compute first
    starts and last ends inside it (null without compute), by the per-rank model's own sweep
    (overlap.breakdown) over their compute kernels: for steps that do not carry them."""
    compute = kernels.filter(pl.col("kind") == "compute").select(
        pl.col("rank").cast(pl.Int64),
        "kind",
        pl.col("start_ns").cast(pl.Int64),
        pl.col("end_ns").cast(pl.Int64),
    )
    windows = windows.filter(
        pl.col("rank").is_in(kernels["rank"].unique().cast(pl.Int64).implode())
    )
    swept = breakdown(compute, windows.rename({"step": "window"})).select(
        "rank", step="window", **_SWEPT
    )
    return swept.select([pl.col(c).cast(t) for c, t in _EDGES.items()])
