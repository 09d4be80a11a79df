"""The kernel-level dependency graph of a job's steps and its critical path (issue #51).

A node per kernel, per rank in start order; each kernel's binding edge says when it could
start (`stream`: its stream's previous kernel; `launch`: its CPU launch; `stream_wait`: a
kernel of another stream, recorded in the trace or inferred by a conservative rule) and, for
a communication kernel that waited, when it could end (`collective`, `p2p`: the late rank's
kernel of the same instance). The critical path of a step walks binding edges back from
the end of the critical rank's window (steptime.step_times), crossing ranks at the late
arrivals, and never leaves that window (`critical_path` hops, `critical_path_kernels`).

Why: the blame says where the critical rank's time went; the path says what it waited for
across ranks and streams, kernel by kernel, as HTA's critical path does (compared in
tests/test_depgraph.py). The graph is vectorised numpy per rank (no loop over kernels); the
walk runs along a rank in _walk.c where built and builds a rank's graph only when the path
reaches it. The full statement of the edges and the walk is docs/model-of-time.md.
Pure functions of tables: Polars in, Polars out, no I/O.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Iterable

import numpy as np
import polars as pl

from kineto_comm.analysis.match import last_arrivals

try:  # the walk along one rank, compiled (_walk.c); optional: the Python loop is the same.
    from kineto_comm.analysis import _walk as _compiled
except ImportError:  # pragma: no cover - not built on this machine
    _compiled = None  # type: ignore[assignment]

# Start more than this after the stream and the launch: the kernel waited for another
# stream; and overlap allowed between that stream's kernel end and the start (rounding).
TOLERANCE_NS = 2_000
# The most kernels whose graphs the walk holds at once (about 100 bytes each).
HELD_KERNELS = 4_000_000
VIA = ("stream", "launch", "stream_wait", "collective", "p2p", "start")
_CODE = {v: i for i, v in enumerate(VIA)}
_START = _CODE["start"]
# A row of the walk's output: idx, start_ns, end_ns, via, path_start_ns, path_end_ns.
_WIDTH = 6
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


def _late_edges(waits: pl.DataFrame | None, instances: pl.DataFrame | None) -> pl.DataFrame | None:
    """rank, start_ns, _crank, _cstart, _p2p: per communication call that waited for a
    later rank (collective_waits.wait_ns > 0), the instance's last rank and its arrival
    (match.last_arrivals, as the blame names it). None without waits or instances."""
    if waits is None or instances is None:
        return None
    return (
        last_arrivals(waits, instances)
        .filter((pl.col("wait_ns") > 0) & (pl.col("last_rank") != pl.col("rank")))
        .select("rank", "start_ns", _crank="last_rank", _cstart="last_start_ns", _p2p="p2p")
    )


class _Rank:
    """One rank's graph as arrays (module docstring), built with vectorised numpy over the
    rank's kernels in (start, end, stream) order, `idx` their position; for the walk and,
    as a table, rank_graph."""

    def __init__(self, k: pl.DataFrame, late: pl.DataFrame | None, tolerance_ns: int) -> None:
        if not _in_graph_order(k):
            k = k.sort("start_ns", "end_ns", "stream")
        n = k.height
        s = k["start_ns"].to_numpy().astype(np.int64, copy=False)
        e = k["end_ns"].to_numpy().astype(np.int64, copy=False)
        st = k["stream"].to_numpy().astype(np.int64, copy=False)
        got = k.select(  # one query for the three
            has=pl.col("launch_ns").is_not_null(),
            launch=pl.col("launch_ns").fill_null(_FAR),
            comm=(pl.col("kind") == "communication").fill_null(False),
        )
        has_launch = got["has"].to_numpy()
        launch = got["launch"].to_numpy().astype(np.int64, copy=False)
        self.comm = got["comm"].to_numpy()
        self.labels = pl.DataFrame([k["stream"], k["kind"], k["name"]])
        self.start, self.end, self.stream, self.launch = s, e, st, launch
        idx = np.arange(n, dtype=np.int64)
        none = np.full(n, -1, dtype=np.int64)
        # (a) stream order: the previous kernel on the same stream.
        by_stream = np.argsort(st, kind="stable")
        sp = none.copy()
        if n > 1:
            same = st[by_stream[1:]] == st[by_stream[:-1]]
            sp[by_stream[1:][same]] = by_stream[:-1][same]
        has_sp = sp >= 0
        se = np.where(has_sp, e[np.maximum(sp, 0)], _FAR)
        # The kernels in end order; per row the latest-ending kernel of another stream at or
        # before it (the row before its run of one stream in end order).
        eo = np.argsort(e, kind="stable")  # by end, then idx
        e_sorted, st_sorted = e[eo], st[eo]
        run_start = np.ones(n, dtype=bool)
        run_start[1:] = st_sorted[1:] != st_sorted[:-1]
        head = np.maximum.accumulate(np.where(run_start, idx, 0))
        before = head - 1
        a_idx = np.where(before >= 0, eo[np.maximum(before, 0)], -1)
        a_end = np.where(before >= 0, e_sorted[np.maximum(before, 0)], _FAR)
        # (c) another stream's latest end at or before the start (within the tolerance).
        pos = np.searchsorted(e_sorted, s + tolerance_ns, side="right") - 1
        found = pos >= 0
        at = np.maximum(pos, 0)
        own = found & (st_sorted[at] == st)
        w_idx = np.where(own, a_idx[at], np.where(found, eo[at], -1))
        w_end = np.where(own, a_end[at], np.where(found, e_sorted[at], _FAR))
        has_w = found & (w_idx >= 0)
        # (b) the launch: where the walk goes on, the rank's latest end at or before it.
        lpos = np.searchsorted(e_sorted, launch, side="right") - 1
        l_idx = np.where(has_launch & (lpos >= 0), eo[np.maximum(lpos, 0)], -1)
        ready = np.maximum(np.where(has_sp, se, _FAR), np.where(has_launch, launch, _FAR))
        waited = has_w & (s - ready > tolerance_ns) & (w_end > ready)
        if k["waits_for"].null_count() < n:
            # The trace records the rank's stream waits: a kernel no wait held back waited
            # for none, one held by a wait the trace resolves waited for the kernel it names
            # (if that ended after the stream and the launch freed it), and only one held by
            # a wait it does not resolve (waits_for -1) is left to the rule.
            r_idx, r_end, recorded = _recorded_waits(k, e)
            unresolved = (k["waits_for"] == -1).fill_null(False).to_numpy()
            waited = (recorded & (r_end > ready) & (r_end <= s + tolerance_ns)) | (
                unresolved & waited
            )
            w_idx = np.where(recorded, r_idx, w_idx)
            w_end = np.where(recorded, r_end, w_end)
        launched = has_launch & (~has_sp | (launch >= se))
        via = np.full(n, _CODE["start"], dtype=np.int8)
        via[has_sp] = _CODE["stream"]
        via[launched] = _CODE["launch"]
        via[waited] = _CODE["stream_wait"]
        self.via = via
        self.release = np.select([waited, launched, has_sp], [w_end, launch, se], _FAR)
        self.pred_idx = np.select([waited, launched, has_sp], [w_idx, l_idx, sp], -1)
        # (d, e) a communication kernel that waited: bound by the late rank's kernel.
        self.late_rank = none.copy()
        self.late_start = np.zeros(n, dtype=np.int64)
        self.late_p2p = np.zeros(n, dtype=bool)
        if late is not None and late.height and n:
            ls = late["start_ns"].to_numpy().astype(np.int64, copy=False)
            order = np.argsort(ls, kind="stable")
            ls = ls[order]
            hit = np.minimum(np.searchsorted(ls, s), len(ls) - 1)
            matched = (ls[hit] == s) & self.comm
            crank = late["_crank"].to_numpy()[order][hit]
            cstart = late["_cstart"].to_numpy()[order][hit]
            crossed = matched & (cstart > s)
            self.late_rank = np.where(crossed, crank, -1).astype(np.int64)
            self.late_start = np.where(crossed, cstart, 0).astype(np.int64)
            self.late_p2p = crossed & late["_p2p"].fill_null(False).to_numpy()[order][hit]
        # Running maximum of the end in start order, and where it was reached.
        if n:
            self.reach = np.maximum.accumulate(e)
            self.reach_at = np.maximum.accumulate(np.where(e == self.reach, idx, 0))
        else:
            self.reach = e
            self.reach_at = e

    @functools.cached_property
    def walk(self) -> tuple[np.ndarray, ...]:
        """start, end, via, pred_idx, late_rank, late_start as contiguous arrays (int64, via
        int8): what the walk along the rank reads (_run)."""
        return tuple(
            np.ascontiguousarray(a, dtype=t)
            for a, t in (
                (self.start, np.int64),
                (self.end, np.int64),
                (self.via, np.int8),
                (self.pred_idx, np.int64),
                (self.late_rank, np.int64),
                (self.late_start, np.int64),
            )
        )

    def frame(self, rank: int) -> pl.DataFrame:
        """The rank's rows of rank_graph (GRAPH_SCHEMA)."""
        n = len(self.start)
        code = pl.Series(self.via, dtype=pl.Int8)
        crossed = pl.Series(self.late_rank >= 0)
        has_pred = pl.Series(self.pred_idx >= 0)
        return pl.DataFrame(
            {
                "rank": pl.Series([rank] * n, dtype=pl.Int64),
                "idx": np.arange(n, dtype=np.int64),
                "stream": self.stream,
                "kind": self.labels["kind"],
                "name": self.labels["name"],
                "start_ns": self.start,
                "end_ns": self.end,
                "launch_ns": pl.Series(self.launch).replace(_FAR, None),
                "via": code.replace_strict(dict(enumerate(VIA)), return_dtype=pl.String),
                "release_ns": pl.Series(self.release).replace(_FAR, None),
                "pred_idx": pl.select(pl.when(has_pred).then(pl.Series(self.pred_idx))).to_series(),
                "late_via": pl.select(
                    pl.when(crossed).then(
                        pl.when(pl.Series(self.late_p2p))
                        .then(pl.lit("p2p"))
                        .otherwise(pl.lit("collective"))
                    )
                ).to_series(),
                "late_rank": pl.select(
                    pl.when(crossed).then(pl.Series(self.late_rank))
                ).to_series(),
                "late_start_ns": pl.select(
                    pl.when(crossed).then(pl.Series(self.late_start))
                ).to_series(),
            }
        ).select(*[pl.col(c).cast(t) for c, t in GRAPH_SCHEMA.items()])

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


