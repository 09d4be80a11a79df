"""Terminal rendering of a Report with rich: per-rank breakdown and collectives tables.

Times print in ms (or us for small values), sizes in decimal units (1 MB = 1e6 bytes),
bandwidth in GB/s with 1 GB = 1e9 bytes. Plain text when the output is not a terminal.

Width: the terminal's (rich reads `COLUMNS`, then the terminal); piped or written to a file,
`COLUMNS` when set, else DEFAULT_WIDTH. Nothing is cut to fit: a table's cells wrap at
spaces, never inside a name or a number (`fit_table`), and when the table is still too wide
its least useful columns are left out, saying which; prose wraps at words.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import TextIO

import polars as pl
from rich.cells import cell_len
from rich.console import Console
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from kineto_comm.render.findings import render_findings
from kineto_comm.render.fmt import (
    EXTREME_RANKS,
    MAX_RANK_ROWS,
    fmt_ns,
    pct,
    print_prose,
)
from kineto_comm.render.json_doc import rank_means
from kineto_comm.render.sections import sections
from kineto_comm.report import Report, problem_lines

# Control characters (C0, DEL, C1) and the bidirectional overrides: none of them belongs in
# a report, and in a terminal they recolour, retitle or reorder it.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control character shown as its escape (\\x1b), never sent raw."""
    return _UNPRINTABLE.sub(
        lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 256 else f"\\u{ord(m[0]):04x}", text
    )


class TraceConsole(Console):
    """The text report's console. Trace strings (device, group, kernel names) are data: no
    markup is read from them (markup only where a print asks for it, with the data escaped),
    and the text of every segment is made printable before it is styled, so a control
    character from a trace never reaches the terminal while rich's own styles do."""

    def __init__(self, file: TextIO | None, width: int | None) -> None:
        super().__init__(file=file, width=width, markup=False, highlight=False, soft_wrap=False)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        clean = (s if s.control else Segment(printable(s.text), s.style) for s in buffer)
        return super()._render_buffer(clean)


# Columns of piped or file output when COLUMNS is not set: wide enough that the usual
# tables keep every column, narrow enough to read in a pager or a CI log.
DEFAULT_WIDTH = 120


def output_width(console: Console) -> int:
    """The width to render at: a terminal's own (rich honours COLUMNS), else COLUMNS when
    it is a number, else DEFAULT_WIDTH."""
    if console.is_terminal:
        return console.width
    columns = os.environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else DEFAULT_WIDTH


def _extremes(ranks: pl.DataFrame) -> pl.DataFrame:
    """The ranks with the highest and the lowest share of exposed communication, with a
    "median" row between them (each numeric column's median over every rank)."""
    share = pl.col("exposed_comm_ns") / pl.col("wall_ns")
    ordered = ranks.with_columns(_share=share).sort(
        ["_share", "rank"], descending=[True, False], nulls_last=True
    )
    numeric = [c for c, t in ranks.schema.items() if t.is_numeric() and c != "rank"]
    median = ranks.select(
        pl.lit("median").alias("rank"),
        *[pl.col(c).median().cast(ranks.schema[c]) for c in numeric],
        *[pl.col(c).mode().first() for c in ranks.columns if c not in numeric and c != "rank"],
    )
    top, bottom = ordered.head(EXTREME_RANKS), ordered.tail(EXTREME_RANKS)
    parts = [f.drop("_share").with_columns(pl.col("rank").cast(pl.String)) for f in (top, bottom)]
    return pl.concat([parts[0], median.select(parts[0].columns), parts[1]], how="vertical_relaxed")


