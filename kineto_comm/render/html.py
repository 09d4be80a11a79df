"""A self-contained HTML report: inline SVG plots, tables and findings; no script, works offline.

Plots (all SVG generated here, with `<title>` tooltips; no JavaScript, no external fetch, and
a Content-Security-Policy that forbids both):
    step time      per rank, the mean step split into compute, overlapped communication,
                   exposed communication, idle (and memcpy/memset when present)
    message sizes  a log2 histogram of calls per (collective, process group), from the
                   `message_sizes` table when filled, else from `collectives`
    skew heatmap   rank x collective instance (by group, in time order; a line between
                   groups), colour = time the rank waited for the group's last arrival
                   (`collective_waits`), each column's last arriver outlined
    pipeline       one step's kernels on each pipeline rank (ranks of the `pipeline` table,
                   else the ranks that send/recv), compute vs communication
    timelines      the median and the worst step, a lane per rank: compute, exposed
                   communication, waits and idle, the findings' windows linked to their
                   cards (kineto_comm.render.html_timeline)
Every string that comes from a trace goes through `esc` (html.escape with quotes).
"""

from __future__ import annotations

import json
import math
from typing import Any

import polars as pl

from kineto_comm.analysis.stragglers import NOISE_NS
from kineto_comm.findings import Finding, Severity
from kineto_comm.lazy import collect
from kineto_comm.render.findings import all_fixes_line, claim_note
from kineto_comm.render.fmt import fmt_bytes, fmt_ns
from kineto_comm.render.html_timeline import timelines_html
from kineto_comm.render.json_doc import at_or_above, findings_of, overview, rank_means
from kineto_comm.render.palette import COLORS, KIND
from kineto_comm.render.sections import UNKNOWN_GROUP, Section, pair_matrices, sections
from kineto_comm.render.svg import esc, legend_html, tick_label, ticks
from kineto_comm.render.text import clock_sets_line, hosts_line
from kineto_comm.report import Report

SEV_COLOR = {"error": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}
MAX_HEAT_COLS = 200
MAX_HEAT_ROWS = 64
MAX_HISTS = 12
PLOT_W = 900
LABEL_W = 90
FONT = 'font-family="system-ui, sans-serif" font-size="11"'

CSS = """
body{font-family:system-ui,-apple-system,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.muted{color:#666} .headline{font-size:15px;margin:8px 0 16px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right} th{background:#f4f4f4}
td.l,th.l{text-align:left}
.finding{border-left:5px solid #999;padding:6px 12px;margin:10px 0;background:#fafafa}
.finding h3{font-size:14px;margin:2px 0} .finding p{margin:4px 0}
.sev{font-weight:bold;text-transform:uppercase;font-size:11px}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
.hists{display:flex;flex-wrap:wrap;gap:12px}
pre{font-size:11px;background:#f4f4f4;padding:6px;overflow:auto;max-height:240px}
"""


def _empty(plot_id: str, text: str) -> str:
    """A placeholder SVG saying why a plot has nothing to show."""
    return (
        f'<svg id="{plot_id}" class="plot" xmlns="http://www.w3.org/2000/svg" width="{PLOT_W}"'
        f' height="40" role="img"><text x="8" y="24" {FONT} fill="#666">{esc(text)}</text></svg>'
    )


# ------------------------------------------------------------------ per-rank step time


