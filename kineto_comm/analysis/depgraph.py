"""The kernel-level dependency graph of a job's steps and its critical path (issue #51).

**The graph.** A node per kernel (the kernels table: memcpy, memset and communication
kernels included), per rank in start order (`idx`). Each kernel has up to five candidate
predecessors; the **binding** ones are the edge that explains when it could start (`via`:
stream, launch or stream_wait) and, for a communication kernel that waited, the edge that
explains when it could end (`late_via`: collective or p2p):

    stream       the previous kernel on the same stream ended (stream order)
    launch       the CPU launched it (`launch_ns`) after its stream was free: a late launch
                 delays its kernel. The CPU side is not in the tables, so the walk goes on
                 at the rank's kernel (any stream) that ended last at or before the launch:
                 the device work the CPU could have been waiting for; the gap between that
                 kernel's end and this kernel's start is the CPU's (launch) time
    stream_wait  a wait on another stream of the rank (below)
    collective   a collective kernel that waited for its group (`collective_waits.wait_ns`
                 > 0): its transfer could only start when the last member arrived, so its
                 end is bound by the last-arriving rank's kernel of the same instance
                 (`collective_instances.last_rank`, which started at `last_start_ns`)
    p2p          the same for a point-to-point call (an instance of key_kind p2p pairs a
                 send with its peer's recv): bound by the peer's kernel when the peer
                 arrived later

A kernel with no start edge (the first on its stream, launch unknown) has `via` `start`:
the walk ends there.

**The conservative stream-wait rule.** The decoded traces keep no cudaEventRecord /
cudaStreamWaitEvent calls, so cross-stream waits are inferred: a kernel that starts more
than TOLERANCE_NS after both its stream's previous kernel ended and its CPU launch waited
for something else; it is taken to have waited for the kernel of another stream of the same
rank whose end is the latest at or before its start (TOLERANCE_NS of overlap allowed for
rounding): the event a cudaStreamWaitEvent would have named, when that end is later than
both the stream and the launch (else the later of those binds). The rule never invents a
wait where the stream or the launch explains the start; it may name a kernel that merely
finished just before (an unrelated stream, or one that only competed for the device),
which bounds the wait conservatively: the path then goes through work that did run there.

The start edge is, in this order: stream_wait (the rule above), launch (launched at or
after the stream's previous kernel ended), stream.

**The critical path of a step.** From the end of the step's critical rank's window
(steptime.step_times), take the kernel of that rank ending last in it and follow binding
predecessors back: a call reached after its late rank's arrival crosses to that rank's
kernel at the arrival (collective, p2p), any other kernel goes to its start edge's
predecessor (a call reached at its start: what let it start). It stops when a predecessor
ends at or before the step's start (the later of the critical rank's window start and the
current rank's), or there is none, or it would come back to a kernel already on the path.
Each element holds a stretch of the path: from its predecessor's end (a collective: the
late rank's arrival) to where the path left it, so the elements tile the path in time;
the walk's last element holds down to that step start. Consecutive elements on one rank
make a hop (CRITICAL_PATH_SCHEMA); hops are contiguous and the whole path lies inside the
critical rank's window: never longer than the step.

The graph is computed column-wise per rank (shifts over streams, as-of joins on end
times); the walk is a Python loop over the path's elements only, loading a rank's graph
when the path first reaches it (a big job's kernels stay in files per rank).

Pure functions of tables: Polars in, Polars out, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import polars as pl

# Start more than this after the stream and the launch: the kernel waited for another
# stream; and overlap allowed between that stream's kernel end and the start (rounding).
TOLERANCE_NS = 2_000
VIA = ("stream", "launch", "stream_wait", "collective", "p2p", "start")
_CODE = {v: i for i, v in enumerate(VIA)}
_FAR = -(2**62)
# The critical path as hops, one per stretch on one rank (docs/tables.md `critical_path`).
CRITICAL_PATH_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "hop": pl.Int64(),
    "rank": pl.Int64(),
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "waited_for": pl.Int64(),
    "name": pl.String(),
}
_LABELS = ("stream", "kind", "name")

GRAPH_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "idx": pl.Int64(),
    "stream": pl.Int64(),
    "kind": pl.String(),
    "name": pl.String(),
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "launch_ns": pl.Int64(),
    "via": pl.String(),
    "release_ns": pl.Int64(),
    "pred_idx": pl.Int64(),
    "late_via": pl.String(),
    "late_rank": pl.Int64(),
    "late_start_ns": pl.Int64(),
}
# The kernel-level critical path (docs/tables.md `critical_path_kernels`).
CRITICAL_KERNELS_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "order": pl.Int64(),
    "rank": pl.Int64(),
    "stream": pl.Int64(),
    "kind": pl.String(),
    "name": pl.String(),
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "via": pl.String(),
    "gap_ns": pl.Int64(),
    "path_start_ns": pl.Int64(),
    "path_end_ns": pl.Int64(),
}


def _col(frame: pl.DataFrame, name: str, dtype: pl.DataType) -> pl.Expr:
    if name in frame.columns:
        return pl.col(name).cast(dtype)
    return pl.lit(None, dtype=dtype).alias(name)


def _in_rank_order(frame: pl.DataFrame, key: str) -> bool:
    """Each rank's rows of `frame` come in `key` order (ranks in any order)."""
    return bool(frame.select((pl.col(key).diff().over("rank") >= 0).all()).item())


