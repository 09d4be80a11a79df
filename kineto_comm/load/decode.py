"""Decode Kineto / Chrome trace files into per-role Polars tables (RawTrace): the public face
of the decoder, `decode_file` and `decode_files`. Its parts, by job:

- read.py: the file's bytes (whole, or in blocks; gzip inflated);
- pieces.py: the `traceEvents` array cut into pieces, header, trailer, damage, cut-off ends;
- scan.py: the compiled scanner's path (a piece or a whole file straight into columns);
- columns.py: msgspec's path (decoded events into columns) and what both paths share;
- events.py: categories, roles, msgspec classes, table schemas, RawTrace;
- times.py: integer nanoseconds and range checks; assemble.py: a file's RawTrace.

`decode_files` decodes a batch of rank files: those the scanner reads whole (the usual rank
file) wait, without their bytes, and their tables are then built by one set of queries over
all of them, keyed by file; most of that work is fixed cost per query, not per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import cast

import polars as pl

from kineto_comm.errors import TraceError
from kineto_comm.lazy import collect, stack
from kineto_comm.load.assemble import _About, _assemble
from kineto_comm.load.columns import _Annotations, _object_columns
from kineto_comm.load.events import (
    _DETAIL_TEXT,
    COLLECTIVE_SPAN,
    GPU_CATS,
    HOST_SPANS,
    HOST_WAIT_CALLS,
    MTIA_CAT,
    RUNTIME_CATS,
    SIZED_C10D,
    STREAM_WAIT,
    SYNC_CAT,
    Event,
    RawTrace,
    Top,
    parse_int,
)
from kineto_comm.load.pieces import PIECE_BYTES, WHOLE_PIECES, _not_utf8, _Reader, _Unsalvageable
from kineto_comm.load.read import _Buffer, _Corrupt, _read_blocks
from kineto_comm.load.scan import Scanned, _needs_event, _scanned_columns, _settle
from kineto_comm.memory import release_free_memory

# The names callers import from here; each lives in the module named above.
__all__ = [
    "COLLECTIVE_SPAN",
    "GPU_CATS",
    "HOST_SPANS",
    "HOST_WAIT_CALLS",
    "MTIA_CAT",
    "PIECE_BYTES",
    "RUNTIME_CATS",
    "SIZED_C10D",
    "STREAM_WAIT",
    "SYNC_CAT",
    "WHOLE_PIECES",
    "RawTrace",
    "TraceError",
    "decode_file",
    "decode_files",
    "empty_trace",
    "parse_int",
]


def decode_file(path: str | Path, piece_bytes: int | None = None) -> RawTrace:
    """Decode one trace file. Raises TraceError (one line) when nothing usable is in it.

    `piece_bytes` (default PIECE_BYTES) bounds how much JSON is decoded into Python objects
    at a time; the tables are the same whatever it is.

    The `host` table (every CPU op) only serves traces without device activity, so a trace
    whose header lists devices is first read without it, and read again with it in the rare
    case that no device activity turns up after all.
    """
    raw = _decode_file(Path(path), None, piece_bytes, defer=False)
    assert isinstance(raw, RawTrace)
    return _with_host(raw, piece_bytes)


def empty_trace() -> RawTrace:
    """A RawTrace without events or metadata: its tables have their columns and no rows."""
    return _assemble([_About("", [], 0, [], False)], [_columns([], _Annotations(), True)])[0]


def decode_files(
    paths: list[str] | list[Path], piece_bytes: int | None = None
) -> list[RawTrace | Exception]:
    """decode_file for each file, in order; the exception it raised in place of a file that
    cannot be used (a file that fails costs only itself).

    A file read whole by the scanner (a rank file of up to WHOLE_PIECES x `piece_bytes`,
    the usual case) has its tables built together with the other such files: one set of
    queries for all of them, each row keyed by its file, rather than one set per file. Most
    of that work's cost on a file of a few MB is fixed, so a batch of small files costs
    little more than one. The tables are the same as decode_file's.
    """
    out: list[RawTrace | Exception | None] = [None] * len(paths)
    waiting: list[tuple[int, _Pending]] = []
    buffer = _Buffer()
    for i, path in enumerate(paths):
        try:
            got = _decode_file(Path(path), None, piece_bytes, defer=True, buffer=buffer)
            if isinstance(got, _Pending):
                waiting.append((i, got))
            else:
                out[i] = _with_host(got, piece_bytes)
        except Exception as exc:
            out[i] = exc
    if waiting:
        order = [i for i, _ in waiting]
        built: list[RawTrace | None]
        try:
            built = list(_scanned_batch([pending for _, pending in waiting]))
        except Exception:  # a bug must cost no file: each is decoded again on its own
            built = [None] * len(order)
        waiting.clear()
        for i, raw in zip(order, built, strict=True):
            try:
                if raw is None:
                    out[i] = decode_file(paths[i], piece_bytes)
                else:
                    out[i] = _with_host(raw, piece_bytes)
            except Exception as exc:
                out[i] = exc
    return cast(list[RawTrace | Exception], out)


def _columns(
    events: list[Event] | Scanned,
    notes: _Annotations | None = None,
    host: bool = True,
) -> dict[str, pl.DataFrame]:
    """A piece's tables by role, whichever way it was read: by the compiled scanner
    (scan._scanned_columns) or by msgspec (columns._object_columns)."""
    if isinstance(events, Scanned):
        return _scanned_columns(events, None if notes is None else [notes], [host])
    return _object_columns(events, notes, host)


def _with_host(raw: RawTrace, piece_bytes: int | None) -> RawTrace:
    """`raw`, or the file read again with its host table when it was left out but no device
    activity turned up (see decode_file)."""
    if raw.gpu.height == 0 and raw.host_skipped:
        got = _decode_file(Path(raw.file), True, piece_bytes, defer=False)
        assert isinstance(got, RawTrace)
        return got
    return raw


@dataclass
class _Pending:
    """A file read whole by the scanner, its tables not built yet (decode_files builds a
    batch's together). `notes`: its annotations; `host`: whether it keeps all CPU ops."""

    about: _About
    scanned: Scanned
    notes: _Annotations
    host: bool


def _decode_file(
    path: Path,
    host: bool | None,
    piece_bytes: int | None,
    defer: bool,
    buffer: _Buffer | None = None,
) -> RawTrace | _Pending:
    """Decode one file; `host=None` keeps the host table unless the header lists devices.
    With `defer`, a file read whole by the scanner comes back as a _Pending. A file read
    whole goes into `buffer` when given (the files of a batch share it, see _Buffer)."""
    name = str(path)
    reader = _Reader(name, piece_bytes)
    reader.host = host
    parts: list[dict[str, pl.DataFrame]] = []
    trailer: Top | None = None
    objects = False  # whether msgspec decoded a piece into Python objects
    whole: Scanned | None = None

    def tabulate(events: list[Event]) -> None:
        nonlocal host, objects
        host = reader.keeps_host()  # as told, else the header (read before the first piece)
        objects = objects or not isinstance(events, Scanned)
        parts.append(_columns(events, reader.notes, host))

    try:
        for block in _read_blocks(path, reader.whole_bytes, buffer):
            for events in reader.feed(block):
                if reader.restarted:  # a later traceEvents array: the earlier one is void
                    parts.clear()
                    reader.restarted = False
                tabulate(events)
                del events
        try:
            events, trailer = reader.finish()
            if reader.restarted:
                parts.clear()
                reader.restarted = False
            if defer and not parts and isinstance(events, Scanned):
                whole = _settle(events, reader.notes)
                host = reader.keeps_host()
            else:
                tabulate(events)
            del events
        except _Unsalvageable as exc:
            raise TraceError(name, str(exc)) from None
    except _Corrupt as exc:
        raise TraceError(name, str(exc)) from None
    except OSError as exc:
        raise TraceError(name, f"cannot read file ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise TraceError(name, f"invalid JSON trace ({_not_utf8(exc)})") from None
    except RecursionError:  # msgspec's limit on nesting, reached by a damaged or hostile file
        raise TraceError(name, "invalid JSON trace (values nested too deeply)") from None
    if whole is not None:
        empty = whole.table.height == 0
    else:
        empty = all(sum(frame.height for frame in p.values()) == 0 for p in parts)
    if empty and reader.header is None and trailer is None:
        raise TraceError(name, "no trace events found")
    # The trailer's keys come after the header's: JSON parsers take the last of a key.
    tops = [t for t in (trailer, reader.middle, reader.header) if t is not None]
    del reader.buf
    about = _About(name, tops, reader.nbytes, reader.warnings, host is False, reader.cut_off)
    if whole is not None:
        return _Pending(about, whole, reader.notes, bool(host))
    if objects or reader.cut:
        # The decoded objects' heap, or the pieces' buffers, before the Polars work below.
        # Not after a file read whole by the scanner: there is nothing of it to hand back
        # (its bytes are in the batch's _Buffer, for the next file).
        release_free_memory()
    return _assemble([about], parts)[0]


def _scanned_batch(pending: list[_Pending]) -> list[RawTrace]:
    """The RawTraces of files read whole by the scanner, built by one set of queries over
    their rows one above the other (each row's `_file`: its file's position here)."""
    table = stack([p.scanned.table for p in pending], "_file")
    # The files' names one above the other: each file's name rows move down by the names
    # of the files before it.
    names = [p.scanned.names for p in pending]
    before = list(accumulate((n.height for n in names[:-1]), initial=0))
    shift = pl.lit(pl.Series(before, dtype=pl.UInt32)).gather(pl.col("_file"))
    moved = pl.col("name") + shift
    # The details one above the other too: each file's rows (and text ids) move down.
    found = [p.scanned.details for p in pending]
    rows_before = list(accumulate((d.height for d in found[:-1]), initial=0))
    moved_detail = pl.col("_detail") + pl.lit(pl.Series(rows_before, dtype=pl.UInt32)).gather(
        pl.col("_file")
    )
    details = collect(
        stack(found, "_file").select(
            pl.col(c) + shift if c in _DETAIL_TEXT else pl.col(c) for c in found[0].columns
        )
    )
    both = Scanned(pl.DataFrame(), None, pl.concat(names, rechunk=True), details=details)
    # The settled events, numbered in table order (as each file's were decoded).
    need = _needs_event(both)
    number = pl.when(need).then(need.cum_sum().cast(pl.Int64) - 1)
    both.table = collect(
        table.select(pl.all().exclude("span_start", "span_end"))
        .with_columns(name=moved, _detail=moved_detail)
        .with_columns(_obj=number)
    )
    both.decoded = [e for p in pending for e in p.scanned.decoded]
    del table
    for p in pending:
        p.scanned = Scanned(p.scanned.table.clear(), None, p.scanned.names.clear())
    notes, host = [p.notes for p in pending], [p.host for p in pending]
    part = _scanned_columns(both, notes, host)
    del both
    return _assemble([p.about for p in pending], [part])