def svg_step_time(report: Report) -> str:
    """Horizontal stacked bars: each rank's mean step split by what the device was doing."""
    if report.rank_steps.height == 0:
        return _empty("plot-step-time", "No step windows in the traces.")
    rows = []
    for r in rank_means(report):
        if r["wall_ns"] is None:
            continue
        wall = r["wall_ns"] or 0.0
        compute = max(0.0, (r["compute_ns"] or 0) - (r["overlap_ns"] or 0))
        overlap = r["overlap_ns"] or 0.0
        exposed = r["exposed_comm_ns"] or 0.0
        idle = r["idle_ns"] or 0.0
        other = max(0.0, wall - compute - overlap - exposed - idle)
        rows.append((r["rank"], wall, [compute, overlap, exposed, idle, other]))
    names = ["compute", "overlap", "exposed", "idle", "memory"]
    labels = ["compute", "overlapped comm", "exposed comm", "idle", "memcpy/memset"]
    n = len(rows)
    bar_h = max(3, min(18, 900 // max(n, 1)))
    gap = 2 if bar_h >= 8 else 0
    top, axis = 6, 26
    height = top + n * (bar_h + gap) + axis
    vmax = max(w for _, w, _ in rows) or 1.0
    scale = (PLOT_W - LABEL_W - 20) / vmax
    parts = [
        f'<svg id="plot-step-time" class="plot" xmlns="http://www.w3.org/2000/svg" '
        f'width="{PLOT_W}" height="{height}" role="img" aria-label="Mean step time per rank">'
    ]
    label_every = 1 if bar_h >= 10 else math.ceil(12 / (bar_h + gap))
    for i, (rank, wall, segs) in enumerate(rows):
        y = top + i * (bar_h + gap)
        if i % label_every == 0:
            parts.append(
                f'<text x="{LABEL_W - 6}" y="{y + bar_h / 2 + 4:.1f}" text-anchor="end" {FONT}>'
                f"rank {esc(rank)}</text>"
            )
        x = float(LABEL_W)
        for name, label, v in zip(names, labels, segs, strict=True):
            if v <= 0:
                continue
            w = v * scale
            parts.append(
                f'<rect class="seg-{name}" x="{x:.2f}" y="{y}" width="{w:.2f}" height="{bar_h}" '
                f'fill="{COLORS[name]}"><title>rank {esc(rank)}: {label} {esc(fmt_ns(v))} '
                f"({100 * v / wall:.1f}% of {esc(fmt_ns(wall))})</title></rect>"
            )
            x += w
    y0 = top + n * (bar_h + gap)
    parts.append(f'<line x1="{LABEL_W}" y1="{y0}" x2="{PLOT_W - 20}" y2="{y0}" stroke="#999"/>')
    for t in ticks(vmax):
        x = LABEL_W + t * scale
        parts.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 4}" stroke="#999"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{y0 + 16}" text-anchor="middle" {FONT}>{tick_label(t)}</text>'
        )
    parts.append("</svg>")
    legend = legend_html([(lb, COLORS[nm]) for nm, lb in zip(names, labels, strict=True)])
    return legend + "".join(parts)


# ------------------------------------------------------------------ message sizes


def size_histograms(report: Report) -> pl.DataFrame:
    """calls per (collective, process_group, log2_bucket) over all ranks (known sizes only)."""
    ms = (
        report.message_sizes.filter(pl.col("log2_bucket").is_not_null())
        if ("log2_bucket" in report.message_sizes.columns)
        else report.message_sizes
    )
    if ms.height and {"collective", "log2_bucket", "calls"} <= set(ms.columns):
        pg = pl.col("process_group") if "process_group" in ms.columns else pl.lit(None)
        return (
            ms.select(
                "collective", pg.cast(pl.String).alias("process_group"), "log2_bucket", "calls"
            )
            .group_by("collective", "process_group", "log2_bucket")
            .agg(pl.col("calls").sum().cast(pl.Int64))
        )
    calls = report.rank_collectives
    if calls.height == 0:
        return pl.DataFrame()
    return collect(
        calls.lazy(["collective", "process_group", "bytes"])
        .filter(pl.col("bytes").is_not_null() & (pl.col("bytes") > 0))
        .with_columns(log2_bucket=pl.col("bytes").cast(pl.Float64).log(2).floor().cast(pl.Int64))
        .group_by("collective", "process_group", "log2_bucket")
        .agg(calls=pl.len().cast(pl.Int64)),
        calls.height,
    )


