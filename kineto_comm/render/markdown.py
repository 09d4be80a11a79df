"""Markdown for a pull-request comment: headline, per-rank and collectives tables, findings.

Sized for GitHub comments (at most 65,536 characters): tables are cut to their largest rows
and the findings list to the worst ones, with a note saying how many were left out. Every
string that comes from a trace (kernel, group and file names, finding text) goes through
`md_escape`, so a `|` cannot break a table and `<`/`>` cannot open HTML.
"""

from __future__ import annotations

import html
import re
from typing import Any

from kineto_comm.findings import Finding, Severity
from kineto_comm.render.findings import all_fixes_line, claim_note
from kineto_comm.render.fmt import fmt_bytes, fmt_ns
from kineto_comm.render.json_doc import at_or_above, findings_of, overview
from kineto_comm.render.sections import pair_matrices, sections
from kineto_comm.render.text import clock_sets_line, hosts_line
from kineto_comm.report import Report

MAX_CHARS = 60_000
MAX_ROWS = 25
MAX_FINDINGS = 30
TOP = 3
ICON = {"error": "🔴", "warning": "🟠", "info": "🔵"}
_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|~])")


def md_escape(value: Any) -> str:
    """Text safe inside Markdown and table cells: HTML-escaped, specials and `|` backslashed."""
    text = "-" if value is None else str(value)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _SPECIAL.sub(r"\\\1", text)
    return re.sub(r"[\r\n\t]+", " ", text).strip()


def html_escape(value: Any) -> str:
    """Text for inside an HTML element of a comment (e.g. <summary>), where Markdown is off."""
    text = "-" if value is None else str(value)
    return re.sub(r"[\r\n\t]+", " ", html.escape(text, quote=True)).strip()


def _share(part: float | None, whole: float | None) -> str:
    return "-" if part is None or not whole else f"{100 * part / whole:.1f}%"


