"""Where the tables with a row per kernel, call or step of every rank are kept: in memory for
small jobs, in Arrow IPC files for big ones.

Kernels (about 100 bytes each, some 0.1 GB per GB of trace JSON), collective calls (about 300
bytes each), the calls' waits and the steps (120 bytes each) grow with ranks x steps: merged
in the parent, 1024 ranks of 6,650 calls hold 2.3 GiB of calls alone (docs/scale.md). Big jobs
therefore keep each rank's rows in its own uncompressed Arrow IPC file (written by the worker
that built them, or by the cross-rank step that derived them), and the parent reads them in
batches of whole ranks (`batches`), as one lazy query for the streaming engine (`lazy`), or a
window of ranks at a time (`per_window`): it holds one batch, or a query's bounded state,
whatever the rank count. A query reads a run of files whose rows hold their final ranks (what
workers write where the trace's rank claim holds) with one scan: the streaming engine holds
state per scan, some 140 kB, a GB over 8192 files read one scan each. Clock offsets are
applied as rows are read, so the files never change.

`frame()` still gives every rank's rows as one DataFrame (`Report.kernels`,
`Report.collectives`, `Report.steps`) for users who ask: on a big job that costs what a
merged table costs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tempfile
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from kineto_comm.frames import read_frame, shared_text, write_frame
from kineto_comm.lazy import collect
from kineto_comm.timeshift import shift, shifted

BATCH_ROWS = 100_000  # rows per batch: a few MB for the columns a rule reads
# Calls per view of a few ranks (Tables.rank_slices): a fold over ranks holds state per
# (rank, step) for about this many calls' ranks at a time.
SLICE_ROWS = 2_000_000
TIME_COLUMNS = [
    "start_ns",
    "end_ns",
    "launch_ns",
    "cpu_start_ns",
    "cpu_end_ns",
    "compute_start_ns",
    "compute_end_ns",
]


SPILL_PREFIX = "kineto-comm-tables-"
_OWNER = "owner"  # in each spill folder: the host, pid and start time of the process


class SpillFolder:
    """A temporary folder for per-rank files, removed when the last store using it is gone
    (or at exit).

    A process that is killed (SIGKILL, SIGTERM, an out-of-memory kill, `os._exit`) never
    removes its folder, which can hold GBs: so each new folder first removes those whose
    owner, on this host, is gone (`sweep`)."""

    def __init__(self, root: str | Path | None = None) -> None:
        sweep(root)
        self.path = Path(tempfile.mkdtemp(prefix=SPILL_PREFIX, dir=root))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.path, True)
        (self.path / _OWNER).write_text(_owner(os.getpid()))


def _started(pid: int) -> str:
    """When process `pid` started (Linux: clock ticks since boot, field 22 of
    /proc/PID/stat), so that a pid used again by a later process is not taken for the
    owner; "-" where that is not known."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "-"
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else "-"


def _owner(pid: int) -> str:
    return f"{socket.gethostname()}\n{pid}\n{_started(pid)}\n"