def _asof(left: pl.DataFrame, key: str, right: pl.DataFrame, right_key: str) -> pl.DataFrame:
    """`left` joined backward on `key` to `right`'s `right_key` by rank; left's order kept.
    An as-of join by rank needs each rank's rows in key order, not the whole frame's: only
    a side out of that order is sorted (a global sort of every kernel was most of the
    graph's time)."""
    if not _in_rank_order(right, right_key):
        right = right.sort("rank", right_key)
    ordered = _in_rank_order(left, key)
    if not ordered:
        left = left.with_row_index("_row").sort("rank", key)
    out = left.join_asof(
        right,
        left_on=key,
        right_on=right_key,
        by="rank",
        strategy="backward",
        check_sortedness=False,
    )
    return out if ordered else out.sort("_row").drop("_row")


def rank_graph(
    kernels: pl.DataFrame,
    waits: pl.DataFrame | None = None,
    instances: pl.DataFrame | None = None,
    tolerance_ns: int = TOLERANCE_NS,
) -> pl.DataFrame:
    """Every kernel of `kernels`' ranks with its binding predecessor (GRAPH_SCHEMA).

    kernels: rank, stream, kind, name, start_ns, end_ns, launch_ns (any ranks). waits: the
    collective_waits rows of those ranks (instance, rank, start_ns, wait_ns); instances:
    collective_instances (instance, key_kind, last_rank, last_start_ns). `idx` numbers a
    rank's kernels in (start, end, stream) order. What let the kernel start: `via`
    (stream | launch | stream_wait | start, see the module docstring), `release_ns` when
    (the predecessor's end, or the launch) and `pred_idx` the predecessor on the same rank
    (for a launch: the kernel the walk goes on at). What bound its end, for a communication
    kernel that waited for a later rank: `late_via` (collective | p2p), `late_rank` and
    `late_start_ns` (that rank's communication kernel of the instance starts there)."""
    if kernels.height == 0:
        return pl.DataFrame(schema=GRAPH_SCHEMA)
    k = (
        kernels.select(
            pl.col("rank").cast(pl.Int64),
            _col(kernels, "stream", pl.Int64()).fill_null(-1),
            _col(kernels, "kind", pl.String()),
            _col(kernels, "name", pl.String()),
            pl.col("start_ns").cast(pl.Int64),
            pl.col("end_ns").cast(pl.Int64),
            _col(kernels, "launch_ns", pl.Int64()),
        )
        .filter(pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null())
        .sort("rank", "start_ns", "end_ns", "stream")
        .with_columns(idx=pl.int_range(pl.len(), dtype=pl.Int64).over("rank"))
    )
    # The text columns are set aside (every step below keeps the rows' order) and put back
    # at the end: carried through the joins, they were a third of the graph's time.
    labels = k.select("kind", "name")
    k = (
        k.drop("kind", "name")
        .with_columns(_comm=labels["kind"] == "communication")
        # (a) stream order: the previous kernel on the same stream.
        .with_columns(
            _sp=pl.col("idx").shift(1).over("rank", "stream"),
            _se=pl.col("end_ns").shift(1).over("rank", "stream"),
        )
    )
    # The rank's kernels in end order; `_alt`: the latest-ending kernel of another stream
    # at or before each one (the row before its run of one stream in end order).
    # (Whole-frame shifts, ranks kept apart by hand: windows over many small runs cost
    # more than the rest of the graph.)
    same_rank = pl.col("rank") == pl.col("rank").shift(1)
    run_start = ~same_rank.fill_null(False) | (pl.col("_estream") != pl.col("_estream").shift(1))
    ends = (
        k.select("rank", _eidx="idx", _estream="stream", _end="end_ns")
        .sort("rank", "_end", "_eidx")
        .with_columns(
            # At each run's start the row before it (-1: the rank's first run), carried on.
            _aidx=pl.when(run_start)
            .then(pl.when(same_rank).then(pl.col("_eidx").shift(1)).otherwise(-1))
            .forward_fill(),
            _aend=pl.when(run_start)
            .then(pl.when(same_rank).then(pl.col("_end").shift(1)).otherwise(_FAR))
            .forward_fill(),
        )
        .with_columns(
            _aidx=pl.when(pl.col("_aidx") >= 0).then("_aidx"),
            _aend=pl.when(pl.col("_aend") > _FAR).then("_aend"),
        )
        .select("rank", "_end", "_eidx", "_estream", "_aidx", "_aend")
    )
    # (c) another stream's latest end at or before the start (within the tolerance).
    k = _asof(
        k.with_columns(_t=pl.col("start_ns") + tolerance_ns), "_t", ends, "_end"
    ).with_columns(
        _widx=pl.when(pl.col("_estream") == pl.col("stream"))
        .then(pl.col("_aidx"))
        .otherwise(pl.col("_eidx")),
        _we=pl.when(pl.col("_estream") == pl.col("stream"))
        .then(pl.col("_aend"))
        .otherwise(pl.col("_end")),
    )
    k = k.drop("_t", "_end", "_eidx", "_estream", "_aidx", "_aend")
    # (b) the launch: where the walk goes on, the rank's latest end at or before it.
    k = _asof(
        k.with_columns(_t=pl.col("launch_ns").fill_null(_FAR)),
        "_t",
        ends.select("rank", "_end", _lidx="_eidx"),
        "_end",
    ).drop("_t", "_end")
    # (d, e) a communication kernel that waited: bound by the late rank's kernel.
    late = None
    if (
        waits is not None
        and instances is not None
        and waits.height
        and instances.height
        and {"instance", "rank", "start_ns", "wait_ns"} <= set(waits.columns)
        and {"instance", "last_rank", "last_start_ns"} <= set(instances.columns)
    ):
        late = (
            waits.select(
                pl.col("instance").cast(pl.Int64),
                pl.col("rank").cast(pl.Int64),
                pl.col("start_ns").cast(pl.Int64),
                pl.col("wait_ns").cast(pl.Int64),
            )
            .filter(pl.col("wait_ns") > 0)
            .join(
                instances.select(
                    pl.col("instance").cast(pl.Int64),
                    _col(instances, "key_kind", pl.String()),
                    _crank=pl.col("last_rank").cast(pl.Int64),
                    _cstart=pl.col("last_start_ns").cast(pl.Int64),
                ),
                on="instance",
            )
            .filter(pl.col("_crank").is_not_null() & (pl.col("_crank") != pl.col("rank")))
            .sort("rank", "start_ns", "wait_ns", "instance", descending=[False, False, True, False])
            .unique(["rank", "start_ns"], keep="first", maintain_order=True)
            .select(
                "rank",
                "start_ns",
                "_crank",
                "_cstart",
                _p2p=pl.col("key_kind") == "p2p",
            )
        )
    if late is not None and late.height:
        k = k.join(late, on=["rank", "start_ns"], how="left", maintain_order="left")
        k = k.with_columns(
            _crank=pl.when(pl.col("_comm")).then(pl.col("_crank")),
        )
    else:
        k = k.with_columns(
            _crank=pl.lit(None, dtype=pl.Int64),
            _cstart=pl.lit(None, dtype=pl.Int64),
            _p2p=pl.lit(False),
        )
    ready = pl.max_horizontal("_se", "launch_ns").fill_null(_FAR)
    crossed = pl.col("_crank").is_not_null() & (pl.col("_cstart") > pl.col("start_ns"))
    waited = (
        pl.col("_we").is_not_null()
        & (pl.col("start_ns") - ready > tolerance_ns)
        & (pl.col("_we") > ready)
    )
    launched = pl.col("launch_ns").is_not_null() & (
        pl.col("_se").is_null() | (pl.col("launch_ns") >= pl.col("_se"))
    )
    via = (
        pl.when(waited)
        .then(pl.lit("stream_wait"))
        .when(launched)
        .then(pl.lit("launch"))
        .when(pl.col("_sp").is_not_null())
        .then(pl.lit("stream"))
        .otherwise(pl.lit("start"))
    )
    k = k.with_columns(via=via).hstack(labels)
    v = pl.col("via")
    return k.select(
        "rank",
        "idx",
        "stream",
        "kind",
        "name",
        "start_ns",
        "end_ns",
        "launch_ns",
        "via",
        release_ns=pl.when(v == "stream_wait")
        .then(pl.col("_we"))
        .when(v == "launch")
        .then(pl.col("launch_ns"))
        .when(v == "stream")
        .then(pl.col("_se")),
        pred_idx=pl.when(v == "stream_wait")
        .then(pl.col("_widx"))
        .when(v == "launch")
        .then(pl.col("_lidx"))
        .when(v == "stream")
        .then(pl.col("_sp")),
        late_via=pl.when(crossed).then(
            pl.when(pl.col("_p2p")).then(pl.lit("p2p")).otherwise(pl.lit("collective"))
        ),
        late_rank=pl.when(crossed).then(pl.col("_crank")),
        late_start_ns=pl.when(crossed).then(pl.col("_cstart")),
    ).select(*[pl.col(n).cast(t) for n, t in GRAPH_SCHEMA.items()])


