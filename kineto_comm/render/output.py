"""Where a rendering is written: a file opened for UTF-8 text, gzip when its name says so.
Below the format dispatcher (formats.py) and the timeline export (perfetto.py), which both
write files.
"""

from __future__ import annotations

import errno
import gzip
from pathlib import Path
from typing import TextIO


def open_output(path: Path, compresslevel: int = 6) -> TextIO:
    """`path` opened to write UTF-8 text: gzip-compressed when its name ends in .gz (any
    format: `-o report.json.gz` is a gzip file, as its name says), its missing parent
    directories made. NotADirectoryError naming `path` when a parent is a regular file
    (mkdir would say "File exists", which names neither the path nor the problem)."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(
                    errno.ENOTDIR, f"{parent} is a file, not a directory", str(path)
                )
            break
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        return gzip.open(path, "wt", encoding="utf-8", compresslevel=compresslevel)
    return path.open("w", encoding="utf-8")
