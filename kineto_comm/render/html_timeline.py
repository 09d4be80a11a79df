"""The HTML report's per-rank timelines: the median and the worst step, one lane per rank,
on the reference clock, each instant coloured by what the rank's GPU did then.

Why: the step-time bars say how much of a step went to waiting; a timeline says when, on
which rank, and next to whom. For every layout (not only pipelines) the page shows the step
whose mean time over the ranks is the median, and the slowest one. Each lane paints, in
this order, idle (nothing running), compute, exposed communication (communication while
no compute runs) and, over it, waits (the part of a matched call spent waiting for the
group's last arriver, `collective_waits`); a row per finding that concerns the step marks
its window and links to the finding's card (`#finding-N`, the cards' ids in html.py).

Lanes: every rank of a job of up to ALL_RANKS ranks, else the ranks the perfetto export
chooses (the median rank, the slowest and fastest of each group, the stragglers), at most
MAX_LANES. Kernels are read a rank at a time and merged at the drawing's resolution (half
a pixel), so a lane is a few hundred rectangles whatever the trace.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.analysis import steptime
from kineto_comm.lazy import collect
from kineto_comm.render.palette import COLORS
from kineto_comm.render.text import fmt_ns
from kineto_comm.report import Report

PLOT_W = 900
LABEL_W = 110
FONT = 'font-family="system-ui, sans-serif" font-size="11"'
ALL_RANKS = 16
MAX_LANES = 24
MAX_FINDING_ROWS = 12
Intervals = list[tuple[float, float]]


def _esc(value: Any) -> str:
    import html

    return html.escape("-" if value is None else str(value), quote=True)


def chosen_steps(report: Report) -> list[tuple[str, int, float]]:
    """(which, step, step time) of the median step and the worst one (the worst left out
    when it is the median step): the steps the text report's blame shows
    (steptime.median_and_worst: complete steps by the model of time's `step_ns`); a report
    without them (rules not run) falls back to the numbered steps' mean window over the
    ranks."""
    shown = steptime.median_and_worst(report.step_times)
    if shown:
        median, worst = shown
        out = [("median", int(median["step"]), float(median["step_ns"]))]
        if worst["step"] != median["step"]:
            out.append(("worst", int(worst["step"]), float(worst["step_ns"])))
        return out
    steps = report.rank_steps
    if steps.height == 0:
        return []
    means = (
        collect(
            steps.lazy(["step", "wall_ns"])
            .filter(pl.col("step") >= 0)
            .group_by("step")
            .agg(wall=pl.col("wall_ns").mean()),
            steps.height,
        )
        .drop_nulls()
        .sort("wall", "step")
    )
    if means.height == 0:
        return []
    rows = means.rows()
    mid, worst = rows[(len(rows) - 1) // 2], rows[-1]
    out = [("median", int(mid[0]), float(mid[1]))]
    if worst[0] != mid[0]:
        out.append(("worst", int(worst[0]), float(worst[1])))
    return out


def lanes(report: Report) -> tuple[list[int], dict[int, list[str]]]:
    """The ranks drawn, and why each (empty for a small job, where every rank is)."""
    ranks = sorted(int(r) for r in report.ranks["rank"])
    if len(ranks) <= ALL_RANKS:
        return ranks, {}
    from kineto_comm.render.perfetto import default_ranks

    why = default_ranks(report)
    # Stragglers first, then the others by rank, up to MAX_LANES.
    first = sorted(why, key=lambda r: ("straggler" not in why[r], r))[:MAX_LANES]
    return sorted(first), why


def _merged(spans: Intervals, gap: float) -> Intervals:
    """`spans` sorted and merged where they touch or lie less than `gap` apart."""
    out: Intervals = []
    for a, b in sorted(spans):
        if b <= a:
            b = a
        if out and a <= out[-1][1] + gap:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _minus(spans: Intervals, cut: Intervals) -> Intervals:
    """Merged `spans` without merged `cut`."""
    out: Intervals = []
    j = 0
    for a, b in spans:
        while j < len(cut) and cut[j][1] <= a:
            j += 1
        k, start = j, a
        while k < len(cut) and cut[k][0] < b:
            if cut[k][0] > start:
                out.append((start, cut[k][0]))
            start = max(start, cut[k][1])
            k += 1
        if start < b:
            out.append((start, b))
    return out


def _within(spans: Intervals, keep: Intervals) -> Intervals:
    """Merged `spans` inside merged `keep`."""
    out: Intervals = []
    j = 0
    for a, b in spans:
        while j < len(keep) and keep[j][1] <= a:
            j += 1
        k = j
        while k < len(keep) and keep[k][0] < b:
            lo, hi = max(a, keep[k][0]), min(b, keep[k][1])
            if lo < hi:
                out.append((lo, hi))
            k += 1
    return out


def _paint(report: Report, rank: int, t0: int, t1: int, scale: float) -> dict[str, Intervals]:
    """Rank `rank`'s compute, exposed communication and waits in [t0, t1], in pixels."""
    kernels = report.rank_kernels.frame([rank], ["rank", "kind", "start_ns", "end_ns"])
    if kernels.height:
        kernels = kernels.filter((pl.col("end_ns") > t0) & (pl.col("start_ns") < t1))

    def px(frame: pl.DataFrame) -> Intervals:
        return [
            ((max(a, t0) - t0) * scale, (min(b, t1) - t0) * scale)
            for a, b in frame.select("start_ns", "end_ns").iter_rows()
        ]

    compute = (
        _merged(px(kernels.filter(pl.col("kind") == "compute")), 0.5) if kernels.height else []
    )
    comm = (
        _merged(px(kernels.filter(pl.col("kind") == "communication")), 0.5)
        if kernels.height
        else []
    )
    waits: Intervals = []
    if report.rank_waits.height:
        w = report.rank_waits.frame([rank], ["rank", "start_ns", "wait_ns"])
        if w.height:
            w = w.filter(
                (pl.col("wait_ns") > 0)
                & (pl.col("start_ns") < t1)
                & (pl.col("start_ns") + pl.col("wait_ns") > t0)
            ).select("start_ns", end_ns=pl.col("start_ns") + pl.col("wait_ns"))
            waits = _merged(px(w), 0.5)
    exposed = _minus(comm, compute)
    waiting = _within(_minus(waits, compute), comm)
    return {"compute": compute, "exposed": _minus(exposed, waiting), "wait": waiting}


def _finding_windows(
    findings: list[Any], step: int, t0: int, t1: int, windows: dict[int, tuple[int, int]]
) -> list[tuple[int, Any, int, int]]:
    """(index, finding, start, end) of the findings that concern this step: their
    window_ns where it meets the drawn span, else the step on their ranks."""
    out = []
    for i, f in enumerate(findings):
        if f.window_ns:
            a, b = max(f.window_ns[0], t0), min(f.window_ns[1], t1)
            if a < b:
                out.append((i, f, a, b))
        elif not f.steps or step in f.steps:
            spans = [windows[r] for r in (f.ranks or windows) if r in windows]
            if spans:
                out.append((i, f, min(s[0] for s in spans), max(s[1] for s in spans)))
    return out[:MAX_FINDING_ROWS]


def svg_step_timeline(report: Report, which: str, step: int, step_ns: float) -> str:
    """One step's lanes (see the module's docstring) as an SVG with id timeline-WHICH; the
    step's critical path (`report.critical_path`) as a black bar under the lanes it
    crosses."""
    ranks, why = lanes(report)
    steps = report.rank_steps.frame(ranks, ["rank", "step", "start_ns", "end_ns"])
    steps = steps.filter(pl.col("step") == step) if steps.height else steps
    windows = {int(r): (int(a), int(b)) for r, _, a, b in steps.iter_rows()}
    shown = [r for r in ranks if r in windows]
    if not shown:
        return ""
    t0 = min(a for a, _ in windows.values())
    t1 = max(b for _, b in windows.values())
    usable = PLOT_W - LABEL_W - 20
    scale = usable / max(t1 - t0, 1)
    from kineto_comm.render.json_doc import findings_of

    findings = findings_of(report)
    marks = _finding_windows(findings, step, t0, t1, windows)
    critical: dict[int, list[tuple[int, int, str]]] = {}
    path = report.critical_path
    if path.height and {"step", "rank", "start_ns", "end_ns", "name"} <= set(path.columns):
        for r, c0, c1, name in (
            path.filter(pl.col("step") == step)
            .select("rank", "start_ns", "end_ns", "name")
            .iter_rows()
        ):
            critical.setdefault(int(r), []).append((int(c0), int(c1), name))
    lane_h, gap, top, band = 18, 4, 4, 14
    ftop = top
    ltop = ftop + len(marks) * (band + 2) + (6 if marks else 0)
    height = ltop + len(shown) * (lane_h + gap) + 40
    parts = [
        f'<svg id="timeline-{which}" class="plot timeline" xmlns="http://www.w3.org/2000/svg" '
        f'width="{PLOT_W}" height="{height}" role="img" '
        f'aria-label="Per-rank timeline of the {which} step">'
    ]
    for row, (i, f, a, b) in enumerate(marks):
        y = ftop + row * (band + 2)
        x0, x1 = LABEL_W + (a - t0) * scale, LABEL_W + (b - t0) * scale
        ranks_txt = ", ".join(map(str, f.ranks[:16])) if f.ranks else "all ranks"
        parts.append(
            f'<a href="#finding-{i + 1}"><rect class="tl-finding" x="{x0:.2f}" y="{y}" '
            f'width="{max(x1 - x0, 1):.2f}" height="{band}" fill="{COLORS["window"]}" '
            'stroke="#b8860b">'
            f"<title>{_esc(f.code)} {_esc(f.title)} · {_esc(ranks_txt)}</title></rect>"
            f'<text x="{x0 + 3:.2f}" y="{y + band - 3}" {FONT}>{_esc(f.code)}</text></a>'
            f'<text x="{LABEL_W - 6}" y="{y + band - 3}" text-anchor="end" {FONT} '
            f'fill="#666">finding {i + 1}</text>'
        )
    for n, rank in enumerate(shown):
        y = ltop + n * (lane_h + gap)
        a, b = windows[rank]
        x0, x1 = LABEL_W + (a - t0) * scale, LABEL_W + (b - t0) * scale
        tag = "straggler" if "straggler" in why.get(rank, []) else ""
        label = f"rank {rank}" + (f" ({tag})" if tag else "")
        reasons = "; ".join(why.get(rank, [])) or "every rank"
        parts.append(
            f'<text x="{LABEL_W - 6}" y="{y + lane_h / 2 + 4}" text-anchor="end" {FONT}>'
            f"{_esc(label)}<title>{_esc(reasons)}</title></text>"
            f'<rect class="tl-idle" x="{x0:.2f}" y="{y}" width="{max(x1 - x0, 0.5):.2f}" '
            f'height="{lane_h}" fill="{COLORS["idle"]}"><title>rank {rank} · step {step}: '
            f"{_esc(fmt_ns(b - a))}</title></rect>"
        )
        painted = _paint(report, rank, a, b, scale)
        offset = (a - t0) * scale
        for kind in ("compute", "exposed", "wait"):
            for p0, p1 in painted[kind]:
                parts.append(
                    f'<rect class="tl-{kind}" x="{LABEL_W + offset + p0:.2f}" y="{y}" '
                    f'width="{max(p1 - p0, 0.5):.2f}" height="{lane_h}" fill="{COLORS[kind]}"/>'
                )
        for c0, c1, name in critical.get(rank, []):
            x0, x1 = LABEL_W + (max(c0, t0) - t0) * scale, LABEL_W + (min(c1, t1) - t0) * scale
            parts.append(
                f'<rect class="tl-critical" x="{x0:.2f}" y="{y + lane_h - 4}" '
                f'width="{max(x1 - x0, 1):.2f}" height="4" fill="{COLORS["critical"]}">'
                f"<title>{_esc(name)}: {_esc(fmt_ns(c1 - c0))}</title></rect>"
            )
    y0 = ltop + len(shown) * (lane_h + gap)
    span = t1 - t0
    from kineto_comm.render.html import _tick_label, _ticks

    for t in _ticks(float(span)):
        x = LABEL_W + t * scale
        parts.append(
            f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 4}" stroke="#999"/>'
            f'<text x="{x:.1f}" y="{y0 + 16}" text-anchor="middle" {FONT}>{_tick_label(t)}</text>'
        )
    parts.append(
        f'<text x="{LABEL_W}" y="{y0 + 32}" {FONT} fill="#666">step {step} ({which}: '
        f"{_esc(fmt_ns(step_ns))}, its longest rank's window), time from its first rank's "
        "start on the reference clock</text></svg>"
    )
    return "".join(parts)


def timelines_html(report: Report) -> str:
    """The section's HTML: a legend, then the median and the worst step's timelines."""
    chosen = chosen_steps(report)
    if not chosen:
        return '<p class="muted">No numbered steps: no per-step timeline.</p>'
    from kineto_comm.render.html import _legend

    ranks, why = lanes(report)
    legend = _legend(
        [
            ("compute", COLORS["compute"]),
            ("exposed communication", COLORS["exposed"]),
            ("waiting for the last rank", COLORS["wait"]),
            ("idle", COLORS["idle"]),
            ("critical path (under the lanes)", COLORS["critical"]),
            ("finding's window (links to it)", COLORS["window"]),
        ]
    )
    out = [legend]
    total = report.ranks.height
    if len(ranks) < total:
        out.append(
            f'<p class="muted">{len(ranks)} of {total} ranks: the median rank, the slowest '
            "and fastest of each group, the stragglers (the perfetto export shows any).</p>"
        )
    for which, step, step_ns in chosen:
        out.append(f"<h3>{'Median' if which == 'median' else 'Worst'} step: step {step}</h3>")
        out.append(svg_step_timeline(report, which, step, step_ns))
    return "".join(out)