def render_text(
    report: Report, out: TextIO | None = None, width: int | None = None, problems: bool = True
) -> None:
    """Print the report: a per-rank summary, the collectives, then (`problems`) warnings and
    errors (problem_lines)."""
    console = TraceConsole(file=out, width=width)
    if width is None and not console.is_terminal:
        console = TraceConsole(file=out, width=output_width(console))

    render_findings(report, console)
    if report.ranks.height == 0:  # every file was unusable: what was wrong with each
        console.print("No rank could be analysed.")
        _render_problems(report, console, problems)
        return
    ranks = report.ranks.join(report.totals, on="rank", how="left")
    if report.rank_steps.height:
        # The complete steps' windows, as every per-step figure (json_doc.counted).
        steps = pl.DataFrame(rank_means(report)).select(
            pl.col("rank").cast(pl.Int64),
            n_steps=pl.col("steps").cast(pl.Int64),
            mean_step_ns=pl.col("wall_ns").cast(pl.Float64),
        )
        ranks = ranks.join(steps, on="rank", how="left")
    ranks = ranks.sort("rank")
    title = "Where each rank's device time went (totals over the trace)"
    if ranks.height > MAX_RANK_ROWS:
        ranks = _extremes(ranks)
        title += (
            f"\n{report.ranks.height} ranks: the {EXTREME_RANKS} with the most and the "
            f"{EXTREME_RANKS} with the least exposed communication, and each column's median "
            "(every rank: --format json or html)"
        )
    header = (
        "rank",
        "device",
        "steps",
        "step (mean)",
        "wall",
        "compute",
        "comm",
        "overlap",
        "exposed comm",
        "idle",
    )
    rows = []
    for r in ranks.iter_rows(named=True):
        wall = r.get("wall_ns")
        rows.append(
            (
                str(r["rank"]),
                (r["device"] or r["timeline"] or "-")[:28],
                str(r.get("n_steps") or 0),
                fmt_ns(r.get("mean_step_ns")),
                fmt_ns(wall),
                fmt_ns(r.get("compute_ns")),
                fmt_ns(r.get("comm_ns")),
                pct(r.get("overlap_ns"), r.get("comm_ns")),
                f"{fmt_ns(r.get('exposed_comm_ns'))} ({pct(r.get('exposed_comm_ns'), wall)})",
                f"{fmt_ns(r.get('idle_ns'))} ({pct(r.get('idle_ns'), wall)})",
            )
        )
    print_table(console, "ranks", header, rows, frozenset(i for i in range(10) if i != 1), title)
    print_prose(
        console,
        "overlap = share of communication time hidden behind compute; exposed comm = "
        "communication with no compute kernel running (it adds to step time); idle = nothing "
        "running on the device (the step table splits it: launch, queued, other_idle); steps, step "
        "(mean) = the rank's windows of the job's complete steps (a last step, cut at its last "
        "kernel, left out) and their mean.",
    )

    shown = sections(report, brief=True)
    if not any(section.key == "collective_totals" for section in shown):
        console.print("No communication kernels found.")
    for section in shown:
        # The title on its own line, wrapped at words to the output's width.
        print_prose(console, Text(section.title, style="italic"))
        print_table(console, section.key, section.header, section.rows, section.right)
        if section.note:
            print_prose(console, section.note)
    _render_hosts(report, console)
    _render_clock_sets(report, console)
    _render_problems(report, console, problems)


# Which columns a table leaves out first when the output is too narrow for all of them, by
# the table's key (the per-rank table, the sections' JSON keys); a name that appears twice
# in a header leaves its last copy first. Tables not named here drop from the right.
DROP_FIRST: dict[str, tuple[str, ...]] = {
    "ranks": ("device", "steps", "wall", "compute", "comm", "idle", "overlap"),
    "collective_totals": (
        "of link",
        "algbw",
        "dtype",
        "volume",
        "mean size",
        "calls",
        "ranks",
        "group",
    ),
    "skew": ("p95 skew", "calls", "ranks", "last rank"),
    "step_blame": ("share", "share", "category"),
    "attribution": ("module from", "all ranks/step", "bubble/step", "role"),
    "process_groups": ("size", "calls/step", "bytes/step", "ranks", "evidence"),
    "pipeline": ("m", "p", "theory"),
    "message_size_summary": ("volume", "calls < 1 MB", "calls < 64 KB", "calls", "time"),
    "storms": ("large-message busbw", "runs", "calls"),
    "all_to_all_loads": ("worst exchange", "load max/mean", "exchanges/step", "ranks"),
    "offsets": ("method", "residual", "matched calls"),
    "stragglers": ("confidence", "others' wait/step", "last in"),
    "inferred_config": ("evidence",),
    "model_comparison": (
        "calls expected",
        "calls measured",
        "bytes expected",
        "bytes measured",
        "dtype",
        "flagged",
        "calls dev",
        "likely causes",
    ),
}


def _pieces(text: str, numeric: bool) -> list[str]:
    """What a cell may not be broken inside: its words, or in a numeric column the number
    with its unit and the bracket after it ('17.98 ms', '(47.7%)')."""
    if numeric:
        return [p if i == 0 else "(" + p for i, p in enumerate(text.split(" ("))]
    return text.split() or [""]


