"""GitHub Actions workflow commands: one `::error|warning|notice` annotation per finding.

Escaping follows the Actions toolkit (`@actions/core` command.ts): in the message `%`, CR and
LF become %25, %0D and %0A; in properties (`title=`) also `:` and `,` become %3A and %2C, so a
kernel or group name from a trace can neither end the command nor inject another one.
Severity maps to the command: error -> ::error, warning -> ::warning, info -> ::notice.
"""

from __future__ import annotations

from kineto_comm.findings import Finding, Severity
from kineto_comm.render.findings import claim_note
from kineto_comm.render.fmt import fmt_ns
from kineto_comm.render.json_doc import findings_of
from kineto_comm.report import Report

COMMAND = {"error": "error", "warning": "warning", "info": "notice"}


def escape_data(text: str) -> str:
    """A command's message: % CR LF escaped."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A command property value: % CR LF : , escaped."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(f: Finding) -> str:
    """One workflow command line for one finding."""
    title = f"kineto-comm {f.code}: {f.title}" if f.title else f"kineto-comm {f.code}"
    parts = [f.message or f.title]
    if f.impact_ns_per_step:
        share = f" ({100 * f.step_share:.1f}% of step)" if f.step_share is not None else ""
        parts.append(
            f"Estimated cost {fmt_ns(f.impact_ns_per_step)} per step{share}{claim_note(f)}."
        )
    if f.ranks:
        parts.append("Ranks: " + ", ".join(map(str, f.ranks[:32])) + ".")
    if f.process_group is not None:
        parts.append(f"Process group: {f.process_group}.")
    if f.advice:
        parts.append("\n" + "\n".join(f"- {a}" for a in f.advice))
    message = " ".join(parts)
    return f"::{COMMAND[f.severity.value]} title={escape_property(title)}::{escape_data(message)}"


def render_github(report: Report, fail_on: Severity = Severity.error) -> str:
    """One annotation line per finding (worst impact first); empty when there are none."""
    lines = [annotation(f) for f in findings_of(report)]
    return "".join(line + "\n" for line in lines)