def svg_histograms(report: Report) -> str:
    """Small multiples: one log2 message-size histogram per (collective, process group)."""
    hist = size_histograms(report)
    if hist.height == 0:
        return _empty("plot-sizes", "No collective with a known message size.")
    order = (
        hist.group_by("collective", "process_group")
        .agg(total=pl.col("calls").sum())
        .sort(["total", "collective", "process_group"], descending=[True, False, False])
    )
    lo, hi = int(hist["log2_bucket"].min()), int(hist["log2_bucket"].max())  # type: ignore[arg-type]
    nb = hi - lo + 1
    w, h, left, bottom = 280, 150, 34, 34
    bw = min((w - left - 8) / nb, 48.0)
    charts = []
    for key in order.head(MAX_HISTS).iter_rows(named=True):
        sub = hist.filter(
            (pl.col("collective") == key["collective"])
            & (
                pl.col("process_group").is_null()
                if key["process_group"] is None
                else pl.col("process_group") == key["process_group"]
            )
        )
        counts = dict(zip(sub["log2_bucket"].to_list(), sub["calls"].to_list(), strict=True))
        cmax = max(counts.values()) or 1
        title = f"{key['collective']} · group {key['process_group'] or '?'} · {key['total']} calls"
        parts = [
            f'<svg class="plot hist" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}"'
            f' role="img"><text x="{left}" y="12" {FONT} font-weight="bold">{esc(title)}</text>'
        ]
        ph = h - bottom - 20
        for b in range(lo, hi + 1):
            c = counts.get(b, 0)
            x = left + (b - lo) * bw
            bh = ph * c / cmax
            if c:
                parts.append(
                    f'<rect class="bar" x="{x + 1:.1f}" y="{20 + ph - bh:.1f}" '
                    f'width="{max(bw - 2, 1):.1f}" height="{bh:.1f}" '
                    f'fill="{COLORS["communication"]}"><title>'
                    f"{esc(fmt_bytes(2**b))} to {esc(fmt_bytes(2 ** (b + 1)))}: {c} calls"
                    "</title></rect>"
                )
        y0 = 20 + ph
        parts.append(f'<line x1="{left}" y1="{y0}" x2="{w - 8}" y2="{y0}" stroke="#999"/>')
        step = max(1, math.ceil(nb / 5))
        for b in range(lo, hi + 1, step):
            x = left + (b - lo + 0.5) * bw
            parts.append(
                f'<text x="{x:.1f}" y="{y0 + 13}" text-anchor="middle" {FONT}>'
                f"{esc(fmt_bytes(2**b))}</text>"
            )
        parts.append(
            f'<text x="{left - 4}" y="26" text-anchor="end" {FONT}>{cmax}</text>'
            f'<text x="{(left + w) / 2}" y="{h - 4}" text-anchor="middle" {FONT} fill="#666">'
            "message size (log2 buckets)</text></svg>"
        )
        charts.append("".join(parts))
    more = order.height - MAX_HISTS
    note = f'<p class="muted">{more} more histogram(s) left out.</p>' if more > 0 else ""
    return f'<div id="plot-sizes" class="hists">{"".join(charts)}</div>{note}'


# ------------------------------------------------------------------ skew heatmap


