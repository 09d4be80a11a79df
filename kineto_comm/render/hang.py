"""The hang report (kineto_comm.hang.HangReport) as text, JSON, Markdown, GitHub
annotations, SARIF, JUnit or HTML. It reads the analysis' tables and the findings; it
computes nothing. SARIF and JUnit are the Kineto report's own renderers (render.sarif,
render.junit) given the hang report's findings, dumps and errors; HTML uses the Kineto
report's page style and finding cards (render.html)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

import polars as pl

from kineto_comm.findings import Finding, Severity
from kineto_comm.hang import HangReport
from kineto_comm.render.github import annotation
from kineto_comm.report import Report

HANG_FORMATS = ("text", "json", "markdown", "github", "sarif", "junit", "html")


def _ranks(values: list[int] | None) -> str:
    return ", ".join(map(str, values or [])) or "-"


def _secs(ns: int | None) -> str:
    return "?" if ns is None else f"{ns / 1e9:.1f} s"


def _before(report: HangReport) -> dict[int, str]:
    """Per root rank, its lateness before the hang (report.history) in a few words."""
    out = {}
    for h in report.history.to_dicts():
        if not h["traced"]:
            out[h["rank"]] = "no Kineto trace of it"
            continue
        verdict = (
            "a straggler"
            if h["is_straggler"]
            else "the most late rank, not a straggler"
            if h["most_late"]
            else "not a straggler"
        )
        out[h["rank"]] = (
            f"{verdict} (last at {h['times_last']} of {h['instances']} collectives,"
            f" {100 * (h['late_share'] or 0):.0f}% of the lateness)"
        )
    return out


def _root_lines(report: HangReport) -> list[str]:
    lines = []
    before = _before(report)
    for r in report.analysis.roots.to_dicts():
        stuck = (
            f"stuck in {r['stuck_op']} #{r['stuck_seq']} of {r['stuck_group_desc']}"
            f" ({r['stuck_group']}), {r['stuck_state']}, for at least {_secs(r['stuck_for_ns'])}"
            f"{', thread ' + r['thread_name'] if r.get('thread_name') else ''}"
            if r.get("stuck_op")
            else "nothing pending"
        )
        last = (
            f"; last completed #{r['last_completed_seq']} of {r['last_completed_group']}"
            if r.get("last_completed_seq") is not None
            else ""
        )
        lines.append(
            f"  rank {r['rank']:<5} {r['kind']:<9} waited for by {_ranks(r['waited_by'])}:"
            f" {stuck}{last}"
        )
        if r["rank"] in before:
            lines.append(f"      before the hang (Kineto traces): {before[r['rank']]}")
        for frame in (r.get("frames") or "").splitlines()[:4]:
            lines.append(f"      at {frame}")
    return lines


def render_hang_text(report: HangReport) -> str:
    """The hang report for a terminal: roots first, then stuck groups, then findings."""
    a = report.analysis
    world = a.tables.world
    missing = world.filter(~pl.col("has_dump"))["rank"].to_list()
    out = [
        f"Flight Recorder: {report.analysed} dumps of {world.height} ranks (format {a.version})"
        + (f"; no dump from ranks {_ranks(missing)}" if missing else "")
        + (f"; {report.kineto_traces} Kineto traces beside them" if report.kineto_traces else ""),
        "",
    ]
    if a.roots.height:
        out.append(f"The hang starts at rank(s) {_ranks(a.roots['rank'].to_list())}:")
        out.extend(_root_lines(report))
    else:
        out.append("No rank is waited for: no hang is visible in these dumps.")
    stuck = a.frontier.filter(
        (pl.col("completed").list.len() > 0)
        | (pl.col("never_reached").list.len() > 0)
        | (pl.col("no_dump").list.len() > 0)
    )
    if stuck.height:
        out += ["", "First collective not completed by every member, where members differ:"]
        for g in stuck.to_dicts():
            out.append(
                f"  {g['group_desc']} ({g['process_group']}) #{g['seq']} {g['op'] or '?'}:"
                f" completed {_ranks(g['completed'])}; started {_ranks(g['started'])};"
                f" scheduled {_ranks(g['scheduled'])}; never reached {_ranks(g['never_reached'])};"
                f" no dump {_ranks(g['no_dump'])}"
            )
    if report.findings:
        out += ["", "Findings:"]
        for f in report.findings:
            out.append(f"  {f.code} {f.severity.value}: {f.title}")
            out.append(f"    {f.message}")
            out.extend(f"    -> {adv}" for adv in f.advice)
    return "\n".join(out) + "\n"


def hang_document(report: HangReport) -> dict[str, Any]:
    """The JSON document: dumps, roots, stuck groups, waits, mismatches, findings, errors."""
    a = report.analysis
    return {
        "kind": "hang",
        "version": a.version,
        "dump_time_ns": a.dump_time_ns,
        "ranks": a.tables.world.to_dicts(),
        "dumps": a.tables.dumps.to_dicts(),
        "roots": a.roots.to_dicts(),
        "frontier": a.frontier.to_dicts(),
        "waits": a.waits.to_dicts(),
        "lagging": a.lagging.to_dicts(),
        "mismatches": a.mismatches.to_dicts(),
        "kineto_traces": report.kineto_traces,
        "history": report.history.to_dicts(),
        "findings": [f.to_dict() for f in report.findings],
        "errors": [{"file": f, "problem": p} for f, p in report.errors],
        "warnings": list(report.warnings),
    }


def render_hang_json(report: HangReport) -> str:
    return json.dumps(hang_document(report), indent=2, default=str) + "\n"


def render_hang_markdown(report: HangReport) -> str:
    """A Markdown summary (a CI job summary or PR comment)."""
    before = _before(report)
    rows = [
        "| rank | kind | waited for by | stuck in | for | before the hang |",
        "|---|---|---|---|---|---|",
    ]
    for r in report.analysis.roots.to_dicts():
        stuck = (
            f"{r['stuck_op']} #{r['stuck_seq']} of {r['stuck_group_desc']}"
            if r.get("stuck_op")
            else "nothing pending"
        )
        rows.append(
            f"| {r['rank']} | {r['kind']} | {_ranks(r['waited_by'])} | {stuck}"
            f" | {_secs(r['stuck_for_ns'])} | {before.get(r['rank'], '-')} |"
        )
    findings = [f"- **{f.code}** {f.title}: {f.message}" for f in report.findings]
    return "\n".join(["## kineto-comm hang report", "", *rows, "", *findings]) + "\n"


@dataclass(frozen=True)
class _Findings:
    """What the SARIF and JUnit renderers read of a Report, from a hang report: findings,
    the rules that ran, each rank's file (its dump), errors and warnings."""

    findings: tuple[Finding, ...]
    ranks: pl.DataFrame
    errors: tuple[tuple[str, str], ...]
    warnings: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)