def _impact(f: Finding, step: float | None) -> str:
    """Estimated savings per step, with the share of step time when known."""
    share = f.step_share
    if share is None and step:
        share = f.impact_ns_per_step / step
    text = f"~{fmt_ns(f.impact_ns_per_step)}/step"
    text += f" ({100 * share:.1f}% of step time)" if share is not None else ""
    return text + claim_note(f)


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """A GFM table; columns whose index is in `right` are right-aligned."""
    align = ["---:" if i in right else ":---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _pair_matrices(report: Report) -> list[str]:
    """Each all-to-all exchange of a group as a small matrix: bytes per step from each rank
    (rows) to each rank (columns), what each receives under them."""
    matrices, note = pair_matrices(report)
    out: list[str] = []
    for m in matrices:
        imbalance = "" if m.imbalance is None else f"; imbalance {m.imbalance:.2f}x"
        out += [
            f"### All-to-all pairs: group {md_escape(m.group)}, exchange {m.call} of each step",
            "",
        ]
        header = ["from / to", *[f"rank {r}" for r in m.ranks]]
        rows = [
            [f"rank {r}", *[fmt_bytes(b) for b in row]]
            for r, row in zip(m.ranks, m.cells, strict=True)
        ]
        rows.append(["received", *[fmt_bytes(b) for b in m.received]])
        out += _table(header, rows, set(range(1, len(header))))
        out += ["", f"_Bytes per step (the mean over the steps){md_escape(imbalance)}._", ""]
    if note:
        out += [f"_{md_escape(note)}_", ""]
    return out


def render_markdown(report: Report, fail_on: Severity = Severity.error) -> str:
    """The report as GitHub-flavoured Markdown for a PR comment."""
    doc = overview(report, fail_on)
    s = doc["summary"]
    findings = findings_of(report)
    failing = at_or_above(findings, fail_on)
    mean_step = s["mean_step_ns"]
    out: list[str] = ["## kineto-comm: communication report", ""]
    verdict = (
        f"**{len(failing)} finding(s) at or above `{fail_on.value}`**"
        if failing
        else f"No findings at or above `{fail_on.value}`."
    )
    counts = ", ".join(f"{s['findings'][k]} {k}" for k in ("error", "warning", "info"))
    # The step is the model of time's (its longest rank's window), as the findings' shares
    # are; the per-rank means are said to be per rank.
    step = s.get("step_ns") or mean_step
    out.append(
        f"{verdict} ({counts}) · {s['ranks']} rank(s) · step **{fmt_ns(step)}** (its longest "
        f"rank's window; the mean rank's {fmt_ns(mean_step)}) · exposed communication "
        f"**{fmt_ns(s['mean_exposed_comm_ns'])}** per step and rank "
        f"({_share(s['mean_exposed_comm_ns'], mean_step)} of its window) · idle "
        f"{_share(s['mean_idle_ns'], mean_step)}"
    )
    if fixes := all_fixes_line(report):
        out += ["", md_escape(fixes)]
    out.append("")
    # Which ranks share a host and its clock, and clocks left unaligned (as text and HTML).
    for line in (hosts_line(report), clock_sets_line(report)):
        if line:
            out += [md_escape(line), ""]
    if findings:
        out.append("### Top recommendations")
        out.append("")
        for i, f in enumerate(findings[:TOP], 1):
            first = f" {md_escape(f.advice[0])}" if f.advice else ""
            out.append(
                f"{i}. {ICON[f.severity.value]} **{md_escape(f.title)}** (`{md_escape(f.code)}`, "
                f"{f.severity.value}): saves {_impact(f, step)}.{first}"
            )
        out.append("")

    out += ["### Per rank (mean per step)", ""]
    rank_rows = []
    for r in doc["ranks"][:MAX_ROWS]:
        n = r["steps"]

        def m(col: str, r: dict[str, Any] = r) -> float | None:
            return r[col] if r["steps"] else None

        wall = m("wall_ns")
        rank_rows.append(
            [
                str(r["rank"]),
                md_escape(r.get("device") or r.get("timeline")),
                str(n),
                fmt_ns(wall),
                fmt_ns(m("compute_ns")),
                _share(m("overlap_ns"), m("comm_ns")),
                f"{fmt_ns(m('exposed_comm_ns'))} ({_share(m('exposed_comm_ns'), wall)})",
                f"{fmt_ns(m('idle_ns'))} ({_share(m('idle_ns'), wall)})",
            ]
        )
    out += _table(
        ["rank", "device", "steps", "step", "compute", "overlap", "exposed comm", "idle"],
        rank_rows,
        {0, 2, 3, 4, 5, 6, 7},
    )
    if len(doc["ranks"]) > MAX_ROWS:
        out.append(f"\n_{len(doc['ranks']) - MAX_ROWS} more rank(s) in the JSON report._")
    out.append("")

    shown = sections(report)
    if not any(section.key == "collective_totals" for section in shown):
        out += ["### Collectives (all ranks)", "", "No communication kernels found.", ""]
    for section in shown:
        out += [f"### {md_escape(section.title)}", ""]
        rows = [[md_escape(cell) for cell in row] for row in section.rows]
        out += _table([md_escape(h) for h in section.header], rows, set(section.right))
        if section.note:
            out.append(f"\n_{md_escape(section.note)}_")
        out.append("")

    out += _pair_matrices(report)
    if findings:
        out += ["### Findings", ""]
        for f in findings[:MAX_FINDINGS]:
            where = []
            if f.ranks:
                where.append("ranks " + ", ".join(map(str, f.ranks[:16])))
            if f.process_group is not None:
                where.append(f"group {html_escape(f.process_group)}")
            loc = f" · {' · '.join(where)}" if where else ""
            out.append(
                f"<details><summary>{ICON[f.severity.value]} <b>{html_escape(f.code)}</b> "
                f"{html_escape(f.title)} · {_impact(f, step)}{loc}</summary>"
            )
            out.append("")
            out.append(md_escape(f.message))
            if f.advice:
                out.append("")
                out += [f"- {md_escape(a)}" for a in f.advice]
            out += ["", "</details>", ""]
        if len(findings) > MAX_FINDINGS:
            out.append(f"_{len(findings) - MAX_FINDINGS} more finding(s) in the JSON report._")
            out.append("")
    for e in doc["errors"]:
        out.append(f"> error: {md_escape(e['file'])}: {md_escape(e['message'])}")
    for w in doc["warnings"][:10]:
        out.append(f"> warning: {md_escape(w)}")
    text = "\n".join(out).rstrip() + "\n"
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS].rsplit("\n", 1)[0] + "\n\n_(truncated; see the JSON report)_\n"
    return text