def _heat_color(x: float) -> str:
    """White -> yellow -> the palette's waiting red for x in [0, 1]: the heat map's colour is
    the time a rank waited for the group's last arrival, red as the timelines' waits."""
    x = min(max(x, 0.0), 1.0)
    red = tuple(int(COLORS["wait"][i : i + 2], 16) for i in (1, 3, 5))
    if x < 0.5:
        t = x / 0.5
        r, g, b = 255, 255 - int(35 * t), 255 - int(200 * t)
    else:
        t = (x - 0.5) / 0.5
        r, g, b = (round(a + (z - a) * t) for a, z in zip((255, 220, 55), red, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def svg_skew_heatmap(report: Report) -> str:
    """Rank x collective instance; colour = this rank's wait for the last one. Columns are
    grouped by process group (each group's calls in time order, a line between groups),
    and each column's last arriver (the rank most often last among its calls with a skew
    above the stragglers' noise) is outlined in black."""
    store, inst = report.rank_waits, report.collective_instances
    if store.height == 0 or inst.height == 0 or "wait_ns" not in store.columns:
        return _empty("plot-skew", "No collective calls matched across ranks.")
    inst = inst.filter(pl.col("ranks_seen") > 1).sort(
        pl.col("process_group").fill_null(UNKNOWN_GROUP), "first_start_ns", "instance"
    )
    if inst.height == 0:
        return _empty("plot-skew", "No collective call was seen on more than one rank.")
    ninst = inst.height
    per_col = math.ceil(ninst / MAX_HEAT_COLS)
    # Each group's calls start a column of their own: a column never mixes two groups.
    named = inst.with_columns(_pg=pl.col("process_group").fill_null(UNKNOWN_GROUP))
    sizes = named.group_by("_pg", maintain_order=True).len()
    starts, at = {}, 0
    for pg, n in sizes.iter_rows():
        starts[pg] = at
        at += math.ceil(n / per_col)
    cols = named.with_columns(
        col=(
            pl.col("_pg").replace_strict(starts, return_dtype=pl.Int64)
            + pl.int_range(pl.len()).over("_pg") // per_col
        ).cast(pl.Int64)
    )
    # Aggregations over the waits (a row per call and rank, kept in files on a big job).
    waits = store.lazy(["instance", "rank", "wait_ns"])
    ranks = sorted(collect(waits.select(pl.col("rank").unique()), store.height)["rank"])
    per_row = math.ceil(len(ranks) / MAX_HEAT_ROWS)
    row_of = pl.DataFrame(
        {"rank": ranks, "row": [i // per_row for i in range(len(ranks))]},
        schema={"rank": store.lazy(["rank"]).collect_schema()["rank"], "row": pl.Int64},
    )
    placed = waits.join(
        cols.lazy().select("instance", "col"), on="instance", build_side="force_right"
    ).join(row_of.lazy(), on="rank", build_side="force_right")
    # Each cell names the rank and call that waited longest (ties: lowest rank, first call):
    # the cell's longest wait, then the smallest (rank, instance) among the rows with it.
    longest = collect(placed.group_by("row", "col").agg(_max=pl.col("wait_ns").max()), store.height)
    pair = pl.col("rank").cast(pl.Int64) * 2**32 + pl.col("instance").cast(pl.Int64)
    cells = (
        collect(
            placed.join(longest.lazy(), on=["row", "col"], build_side="force_right")
            .filter(pl.col("wait_ns") == pl.col("_max"))
            .group_by("row", "col")
            .agg(wait_ns=pl.col("wait_ns").max(), _pair=pair.min()),
            store.height,
        )
        .with_columns(rank=pl.col("_pair") // 2**32, instance=pl.col("_pair") % 2**32)
        .drop("_pair")
        .cast({"instance": cols.schema["instance"]})
        .sort("row", "col")
        .join(
            cols.select("instance", "collective", "process_group"),
            on="instance",
            how="left",
            maintain_order="left",
        )
    )
    ncols = int(cols["col"].max()) + 1  # type: ignore[arg-type]
    nrows = int(row_of["row"].max()) + 1  # type: ignore[arg-type]
    vmax = float(cells["wait_ns"].max() or 0) or 1.0  # type: ignore[arg-type]
    cw = (PLOT_W - LABEL_W - 20) / ncols
    ch = max(4, min(20, 640 // nrows))
    top = 18  # group names above the columns
    height = top + nrows * ch + 60
    titles = cells.height <= 6000
    parts = [
        f'<svg id="plot-skew" class="plot" xmlns="http://www.w3.org/2000/svg" width="{PLOT_W}" '
        f'height="{height}" role="img" aria-label="Arrival skew heatmap">'
        '<defs><linearGradient id="heat" x1="0" x2="1" y1="0" y2="0">'
        + "".join(
            f'<stop offset="{s / 4:.2f}" stop-color="{_heat_color(s / 4)}"/>' for s in range(5)
        )
        + "</linearGradient></defs>"
        f'<rect x="{LABEL_W}" y="{top}" width="{ncols * cw:.1f}" height="{nrows * ch}" '
        'fill="#eeeeee"/>'
    ]
    label_every = 1 if ch >= 10 else math.ceil(12 / ch)
    for i in range(0, nrows, label_every):
        first = ranks[i * per_row]
        label = f"rank {first}" if per_row == 1 else f"ranks {first}+"
        parts.append(
            f'<text x="{LABEL_W - 6}" y="{top + i * ch + ch / 2 + 4:.1f}" text-anchor="end" '
            f"{FONT}>{esc(label)}</text>"
        )
    for c in cells.iter_rows(named=True):
        x = LABEL_W + c["col"] * cw
        y = top + c["row"] * ch
        wait = c["wait_ns"] or 0
        tip = (
            f"<title>rank {esc(c['rank'])} · {esc(c['collective'])} (group "
            f"{esc(c['process_group'])}, instance {esc(c['instance'])}) · waited "
            f"{esc(fmt_ns(wait))}</title>"
            if titles
            else ""
        )
        parts.append(
            f'<rect class="cell" x="{x:.2f}" y="{y}" width="{cw + 0.3:.2f}" height="{ch}" '
            f'fill="{_heat_color(wait / vmax)}">{tip}</rect>'
        )
    # Lines between groups, each group's name over its columns.
    for pg, first in starts.items():
        x = LABEL_W + first * cw
        if first:
            parts.append(
                f'<line class="group-sep" x1="{x:.2f}" y1="{top - 14}" x2="{x:.2f}" '
                f'y2="{top + nrows * ch}" stroke="#333" stroke-width="1.5"/>'
            )
        parts.append(f'<text x="{x + 3:.2f}" y="{top - 5}" {FONT}>group {esc(pg)}</text>')
    # Each column's last arriver: the row most often last among its skewed calls.
    last_of = cols.filter(pl.col("arrival_skew_ns") >= NOISE_NS).join(
        row_of.with_columns(pl.col("rank").cast(pl.Int64)),
        left_on="last_rank",
        right_on="rank",
        how="inner",
    )
    if last_of.height:
        marks = last_of.group_by("col").agg(
            row=pl.col("row").mode().min(), calls=pl.len(), rank=pl.col("last_rank").mode().min()
        )
        for c, r, n, rank in marks.sort("col").select("col", "row", "calls", "rank").iter_rows():
            parts.append(
                f'<rect class="last" x="{LABEL_W + c * cw + 0.5:.2f}" y="{top + r * ch + 0.5}" '
                f'width="{max(cw - 1, 1):.2f}" height="{max(ch - 1, 1)}" fill="none" '
                f'stroke="#000" stroke-width="1.2"><title>last to arrive: rank {esc(rank)}'
                f" ({n} call(s) of this column)</title></rect>"
            )
    y0 = top + nrows * ch
    span = f"{ninst} calls" + (f", {per_col} per column" if per_col > 1 else "")
    parts.append(
        f'<text x="{LABEL_W}" y="{y0 + 16}" {FONT} fill="#666">collective calls by group, in time'
        f" order ({esc(span)}) →; black outline: the call's last arriver</text>"
        f'<rect x="{PLOT_W - 320}" y="{y0 + 28}" width="200" height="10" fill="url(#heat)"/>'
        f'<text x="{PLOT_W - 326}" y="{y0 + 37}" text-anchor="end" {FONT}>wait 0</text>'
        f'<text x="{PLOT_W - 114}" y="{y0 + 37}" {FONT}>{esc(fmt_ns(vmax))}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


# ------------------------------------------------------------------ all-to-all pairs

# The largest group whose pair matrix the page draws (cells of at least 6 px).
MAX_PAIR_RANKS = 64


def _volume_color(x: float) -> str:
    """White -> the palette's communication orange for x in [0, 1]: bytes moved."""
    x = min(max(x, 0.0), 1.0)
    end = tuple(int(COLORS["communication"][i : i + 2], 16) for i in (1, 3, 5))
    r, g, b = (round(255 + (z - 255) * x) for z in end)
    return f"#{r:02x}{g:02x}{b:02x}"


def svg_all_to_all(report: Report) -> str:
    """Each all-to-all exchange of a group (sections.pair_matrices) as a heat map: sender
    (rows) x receiver (columns), colour = bytes per step, each column's total under it;
    empty where the job has no all-to-all with split sizes."""
    matrices, note = pair_matrices(report, MAX_PAIR_RANKS)
    charts = []
    for m in matrices:
        n = len(m.ranks)
        cell = max(6, min(28, 448 // n))
        left, top = 56, 34
        width, height = max(left + n * cell + 12, 320), top + n * cell + 40
        vmax = max((b for row in m.cells for b in row), default=0.0) or 1.0
        imbalance = "" if m.imbalance is None else f" · imbalance {m.imbalance:.2f}x"
        parts = [
            f'<svg class="plot a2a" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" role="img" aria-label="All-to-all pair matrix, group '
            f'{esc(m.group)}, exchange {m.call}">'
            f'<text x="0" y="12" {FONT} font-weight="bold">group {esc(m.group)} · exchange '
            f"{m.call}{esc(imbalance)}</text>"
            f'<text x="{left}" y="{top - 8}" {FONT} fill="#666">to rank →</text>'
        ]
        labels = n <= 32
        for i, (src, row) in enumerate(zip(m.ranks, m.cells, strict=True)):
            y = top + i * cell
            if labels:
                parts.append(
                    f'<text x="{left - 4}" y="{y + cell / 2 + 4:.1f}" text-anchor="end" '
                    f"{FONT}>{esc(src)}</text>"
                )
            for j, b in enumerate(row):
                tip = f"rank {src} → rank {m.ranks[j]}: {fmt_bytes(b)} per step"
                parts.append(
                    f'<rect class="pair" x="{left + j * cell}" y="{y}" width="{cell}" '
                    f'height="{cell}" fill="{_volume_color(b / vmax)}" stroke="#fff">'
                    f"<title>{esc(tip)}</title></rect>"
                )
        y0 = top + n * cell
        if labels:
            for j, dst in enumerate(m.ranks):
                parts.append(
                    f'<text x="{left + j * cell + cell / 2:.1f}" y="{y0 + 12}" '
                    f'text-anchor="middle" {FONT}>{esc(dst)}</text>'
                )
        busiest = max(m.received, default=0.0)
        parts.append(
            f'<text x="0" y="{y0 + 30}" {FONT} fill="#666">from rank ↓ · most received '
            f"{esc(fmt_bytes(busiest))}/step · max {esc(fmt_bytes(vmax))}</text></svg>"
        )
        charts.append("".join(parts))
    if not charts:
        return f'<p class="muted">{esc(note)}</p>' if note else ""
    tail = f'<p class="muted">{esc(note)}</p>' if note else ""
    return (
        "<h2>All-to-all: bytes per step from each rank to each rank</h2>"
        f'<div id="plot-a2a" class="hists">{"".join(charts)}</div>{tail}'
    )


# ------------------------------------------------------------------ pipeline timeline


def pipeline_ranks(report: Report) -> list[int]:
    """Ranks of the `pipeline` table when filled, else the ranks that send or receive."""
    pipe = report.pipeline
    if pipe.height and "rank" in pipe.columns:
        return sorted(int(r) for r in pipe["rank"].unique().to_list())
    calls = report.rank_collectives
    if calls.height == 0:
        return []
    p2p = (
        calls.lazy(["rank", "collective"])
        .filter(pl.col("collective").is_in(["send", "recv", "send_recv"]))
        .select(pl.col("rank").unique())
    )
    return sorted(int(r) for r in collect(p2p, calls.height)["rank"].to_list())


def _pipeline_window(report: Report, ranks: list[int]) -> tuple[int, int, str] | None:
    """(start, end, label) of the step to draw: the middle numbered step of those ranks."""
    steps = report.rank_steps.frame(ranks, ["rank", "step", "start_ns", "end_ns"])
    numbered = steps.filter(pl.col("step") >= 0) if steps.height else steps
    if numbered.height:
        ids = sorted(numbered["step"].unique().to_list())
        step = ids[len(ids) // 2]
        sel = numbered.filter(pl.col("step") == step)
        return int(sel["start_ns"].min()), int(sel["end_ns"].max()), f"step {step}"  # type: ignore[arg-type]
    k = report.rank_kernels.frame(ranks, ["start_ns", "end_ns"])
    if k.height == 0:
        return None
    return int(k["start_ns"].min()), int(k["end_ns"].max()), "whole trace"  # type: ignore[arg-type]


def svg_pipeline(report: Report) -> str:
    """One lane per pipeline rank: its kernels over one step, compute vs communication."""
    ranks = pipeline_ranks(report)
    if not ranks:
        return _empty("plot-pipeline", "No pipeline ranks (no send/recv) in these traces.")
    window = _pipeline_window(report, ranks)
    if window is None:
        return _empty("plot-pipeline", "No kernels on the pipeline ranks.")
    t0, t1, label = window
    span = max(t1 - t0, 1)
    usable = PLOT_W - LABEL_W - 20
    k = report.rank_kernels.frame(ranks[:64], ["kind", "name", "start_ns", "end_ns"])  # lanes drawn
    if k.height:
        k = k.filter((pl.col("end_ns") > t0) & (pl.col("start_ns") < t1))
    lanes = ranks[:64]
    lane_h, gap, top = 22, 6, 4
    height = top + len(lanes) * (lane_h + gap) + 44
    parts = [
        f'<svg id="plot-pipeline" class="plot" xmlns="http://www.w3.org/2000/svg" '
        f'width="{PLOT_W}" height="{height}" role="img" aria-label="Pipeline timeline">'
    ]
    for i, rank in enumerate(lanes):
        y = top + i * (lane_h + gap)
        parts.append(
            f'<rect x="{LABEL_W}" y="{y}" width="{usable}" height="{lane_h}" fill="#f4f4f4"/>'
            f'<text x="{LABEL_W - 6}" y="{y + lane_h / 2 + 4}" text-anchor="end" {FONT}>'
            f"rank {esc(rank)}</text>"
        )
    if k.height:
        px = (
            k.with_columns(
                x0=((pl.col("start_ns").clip(t0, t1) - t0) * usable / span),
                x1=((pl.col("end_ns").clip(t0, t1) - t0) * usable / span),
                dur=pl.col("end_ns") - pl.col("start_ns"),
            )
            .sort("rank", "kind", "x0", "x1")
            .with_columns(reach=pl.col("x1").cum_max().shift(1).over("rank", "kind"))
            .with_columns(
                blk=(pl.col("reach").is_null() | (pl.col("x0") > pl.col("reach") + 0.75))
                .cast(pl.Int64)
                .cum_sum()
                .over("rank", "kind")
            )
            .group_by("rank", "kind", "blk", maintain_order=True)
            .agg(
                x0=pl.col("x0").min(),
                x1=pl.col("x1").max(),
                n=pl.len(),
                busy=pl.col("dur").sum(),
                name=pl.col("name").sort_by("dur", "name").last(),
            )
        )
        lane_of = {r: i for i, r in enumerate(lanes)}
        for b in px.iter_rows(named=True):
            if b["rank"] not in lane_of:
                continue
            kind = b["kind"] if b["kind"] in KIND else "memcpy"
            y = top + lane_of[b["rank"]] * (lane_h + gap)
            inset = 0 if kind == "compute" else 4
            parts.append(
                f'<rect class="k-{esc(kind)}" x="{LABEL_W + b["x0"]:.2f}" y="{y + inset}" '
                f'width="{max(b["x1"] - b["x0"], 0.5):.2f}" height="{lane_h - 2 * inset}" '
                f'fill="{COLORS[KIND[kind]]}"><title>rank {esc(b["rank"])} · {esc(kind)} · '
                f"{b['n']} kernel(s), {esc(fmt_ns(b['busy']))}; longest: {esc(b['name'])}"
                "</title></rect>"
            )
    y0 = top + len(lanes) * (lane_h + gap)
    for t in ticks(span / 1.0):
        x = LABEL_W + t * usable / span
        parts.append(
            f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 4}" stroke="#999"/>'
            f'<text x="{x:.1f}" y="{y0 + 16}" text-anchor="middle" {FONT}>{tick_label(t)}</text>'
        )
    parts.append(
        f'<text x="{LABEL_W}" y="{y0 + 34}" {FONT} fill="#666">{esc(label)}, time from its '
        f"start on rank 0's clock</text></svg>"
    )
    legend = legend_html(
        [("compute", COLORS["compute"]), ("communication", COLORS["communication"])]
        + [("memcpy/memset", COLORS["memory"])]
    )
    more = len(ranks) - len(lanes)
    note = f'<p class="muted">{more} more pipeline rank(s) left out.</p>' if more > 0 else ""
    return legend + "".join(parts) + note


# ------------------------------------------------------------------ tables and findings


def _finding_html(
    f: Finding, mean_step: float | None, number: int | None = None, cost: bool = True
) -> str:
    """A finding card with its cost (unless `cost` is false: a hang's findings have none),
    where it is, and the advice; `number` (its place in the list) gives it the id
    `finding-N` that the timelines' windows link to."""
    share = f.step_share
    if share is None and mean_step:
        share = f.impact_ns_per_step / mean_step
    saves = f"saves ~{fmt_ns(f.impact_ns_per_step)} per step" + (
        f" ({100 * share:.1f}% of step time)" if share is not None else ""
    )
    saves = saves + claim_note(f) if cost else ""
    where = []
    if f.ranks:
        where.append("ranks " + ", ".join(map(str, f.ranks[:32])))
    if f.process_group is not None:
        where.append(f"process group {f.process_group}")
    if f.steps:
        where.append("steps " + ", ".join(map(str, f.steps[:16])))
    advice = "".join(f"<li>{esc(a)}</li>" for a in f.advice)
    evidence = (
        f"<details><summary>evidence</summary><pre>"
        f"{esc(json.dumps(f.evidence, indent=1, default=str))}</pre></details>"
        if f.evidence
        else ""
    )
    color = SEV_COLOR[f.severity.value]
    anchor = f' id="finding-{number}"' if number is not None else ""
    return (
        f'<div class="finding"{anchor} style="border-color:{color}">'
        f'<span class="sev" style="color:{color}">{esc(f.severity.value)}</span> '
        f'<b>{esc(f.code)}</b> <span class="muted">{esc(f.rule)}</span>'
        f"<h3>{esc(f.title)}</h3><p>{esc(f.message)}</p>"
        f'<p class="muted">{esc(" · ".join(([saves] if saves else []) + where))}</p>'
        + (f"<ul>{advice}</ul>" if advice else "")
        + evidence
        + "</div>"
    )


def _rank_table(doc: dict[str, Any]) -> str:
    """Per-rank means per step."""
    head = ["rank", "device", "steps", "step", "compute", "overlap", "exposed comm", "idle"]
    rows = []

    def share(v: float | None, whole: float | None) -> str:
        return "-" if v is None or not whole else f"{100 * v / whole:.1f}%"

    for r in doc["ranks"]:
        wall, comm, exposed, idle = r["wall_ns"], r["comm_ns"], r["exposed_comm_ns"], r["idle_ns"]
        cells = [
            r["rank"],
            r.get("device") or r.get("timeline"),
            r["steps"],
            fmt_ns(wall),
            fmt_ns(r["compute_ns"]),
            share(r["overlap_ns"], comm),
            f"{fmt_ns(exposed)} ({share(exposed, wall)})",
            f"{fmt_ns(idle)} ({share(idle, wall)})",
        ]
        rows.append(
            "<tr>"
            + "".join(
                f"<td{' class=l' if i == 1 else ''}>{esc(c)}</td>" for i, c in enumerate(cells)
            )
            + "</tr>"
        )
    ths = "".join(f"<th{' class=l' if h == 'device' else ''}>{h}</th>" for h in head)
    return f'<table id="table-ranks"><tr>{ths}</tr>{"".join(rows[:256])}</table>'


def _section_html(section: Section) -> str:
    """A shared section (kineto_comm.render.sections) as a heading and a table."""

    def cls(i: int) -> str:
        return "" if i in section.right else " class=l"

    ths = "".join(f"<th{cls(i)}>{esc(h)}</th>" for i, h in enumerate(section.header))
    rows = "".join(
        "<tr>" + "".join(f"<td{cls(i)}>{esc(v)}</td>" for i, v in enumerate(row)) + "</tr>"
        for row in section.rows
    )
    note = f'<p class="muted">{esc(section.note)}</p>' if section.note else ""
    return (
        f"<h2>{esc(section.title)}</h2>"
        f'<table id="table-{esc(section.key)}"><tr>{ths}</tr>{rows}</table>{note}'
    )


def render_html(report: Report, fail_on: Severity = Severity.error) -> str:
    """The whole report as one offline HTML page."""
    doc = overview(report, fail_on)
    s = doc["summary"]
    findings = findings_of(report)
    failing = at_or_above(findings, fail_on)
    mean_step = s["mean_step_ns"]
    # The step of the model of time (its longest rank's window), as the findings' shares.
    step = s.get("step_ns") or mean_step

    def share(v: float | None) -> str:
        return "-" if v is None or not mean_step else f"{100 * v / mean_step:.1f}%"

    shown = sections(report)
    keys = {section.key for section in shown}
    verdict = (
        f"{len(failing)} finding(s) at or above {fail_on.value}"
        if failing
        else f"no findings at or above {fail_on.value}"
    )
    top = "".join(
        f"<li><b>{esc(f.title)}</b> ({esc(f.code)}): saves ~{esc(fmt_ns(f.impact_ns_per_step))}"
        f" per step{' — ' + esc(f.advice[0]) if f.advice else ''}</li>"
        for f in findings[:3]
    )
    notes = "".join(f"<li>error: {esc(e['file'])}: {esc(e['message'])}</li>" for e in doc["errors"])
    notes += "".join(f"<li>warning: {esc(w)}</li>" for w in doc["warnings"][:20])
    body = [
        "<h1>kineto-comm report</h1>",
        f'<p class="muted">{s["ranks"]} rank(s) · kineto-comm {esc(doc["tool"]["version"])} · '
        f"JSON schema v{esc(doc['schema_version'])}</p>",
        f'<p class="headline"><b>{esc(verdict)}</b> · step <b>{esc(fmt_ns(step))}</b> (its '
        f"longest rank's window; the mean rank's {esc(fmt_ns(mean_step))}) · exposed "
        f"communication <b>{esc(fmt_ns(s['mean_exposed_comm_ns']))}</b> per step and rank "
        f"({share(s['mean_exposed_comm_ns'])} of its window) · idle "
        f"{share(s['mean_idle_ns'])}</p>",
        f"<h2>Top recommendations</h2><ol>{top}</ol>" if top else "",
        f'<p class="headline">{esc(fixes)}</p>' if (fixes := all_fixes_line(report)) else "",
        "<h2>Step time per rank (mean per step)</h2>",
        svg_step_time(report),
        _rank_table(doc),
        "<h2>Timeline: the median and the worst step, rank by rank</h2>",
        timelines_html(report),
        "" if "collective_totals" in keys else "<p>No communication kernels found.</p>",
        *(_section_html(section) for section in shown),
        *(
            f'<p class="muted">{esc(line)}</p>'
            for line in (hosts_line(report), clock_sets_line(report))
            if line
        ),
        "<h2>Message sizes per collective</h2>",
        svg_histograms(report),
        "<h2>Arrival skew: time each rank waited in each collective</h2>",
        svg_skew_heatmap(report),
        svg_all_to_all(report),
        "<h2>Pipeline timeline</h2>",
        svg_pipeline(report),
        f"<h2>Findings ({len(findings)})</h2>",
        "".join(_finding_html(f, step, i + 1) for i, f in enumerate(findings))
        or "<p>No findings.</p>",
        f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "",
    ]
    return page("kineto-comm report", body)


def page(title: str, body: list[str]) -> str:
    """A self-contained page of the body's non-empty parts: no script, nothing fetched."""
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{title}</title><style>{CSS}</style></head>\n<body>\n"
        + "\n".join(b for b in body if b)
        + "\n</body></html>\n"
    )
