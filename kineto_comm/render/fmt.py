"""How numbers and prose are written in every report: durations, sizes, shares, the per-rank
table's size limits, and paragraphs wrapped to the console. Below the renderers that share
them (text, findings, sections), so that none imports another back.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text


def fmt_ns(ns: int | float | None) -> str:
    """A duration for people: ms with 2 decimals, us below 0.1 ms."""
    if ns is None:
        return "-"
    if abs(ns) < 100_000:
        return f"{ns / 1e3:.1f} us"
    return f"{ns / 1e6:,.2f} ms"


def fmt_bytes(n: int | float | None) -> str:
    """A size in decimal units (B, KB, MB, GB; 1 KB = 1000 bytes)."""
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{int(n)} B"


def pct(part: float | None, whole: float | None) -> str:
    """part/whole as a percentage, '-' when undefined."""
    if part is None or not whole:
        return "-"
    return f"{100 * part / whole:.1f}%"


# Above this many ranks the per-rank table shows the extremes and the median, not every rank:
# a 2,048-rank job would print thousands of lines.
MAX_RANK_ROWS = 16
EXTREME_RANKS = 5


def print_prose(console: Console, text: str | Text, indent: int = 0, hang: int = 0) -> None:
    """A paragraph wrapped at words to the console's width: `indent` spaces before its
    first line, `indent + hang` before the others (a list item's text under its text)."""
    body = Text(text) if isinstance(text, str) else text
    lead = indent + hang
    lines = body.wrap(console, max(console.width - lead, 10), overflow="fold")
    for i, line in enumerate(lines):
        line.rstrip()
        pad = indent if i == 0 else lead
        console.print(Text(" " * pad) + line, soft_wrap=True)
