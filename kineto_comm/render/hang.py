"""The hang report (kineto_comm.hang.HangReport) as text, JSON, Markdown or GitHub
annotations. It reads the analysis' tables and the findings; it computes nothing."""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from kineto_comm.hang import HangReport
from kineto_comm.render.github import annotation

HANG_FORMATS = ("text", "json", "markdown", "github")


def _ranks(values: list[int] | None) -> str:
    return ", ".join(map(str, values or [])) or "-"


def _secs(ns: int | None) -> str:
    return "?" if ns is None else f"{ns / 1e9:.1f} s"


def _root_lines(report: HangReport) -> list[str]:
    lines = []
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
        + (f"; no dump from ranks {_ranks(missing)}" if missing else ""),
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
        "findings": [f.to_dict() for f in report.findings],
        "errors": [{"file": f, "problem": p} for f, p in report.errors],
        "warnings": list(report.warnings),
    }


def render_hang_json(report: HangReport) -> str:
    return json.dumps(hang_document(report), indent=2, default=str) + "\n"


def render_hang_markdown(report: HangReport) -> str:
    """A Markdown summary (a CI job summary or PR comment)."""
    rows = [
        "| rank | kind | waited for by | stuck in | for |",
        "|---|---|---|---|---|",
    ]
    for r in report.analysis.roots.to_dicts():
        stuck = (
            f"{r['stuck_op']} #{r['stuck_seq']} of {r['stuck_group_desc']}"
            if r.get("stuck_op")
            else "nothing pending"
        )
        rows.append(
            f"| {r['rank']} | {r['kind']} | {_ranks(r['waited_by'])} | {stuck}"
            f" | {_secs(r['stuck_for_ns'])} |"
        )
    findings = [f"- **{f.code}** {f.title}: {f.message}" for f in report.findings]
    return "\n".join(["## kineto-comm hang report", "", *rows, "", *findings]) + "\n"


def render_hang(report: HangReport, fmt: str) -> str:
    """The report in `fmt` (one of HANG_FORMATS); ValueError for others."""
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
