"""Frames as Arrow IPC (a worker's results, spilled per-rank tables, cache entries), and
text columns whose rows share one copy of each distinct value.

Storage's own module: the rank stores, the workers and the cache read and write frames
here, so storage depends on no analysis (and no analysis on how frames are stored).
"""

from __future__ import annotations

import io
from pathlib import Path

import polars as pl


def write_frame(frame: pl.DataFrame, out: io.BytesIO | Path) -> None:
    """The frame as Arrow IPC, read back by `read_frame`."""
    # Text is written dictionary-encoded: kernel names repeat, and IPC would otherwise
    # write every row's copy (for a 50 MB trace, 11 MB of kernels instead of ~2 MB).
    frame.with_columns(pl.col(pl.String).cast(pl.Categorical)).write_ipc(out)


def read_frame(source: bytes | str | Path, columns: list[str] | None = None) -> pl.DataFrame:
    """A frame written by `write_frame` (bytes or a file; only `columns` when given), its text
    columns back as strings whose rows share one copy of each distinct value (what keeps the
    parent's memory small)."""
    data = io.BytesIO(source) if isinstance(source, bytes) else source
    frame = pl.read_ipc(data, columns=columns)
    return shared_text(frame)


def shared_text(frame: pl.DataFrame) -> pl.DataFrame:
    """The frame with its Categorical columns as text whose rows point at one copy of each
    distinct value, in two queries whatever the number of columns.

    (A plain cast writes every row's own copy: ~150 bytes per kernel row for typical kernel
    names, ten times the 16 bytes of a shared view. Gathering rows from the few distinct
    values instead makes every row a view on them.)"""
    text = [c for c, t in frame.schema.items() if t == pl.Categorical]
    if not text:
        return frame
    distinct = frame.select(pl.col(c).unique().drop_nulls().implode() for c in text)
    shared = []
    for c in text:
        values = distinct[c][0]
        position = pl.int_range(values.len(), dtype=pl.UInt32, eager=True)
        at = pl.col(c).to_physical().replace_strict(values.to_physical(), position, default=None)
        shared.append(pl.lit(values.cast(pl.String)).gather(at).alias(c))
    return frame.with_columns(shared)