def _as_report(report: HangReport) -> Report:
    view = _Findings(
        findings=report.findings,
        ranks=report.analysis.tables.dumps.select("rank", "file"),
        errors=report.errors,
        warnings=report.warnings,
        options={"rules_run": list(report.rules_run)} if report.rules_run else {},
    )
    return cast(Report, view)


def _table_html(head: list[str], rows: list[list[Any]]) -> str:
    from kineto_comm.render.html import esc

    cells = "".join(f'<th class="l">{esc(h)}</th>' for h in head)
    body = "".join(
        "<tr>" + "".join(f'<td class="l">{esc(c)}</td>' for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{cells}</tr>{body}</table>"


def render_hang_html(report: HangReport, fail_on: Severity = Severity.error) -> str:
    """One offline HTML page: the roots, the stuck groups, mismatches, the findings' cards."""
    from kineto_comm.render.html import _finding_html, esc, page

    a = report.analysis
    missing = a.tables.world.filter(~pl.col("has_dump"))["rank"].to_list()
    failing = [f for f in report.findings if f.severity.level >= fail_on.level]
    before = _before(report)
    roots = [
        [
            r["rank"],
            r["kind"],
            _ranks(r["waited_by"]),
            f"{r['stuck_op']} #{r['stuck_seq']} of {r['stuck_group_desc']} ({r['stuck_group']}),"
            f" {r['stuck_state']}"
            if r.get("stuck_op")
            else "nothing pending",
            _secs(r["stuck_for_ns"]),
            r.get("thread_name") or "-",
            f"#{r['last_completed_seq']} of {r['last_completed_group']}"
            if r.get("last_completed_seq") is not None
            else "-",
            before.get(r["rank"], "-"),
            r.get("frames") or "",
        ]
        for r in a.roots.to_dicts()
    ]
    front = [
        [
            f"{g['group_desc']} ({g['process_group']})",
            g["seq"],
            g["op"] or "?",
            *(_ranks(g[c]) for c in ("completed", "started", "scheduled", "never_reached")),
            _ranks(g["no_dump"]),
        ]
        for g in a.frontier.to_dicts()
    ]
    odd = [
        [f"{m['group_desc']} ({m['process_group']})", m["seq"], m["kind"], m["rank"], m["op"]]
        + [m["expected"], m["found"]]
        for m in a.mismatches.to_dicts()
    ]
    notes = "".join(f"<li>error: {esc(f)}: {esc(p)}</li>" for f, p in report.errors)
    notes += "".join(f"<li>warning: {esc(w)}</li>" for w in report.warnings)
    body = [
        "<h1>kineto-comm hang report</h1>",
        f'<p class="muted">Flight Recorder: {report.analysed} dumps of {a.tables.world.height}'
        f" ranks (format {esc(a.version)})"
        + (f"; no dump from ranks {esc(_ranks(missing))}" if missing else "")
        + "</p>",
        f'<p class="headline"><b>{len(failing)} finding(s) at or above {fail_on.value}</b> · '
        + (
            f"the hang starts at rank(s) <b>{esc(_ranks(a.roots['rank'].to_list()))}</b></p>"
            if a.roots.height
            else "no rank is waited for: no hang is visible in these dumps</p>"
        ),
        "<h2>Root ranks</h2>"
        + _table_html(
            ["rank", "kind", "waited for by", "stuck in", "for at least", "thread"]
            + ["last completed", "before the hang", "stack"],
            roots,
        )
        if roots
        else "",
        "<h2>First collective not completed by every member</h2>"
        + _table_html(
            ["group", "seq", "op", "completed", "started", "scheduled", "never reached"]
            + ["no dump"],
            front,
        )
        if front
        else "",
        "<h2>Mismatched calls</h2>"
        + _table_html(["group", "seq", "kind", "rank", "op", "expected", "found"], odd)
        if odd
        else "",
        f"<h2>Findings ({len(report.findings)})</h2>",
        "".join(_finding_html(f, None, i + 1, cost=False) for i, f in enumerate(report.findings))
        or "<p>No findings.</p>",
        f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "",
    ]
    return page("kineto-comm hang report", body)


def render_hang(report: HangReport, fmt: str, fail_on: Severity = Severity.error) -> str:
    """The report in `fmt` (one of HANG_FORMATS); ValueError for others. `fail_on`: the
    level SARIF, JUnit and HTML call failing."""
    if fmt == "sarif":
        from kineto_comm.render.sarif import render_sarif

        return render_sarif(_as_report(report), fail_on)
    if fmt == "junit":
        from kineto_comm.render.junit import render_junit

        return render_junit(_as_report(report), fail_on)
    if fmt == "html":
        return render_hang_html(report, fail_on)
    if fmt == "text":
        return render_hang_text(report)
    if fmt == "json":
        return render_hang_json(report)
    if fmt == "markdown":
        return render_hang_markdown(report)
    if fmt == "github":
        return "".join(annotation(f) + "\n" for f in report.findings)
    raise ValueError(
        f"format {fmt!r} is not available for hang reports; choose {', '.join(HANG_FORMATS)}"
    )
