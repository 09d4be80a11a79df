"""`analyze_hang(paths) -> HangReport`: the hang report of a folder of Flight Recorder dumps.

Dumps are found by content (kineto_comm.load.flight), decoded safely, one job kept; the
hang tables are built (kineto_comm.analysis.hang) and the HANG rules turn the root ranks
into findings. Kineto traces of the same job among the paths are analysed too, and their
stragglers table says whether each root rank was already late before the hang
(`history`). A file that cannot be used is one line in `errors`; the others are still
analysed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from kineto_comm.analysis.hang import HISTORY_SCHEMA, HangAnalysis, analyse, history, tables_of
from kineto_comm.findings import Finding, Severity
from kineto_comm.load.flight import find_dumps, read_dumps


@dataclass(frozen=True)
class HangReport:
    """The hang analysis, its findings, and the files that could not be used."""

    analysis: HangAnalysis
    findings: tuple[Finding, ...]
    errors: tuple[tuple[str, str], ...]
    warnings: tuple[str, ...]
    rules_run: tuple[str, ...] = ()  # the codes of the rules that ran (SARIF, JUnit list them)
    # Each root's lateness before the hang (analysis.hang.history), from Kineto traces of
    # the same job beside the dumps; empty without them.
    history: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=HISTORY_SCHEMA))
    kineto_traces: int = 0  # how many Kineto traces were analysed for it

    @property
    def analysed(self) -> int:
        """How many dumps were analysed."""
        return self.analysis.tables.dumps.height


def has_dumps(paths: Sequence[str | Path]) -> bool:
    """Whether the paths hold Flight Recorder dumps (so `report` gives the hang report)."""
    return bool(find_dumps(list(paths)))


def analyze_hang(
    paths: Sequence[str | Path],
    *,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    rule_options: Mapping[str, Mapping[str, Any]] | None = None,
    jobs: int | None = None,
) -> HangReport:
    """Read every FR dump under `paths`, find the ranks the hang starts from, run HANG rules.
    `jobs`: processes decoding the dumps (default: the cores, on big jobs only)."""
    from kineto_comm.rules_engine import rule_set

    chosen = rule_set(select=tuple(select) or ("HANG",), ignore=ignore, options=rule_options)
    dumps, bad, warnings = read_dumps(list(paths), jobs)
    analysis = analyse(tables_of(dumps))
    errors = [(e.file, e.problem) for e in bad]
    stragglers, traced = _lateness(paths, [d.file for d in dumps] + [e.file for e in bad], errors)
    late = history(analysis.roots, stragglers)
    findings = chosen.run({**analysis.as_dict(), "hang_history": late}) if dumps else ()
    return HangReport(
        analysis,
        findings,
        tuple(errors),
        tuple(warnings),
        tuple(chosen.codes),
        history=late,
        kineto_traces=traced,
    )


def _lateness(
    paths: Sequence[str | Path], dumps: list[str], errors: list[tuple[str, str]]
) -> tuple[pl.DataFrame | None, int]:
    """The stragglers table of the Kineto traces beside the dumps (analyze() on every
    trace file that is not a dump; no rules run), and how many traces it read; (None, 0)
    when there are none. Their unusable files join `errors`."""
    from kineto_comm.analyze import analyze
    from kineto_comm.errors import TraceError, UsageError
    from kineto_comm.load.discover import discover

    skip = {Path(f).resolve() for f in dumps}
    traces = [p for p in discover(list(paths))[0] if p.resolve() not in skip]
    if not traces:
        return None, 0
    try:
        report = analyze(traces, ignore=["ALL"])
    except (TraceError, UsageError) as exc:
        errors.append(("Kineto traces beside the dumps", str(exc)))
        return None, 0
    errors.extend(report.errors)
    return report.stragglers, report.ranks.height


def exit_code(
    report: HangReport, fail_on: Severity = Severity.error, exit_zero: bool = False
) -> int:
    """2: nothing analysed; 1: a finding at or above `fail_on` (unless exit_zero); else 0."""
    if report.analysed == 0:
        return 2
    if exit_zero:
        return 0
    return int(any(f.severity.level >= fail_on.level for f in report.findings))
