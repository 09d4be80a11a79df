"""Clock alignment: one offset per host, estimated from matched collectives.

Ranks on one host read one clock; ranks on different hosts read different ones. So the
ranks are first grouped into hosts (`hosts`: from --ranks-per-host, the trace's host names,
Kineto's default file names, device ids, a shared device, else a clock per rank), and an
offset is fitted per host, never inside one: on the real one-host NCCL captures
(tests/data/h100-nccl), a fit per rank found offsets of up to 11 ms. Where the traces do not
say (a shared device, or nothing), the calls are asked (`fit_offsets`): no rank ends a
collective before every rank has started it, so a reading of the clocks that breaks that in
many calls is wrong; one clock broken and a clock per rank not is another clock per rank
(`measured`). `host_source` says what decided, `host_evidence` what the calls said.

A collective completes at nearly the same instant on every rank of its group, so matched
calls' ends differ across hosts mostly by the offsets. Per pair of hosts the median of their
end differences is a link; the tightest links that join all hosts carry the offsets out from
rank 0's host, and only significant ones are applied. Host-timeline (gloo), point-to-point
and rooted calls are not used: one side may finish without waiting for the other. In full:
the comment below the imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from kineto_comm.analysis.graph import walk
from kineto_comm.lazy import collect, sample
from kineto_comm.load.discover import HOST_IN_NAME, RANK_IN_NAME
from kineto_comm.model.names import POINT_TO_POINT

# In full (the module docstring says what and why):
#
# Clock alignment: one offset per host, estimated from matched collectives.
#
# Ranks on one host read one clock; ranks on different hosts read different ones. So the
# ranks are first grouped into hosts (`hosts`, `fit_offsets`), and an offset is fitted per
# host, never inside one: on the real one-host NCCL captures (tests/data/h100-nccl), a fit
# per rank found offsets of up to 11 ms (time-sliced ranks whose collective ends differ by
# a steady 2.24 ms) and moved skews, waits and the straggler with them.
#
# Which ranks share a host, in this order (the `host_source` column says which):
# `ranks_per_host` (the user's word: ranks r // n together; 1 keeps a clock per rank, for
# ranks of one host that cannot share a clock), `host_name` (the trace header's, when every
# rank has one), `file_name` (Kineto's default file name, {hostname}_{pid}.{timestamp}
# .pt.trace.json[.gz], when every rank's has that shape and reads one way:
# load/discover.py HOST_IN_NAME), `device_ids` (every rank on one device id, and ids that
# follow local rank = rank mod k: hosts of k consecutive ranks), `shared_device` (every
# rank on the same one device id: they share a GPU, hence a host), else `unknown` (a clock
# per rank, as CPU-only traces without a host name).
#
# Hosts measured (`fit_offsets`). The last two are guesses: a job of single-GPU hosts also
# has every rank on device 0 and, without host names, would get no alignment at all. So for
# them a clock per rank is fitted anyway, and both readings are tested against causality:
# no rank ends a collective before every rank of it has started it (each needs the others'
# data), on one clock to within CAUSALITY_SLACK_NS. End differences alone cannot tell: the
# real tp-2 capture's two ranks, time-slicing one GPU, end every call a steady 2.24 ms apart
# (spread 3.5 us over 24 calls), as two hosts 2.24 ms apart would; but shifted by that gap,
# rank 1 would end 7 of the 24 calls before rank 0 started them, while on one clock none
# is. On a generated job of single-GPU hosts 0.5-1.5 ms apart, one clock breaks 21 of 21
# calls and the fitted clocks none. The decision: `measured` (a host per rank, the per-rank
# fit) when one clock breaks at least MIN_CONTRADICTIONS calls, the per-rank clocks fewer
# than 1 / SIGNIFICANCE as many, and every applied offset is at least SIGNIFICANCE times
# its residual (consistent over the calls); `measured_one_clock` (one host) for `unknown`
# the other way round; else the traces' reading stands (`shared_device` one clock, whose
# turns CAPT101 reads; `unknown` a clock per rank). `host_evidence` holds the counts.
#
# A collective completes at nearly the same instant on every rank of its group (nobody
# leaves before the last byte arrives), so each matched call's end times differ across
# hosts mostly by the clock offsets: `end(host, call) = T(call) + offset(host)`, a host's
# end being the median of its ranks' ends.
#
# The fit. Each call pairs its lowest host with each of its other hosts (a host is named by
# its lowest rank); per pair of hosts,
# the median of their end differences is a link (robust to the few calls whose ends
# genuinely differ), and the median distance of a difference from it, its spread. The
# tightest links that join all hosts (a minimum spanning tree by spread, _tree) carry the
# offsets outwards from the lowest host of each linked set: hosts that never share
# a group with rank 0's are aligned through the hosts in between. Offsets are relative to
# that lowest host's lowest rank (method `reference`, offset 0); the other ranks of a host
# take its offset (method `same-host`).
#
# What is applied. A link moves its far end only when its gap is at least SIGNIFICANCE
# times its spread and MIN_OFFSET_NS: else the two hosts read one clock as far as the trace
# can tell. `estimate_ns` sums every gap on a host's way from its reference, `offset_ns` only
# the significant ones (method `collective-end` when there is one, else `insignificant`).
# `residual_ns` is the median distance of the rank's ends, less its estimate, from its calls'
# times (the median over each call's ranks): how far the estimate leaves it off.
#
# Calls not used. Host-timeline (gloo) calls: a send ends when the data is handed off, a
# ring all-reduce ends on each rank at its own last hop (tens of us apart, consistently),
# which would pass for an offset; CPU-only jobs keep each trace's own clock. Point-to-point
# and rooted calls (send, recv, broadcast, reduce, gather, scatter): one side may finish
# without waiting for the other (a small send completes once its bytes sit in the peer's
# buffer, before the recv is even posted). On the real 8-stage pipeline capture (one clock,
# sends and recvs only) they fitted offsets of up to 7 ms with residuals of 1-5 ms; with 3 ms
# per pair of stages added to the ends, one rank got a 14 ms offset applied, 8 ms off the
# truth. Ranks linked only by such calls keep their own clocks (method `none`, or each set its
# own `reference`).

if TYPE_CHECKING:
    from kineto_comm.rank_store import RankStore

OFFSET_COLUMNS = (
    "rank",
    "host",
    "host_source",
    "host_evidence",
    "offset_ns",
    "estimate_ns",
    "residual_ns",
    "matched",
    "method",
)
HOST_COLUMNS = ("rank", "host", "host_source")
# A link's gap is applied only when it clearly exceeds the link's spread: hosts that read one
# clock otherwise get offsets that are noise of the collectives' end times.
SIGNIFICANCE = 3.0
MIN_OFFSET_NS = 1_000
# Calls whose ends need not meet (module doc): never used for offsets.
ONE_SIDED = (*POINT_TO_POINT, "broadcast", "reduce", "gather", "scatter")
# Where the traces do not say which ranks share a host, the calls are asked (`fit_offsets`).
MEASURED_FROM = ("shared_device", "unknown")
# No rank ends a call before every rank of it has started it (each waits for the others'
# data): on one clock, to within this (CUPTI's conversion of GPU to CPU times).
CAUSALITY_SLACK_NS = 10_000
# Calls that must contradict a reading of the clocks before it is dropped for another.
MIN_CONTRADICTIONS = 3


def hosts(
    ranks: pl.DataFrame, devices: pl.DataFrame, ranks_per_host: int | None = None
) -> pl.DataFrame:
    """rank, host, host_source: which ranks share a host (hence a clock), and how that was
    inferred (module doc). `ranks`: rank, host_name (null where the header has none);
    `devices`: rank, device (the device ids of the rank's collectives, -1 for host spans)."""
    file = pl.col("file") if "file" in ranks.columns else pl.lit(None, dtype=pl.String)
    out = ranks.select(pl.col("rank").cast(pl.Int64), "host_name", file=file).sort("rank")
    rank = pl.col("rank")

    def named(host: pl.Expr | pl.Series, source: str) -> pl.DataFrame:
        return out.select("rank", host=host.cast(pl.String), host_source=pl.lit(source))

    if ranks_per_host is not None:
        if ranks_per_host < 1:
            raise ValueError(f"ranks per host must be at least 1 (got {ranks_per_host})")
        return named(pl.format("host {}", rank // ranks_per_host), "ranks_per_host")
    if out.height and out["host_name"].null_count() == 0:
        return named(pl.col("host_name"), "host_name")
    in_names = _hosts_in_file_names(out)
    if in_names is not None:
        return named(in_names, "file_name")
    ids = (
        devices.filter(pl.col("device") >= 0)
        .group_by("rank")
        .agg(n=pl.col("device").n_unique(), device=pl.col("device").first())
    )
    per_rank = out.join(ids, on="rank", how="left")
    one_each = per_rank.height > 1 and bool((per_rank["n"] == 1).all())
    if one_each and per_rank["device"].n_unique() == 1:
        return named(pl.lit("host 0"), "shared_device")
    if one_each:
        k = int(per_rank["device"].max()) + 1  # type: ignore[arg-type]
        if bool((per_rank["device"] == per_rank["rank"] % k).all()):
            return named(pl.format("host {}", rank // k), "device_ids")
    return named(pl.format("rank {}", rank), "unknown")


def _hosts_in_file_names(ranks: pl.DataFrame) -> pl.Series | None:
    """Each rank's host from its file name (Kineto's default, HOST_IN_NAME), or None unless
    every rank's name has that shape and reads one way: a host part that names a rank
    (`rank3_...`) is a worker name, two ranks with one host and pid would be one process,
    and pids equal to the ranks number workers, not processes."""
    if ranks.height == 0:
        return None
    parts = ranks.select("rank", name=pl.col("file").str.extract_groups(HOST_IN_NAME)).unnest(
        "name"
    )
    if parts["host"].null_count():
        return None
    pid = parts["pid"].cast(pl.Int64)
    if bool(parts["host"].str.contains(RANK_IN_NAME).any()):
        return None
    if parts.select(pl.struct("host", "pid").n_unique()).item() < parts.height:
        return None
    if parts.height > 1 and bool((pid == parts["rank"]).all()):
        return None
    return parts["host"]


def fit_offsets(
    keyed: pl.DataFrame | RankStore, ranks: list[int], grouping: pl.DataFrame
) -> pl.DataFrame:
    """The offsets table: `estimate_offsets` over the hosts of `grouping` (`hosts`) where the
    traces say which ranks share one; where they do not (MEASURED_FROM), over the hosts the
    calls show, with the evidence that decided in `host_evidence` (module doc).

    A clock per rank is fitted anyway and both readings are put to the one test every call
    must pass: no rank ends it before every rank has started it. Another clock is measured
    (`measured`, a host per rank) when one clock fails it in at least MIN_CONTRADICTIONS
    calls, the per-rank clocks in fewer than 1 / SIGNIFICANCE as many, and every applied
    offset is at least SIGNIFICANCE times its residual (or the residual within the calls'
    noise, CAUSALITY_SLACK_NS / SIGNIFICANCE). One clock is measured
    (`measured_one_clock`, for `unknown`) the other way round. Else the traces' own
    reading stands (`shared_device`: one clock; `unknown`: a clock per rank)."""
    from kineto_comm.rank_store import as_store

    keyed = as_store(keyed)
    sources = set(grouping["host_source"].to_list())
    if len(ranks) < 2 or not sources or not sources <= set(MEASURED_FROM):
        return estimate_offsets(keyed, ranks, grouping)
    own = estimate_offsets(keyed, ranks)  # a clock per rank
    calls, one_fails, own_fails = _contradictions(keyed, own)
    applied = own.filter(pl.col("method") == "collective-end")
    # Consistent: each applied offset at least SIGNIFICANCE times its residual (a residual
    # within CAUSALITY_SLACK_NS / SIGNIFICANCE is the calls' own noise, whatever the offset).
    room = applied["offset_ns"].abs().clip(lower_bound=CAUSALITY_SLACK_NS)
    misfit = applied["residual_ns"].fill_null(0) * SIGNIFICANCE - room
    consistent = applied.height > 0 and bool((misfit <= 0).all())
    tally = (
        f"of {calls} collectives, {one_fails} end on a rank before another starts them on one"
        f" clock, {own_fails} on a clock per rank"
    )
    if not calls:
        tally = "no collective whose ends meet on every rank to measure by"
    other = one_fails >= MIN_CONTRADICTIONS and own_fails * SIGNIFICANCE < one_fails
    one = own_fails >= MIN_CONTRADICTIONS and one_fails * SIGNIFICANCE < own_fails
    if other and consistent:
        worst = int(applied["residual_ns"].fill_null(0).max())  # type: ignore[arg-type]
        return own.with_columns(
            host=pl.format("host {}", "rank"),
            host_source=pl.lit("measured"),
            host_evidence=pl.lit(f"other clocks: {tally}; residuals up to {worst} ns"),
        )
    if other:
        verdict = "kept, the per-rank offsets fit badly (residuals over a third of them)"
    elif one:
        verdict = "one clock"
    elif max(one_fails, own_fails) < MIN_CONTRADICTIONS:
        verdict = "kept, nothing contradicts it"
    else:
        verdict = "kept, the calls favour neither reading"
    evidence = pl.lit(f"{verdict}: {tally}")
    if one and "unknown" in sources:
        grouping = grouping.with_columns(
            host=pl.lit("host 0"), host_source=pl.lit("measured_one_clock")
        )
    elif "unknown" in sources:
        return own.with_columns(host_evidence=evidence)
    return estimate_offsets(keyed, ranks, grouping.with_columns(host_evidence=evidence))


def _usable(keyed: RankStore, columns: list[str]) -> pl.LazyFrame:
    """instance, rank and `columns` of the matched device collectives whose ends meet on
    every rank (module doc), an evenly spread sample of them above SAMPLE_ROWS rows."""
    # Only device kernels (NCCL/RCCL) complete together on all ranks. Host-side gloo spans
    # do not: a send ends when the data is handed off, a ring all-reduce ends on each rank
    # at its own last hop (tens of us apart, consistently), which would pass for an offset.
    usable = pl.col("instance").is_not_null() & (pl.col("device") != -1)
    read = ["instance", "rank", "device", *columns]
    if "collective" in keyed.columns:
        usable = usable & ~pl.col("collective").is_in(ONE_SIDED)
        read.append("collective")
    calls = keyed.lazy(read).filter(usable)
    # Above SAMPLE_ROWS rows, every k-th call: an evenly spread sample whose medians hold
    # the same offsets, in bounded memory (docs/scale.md).
    return sample(calls, keyed.height, "instance").select("instance", "rank", *columns)


def _contradictions(keyed: RankStore, own: pl.DataFrame) -> tuple[int, int, int]:
    """How many usable calls (`_usable`) two or more ranks made, and in how many some rank
    ends before another rank starts (by more than CAUSALITY_SLACK_NS): on one clock, and
    with `own`'s offset_ns applied."""
    shift = own.lazy().select("rank", off=pl.col("offset_ns"))
    calls = _usable(keyed, ["start_ns", "end_ns"]).join(shift, on="rank")
    start, end, off = pl.col("start_ns"), pl.col("end_ns"), pl.col("off")
    per_call = (
        calls.group_by("instance")
        .agg(
            n=pl.col("rank").n_unique(),
            one=start.max() - end.min(),
            own=(start - off).max() - (end - off).min(),
        )
        .filter(pl.col("n") > 1)
    )
    late = [(pl.col(c) > CAUSALITY_SLACK_NS).sum().cast(pl.Int64) for c in ("one", "own")]
    row = collect(per_call.select(pl.len().cast(pl.Int64), *late), keyed.height).row(0)
    return int(row[0]), int(row[1]), int(row[2])


def estimate_offsets(
    keyed: pl.DataFrame | RankStore, ranks: list[int], grouping: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Offsets per rank from matched calls (keyed: rank, device, instance, end_ns), one per
    host of `grouping` (`hosts`; default: every rank its own host)."""
    from kineto_comm.analysis.match import one_row_per_call
    from kineto_comm.rank_store import as_store

    keyed = as_store(keyed)
    grouping = _grouping(ranks, grouping)
    calls = _usable(keyed, ["end_ns"])
    if not one_row_per_call(keyed):  # a rank's call seen twice: its latest end
        calls = calls.group_by("instance", "rank").agg(pl.col("end_ns").max())
    # Each rank's host, named by its lowest rank (`root`); a call counts when two hosts see it.
    calls = calls.join(grouping.lazy().select("rank", "root"), on="rank", build_side="force_right")
    shared = calls.group_by("instance").agg(n=pl.col("root").n_unique()).filter(pl.col("n") > 1)
    ends = collect(
        calls.join(
            shared.select("instance"), on="instance", how="semi", build_side="force_right"
        ).with_columns(pl.col("end_ns").cast(pl.Float64)),
        keyed.height,
    )
    if not ranks:
        return no_offsets(ranks, grouping)
    host_ends = ends.group_by("instance", "root").agg(pl.col("end_ns").median())
    tree = _tree(_links(host_ends.rename({"root": "rank"}))).rename({"rank": "host_root"})
    alone = pl.len().over("root") == 1
    per_rank = grouping.join(tree, left_on="root", right_on="host_root", how="left")
    # How well each rank's ends fit the estimates: each call's time as the median of its
    # ranks' ends less their estimates, the rank's misfit the median distance from it.
    fit = _fit(ends, per_rank.filter(pl.col("estimate").is_not_null()))
    rounded = pl.col("estimate").round().cast(pl.Int64)
    return (
        per_rank.join(fit, on="rank", how="left")
        .select(
            "rank",
            "host",
            "host_source",
            "host_evidence",
            offset_ns=pl.col("offset").round().cast(pl.Int64).fill_null(0),
            estimate_ns=rounded,
            residual_ns=pl.col("residual_ns").round().cast(pl.Int64),
            matched=pl.col("matched").fill_null(0),
            method=_method(
                pl.when(pl.col("estimate").is_null() & alone)
                .then(pl.lit("none"))
                .when(pl.col("estimate").is_null())
                .then(pl.lit("reference"))  # a host of several ranks linked to no other
                .when(pl.col("root") == pl.col("root_right"))
                .then(pl.lit("reference"))
                .when(pl.col("applied"))
                .then(pl.lit("collective-end"))
                .otherwise(pl.lit("insignificant"))
            ),
        )
        .sort("rank")
    )


def _method(of_host: pl.Expr) -> pl.Expr:
    """A rank's method: its host's, for the host's lowest rank; `same-host` for the others
    (they read that rank's clock)."""
    return pl.when(pl.col("rank") != pl.col("root")).then(pl.lit("same-host")).otherwise(of_host)


def _grouping(ranks: list[int], grouping: pl.DataFrame | None) -> pl.DataFrame:
    """rank, host, host_source, host_evidence (null unless given), root (the host's lowest
    rank) for every rank of `ranks`."""
    base = pl.DataFrame({"rank": ranks}, schema={"rank": pl.Int64})
    if grouping is None:
        grouping = base.select(
            "rank", host=pl.format("rank {}", "rank"), host_source=pl.lit("unknown")
        )
    if "host_evidence" not in grouping.columns:
        grouping = grouping.with_columns(host_evidence=pl.lit(None, dtype=pl.String))
    found = base.join(grouping.select(*HOST_COLUMNS, "host_evidence"), on="rank", how="left")
    return found.with_columns(
        host=pl.col("host").fill_null(pl.format("rank {}", "rank")),
        host_source=pl.col("host_source").fill_null(pl.lit("unknown")),
    ).with_columns(root=pl.col("rank").min().over("host"))


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
    if links.height == 0:
        schema = {"rank": pl.Int64, "root": pl.Int64, "estimate": pl.Float64}
        return pl.DataFrame(schema={**schema, "offset": pl.Float64, "applied": pl.Boolean})
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


def no_offsets(ranks: list[int], grouping: pl.DataFrame | None = None) -> pl.DataFrame:
    """The offsets table when alignment is turned off or finds nothing to fit: every host
    on its own clock (its lowest rank `none`, the others `same-host`)."""
    return (
        _grouping(ranks, grouping)
        .with_columns(
            offset_ns=pl.lit(0, dtype=pl.Int64),
            estimate_ns=pl.lit(None, dtype=pl.Int64),
            residual_ns=pl.lit(None, dtype=pl.Int64),
            matched=pl.lit(0, dtype=pl.Int64),
            method=_method(pl.lit("none")),
        )
        .select(OFFSET_COLUMNS)
    )
