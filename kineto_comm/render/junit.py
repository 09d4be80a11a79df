"""JUnit XML for CI test reporters: one test case per rule, failures at or above the fail level.

Test cases are the rules that produced findings, plus (when the rules engine's registry is
available) a passing case for every rule that found nothing, so a dashboard shows which checks
ran. A rule with findings at or above `fail_on` gets one `<failure>` listing them all; its
findings below the level go to the case's `<system-out>`. Unusable trace files are listed in
the suite's `<system-err>`. Control characters that XML 1.0 forbids are removed.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from kineto_comm.findings import Finding, Severity
from kineto_comm.render.findings import claim_note
from kineto_comm.render.fmt import fmt_ns
from kineto_comm.render.json_doc import findings_of, rule_catalog
from kineto_comm.report import Report

_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xml_text(value: object) -> str:
    """`value` as text XML 1.0 can hold."""
    return _BAD_XML.sub("", str(value))


def _describe(f: Finding) -> str:
    """A finding as a few lines of plain text."""
    lines = [f"[{f.severity.value}] {f.code} {f.title}: {f.message}"]
    lines.append(f"  impact: {fmt_ns(f.impact_ns_per_step)} per step{claim_note(f)}")
    if f.ranks:
        lines.append("  ranks: " + ", ".join(map(str, f.ranks)))
    if f.process_group is not None:
        lines.append(f"  process group: {f.process_group}")
    lines += [f"  advice: {a}" for a in f.advice]
    return "\n".join(lines)


def render_junit(report: Report, fail_on: Severity = Severity.error) -> str:
    """The report as a JUnit XML document (one `<testsuite>` named kineto-comm)."""
    findings = findings_of(report)
    by_code: dict[str, list[Finding]] = {}
    for f in findings:
        by_code.setdefault(f.code, []).append(f)
    catalog = rule_catalog(report, findings)
    suites = ET.Element("testsuites", name="kineto-comm")
    suite = ET.SubElement(suites, "testsuite", name="kineto-comm")
    failures = 0
    for r in catalog:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=xml_text(f"kineto-comm.{re.match(r'[A-Za-z]*', r.code).group(0) or 'rules'}"),  # type: ignore[union-attr]
            name=xml_text(f"{r.code} {r.name}"),
            time="0",
        )
        mine = by_code.get(r.code, [])
        bad = [f for f in mine if f.severity.level >= fail_on.level]
        low = [f for f in mine if f.severity.level < fail_on.level]
        if bad:
            failures += 1
            worst = max(bad, key=lambda f: f.severity.level)
            failure = ET.SubElement(
                case,
                "failure",
                message=xml_text(f"{len(bad)} finding(s): {bad[0].title}"),
                type=worst.severity.value,
            )
            failure.text = xml_text("\n\n".join(_describe(f) for f in bad))
        if low:
            out = ET.SubElement(case, "system-out")
            out.text = xml_text("\n\n".join(_describe(f) for f in low))
    if report.errors or report.warnings:
        err = ET.SubElement(suite, "system-err")
        err.text = xml_text(
            "\n".join(
                [f"error: {file}: {msg}" for file, msg in report.errors]
                + [f"warning: {w}" for w in report.warnings]
            )
        )
    for el in (suite, suites):
        el.set("tests", str(len(catalog)))
        el.set("failures", str(failures))
        el.set("errors", "0")
        el.set("skipped", "0")
        el.set("time", "0")
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, "unicode") + "\n"