class _Rank:
    """One rank's graph as arrays, for the walk."""

    def __init__(self, g: pl.DataFrame) -> None:
        if not g["idx"].is_sorted():
            g = g.sort("idx")
        self.start = g["start_ns"].to_numpy()
        self.end = g["end_ns"].to_numpy()
        self.via = g["via"].replace_strict(_CODE, return_dtype=pl.Int8).to_numpy()
        self.pred_idx = g["pred_idx"].fill_null(-1).to_numpy()
        self.late_rank = g["late_rank"].fill_null(-1).to_numpy()
        self.late_start = g["late_start_ns"].fill_null(0).to_numpy()
        self.late_p2p = (g["late_via"] == "p2p").fill_null(False).to_numpy()
        self.comm = (g["kind"] == "communication").fill_null(False).to_numpy()
        # Read for the path's rows only, by a join at the end of the walk.
        self.labels = g.select("rank", "idx", "stream", "kind", "name")
        # Running maximum of the end in start order, and where it was reached.
        if len(self.end):
            self.reach = np.maximum.accumulate(self.end)
            pos = np.where(self.end == self.reach, np.arange(len(self.end)), 0)
            self.reach_at = np.maximum.accumulate(pos)
        else:
            self.reach = self.end
            self.reach_at = self.end

    def last_before(self, t: int) -> int:
        """The kernel starting before `t` that ends last (-1: none)."""
        n = int(np.searchsorted(self.start, t, side="left"))
        return int(self.reach_at[n - 1]) if n else -1

    def starting_at(self, t: int) -> int:
        """The communication kernel starting at `t` (else any kernel; -1: none)."""
        lo = int(np.searchsorted(self.start, t, side="left"))
        hi = int(np.searchsorted(self.start, t, side="right"))
        for i in range(lo, hi):
            if self.comm[i]:
                return i
        return lo if lo < hi else -1