def fit_table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    right: Iterable[int],
    width: int,
    drop_first: Sequence[str] = (),
) -> tuple[Table, list[str]]:
    """A rich table of `rows` no wider than `width` where it can be: each column as wide as
    its longest line, then the widest narrowed, but never below its longest unbreakable
    piece (a word, a number with its unit: `_pieces`), so wrapping happens at spaces and
    nothing is cut. When even that is too wide, columns are left out, `drop_first` (by
    name) first, then from the right, never the first. Returns the table and the names of
    the columns left out."""
    right = set(right)
    n = len(header)
    longest = [max([cell_len(header[i]), *(cell_len(row[i]) for row in rows)]) for i in range(n)]
    least = [
        max(
            [cell_len(w) for w in header[i].split()]
            + [cell_len(p) for row in rows for p in _pieces(row[i], i in right)]
        )
        for i in range(n)
    ]
    kept = list(range(n))

    def frame(columns: list[int]) -> int:  # borders and padding: "│ a │ b │"
        return 3 * len(columns) + 1

    order = [i for name in drop_first for i in reversed(range(n)) if header[i] == name]
    order = list(dict.fromkeys(order)) + [i for i in reversed(range(1, n)) if i not in order]
    for i in order:
        if sum(least[k] for k in kept) + frame(kept) <= width or len(kept) == 1:
            break
        if i in kept and i != 0:
            kept.remove(i)
    widths = {k: longest[k] for k in kept}
    excess = sum(widths.values()) + frame(kept) - width
    while excess > 0:
        wide = [k for k in kept if widths[k] > least[k]]
        if not wide:
            break
        k = max(wide, key=lambda c: (widths[c] - least[c], widths[c]))
        widths[k] -= 1
        excess -= 1
    table = Table()
    for k in kept:
        table.add_column(
            header[k],
            justify="right" if k in right else "left",
            width=widths[k],
            overflow="fold",  # a piece wider than the whole output: folded, never cut
            no_wrap=False,
        )
    for row in rows:
        table.add_row(*(row[k] for k in kept))
    return table, [header[i] for i in range(n) if i not in kept]


def print_table(
    console: Console,
    key: str,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    right: Iterable[int],
    title: str | None = None,
) -> None:
    """`fit_table` at the console's width (under `title`, wrapped to the table's width),
    then a line naming any column left out."""
    table, left_out = fit_table(header, rows, right, console.width, DROP_FIRST.get(key, ()))
    table.title = title
    console.print(table, markup=False)
    if left_out:
        print_prose(
            console,
            f"(left out at {console.width} columns: {', '.join(left_out)}; a wider terminal"
            " or COLUMNS, or --format json, shows them)",
        )


# How the ranks were grouped into hosts (offsets.host_source), as the report says it.
_HOSTS_FROM = {
    "ranks_per_host": "--ranks-per-host",
    "host_name": "the traces' host names",
    "file_name": "the trace file names ({hostname}_{pid}.{timestamp}.pt.trace.json)",
    "device_ids": "the device ids (local rank = device id)",
    "shared_device": "one device id on every rank (a shared GPU; --ranks-per-host 1 if not)",
    "measured": "the collectives' times: a clock per rank measured",
    "measured_one_clock": "the collectives' times: one clock measured",
    "unknown": "nothing in the traces: a clock per rank",
}


def hosts_line(report: Report) -> str | None:
    """How many hosts (one clock each), how that was inferred and, where the calls were asked
    (offsets.host_evidence), what they said; None for one rank."""
    offsets = report.offsets
    if offsets.height < 2 or "host_source" not in offsets.columns:
        return None
    sources = offsets["host_source"].unique().to_list()
    how = "; ".join(_HOSTS_FROM.get(s, s) for s in sorted(sources))
    said = ""
    if "host_evidence" in offsets.columns:
        said = "".join(f" Evidence: {e}." for e in offsets["host_evidence"].drop_nulls().unique())
    return f"Clocks: {offsets['host'].n_unique()} host(s), one clock each, from {how}.{said}"


def _render_hosts(report: Report, console: Console) -> None:
    """One line: how many hosts (one clock each) and how that was inferred."""
    line = hosts_line(report)
    if line is not None:
        print_prose(console, line)


def _render_problems(report: Report, console: Console, problems: bool) -> None:
    """The warnings, then one line per unusable file (when `problems`)."""
    for line in problem_lines(report) if problems else ():
        console.print(line, markup=False, soft_wrap=True)  # one line each, as on stderr


def clock_sets_line(report: Report) -> str | None:
    """A note when the ranks fall into sets that share no collective: their clocks could
    not be aligned with each other (None when they all share one clock)."""
    roots = report.offsets.filter(pl.col("method") == "reference")["rank"]
    if roots.len() <= 1:
        return None
    shown = ", ".join(str(r) for r in roots.head(EXTREME_RANKS))
    more = f" and {roots.len() - EXTREME_RANKS} more" if roots.len() > EXTREME_RANKS else ""
    return (
        f"Clocks not aligned across {roots.len()} sets of ranks that share no collective"
        f" (point-to-point ends do not fix offsets); each set is on the clock of its"
        f" lowest rank: {shown}{more}. Waits between the sets include any clock offset."
    )


def _render_clock_sets(report: Report, console: Console) -> None:
    """The clock sets' note (clock_sets_line), when there is one."""
    line = clock_sets_line(report)
    if line is not None:
        print_prose(console, line)