def _recorded_waits(k: pl.DataFrame, end: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per kernel of one rank's `k` (graph order), the kernel its recorded stream wait
    names (`waits_for`, a correlation: the rank's kernel with that correlation): its
    position (-1: none), its end, and whether there is one."""
    n = k.height
    corr = k["correlation"].fill_null(-1).to_numpy().astype(np.int64, copy=False)
    want = k["waits_for"].fill_null(-1).to_numpy().astype(np.int64, copy=False)
    order = np.argsort(corr, kind="stable")
    at = np.minimum(np.searchsorted(corr[order], want), max(n - 1, 0))
    found = (want >= 0) & (corr[order][at] == want) if n else np.zeros(0, dtype=bool)
    idx = np.where(found, order[at], -1)
    return idx, np.where(found, end[np.maximum(idx, 0)], _FAR), found


def _in_graph_order(k: pl.DataFrame) -> bool:
    """One rank's `k` already in (start_ns, end_ns, stream) order (the kernels table comes
    in start order; only ties on the start can be out of it): no sort needed."""
    ds, de = pl.col("start_ns").diff(), pl.col("end_ns").diff()
    ok = (ds > 0) | ((ds == 0) & ((de > 0) | ((de == 0) & (pl.col("stream").diff() >= 0))))
    return bool(k.select(ok.fill_null(True).all()).item())


def rank_nodes(
    kernels: pl.DataFrame,
    waits: pl.DataFrame | None = None,
    instances: pl.DataFrame | None = None,
    tolerance_ns: int = TOLERANCE_NS,
) -> dict[int, _Rank]:
    """The graph of each rank of `kernels` (rank_graph's inputs), as arrays."""
    k = kernels.select(
        pl.col("rank").cast(pl.Int64),
        _col(kernels, "stream", pl.Int64()).fill_null(-1),
        _col(kernels, "kind", pl.String()),
        _col(kernels, "name", pl.String()),
        pl.col("start_ns").cast(pl.Int64),
        pl.col("end_ns").cast(pl.Int64),
        _col(kernels, "launch_ns", pl.Int64()),
        _col(kernels, "correlation", pl.Int64()),
        _col(kernels, "waits_for", pl.Int64()),
    ).filter(pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null())
    if k.height == 0:
        return {}
    late = _late_edges(waits, instances)
    lates = late.partition_by("rank", as_dict=True) if late is not None and late.height else {}
    if not k["rank"].is_sorted():
        k = k.sort("rank", maintain_order=True)
    # Each rank's rows are one slice (no copy) of the rank-ordered kernels.
    ranks = k["rank"].to_numpy()
    cuts = np.flatnonzero(np.diff(ranks)) + 1
    bounds = zip(np.r_[0, cuts], np.r_[cuts, len(ranks)], strict=True)
    return {
        int(ranks[a]): _Rank(k.slice(int(a), int(b - a)), lates.get((int(ranks[a]),)), tolerance_ns)
        for a, b in bounds
    }


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
    `late_start_ns` (that rank's communication kernel of the instance starts there).
    Computed per rank with vectorised numpy (searches in the rank's kernels sorted by end),
    no loop over kernels."""
    nodes = rank_nodes(kernels, waits, instances, tolerance_ns)
    if not nodes:
        return pl.DataFrame(schema=GRAPH_SCHEMA)
    return pl.concat([g.frame(r) for r, g in sorted(nodes.items())])


Loader = Callable[[list[int]], tuple[dict[int, _Rank], pl.DataFrame]]


def critical_walk(times: pl.DataFrame, load: Loader) -> pl.DataFrame:
    """The kernel-level critical path of every step of `times` (steptime.step_times:
    step, critical_rank; CRITICAL_KERNELS_SCHEMA), walked back from the end of the critical
    rank's window along binding predecessors.

    `load(ranks)` returns (graph, windows) for those ranks: their graphs (rank_nodes) and
    their step windows (the steps table: rank, step, start_ns, end_ns). It is called once with
    the critical ranks, then once per further rank the path reaches. A row per element of
    the path, last first (`order` 0): its kernel, `via` the edge to the next row (its
    binding predecessor; `start` on the last row: none inside the step), `gap_ns` the time
    between that predecessor's end (or arrival) and this kernel's start that the path
    spends waiting (idle or on the CPU's launch), and `path_start_ns`..`path_end_ns` the
    stretch of the path it holds (the rows tile the path)."""
    if times.height == 0 or "critical_rank" not in times.columns:
        return pl.DataFrame(schema=CRITICAL_KERNELS_SCHEMA)
    # The ranks' graphs the walk holds, least recently used first: at most HELD_KERNELS
    # kernels' worth (a big job's path reaches every rank; one reached again after it was
    # let go is built again).
    ranks: OrderedDict[int, _Rank | None] = OrderedDict()
    window: dict[tuple[int, int], tuple[int, int]] = {}

    def held() -> int:
        return sum(len(g.start) for g in ranks.values() if g is not None)

    def fetch(wanted: Iterable[int]) -> None:
        # Once per hop of the path: the ranks wanted only, not every rank held.
        want = {int(r) for r in wanted if r is not None}
        todo = []
        for r in want:
            if r in ranks:
                ranks.move_to_end(r)
            else:
                todo.append(r)
        if not todo:
            return
        todo.sort()
        nodes, wins = load(todo)
        for r, s, a, b in wins.select("rank", "step", "start_ns", "end_ns").iter_rows():
            window[(int(r), int(s))] = (int(a), int(b))
        for r in todo:
            node = nodes.get(r)
            ranks[r] = node if node is not None and len(node.start) else None
        while len(ranks) > len(want) and held() > HELD_KERNELS:
            oldest = next(r for r in ranks if r not in want)
            del ranks[oldest]

    fetch(times["critical_rank"].drop_nulls().to_list())
    run = _compiled.run if _compiled is not None else _run
    out = np.empty(_WIDTH * 4096, dtype=np.int64)
    pos = 0
    # (step, rank, first row, end row): who holds each stretch of `out`'s rows.
    owners: list[tuple[int, int, int, int]] = []
    for step, crit in times.select("step", "critical_rank").iter_rows():
        if crit is None or (crit, step) not in window:
            continue
        low, high = window[(crit, step)]
        fetch([crit])
        g = ranks.get(crit)
        i = g.last_before(high) if g is not None else -1
        if g is None or i < 0 or g.end[i] <= low:
            continue
        rank, cursor, bound, skip = crit, high, low, False
        # Per rank the kernels already on this step's path: it never comes back to one.
        seen: dict[int, np.ndarray] = {}
        while True:
            arrays = g.walk
            mark = seen.get(rank)
            if mark is None:
                mark = seen[rank] = np.zeros(len(arrays[0]), dtype=np.uint8)
            first = pos
            pos, state, i, cursor = run(*arrays, mark, out, pos, i, cursor, bound, skip)
            if pos > first:
                owners.append((step, rank, first, pos))
            skip = False
            if state == 2:  # out is full
                out = np.concatenate([out, np.empty_like(out)])
                continue
            if state == 0:
                break
            # A call that waited: its end is bound by the late rank's arrival, when that lies
            # before where the path reached it (a call reached at its start is bound by what
            # let it start).
            q, arrived = int(arrays[4][i]), int(arrays[5][i])
            fetch([q])
            gq = ranks.get(q)
            j = gq.starting_at(arrived) if gq is not None else -1
            wq = window.get((q, step))
            bq = max(low, wq[0]) if wq is not None else low
            if j < 0 or arrived <= bq or (q in seen and seen[q][j]):
                skip = True  # the path goes on at the call's start edge
                continue
            if (pos + 1) * _WIDTH > len(out):
                out = np.concatenate([out, np.empty_like(out)])
            via = _CODE["p2p"] if g.late_p2p[i] else _CODE["collective"]
            s, e = int(arrays[0][i]), int(arrays[1][i])
            out[pos * _WIDTH : (pos + 1) * _WIDTH] = (i, s, e, via, min(arrived, cursor), cursor)
            owners.append((step, rank, pos, pos + 1))
            pos += 1
            g, rank, i, cursor, bound = gq, q, j, arrived, bq  # type: ignore[assignment]
    if pos == 0:
        return pl.DataFrame(schema=CRITICAL_KERNELS_SCHEMA)
    rows = out[: pos * _WIDTH].reshape(pos, _WIDTH)
    lengths = [b - a for _, _, a, b in owners]
    found = pl.DataFrame(
        {
            "step": np.repeat([o[0] for o in owners], lengths).astype(np.int64),
            "rank": np.repeat([o[1] for o in owners], lengths).astype(np.int64),
            "idx": rows[:, 0],
            "start_ns": rows[:, 1],
            "end_ns": rows[:, 2],
            "_via": rows[:, 3],
            "path_start_ns": rows[:, 4],
            "path_end_ns": rows[:, 5],
        }
    ).with_row_index("_row")
    found = found.with_columns(
        order=pl.int_range(pl.len(), dtype=pl.Int64).over("step"),
        via=pl.col("_via").replace_strict(dict(enumerate(VIA)), return_dtype=pl.String),
        gap_ns=(pl.min_horizontal("start_ns", "path_end_ns") - pl.col("path_start_ns")).clip(
            lower_bound=0
        ),
    )
    # The labels of the path's kernels only (a rank's `idx` is its row in the rank's
    # graph), a rank at a time: one let go during the walk is built again.
    parts = []
    for (rank,), part in (
        found.select("_row", "rank", "idx").partition_by("rank", as_dict=True).items()
    ):
        fetch([rank])
        labels = ranks[rank].labels  # type: ignore[union-attr]
        parts.append(labels[part["idx"].to_numpy()].hstack(part.select("_row")))
    labels = pl.concat(parts, how="vertical_relaxed")
    return (
        found.join(labels, on="_row", how="left")
        .sort("_row")
        .select(*[pl.col(n).cast(t) for n, t in CRITICAL_KERNELS_SCHEMA.items()])
    )


def _run(
    start: np.ndarray,
    end: np.ndarray,
    via: np.ndarray,
    pred: np.ndarray,
    late_rank: np.ndarray,
    late_start: np.ndarray,
    seen: np.ndarray,
    out: np.ndarray,
    pos: int,
    i: int,
    cursor: int,
    bound: int,
    skip: bool,
) -> tuple[int, int, int, int]:
    """The walk along one rank from its kernel i, reached at `cursor`, back along start
    edges (critical_walk; compiled in _walk.c): each kernel's row (_WIDTH: idx, start, end,
    the edge to the next, the stretch of the path it holds) written to `out` from row
    `pos`, `seen` marked. It stops (pos, state, i, cursor) at state 0 where the path ends
    (no predecessor after `bound`, the step's start on this rank, or one already on the
    path), 1 at a kernel that may cross to its late rank (its row not written; `skip`
    goes on past that test) and 2 when `out` is full. Python's loop reads the arrays
    through memoryviews, about four times faster per element than an array's indexing."""
    start_, end_, via_, pred_, late_rank_, late_start_, seen_, out_ = (
        memoryview(a) for a in (start, end, via, pred, late_rank, late_start, seen, out)
    )
    n, cap = len(start_), len(out_) // _WIDTH
    while True:
        if pos >= cap:
            return pos, 2, i, cursor
        seen_[i] = 1
        s = start_[i]
        if not skip and late_rank_[i] >= 0 and s < late_start_[i] < cursor:
            return pos, 1, i, cursor
        skip = False
        v = via_[i]
        j, t, nxt = -1, 0, False
        if v != _START:
            j = pred_[i]
            if 0 <= j < n and not seen_[j]:
                t = min(end_[j], max(min(s, cursor), bound))
                nxt = t > bound
        k = pos * _WIDTH
        out_[k] = i
        out_[k + 1] = s
        out_[k + 2] = end_[i]
        out_[k + 3] = v if nxt else _START
        out_[k + 4] = min(t if nxt else bound, cursor)
        out_[k + 5] = cursor
        pos += 1
        if not nxt:
            return pos, 0, i, cursor
        i, cursor = j, t


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

    def load(ranks: list[int]) -> tuple[dict[int, _Rank], pl.DataFrame]:
        pick = pl.col("rank").is_in(ranks)
        w = None if waits is None or waits.height == 0 else waits.filter(pick)
        return rank_nodes(kernels.filter(pick), w, instances, tolerance_ns), windows.filter(pick)

    return load
