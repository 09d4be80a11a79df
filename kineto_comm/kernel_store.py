"""Where every rank's kernels are kept: in memory for small jobs, in Arrow IPC files for big ones.

Kernels are the one per-rank table that grows with the job: about 100 bytes per kernel, some
0.1 GB per GB of trace JSON. Merged in the parent, 256 ranks of 1 GB traces would need
~25 GB, so big jobs keep each rank's kernels in its own uncompressed Arrow IPC file (written
by the worker that built them) and everything in the parent that needs kernels reads them in
batches of whole ranks (`batches`): the parent then holds one batch at a time, whatever the
rank count. Clock offsets are applied as a batch is read, so the files never change.

`frame()` still gives every rank's kernels as one DataFrame (`Report.kernels`) for users who
ask: on a big job that costs what the merged table costs.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from kineto_comm.analysis.align import shift

BATCH_ROWS = 100_000  # rows per batch: a few MB for the columns a rule reads
TIME_COLUMNS = ["start_ns", "end_ns", "launch_ns"]


class SpillFolder:
    """A temporary folder for kernel files, removed when the last store using it is gone
    (or at exit)."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="kineto-comm-kernels-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.path, True)


@dataclass(frozen=True)
class Part:
    """One source of kernel rows: an in-memory frame (any ranks) or one rank's IPC file."""

    rows: int
    frame: pl.DataFrame | None = None
    path: str | None = None
    rank: int | None = None  # the final rank of a file's rows (files hold provisional ones)

    def read(self, columns: list[str] | None = None) -> pl.DataFrame:
        """The rows (only `columns`, in that order, when given)."""
        if self.frame is not None:
            return self.frame if columns is None else self.frame.select(columns)
        from kineto_comm.per_rank import read_frame

        assert self.path is not None
        rank = pl.lit(self.rank, dtype=pl.Int64).alias("rank")  # files hold provisional ranks
        if columns is None:
            return read_frame(self.path).with_columns(rank)
        stored = [c for c in columns if c != "rank"] or ["rank"]
        return read_frame(self.path, stored).with_columns(rank).select(columns)


class RankKernels:
    """Every rank's kernels table (columns: kineto_comm.model.kernels), one batch at a time."""

    def __init__(
        self,
        parts: Iterable[Part] = (),
        offsets: pl.DataFrame | None = None,
        folder: SpillFolder | None = None,
    ) -> None:
        self._parts = tuple(parts)
        self._offsets = offsets  # the offsets table (rank, offset_ns), None: no shift
        self._folder = folder  # kept alive as long as a store reads its files

    @classmethod
    def from_frame(cls, frame: pl.DataFrame) -> RankKernels:
        """A store over one in-memory kernels table (tests, user-built reports)."""
        return cls([Part(rows=frame.height, frame=frame)])

    @property
    def height(self) -> int:
        return sum(p.rows for p in self._parts)

    @property
    def spilled(self) -> bool:
        """True when some rank's kernels live in a file."""
        return any(p.path is not None for p in self._parts)

    def with_offsets(self, offsets: pl.DataFrame) -> RankKernels:
        """The same kernels on another clock: `offset_ns` (per `rank`) is subtracted from
        every time column when rows are read."""
        return RankKernels(self._parts, offsets, self._folder)

    def batches(
        self,
        ranks: Iterable[int] | None = None,
        columns: list[str] | None = None,
        rows: int | None = None,
    ) -> Iterator[pl.DataFrame]:
        """The kernels of `ranks` (default: all; only `columns` when given), in DataFrames of
        whole ranks holding about `rows` rows each (default BATCH_ROWS; more when one rank
        has more)."""
        rows = BATCH_ROWS if rows is None else rows
        if columns is not None and "rank" not in columns:
            columns = ["rank", *columns]
        wanted = None if ranks is None else set(ranks)
        pending: list[pl.DataFrame] = []
        held = 0
        for part in self._parts:
            if wanted is not None and part.rank is not None and part.rank not in wanted:
                continue
            frame = part.read(columns)
            if self._offsets is not None:
                frame = shift(frame, self._offsets, TIME_COLUMNS)
            if wanted is not None and part.rank is None:
                frame = frame.filter(pl.col("rank").is_in(sorted(wanted)))
            pending.append(frame)
            held += frame.height
            if held >= rows:
                yield pl.concat(pending, how="vertical_relaxed")
                pending, held = [], 0
        if pending:
            yield pl.concat(pending, how="vertical_relaxed")

    def frame(
        self, ranks: Iterable[int] | None = None, columns: list[str] | None = None
    ) -> pl.DataFrame:
        """The kernels of `ranks` (default: all; only `columns` when given) in one DataFrame."""
        out = list(self.batches(ranks, columns, rows=2**62))
        return out[0] if out else pl.DataFrame()