def _alive(pid: int, started: str) -> bool:
    """Whether the process that wrote an owner record may still be running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (PermissionError), or cannot tell
        return True
    return started == "-" or _started(pid) in ("-", started)


def sweep(root: str | Path | None = None) -> list[Path]:
    """Remove the spill folders under `root` (default: the temporary folder) left by
    processes of this host that are gone; returns them. Folders of other hosts (a shared
    temporary folder), of live processes, or without an owner record are left alone."""
    if os.name != "posix":  # os.kill(pid, 0) is no liveness test elsewhere
        return []
    host, removed = socket.gethostname(), []
    for folder in Path(root or tempfile.gettempdir()).glob(SPILL_PREFIX + "*"):
        try:
            lines = (folder / _OWNER).read_text().splitlines()
            mine, pid, started = lines[0] == host, int(lines[1]), lines[2]
        except (OSError, ValueError, IndexError):
            continue
        if mine and not _alive(pid, started):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


@dataclass(frozen=True)
class Part:
    """One source of rows: an in-memory frame (any ranks) or an IPC file (one rank's when
    `rank` is set, which then replaces the provisional rank the file holds, `held`)."""

    rows: int
    frame: pl.DataFrame | None = None
    path: str | None = None
    rank: int | None = None  # the final rank of a file's rows (the file holds `held`)
    span: tuple[int, int] | None = None  # lowest and highest rank of a part of several ranks
    # The rank a file's rows hold (what the trace claimed, -1 when it did not); None: unknown.
    held: int | None = None
    # The file's columns and types (`layout`): files are read by one scan only when theirs
    # agree (a column of nulls has no type of its own); None: unknown.
    layout: str | None = None

    @property
    def bounds(self) -> tuple[int, int] | None:
        """The lowest and highest rank of the rows; None when not known."""
        return (self.rank, self.rank) if self.rank is not None else self.span

    @property
    def relabels(self) -> bool:
        """True when the rows' `rank` must be replaced as they are read."""
        return self.rank is not None and self.held != self.rank

    def within(self, lo: int | None, hi: int | None) -> bool | None:
        """True when every row's rank is in [lo, hi] (None: open), False when none is,
        None when some may be."""
        if self.bounds is None:
            return None
        low, high = self.bounds
        if (lo is None or low >= lo) and (hi is None or high <= hi):
            return True
        if (lo is not None and high < lo) or (hi is not None and low > hi):
            return False
        return None

    def read(self, columns: list[str] | None = None) -> pl.DataFrame:
        """The rows (only `columns`, in that order, when given)."""
        if self.frame is not None:
            return self.frame if columns is None else self.frame.select(columns)
        assert self.path is not None
        if not self.relabels:
            return read_frame(self.path, columns)
        rank = pl.lit(self.rank, dtype=pl.Int64).alias("rank")
        if columns is None:
            return read_frame(self.path).with_columns(rank)
        stored = [c for c in columns if c != "rank"] or ["rank"]
        return read_frame(self.path, stored).with_columns(rank).select(columns)

    def schema(self) -> pl.Schema:
        """The stored columns and their types (a file's text columns are Categorical)."""
        if self.frame is not None:
            return self.frame.schema
        assert self.path is not None
        return pl.scan_ipc(self.path, glob=False).collect_schema()

    def scan(
        self,
        columns: list[str] | None = None,
        where: pl.Expr | None = None,
        categorical: tuple[str, ...] = (),
        schema: pl.Schema | None = None,
    ) -> pl.LazyFrame:
        """The rows as a lazy query, the final rank in `rank` (see RankStore.lazy).

        schema: the file's `schema()` when the caller knows it (a store's files share one).
        Each query that reads its schema from its file keeps the file's metadata for as
        long as the plan lives: some 70 kB a file, 150 MB over 2048 rank files."""
        if self.frame is not None:
            query = self.frame.lazy() if where is None else self.frame.lazy().filter(where)
            query = query if columns is None else query.select(columns)
            names = self.frame.columns if columns is None else columns
            keep = [c for c in categorical if c in names and self.frame.schema[c] == pl.String]
            return query.with_columns(pl.col(keep).cast(pl.Categorical))
        return _scan_files(
            [self], self.schema() if schema is None else schema, columns, where, categorical
        )


def layout(path: str | Path) -> str:
    """A short fingerprint of an IPC file's columns and their types."""
    columns = repr(list(pl.read_ipc_schema(path).items())).encode()
    return hashlib.blake2b(columns, digest_size=8).hexdigest()