Loader = Callable[[list[int]], tuple[pl.DataFrame, pl.DataFrame]]


def critical_walk(times: pl.DataFrame, load: Loader) -> pl.DataFrame:
    """The kernel-level critical path of every step of `times` (steptime.step_times:
    step, critical_rank; CRITICAL_KERNELS_SCHEMA), walked back from the end of the critical
    rank's window along binding predecessors.

    `load(ranks)` returns (graph, windows) for those ranks: rank_graph's rows and their
    step windows (the steps table: rank, step, start_ns, end_ns). It is called once with
    the critical ranks, then once per further rank the path reaches. A row per element of
    the path, last first (`order` 0): its kernel, `via` the edge to the next row (its
    binding predecessor; `start` on the last row: none inside the step), `gap_ns` the time
    between that predecessor's end (or arrival) and this kernel's start that the path
    spends waiting (idle or on the CPU's launch), and `path_start_ns`..`path_end_ns` the
    stretch of the path it holds (the rows tile the path)."""
    if times.height == 0 or "critical_rank" not in times.columns:
        return pl.DataFrame(schema=CRITICAL_KERNELS_SCHEMA)
    ranks: dict[int, _Rank | None] = {}
    window: dict[tuple[int, int], tuple[int, int]] = {}

    def fetch(wanted: Iterable[int]) -> None:
        todo = sorted({int(r) for r in wanted if r is not None and int(r) not in ranks})
        if not todo:
            return
        graph, wins = load(todo)
        for r, s, a, b in wins.select("rank", "step", "start_ns", "end_ns").iter_rows():
            window[(int(r), int(s))] = (int(a), int(b))
        parts = graph.partition_by("rank", as_dict=True) if graph.height else {}
        for r in todo:
            part = parts.get((r,))
            ranks[r] = _Rank(part) if part is not None and part.height else None

    fetch(times["critical_rank"].drop_nulls().to_list())
    rows: list[tuple] = []
    for step, crit in times.select("step", "critical_rank").iter_rows():
        if crit is None or (crit, step) not in window:
            continue
        low, high = window[(crit, step)]
        g = ranks.get(crit)
        i = g.last_before(high) if g is not None else -1
        if g is None or i < 0 or g.end[i] <= low:
            continue
        rank, cursor, order = crit, high, 0
        seen: set[tuple[int, int]] = set()
        while True:
            seen.add((rank, i))
            own = window.get((rank, step))
            bound = max(low, own[0]) if own is not None else low
            s, e = int(g.start[i]), int(g.end[i])
            via = VIA[int(g.via[i])]
            nxt: tuple[int, int, int] | None = None
            q = int(g.late_rank[i])
            arrived = int(g.late_start[i])
            # A call that waited: its end is bound by the late rank's arrival, when that
            # lies before where the path reached it (a call reached at its start is bound
            # by what let it start).
            if q >= 0 and s < arrived < cursor:
                fetch([q])
                gq = ranks.get(q)
                j = gq.starting_at(arrived) if gq is not None else -1
                wq = window.get((q, step))
                bq = max(low, wq[0]) if wq is not None else low
                if j >= 0 and arrived > bq and (q, j) not in seen:
                    nxt = (q, j, arrived)
                    via = "p2p" if g.late_p2p[i] else "collective"
            if nxt is None and via != "start":
                j = int(g.pred_idx[i])
                if j >= 0 and (rank, j) not in seen:
                    t = min(int(g.end[j]), max(min(s, cursor), bound))
                    if t > bound:
                        nxt = (rank, j, t)
            start_at = nxt[2] if nxt is not None else bound
            start_at = min(start_at, cursor)
            gap = max(0, min(s, cursor) - start_at)
            rows.append(
                (
                    step,
                    order,
                    rank,
                    i,
                    s,
                    e,
                    via if nxt is not None else "start",
                    gap,
                    start_at,
                    cursor,
                )
            )
            if nxt is None:
                break
            rank, i, cursor = nxt
            g = ranks[rank]
            order += 1
    if not rows:
        return pl.DataFrame(schema=CRITICAL_KERNELS_SCHEMA)
    fields = {n: t for n, t in CRITICAL_KERNELS_SCHEMA.items() if n not in _LABELS}
    order = [
        "step",
        "order",
        "rank",
        "idx",
        *[n for n in fields if n not in ("step", "order", "rank")],
    ]
    schema = {n: fields.get(n, pl.Int64()) for n in order}
    found = pl.DataFrame(rows, schema=schema, orient="row")
    on_path = found["rank"].unique().to_list()
    labels = pl.concat([r.labels for k, r in ranks.items() if r is not None and k in on_path])
    return found.join(labels, on=["rank", "idx"], how="left", maintain_order="left").select(
        *[pl.col(n).cast(t) for n, t in CRITICAL_KERNELS_SCHEMA.items()]
    )


