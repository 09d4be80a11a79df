"""SARIF 2.1.0 for code-scanning tools (GitHub `upload-sarif`): one result per finding.

`tool.driver.rules` describes every rule (the rules engine's registry when installed, plus any
code that only findings name) with its help text; each result points at the trace file of the
first rank it involves (code scanning requires a physical location), names the ranks as
logical locations, and carries a stable `partialFingerprints` entry (code, group, ranks) so
the same problem in the next run is recognised as the same alert. Severity maps to SARIF
levels: error -> error, warning -> warning, info -> note.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any
from urllib.parse import quote

from kineto_comm.findings import Finding, Severity
from kineto_comm.render.json_doc import clean, finding_key, findings_of, rule_catalog
from kineto_comm.report import Report
from kineto_comm.version import __version__

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVEL = {"error": "error", "warning": "warning", "info": "note"}
INFO_URI = "https://pypi.org/project/kineto-comm/"


def artifact_uri(path: str) -> str:
    """A trace path as a SARIF URI: relative paths stay relative (POSIX), absolute -> file:."""
    if PureWindowsPath(path).drive:
        return PureWindowsPath(path).as_uri()
    p = PurePosixPath(path.replace("\\", "/"))
    if p.is_absolute():
        return p.as_uri()
    return quote(p.as_posix(), safe="/")


def fingerprint(f: Finding) -> str:
    """A stable hash of what identifies the finding across runs."""
    code, group, ranks = finding_key(f)
    return hashlib.sha256(f"{code}|{group}|{ranks}".encode()).hexdigest()[:32]


def _result(f: Finding, index: int, files: dict[int, str], default_file: str | None) -> dict:
    """One SARIF result for one finding."""
    text = f.message or f.title
    if f.advice:
        text += " Advice: " + " ".join(f.advice)
    result: dict[str, Any] = {
        "ruleId": f.code,
        "ruleIndex": index,
        "level": LEVEL[f.severity.value],
        "message": {"text": f"{f.title}: {text}" if f.title else text},
        "partialFingerprints": {"kinetoCommFinding/v1": fingerprint(f)},
        "properties": clean(
            {
                "severity": f.severity.value,
                "impact_ns_per_step": int(f.impact_ns_per_step),
                "step_share": f.step_share,
                "ranks": list(f.ranks),
                "steps": list(f.steps),
                "process_group": f.process_group,
                "window_ns": list(f.window_ns) if f.window_ns else None,
                "evidence": f.evidence,
                "advice": list(f.advice),
            }
        ),
    }
    file = next((files[r] for r in f.ranks if r in files), default_file)
    location: dict[str, Any] = {}
    if file:
        location["physicalLocation"] = {
            "artifactLocation": {"uri": artifact_uri(file)},
            "region": {"startLine": 1},
        }
    logical = [{"name": f"rank {r}", "kind": "module"} for r in f.ranks[:64]]
    if f.process_group is not None:
        logical.append({"name": f"process group {f.process_group}", "kind": "namespace"})
    if logical:
        location["logicalLocations"] = logical
    if location:
        result["locations"] = [location]
    return result


def sarif_log(report: Report, fail_on: Severity = Severity.error) -> dict[str, Any]:
    """The SARIF log as a dict (see `render_sarif`)."""
    findings = findings_of(report)
    catalog = rule_catalog(report, findings)
    index = {r.code: i for i, r in enumerate(catalog)}
    worst: dict[str, Severity] = {}
    for f in findings:
        if f.code not in worst or f.severity.level > worst[f.code].level:
            worst[f.code] = f.severity
    rules = []
    for r in catalog:
        rule: dict[str, Any] = {
            "id": r.code,
            "name": r.name,
            "shortDescription": {"text": r.summary},
            "fullDescription": {"text": r.help.split("\n\n")[0].strip() or r.summary},
            "help": {"text": r.help, "markdown": r.help},
            "properties": {"tags": ["performance", "distributed", "communication"]},
        }
        if r.code in worst:
            rule["defaultConfiguration"] = {"level": LEVEL[worst[r.code].value]}
        rules.append(rule)
    files = {
        int(row["rank"]): str(row["file"])
        for row in report.ranks.select("rank", "file").iter_rows(named=True)
        if row["file"]
    }
    default_file = files[min(files)] if files else None
    notifications = [
        {"level": "error", "message": {"text": f"{file}: {message}"}}
        for file, message in report.errors
    ] + [{"level": "warning", "message": {"text": w}} for w in report.warnings]
    invocation: dict[str, Any] = {
        "executionSuccessful": report.ranks.height > 0,
        "properties": {"fail_on": fail_on.value},
    }
    if notifications:
        invocation["toolExecutionNotifications"] = notifications
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "kineto-comm",
                "version": __version__,
                "semanticVersion": __version__,
                "informationUri": INFO_URI,
                "rules": rules,
            }
        },
        "invocations": [invocation],
        "results": [_result(f, index[f.code], files, default_file) for f in findings],
    }
    if files:
        run["artifacts"] = [
            {"location": {"uri": artifact_uri(files[r])}, "roles": ["analysisTarget"]}
            for r in sorted(files)
        ]
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def render_sarif(report: Report, fail_on: Severity = Severity.error) -> str:
    """The findings as a SARIF 2.1.0 log (JSON text)."""
    return json.dumps(sarif_log(report, fail_on), indent=2, default=str, allow_nan=False) + "\n"