def _scan_files(
    parts: list[Part],
    schema: pl.Schema,
    columns: list[str] | None,
    where: pl.Expr | None,
    categorical: tuple[str, ...],
) -> pl.LazyFrame:
    """The rows of file parts (`schema`: theirs) as one scan, in order, the final rank in
    `rank`: either no part relabels its rows, or one does alone, or each does and holds a
    rank no other one holds (RankStore._runs)."""
    names = list(schema) if columns is None else columns
    text = [c for c in names if schema.get(c) == pl.Categorical and c not in categorical]
    query = pl.scan_ipc([p.path for p in parts], glob=False)
    if where is not None:
        query = query.filter(where)
    moved = [p for p in parts if p.relabels]
    if moved and "rank" in names:
        if len(parts) == 1:
            rank = pl.lit(parts[0].rank, dtype=pl.Int64)
        else:
            rank = pl.col("rank").replace_strict(
                [p.held for p in moved], [p.rank for p in moved], return_dtype=pl.Int64
            )
        query = query.with_columns(rank=rank)
    return query.with_columns(pl.col(text).cast(pl.String)).select(names)


class RankStore:
    """Every rank's rows of one table (kernels: kineto_comm.model.kernels; collectives:
    kineto_comm.model.collectives; collective_waits), one batch at a time."""

    def __init__(
        self,
        parts: Iterable[Part] = (),
        offsets: pl.DataFrame | None = None,
        folder: SpillFolder | None = None,
        window: tuple[int | None, int | None] = (None, None),
    ) -> None:
        self._parts = tuple(parts)
        self._offsets = offsets  # the offsets table (rank, offset_ns), None: no shift
        self._folder = folder  # kept alive as long as a store reads its files
        self._window = window  # only the rows of ranks in [lo, hi] (None: open)
        self._index: dict[int | None, list[int]] | None = None  # rank -> positions of parts

    @classmethod
    def from_frame(cls, frame: pl.DataFrame) -> RankStore:
        """A store over one in-memory table (small jobs, tests, user-built reports)."""
        return cls([keep(frame, None)])

    def restricted(self, lo: int | None, hi: int | None) -> RankStore:
        """The same store with only the rows of ranks in [lo, hi] (None: open): the files of
        other ranks are not read."""
        parts = [p for p in self._parts if p.within(lo, hi) is not False]
        if self._parts and not parts:  # no rows, but the table's columns
            parts = [self._parts[0]]
        return RankStore(parts, self._offsets, self._folder, (lo, hi))

    def windows(self, rows: int) -> list[tuple[int | None, int | None]]:
        """Rank ranges [lo, hi] (None: open) that hold about `rows` rows each, every rank in
        exactly one, cut only between parts: [(None, None)] when the store fits in one."""
        if self.height <= rows:
            return [(None, None)]
        spans = sorted((p.bounds, p.rows) for p in self._parts if p.bounds is not None)
        cuts: list[int] = []
        held, top = 0, None
        for (low, high), n in spans:
            if held >= rows and top is not None and low > top:
                cuts.append(low)
                held = 0
            held += n
            top = high if top is None else max(top, high)
        edges = [None, *cuts, None]
        return [(a, None if b is None else b - 1) for a, b in zip(edges, edges[1:], strict=False)]

    def per_window(
        self, query: Callable[[RankStore], pl.LazyFrame], rows: int | None = None
    ) -> pl.DataFrame:
        """`query(view)` collected for views of whole ranks holding about `rows` rows each
        (default SLICE_ROWS), the results stacked: how an aggregation whose state grows with
        every rank's rows (distinct steps per rank) stays within bounds on a big job."""
        limit = SLICE_ROWS if rows is None else rows
        found = []
        for lo, hi in self.windows(limit):
            view = self.restricted(lo, hi)
            found.append(collect(query(view), view.height))
        return pl.concat(found, how="vertical_relaxed")

    def _mask(self, part: Part) -> pl.Expr | None:
        """The filter keeping `part`'s rows of the window's ranks; None when all are."""
        lo, hi = self._window
        if part.within(lo, hi):
            return None
        rank = pl.col("rank")
        return (pl.lit(True) if lo is None else rank >= lo) & (
            pl.lit(True) if hi is None else rank <= hi
        )

    @property
    def height(self) -> int:
        """Rows (with a window: of the parts holding its ranks, a part cut by it whole)."""
        return sum(p.rows for p in self._parts)

    @property
    def columns(self) -> list[str]:
        """The table's column names (none for a store without parts)."""
        return list(self._parts[0].schema()) if self._parts else []

    @property
    def spilled(self) -> bool:
        """True when some rank's rows live in a file."""
        return any(p.path is not None for p in self._parts)

    def with_offsets(self, offsets: pl.DataFrame) -> RankStore:
        """The same rows on another clock: `offset_ns` (per `rank`) is subtracted from
        every time column when rows are read."""
        return RankStore(self._parts, offsets, self._folder, self._window)

    def batches(
        self,
        ranks: Iterable[int] | None = None,
        columns: list[str] | None = None,
        rows: int | None = None,
    ) -> Iterator[pl.DataFrame]:
        """The rows of `ranks` (default: all; only `columns` when given), in DataFrames of
        whole ranks holding about `rows` rows each (default BATCH_ROWS; more when one rank
        has more)."""
        rows = BATCH_ROWS if rows is None else rows
        if columns is not None and "rank" not in columns:
            columns = ["rank", *columns]
        wanted = None if ranks is None else set(ranks)
        pending: list[pl.DataFrame] = []
        held = 0
        for group in _groups(self._holding(wanted), rows):
            frame = _read_group(group, columns)
            if self._offsets is not None:
                frame = shift(frame, self._offsets, TIME_COLUMNS)
            if wanted is not None and any(part.rank is None for part in group):
                frame = frame.filter(pl.col("rank").is_in(sorted(wanted)))
            mask = next((m for p in group if (m := self._mask(p)) is not None), None)
            if mask is not None:
                frame = frame.filter(mask)
            pending.append(frame)
            held += frame.height
            if held >= rows:
                yield pl.concat(pending, how="vertical_relaxed")
                pending, held = [], 0
        if pending:
            yield pl.concat(pending, how="vertical_relaxed")

    def _holding(self, wanted: set[int] | None) -> Iterable[Part]:
        """The parts that may hold rows of the `wanted` ranks (all when None), in order: a
        rank at a time over thousands of one-rank files, found without a pass over them all."""
        if wanted is None:
            return self._parts
        if self._index is None:  # built whole before it is shared: threads may read stores
            index: dict[int | None, list[int]] = {}
            for i, part in enumerate(self._parts):
                index.setdefault(part.rank, []).append(i)
            self._index = index
        found = [i for r in (*wanted, None) for i in self._index.get(r, ())]
        return [self._parts[i] for i in sorted(found)]

    def frame(
        self, ranks: Iterable[int] | None = None, columns: list[str] | None = None
    ) -> pl.DataFrame:
        """The rows of `ranks` (default: all; only `columns` when given) in one DataFrame."""
        out = list(self.batches(ranks, columns, rows=2**62))
        return out[0] if out else pl.DataFrame()

    def discard(self) -> None:
        """Delete the store's files now (a transient table's), not with its folder."""
        for part in self._parts:
            if part.path is not None:
                Path(part.path).unlink(missing_ok=True)

    def _runs(self) -> list[list[Part]]:
        """The parts in order, consecutive files grouped where one scan can read them all:
        files of one layout whose rows hold their final ranks, or files of one layout and one
        rank each whose rows hold distinct provisional ones. A query holds state per scan
        (about 140 kB), so a store of thousands of rank files read one scan per file would
        hold a few GB."""
        return list(
            _groups(self._parts, 2**62, lambda p: _file_kind(p) if self._mask(p) is None else None)
        )

    def lazy(
        self,
        columns: list[str] | None = None,
        *,
        where: pl.Expr | None = None,
        categorical: tuple[str, ...] = (),
    ) -> pl.LazyFrame:
        """Every rank's rows (only `columns` when given) as one lazy query, offsets applied:
        on the streaming engine, aggregations over it hold a bounded state whatever the
        rank count (lazy.collect).

        where: a filter on the stored columns (not `rank` nor times), applied as rows are
            read, before text is turned into strings.
        categorical: text columns left Categorical (or made so): a long value repeated on
            every row (`pg_ranks` lists every rank of a group) would otherwise be copied
            into each of millions of rows."""
        if not self._parts:
            return pl.LazyFrame()
        files = [p for p in self._parts if p.path is not None]
        schema = files[0].schema() if files else None
        parts = []
        for run in self._runs():
            p = run[0]
            mask = self._mask(p)
            if len(run) > 1:
                assert schema is not None
                parts.append(_scan_files(run, schema, columns, where, categorical))
            elif mask is None:
                parts.append(p.scan(columns, where, categorical, schema if p.path else None))
            elif columns is None or "rank" in columns:
                scan = p.scan(columns, where, categorical, schema if p.path else None)
                parts.append(scan.filter(mask))
            else:
                scan = p.scan([*columns, "rank"], where, categorical, schema if p.path else None)
                parts.append(scan.filter(mask).drop("rank"))
        query = pl.concat(parts, how="vertical_relaxed") if len(parts) > 1 else parts[0]
        if self._offsets is None:
            return query
        schema = query.collect_schema()
        moved = shifted(self._offsets, [c for c in TIME_COLUMNS if c in schema])
        return query.with_columns(moved) if moved else query