def segments(path: pl.DataFrame) -> pl.DataFrame:
    """The kernel-level path collapsed into CRITICAL_PATH_SCHEMA hops: consecutive rows on
    one rank make a hop (the stretch they hold); `waited_for` the rank the path goes to
    next, back in time (null on the last hop)."""
    if path.height == 0:
        return pl.DataFrame(schema=CRITICAL_PATH_SCHEMA)
    hops = (
        path.sort("step", "order")
        .with_columns(
            hop=(pl.col("rank") != pl.col("rank").shift(1))
            .fill_null(True)
            .cum_sum()
            .over("step")
            .cast(pl.Int64)
            - 1
        )
        .group_by("step", "hop", maintain_order=True)
        .agg(
            pl.col("rank").first(),
            start_ns=pl.col("path_start_ns").min(),
            end_ns=pl.col("path_end_ns").max(),
            kernels=pl.len(),
            _via=pl.col("via").last(),
        )
        .with_columns(waited_for=pl.col("rank").shift(-1).over("step"))
    )
    return hops.select(
        "step",
        "hop",
        "rank",
        "start_ns",
        "end_ns",
        "waited_for",
        name=pl.when(pl.col("waited_for").is_not_null())
        .then(
            pl.format(
                "critical path, step {}: rank {} after rank {} arrived ({})",
                "step",
                "rank",
                "waited_for",
                "_via",
            )
        )
        .otherwise(
            pl.format("critical path, step {}: rank {} from where the path begins", "step", "rank")
        ),
    ).select(*[pl.col(n).cast(t) for n, t in CRITICAL_PATH_SCHEMA.items()])


