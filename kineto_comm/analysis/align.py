"""Clock alignment: a per-rank offset estimated from matched collectives.

Ranks on different hosts read different clocks. A collective completes at nearly the same
instant on every rank of its group (nobody leaves before the last byte arrives), so each
matched call's end times differ across ranks mostly by the clock offsets:
`end(rank, call) = T(call) + offset(rank)`.

The fit. Each call pairs its lowest rank with each of its other ranks; per pair of ranks,
the median of their end differences is a link (robust to the few calls whose ends
genuinely differ), and the median distance of a difference from it, its spread. The
tightest links that join all ranks (a minimum spanning tree by spread, _tree) carry the
offsets outwards from the lowest rank of each linked set of ranks: ranks that never share
a group with rank 0 are aligned through the ranks in between, and a rank's few calls
across hosts count however many it has with its own host. Offsets are relative to that
lowest rank (method `reference`, offset 0): one set in a job whose collectives span it.

What is applied. A link moves its far end only when its gap is at least SIGNIFICANCE
times its spread and MIN_OFFSET_NS: else the two ranks read one clock as far as the trace
can tell (collectives whose ends genuinely vary would otherwise shift ranks that share
one). `estimate_ns` sums every gap on a rank's way from its reference, `offset_ns` only
the significant ones (method `collective-end` when there is one, else `insignificant`).
`residual_ns` is the median distance of the rank's ends, less its estimate, from its calls'
times (the median over each call's ranks): how far the estimate leaves it off.

Calls not used. Host-timeline (gloo) calls: a send ends when the data is handed off, a
ring all-reduce ends on each rank at its own last hop (tens of us apart, consistently),
which would pass for an offset; CPU-only jobs keep each trace's own clock. Point-to-point
and rooted calls (send, recv, broadcast, reduce, gather, scatter): one side may finish
without waiting for the other (a small send completes once its bytes sit in the peer's
buffer, before the recv is even posted). On the real 8-stage pipeline capture (one clock,
sends and recvs only) they fitted offsets of up to 7 ms with residuals of 1-5 ms; with 3 ms
per pair of stages added to the ends, one rank got a 14 ms offset applied, 8 ms off the
truth. Ranks linked only by such calls keep their own clocks (method `none`, or each set its
own `reference`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from kineto_comm.analysis.graph import walk
from kineto_comm.lazy import collect, sample
from kineto_comm.model.names import POINT_TO_POINT

if TYPE_CHECKING:
    from kineto_comm.rank_store import RankStore

OFFSET_COLUMNS = ("rank", "offset_ns", "estimate_ns", "residual_ns", "matched", "method")
# A link's gap is applied only when it clearly exceeds the link's spread: ranks on one host
# (one clock) otherwise get offsets that are noise of the collectives' end times.
SIGNIFICANCE = 3.0
MIN_OFFSET_NS = 1_000
# Calls whose ends need not meet (module doc): never used for offsets.
ONE_SIDED = (*POINT_TO_POINT, "broadcast", "reduce", "gather", "scatter")


def estimate_offsets(keyed: pl.DataFrame | RankStore, ranks: list[int]) -> pl.DataFrame:
    """Offsets per rank from matched calls (keyed: rank, device, instance, end_ns)."""
    from kineto_comm.analysis.match import one_row_per_call
    from kineto_comm.rank_store import as_store

    keyed = as_store(keyed)
    # Only device kernels (NCCL/RCCL) complete together on all ranks. Host-side gloo spans
    # do not: a send ends when the data is handed off, a ring all-reduce ends on each rank
    # at its own last hop (tens of us apart, consistently), which would pass for an offset.
    usable = pl.col("instance").is_not_null() & (pl.col("device") != -1)
    read = ["instance", "rank", "device", "end_ns"]
    if "collective" in keyed.columns:
        usable = usable & ~pl.col("collective").is_in(ONE_SIDED)
        read.append("collective")
    calls = keyed.lazy(read).filter(usable)
    # Above SAMPLE_ROWS rows, every k-th call: an evenly spread sample whose medians hold
    # the same offsets, in bounded memory (docs/scale.md).
    calls = sample(calls, keyed.height, "instance").select("instance", "rank", "end_ns")
    if not one_row_per_call(keyed):  # a rank's call seen twice: its latest end
        calls = calls.group_by("instance", "rank").agg(pl.col("end_ns").max())
    shared = calls.group_by("instance").agg(pl.len().alias("n")).filter(pl.col("n") > 1)
    ends = collect(
        calls.join(
            shared.select("instance"), on="instance", how="semi", build_side="force_right"
        ).with_columns(pl.col("end_ns").cast(pl.Float64)),
        keyed.height,
    )
    base = pl.DataFrame({"rank": ranks}, schema={"rank": pl.Int64})
    if ends.height == 0 or not ranks:
        return no_offsets(ranks)
    tree = _tree(_links(ends))
    # How well each rank's ends fit the estimates: each call's time as the median of its
    # ranks' ends less their estimates, the rank's misfit the median distance from it.
    fit = _fit(ends, tree)
    rounded = pl.col("estimate").round().cast(pl.Int64)
    return (
        base.join(tree, on="rank", how="left")
        .join(fit, on="rank", how="left")
        .select(
            "rank",
            offset_ns=pl.col("offset").round().cast(pl.Int64).fill_null(0),
            estimate_ns=rounded,
            residual_ns=pl.col("residual_ns").round().cast(pl.Int64),
            matched=pl.col("matched").fill_null(0),
            method=pl.when(pl.col("estimate").is_null())
            .then(pl.lit("none"))
            .when(pl.col("rank") == pl.col("root"))
            .then(pl.lit("reference"))
            .when(pl.col("applied"))
            .then(pl.lit("collective-end"))
            .otherwise(pl.lit("insignificant")),
        )
        .sort("rank")
    )


def _fit(ends: pl.DataFrame, tree: pl.DataFrame) -> pl.DataFrame:
    """rank, residual_ns (the median distance of the rank's ends, less its estimate, from
    its calls' times: the median over each call's ranks) and matched (its calls). Eager:
    a small job has a few hundred ends, and planning a lazy query cost twice the work."""
    estimate = pl.col("rank").replace_strict(tree["rank"], tree["estimate"])
    call_time = (pl.col("end_ns") - estimate).median().over("instance")
    return (
        ends.select("rank", _misfit=(pl.col("end_ns") - estimate - call_time).abs())
        .group_by("rank")
        .agg(residual_ns=pl.col("_misfit").median(), matched=pl.len().cast(pl.Int64))
    )


def _links(ends: pl.DataFrame) -> pl.DataFrame:
    """Per pair of ranks that share calls (src < dst): `gap`, the median over those calls of
    dst's end minus src's end (dst's offset minus src's, as far as clocks explain it);
    `spread`, the median distance of a call's difference from that gap (how far the link
    can be trusted); and `calls`, how many. Each call pairs its lowest rank with each other
    rank, so a call adds one pair per rank, not one per pair of ranks."""
    lead = pl.col("rank").min().over("instance")
    lead_end = pl.col("end_ns").filter(pl.col("rank") == lead).first().over("instance")
    gap = pl.col("gap")
    return (
        ends.select("instance", "rank", src=lead, gap=pl.col("end_ns") - lead_end)
        .filter(pl.col("rank") != pl.col("src"))
        .group_by("src", "rank")
        .agg(gap.median(), spread=(gap - gap.median()).abs().median(), calls=pl.len())
        .select("src", dst="rank", gap="gap", spread="spread", calls="calls")
    )


def _tree(links: pl.DataFrame) -> pl.DataFrame:
    """rank, root, estimate, offset, applied: each linked set of ranks on the clock of its
    lowest rank (its root), through the tightest links (_links) that join the set.

    The links kept are a minimum spanning tree by spread (Kruskal: the tightest first, then
    the most calls, then the lowest ranks), so ranks whose ends agree closely (a
    tensor-parallel pair) are always placed by their own link, and a set of them hangs
    from the rest by one link. A rank's `estimate` is the sum of the gaps on its way from
    the root; its `offset` (what is applied) sums only the links whose gap is significant
    (at least SIGNIFICANCE times their spread and MIN_OFFSET_NS): an insignificant link
    says both ranks read one clock as far as the trace can tell. `applied`: some link on
    the way is. Deciding per link and not per rank never pulls apart two ranks whose own
    link is sure: on the real tp-dp-8 capture, a pair whose ends agree to 1 us at a 2.24
    ms gap kept it, whatever the data-parallel ends (scattered over 13 ms) said of the
    pair against the rest.

    Why a tree of links and not one fit of all calls by alternating medians: a median
    follows the majority of a rank's calls. A rank whose calls are mostly with ranks of its
    own host (tensor parallel) kept the offset of its host-mates whatever its few calls
    across hosts (data parallel) said: on a generated tensor- and data-parallel job over
    two hosts 94 us apart, every rank stayed at 0. The tree is walked in Python
    (kineto_comm.analysis.graph).
    """
    rows = links.sort("spread", "calls", "src", "dst", descending=[False, True, False, False])
    leader: dict[int, int] = {}

    def find(rank: int) -> int:
        while leader.setdefault(rank, rank) != rank:
            leader[rank] = leader[leader[rank]]
            rank = leader[rank]
        return rank

    near: dict[int, list[tuple[int, float, bool]]] = {}
    for src, dst, gap, spread, _ in rows.iter_rows():
        near.setdefault(src, [])
        near.setdefault(dst, [])
        a, b = find(src), find(dst)
        if a == b:
            continue
        leader[max(a, b)] = min(a, b)
        sure = abs(gap) >= MIN_OFFSET_NS and abs(gap) >= SIGNIFICANCE * spread
        near[src].append((dst, gap, sure))
        near[dst].append((src, -gap, sure))
    links = {rank: [n for n, _, _ in near[rank]] for rank in near}
    edge = {(rank, n): (gap, sure) for rank in near for n, gap, sure in near[rank]}
    found: dict[int, tuple[int, float, float, bool]] = {}
    for start in sorted(near):  # ascending: each set is first met at its lowest rank
        if start in found:
            continue
        found[start] = (start, 0.0, 0.0, False)
        for rank, prev in walk(links, [start]):
            gap, sure = edge[prev, rank]
            _, estimate, offset, applied = found[prev]
            found[rank] = (start, estimate + gap, offset + gap if sure else offset, applied or sure)
    ranks = sorted(found)  # never empty: every link has two ranks
    root, estimate, offset, applied = zip(*(found[r] for r in ranks), strict=True)
    return pl.DataFrame(
        {"rank": ranks, "root": root, "estimate": estimate, "offset": offset, "applied": applied},
        schema={
            "rank": pl.Int64,
            "root": pl.Int64,
            "estimate": pl.Float64,
            "offset": pl.Float64,
            "applied": pl.Boolean,
        },
    )


def no_offsets(ranks: list[int]) -> pl.DataFrame:
    """The offsets table when alignment is turned off."""
    return pl.DataFrame(
        {"rank": ranks},
        schema={"rank": pl.Int64},
    ).with_columns(
        offset_ns=pl.lit(0, dtype=pl.Int64),
        estimate_ns=pl.lit(None, dtype=pl.Int64),
        residual_ns=pl.lit(None, dtype=pl.Int64),
        matched=pl.lit(0, dtype=pl.Int64),
        method=pl.lit("none"),
    )


def shift(table: pl.DataFrame, offsets: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    """Subtract each row's rank offset from the given time columns."""
    if table.height == 0 or "rank" not in table.columns:
        return table
    moved = shifted(offsets, [c for c in columns if c in table.columns])
    # Nothing to move: no copy of a table that may hold every kernel.
    return table.with_columns(moved) if moved else table


def shifted(offsets: pl.DataFrame, columns: list[str]) -> list[pl.Expr]:
    """Expressions for `columns` less each row's rank offset (none when no offset moves)."""
    # Read as Python lists: a row per rank, and every read of a store asks (a query here
    # cost as much as some of the reads).
    ranks, values = offsets.get_column("rank").to_list(), offsets["offset_ns"].to_list()
    moved = [(rank, value) for rank, value in zip(ranks, values, strict=True) if value]
    if not moved or not columns:
        return []
    by_rank = pl.col("rank").replace_strict(
        pl.Series([r for r, _ in moved], dtype=pl.Int64),
        pl.Series([v for _, v in moved], dtype=pl.Int64),
        default=0,
        return_dtype=pl.Int64,
    )
    return [pl.col(c) - by_rank for c in columns]