def _file_kind(part: Part) -> tuple[str, str] | None:
    """What decides whether file parts can be read together: ("stored", layout) for a file
    whose rows hold their final rank, ("moved", layout) for one whose rows are relabelled
    (each such file in a read must hold a provisional rank no other one does); None for a
    part read alone (an in-memory frame, a file of unknown layout or held rank)."""
    if part.path is None or part.layout is None:
        return None
    if not part.relabels:
        return ("stored", part.layout)
    return None if part.held is None else ("moved", part.layout)


def _groups(
    parts: Iterable[Part],
    rows: int,
    kind_of: Callable[[Part], tuple[str, str] | None] = _file_kind,
) -> Iterator[list[Part]]:
    """`parts` in order, consecutive files that one read can take together grouped (those
    of one `kind_of`, see _file_kind; None: a part alone), up to about `rows` rows a group:
    a read of a rank file has a fixed cost (some 1.6 ms, nearly half of it making text
    shared strings), which a read per file paid 1,283 times in the cross-rank steps of 256
    ranks (bench/README.md, thirty-fourth session)."""
    group: list[Part] = []
    kind: tuple[str, str] | None = None
    held: set[int | None] = set()
    count = 0
    for part in parts:
        this = kind_of(part)
        fits = (
            this is not None
            and this == kind
            and count < rows
            and (this[0] == "stored" or part.held not in held)
        )
        if group and not fits:
            yield group
            group, held, count = [], set(), 0
        group.append(part)
        kind = this
        count += part.rows
        if this is not None and this[0] == "moved":
            held.add(part.held)
    if group:
        yield group