def chains(times: pl.DataFrame, hops: pl.DataFrame) -> pl.DataFrame:
    """`times` with `critical_path`: per step the ranks of its path's hops, in order (the
    critical rank alone where no path was found)."""
    if times.height == 0:
        return times.with_columns(critical_path=pl.lit(None, dtype=pl.List(pl.Int64)))
    per = hops.sort("step", "hop").group_by("step", maintain_order=True).agg(_c=pl.col("rank"))
    return (
        times.drop("critical_path", strict=False)
        .join(per, on="step", how="left", maintain_order="left")
        .with_columns(
            critical_path=pl.coalesce(
                pl.col("_c"), pl.concat_list(pl.col("critical_rank").cast(pl.Int64))
            )
        )
        .drop("_c")
    )


def in_memory(
    kernels: pl.DataFrame,
    waits: pl.DataFrame | None,
    instances: pl.DataFrame | None,
    windows: pl.DataFrame,
    tolerance_ns: int = TOLERANCE_NS,
) -> Loader:
    """A Loader over tables held in memory (every rank's rows)."""

    def load(ranks: list[int]) -> tuple[pl.DataFrame, pl.DataFrame]:
        pick = pl.col("rank").is_in(ranks)
        w = None if waits is None or waits.height == 0 else waits.filter(pick)
        graph = rank_graph(kernels.filter(pick), w, instances, tolerance_ns)
        return graph, windows.filter(pick)

    return load
