"""On-disk cache of per-rank tables, so a second report (other rules, other format) skips parsing.

An entry is keyed by the trace file's content hash, the tool version, a digest of the
package's code, the columns of the kernels and collectives tables, the fields of the rank's
metadata, and the options that change per-rank tables (communication kernel patterns): a
changed file, a new version, changed code or a new column or field is a miss, never a stale
hit. Each entry is a folder of Parquet tables plus the metadata as JSON; it is written to a
temporary name and renamed, so a crash never leaves half an entry.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import polars as pl

from kineto_comm.model.collectives import COLLECTIVE_COLUMNS
from kineto_comm.model.kernels import KERNEL_COLUMNS
from kineto_comm.per_rank import META_FIELDS, TABLES, RankTables
from kineto_comm.version import __version__

_BLOCK = 16 * 1024 * 1024


@functools.cache
def code_digest() -> str:
    """A digest of the package's sources (Python and C), read once per process: tables
    cached by other code (a development tree between versions) are never read as this
    code's. The whole package rather than a list of the modules that build per-rank
    tables, which could fall out of date."""
    root = Path(__file__).parent
    digest = hashlib.blake2b(digest_size=16)
    for f in sorted(root.rglob("*")):
        if f.suffix in (".py", ".c") and f.is_file():
            digest.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()


def cache_key(path: str | Path, comm_patterns: tuple[str, ...]) -> str:
    """Content hash of the file plus what else determines its tables."""
    digest = hashlib.blake2b(digest_size=20)
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)
    digest.update(f"|{__version__}|{code_digest()}|{json.dumps(list(comm_patterns))}".encode())
    digest.update(json.dumps([KERNEL_COLUMNS, COLLECTIVE_COLUMNS, META_FIELDS]).encode())
    return digest.hexdigest()


def load(cache_dir: Path, key: str) -> RankTables | None:
    """The cached tables for a key, or None (missing or unreadable entries are misses)."""
    entry = cache_dir / key
    try:
        meta = json.loads((entry / "meta.json").read_text())
        frames = {name: pl.read_parquet(entry / f"{name}.parquet") for name in TABLES}
    except (OSError, ValueError, pl.exceptions.PolarsError):
        return None
    return RankTables.from_parts(meta, frames)


def unwritable(cache_dir: Path) -> str | None:
    """Why entries cannot be written under cache_dir (None when they can): checked once
    per run, so that a cache that will never fill is said, not silently skipped."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tempfile.mkdtemp(dir=cache_dir, prefix=".tmp-"))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def store(cache_dir: Path, key: str, tables: RankTables) -> None:
    """Write an entry atomically (best effort: a cache that cannot be written is skipped)."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".tmp-"))
    except OSError:
        return
    try:
        (tmp / "meta.json").write_text(json.dumps(tables.header(), default=str))
        for name in TABLES:
            getattr(tables, name).write_parquet(tmp / f"{name}.parquet")
        os.replace(tmp, cache_dir / key)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