def _read_group(parts: list[Part], columns: list[str] | None) -> pl.DataFrame:
    """The rows of `parts` (one part, or files _groups put together), final ranks in
    `rank`, only `columns` (in that order) when given."""
    if len(parts) == 1:
        return parts[0].read(columns)
    schema = parts[0].schema()
    text = tuple(c for c, kind in schema.items() if kind == pl.Categorical)
    return shared_text(collect(_scan_files(parts, schema, columns, None, text)))


def as_store(table: pl.DataFrame | RankStore) -> RankStore:
    """`table` as a store (a DataFrame becomes its one in-memory part)."""
    return table if isinstance(table, RankStore) else RankStore.from_frame(table)


def keep(frame: pl.DataFrame, folder: SpillFolder | None) -> Part:
    """A part holding `frame`'s rows: the frame itself, or an IPC file in `folder` (rows of
    any ranks, the final ones) when one is given."""
    span = None
    if frame.height and "rank" in frame.columns and frame.schema["rank"].is_integer():
        low, high = frame.select(lo=pl.col("rank").min(), hi=pl.col("rank").max()).row(0)
        span = None if low is None else (int(low), int(high))
    if folder is None:
        return Part(rows=frame.height, frame=frame, span=span)
    path = folder.path / f"{uuid.uuid4().hex}.arrow"
    write_frame(frame, path)
    return Part(rows=frame.height, path=str(path), span=span, layout=layout(path))
