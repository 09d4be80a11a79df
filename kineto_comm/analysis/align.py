"""Clock alignment: a per-rank offset estimated from matched collectives.

Ranks on different hosts read different clocks. A collective completes at nearly the same
instant on every rank of its group (nobody leaves before the last byte arrives), so each
matched call's end times differ across ranks mostly by the clock offsets:
`end(rank, call) = T(call) + offset(rank)`.

The fit. Each call pairs its lowest rank with each of its other ranks; per pair, the median
of their end differences is a link (robust to the few calls whose ends genuinely differ).
Offsets travel along the links outwards from the lowest rank of each linked set of ranks
(_linked): ranks that never share a group with rank 0 are aligned through the ranks in
between, and a rank's few calls across hosts count however many it has with its own host.
Alternating medians then weigh all of a rank's calls, until no offset moves by more than
a tenth of its residual (or 100 ns). Offsets are
relative to the lowest rank of the set (method `reference`, offset 0): one set in a job
whose collectives span it. `residual_ns` is each rank's median misfit after alignment, a
measure of how much to trust it. An estimate smaller than SIGNIFICANCE times its residual
(or than MIN_OFFSET_NS) is reported in `estimate_ns` but not applied (`offset_ns` 0, method
`insignificant`): collectives whose ends genuinely vary would otherwise shift ranks that
share one clock.

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

from kineto_comm.lazy import collect, sample

if TYPE_CHECKING:
    from kineto_comm.rank_store import RankStore

OFFSET_COLUMNS = ("rank", "offset_ns", "estimate_ns", "residual_ns", "matched", "method")
_ROUNDS = 12  # at most, of alternating medians after linking
SETTLED_NS = 100  # they stop once no offset moves by more than this
# An estimate is applied only when it clearly exceeds its own misfit: ranks on one host
# (one clock) otherwise get offsets that are noise of the collectives' end times.
SIGNIFICANCE = 3.0
MIN_OFFSET_NS = 1_000
# Calls whose ends need not meet (module doc): never used for offsets.
ONE_SIDED = ("send", "recv", "send_recv", "broadcast", "reduce", "gather", "scatter")


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
    linked = _linked(_links(ends))
    # Then alternating medians from there: each call's time as the median of its ranks'
    # ends less their offsets, each rank's offset as the median of its ends less those
    # times (every call of a rank weighs, not only those with its set's root), until no
    # offset moves by more than a tenth of its residual or SETTLED_NS: a move well inside
    # the misfit is noise (on the real single-GPU captures, whose ends differ by ms, the
    # offsets kept moving by us for 12 rounds). From the linked offsets they only refine.
    fit = linked
    for _ in range(_ROUNDS):
        before = fit["offset"]
        fit = _refined(ends, fit)
        limit = (fit["residual_ns"] / 10).clip(lower_bound=SETTLED_NS)
        if ((fit["offset"] - before).abs() <= limit).all():
            break
    # Each set on its root's clock.
    at_root = pl.col("offset").filter(pl.col("rank") == pl.col("root")).first().over("root")
    offsets = (
        linked.select("rank", "root")
        .with_columns(fit.select("offset", "residual_ns", "matched"))
        .with_columns(pl.col("offset") - at_root)
    )
    estimate = pl.col("offset").fill_null(0.0).round().cast(pl.Int64)
    residual = pl.col("residual_ns").round().cast(pl.Int64)
    significant = (estimate.abs() >= MIN_OFFSET_NS) & (
        estimate.abs() >= SIGNIFICANCE * residual.fill_null(0)
    )
    return (
        base.join(offsets, on="rank", how="left")
        .select(
            "rank",
            offset_ns=pl.when(significant).then(estimate).otherwise(0),
            estimate_ns=estimate,
            residual_ns=residual,
            matched=pl.col("matched").fill_null(0),
            method=pl.when(pl.col("offset").is_null())
            .then(pl.lit("none"))
            .when(pl.col("rank") == pl.col("root"))
            .then(pl.lit("reference"))
            .when(significant)
            .then(pl.lit("collective-end"))
            .otherwise(pl.lit("insignificant")),
        )
        .sort("rank")
    )


def _refined(ends: pl.DataFrame, offsets: pl.DataFrame) -> pl.DataFrame:
    """One round of alternating medians from `offsets` (rank, offset; the ranks of `ends`
    in rank order): rank, offset, residual_ns (the median misfit of the rank's ends around
    it) and matched (its calls), in the same order. Eager: on a small job the round is a
    few hundred rows, and planning it as a lazy query cost twice as much as running it."""
    by_rank = pl.col("rank").replace_strict(offsets["rank"], offsets["offset"])
    call_time = (pl.col("end_ns") - by_rank).median().over("instance")
    misfit = pl.col("_misfit")
    return (
        ends.select("rank", _misfit=pl.col("end_ns") - call_time)
        .group_by("rank")
        .agg(
            offset=misfit.median(),
            residual_ns=(misfit - misfit.median()).abs().median(),
            matched=pl.len().cast(pl.Int64),
        )
        .sort("rank")
    )


def _links(ends: pl.DataFrame) -> pl.DataFrame:
    """Per pair of ranks that share calls (src, dst): `gap`, the median over those calls of
    dst's end minus src's end (dst's offset minus src's, as far as clocks explain it), and
    `calls`, how many. Each call pairs its lowest rank with each other rank, so a call adds
    one pair per rank, not one per pair of ranks. Both directions are listed."""
    lead = pl.col("rank").min().over("instance")
    lead_end = pl.col("end_ns").filter(pl.col("rank") == lead).first().over("instance")
    one_way = (
        ends.select("instance", "rank", src=lead, gap=pl.col("end_ns") - lead_end)
        .filter(pl.col("rank") != pl.col("src"))
        .group_by("src", "rank")
        .agg(pl.col("gap").median(), calls=pl.len())
        .rename({"rank": "dst"})
    )
    return pl.concat(
        [one_way, one_way.select(src="dst", dst="src", gap=-pl.col("gap"), calls="calls")]
    )


def _linked(links: pl.DataFrame) -> pl.DataFrame:
    """rank, root, offset: each linked set of ranks on the clock of its lowest rank (its
    root), through the links (_links) from the root outwards.

    Breadth first from each root: a rank's offset is its nearest neighbour's plus the gap
    between them (among neighbours as near, the one of most calls together, then the lowest
    rank). The graph has a node per rank, and a walk goes one hop after another: in Python
    it takes microseconds, where a Polars query per hop took ~0.7 ms.

    Why offsets travel along links and are not fitted to all calls at once by alternating
    medians: a median follows the majority of a rank's calls. A rank whose calls are mostly
    with ranks of its own host (tensor parallel) kept the offset of its host-mates whatever
    its few calls across hosts (data parallel) said: on a generated tensor- and
    data-parallel job over two hosts 94 us apart, every rank stayed at 0.
    """
    near: dict[int, list[tuple[int, float, int]]] = {}
    for src, dst, gap, calls in links.select("src", "dst", "gap", "calls").iter_rows():
        near.setdefault(src, []).append((dst, gap, calls))
    root: dict[int, int] = {}
    offset: dict[int, float] = {}
    for start in sorted(near):  # ascending: each set is first met at its lowest rank
        if start in root:
            continue
        root[start], offset[start], frontier = start, 0.0, [start]
        while frontier:
            best: dict[int, tuple[tuple[int, int], float]] = {}
            for prev in frontier:
                for rank, gap, calls in near[prev]:
                    choice = ((calls, -prev), offset[prev] + gap)
                    if rank not in root and (rank not in best or choice[0] > best[rank][0]):
                        best[rank] = choice
            for rank, (_, value) in best.items():
                root[rank], offset[rank] = start, value
            frontier = sorted(best)
    ranks = sorted(root)
    return pl.DataFrame(
        {"rank": ranks, "root": [root[r] for r in ranks], "offset": [offset[r] for r in ranks]},
        schema={"rank": pl.Int64, "root": pl.Int64, "offset": pl.Float64},
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
