"""Compare two runs: step time, exposed communication, bus bandwidth, findings; CI gates.

Each side is a Report, a JSON document (`kineto_comm.render.json_doc.document`), a file
written by `kineto-comm report --format json`, or trace files/directories to analyse. Both
sides are reduced to that JSON document first, so a saved baseline compares like fresh traces.

Compared: the model of time's step time (summary `step_ns`; the mean numbered step where a
saved document predates it); per step and rank, exposed communication, communication and
idle; bus bandwidth per (collective, process group); findings, matched by (code, process
group, ranks): new and resolved.

Gates (each optional: `max_regression`, `max_exposed_regression`, `max_busbw_drop`,
`fail_on_new`) make `DiffResult.failed` true, which the CLI turns into exit 1. Every
threshold is a percentage, with or without its sign ("5%", "5" and 5 all mean 5 %; 0.5 is
half a percent). Each gate given is also kept as a `Gate`: its threshold beside the value
measured against it. In full: docs/ci.md, "What `kineto-comm diff` compares".
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kineto_comm.findings import Finding, Severity
from kineto_comm.render.fmt import fmt_ns
from kineto_comm.render.json_doc import as_finding, clean, document, finding_key
from kineto_comm.render.sections import fmt_bw
from kineto_comm.render.sections import group as group_name
from kineto_comm.report import Report

Side = Report | dict[str, Any] | str | Path | Sequence[str | Path]
DIFF_SCHEMA_VERSION = 1


def parse_percent(value: str | float | int | None, name: str = "threshold") -> float | None:
    """A gate's threshold, a percentage, as a fraction: '5%', '5' and 5 -> 0.05; '0.5' ->
    0.005 (a bare number is a percentage too, whatever its size: one reading for every gate).
    None or '' -> None (no gate). ValueError naming `name` when it is not a percentage >= 0."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        try:
            number = float(text.removesuffix("%").strip())
        except ValueError:
            raise ValueError(f"{name}: expected a percentage like 5 or 5%, got {value!r}") from None
    else:
        number = float(value)
    if not (number >= 0 and math.isfinite(number)):
        raise ValueError(f"{name}: a percentage must be >= 0 and finite, got {value!r}")
    return number / 100


def is_report_json(path: Path) -> bool:
    """True when `path` is a JSON file written by `kineto-comm report --format json`."""
    if not path.is_file() or not path.name.endswith(".json"):
        return False
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
        if b'"schema_version"' not in head and b"kineto-comm" not in head:
            return False
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "schema_version" in doc and "ranks" in doc


def load_side(
    side: Side, *, jobs: int | None = None, analysis: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], str]:
    """(JSON document, label) for one side of a diff; ValueError when it cannot be used.
    Traces are analysed by `analyze(paths, jobs=jobs, **analysis)`: the rules run, as in
    `kineto-comm report`, so their findings compare like a saved report's."""
    if isinstance(side, Report):
        return document(side), "report"
    if isinstance(side, dict):
        return side, "report"
    paths = [Path(side)] if isinstance(side, (str, Path)) else [Path(p) for p in side]
    label = ", ".join(str(p) for p in paths)
    if len(paths) == 1 and is_report_json(paths[0]):
        doc = json.loads(paths[0].read_text(encoding="utf-8"))
        version = doc.get("schema_version")
        if not isinstance(version, int) or version > 1:
            raise ValueError(f"{label}: unsupported report schema_version {version!r}")
        return doc, label
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise ValueError(f"{missing[0]}: no such file or directory")
    from kineto_comm.analyze import analyze

    report = analyze(paths, jobs=jobs, **(analysis or {}))
    if report.ranks.height == 0:
        problems = "; ".join(f"{f}: {m}" for f, m in report.errors) or "no trace files found"
        raise ValueError(f"{label}: nothing could be analysed ({problems})")
    return document(report), label


def step_means(doc: dict[str, Any]) -> dict[str, float | None]:
    """Mean per-step wall, exposed comm, comm and idle over every rank's windows of the
    job's complete steps (`step_times`, those of the step time and of the report's per-rank
    table), else (a document without them) over its numbered steps."""
    rows = [st for r in doc.get("ranks", []) for st in r.get("steps", [])]
    complete = {t.get("step") for t in doc.get("step_times") or [] if t.get("complete")}
    counted = [st for st in rows if st.get("step") in complete]
    numbered = [st for st in rows if (st.get("step") if st.get("step") is not None else -1) >= 0]
    rows = counted or numbered or rows
    out: dict[str, float | None] = {}
    for col in ("wall_ns", "exposed_comm_ns", "comm_ns", "idle_ns"):
        vals = [float(st[col]) for st in rows if st.get(col) is not None]
        out[col] = sum(vals) / len(vals) if vals else None
    step = (doc.get("summary") or {}).get("step_ns")
    out["step_ns"] = float(step) if step else None
    return out


def busbw_by_group(doc: dict[str, Any]) -> dict[tuple[str, str | None], float]:
    """Median busbw per (collective, process_group) from `skew`, else `collective_totals`."""
    out: dict[tuple[str, str | None], float] = {}
    for row in doc.get("skew") or []:
        v = row.get("median_busbw_gbps")
        if v is not None and (row.get("ranks") or 2) > 1:
            out[(str(row.get("collective")), row.get("process_group"))] = float(v)
    if not out:
        for row in doc.get("collective_totals") or []:
            v = row.get("busbw_gbps")
            if v is not None:
                out[(str(row.get("collective")), row.get("process_group"))] = float(v)
    return out


@dataclass(frozen=True)
class Change:
    """One compared number: baseline, new, and whether it crossed its gate."""

    name: str
    unit: str
    baseline: float | None
    new: float | None
    higher_is_worse: bool = True
    gate: float | None = None
    gate_basis: str = "relative"
    regressed: bool = False

    @property
    def delta(self) -> float | None:
        """new - baseline (None when either is unknown)."""
        return None if self.baseline is None or self.new is None else self.new - self.baseline

    @property
    def relative(self) -> float | None:
        """delta / baseline (None when undefined)."""
        d = self.delta
        return None if d is None or not self.baseline else d / self.baseline

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "name": self.name,
            "unit": self.unit,
            "baseline": self.baseline,
            "new": self.new,
            "delta": self.delta,
            "relative": self.relative,
            "higher_is_worse": self.higher_is_worse,
            "gate": self.gate,
            "gate_basis": self.gate_basis,
            "regressed": self.regressed,
        }


@dataclass(frozen=True)
class Gate:
    """One gate as applied: its threshold beside the value measured against it.

    `threshold` and `measured` are fractions (step growth over the baseline step; growth of
    exposed communication as a share of the baseline step; the largest busbw drop, negative
    when every bandwidth rose) or, for fail_on_new, the severity and the number of new
    findings at or above it. `measured` is None when one side lacks the number."""

    name: str
    subject: str
    threshold: float | str
    measured: float | int | None
    failed: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "gate": self.name,
            "subject": self.subject,
            "threshold": self.threshold,
            "measured": self.measured,
            "failed": self.failed,
        }


@dataclass(frozen=True)
class DiffResult:
    """What changed between two runs and whether any gate failed (`failed` -> exit 1)."""

    baseline_label: str
    new_label: str
    changes: tuple[Change, ...]
    bandwidth: tuple[Change, ...]
    new_findings: tuple[Finding, ...]
    resolved_findings: tuple[Finding, ...]
    failures: tuple[str, ...]
    notes: tuple[str, ...] = ()
    gates: dict[str, Any] = field(default_factory=dict)
    checks: tuple[Gate, ...] = ()

    @property
    def failed(self) -> bool:
        """True when at least one gate was exceeded."""
        return bool(self.failures)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of the diff (schema version DIFF_SCHEMA_VERSION)."""
        return clean(
            {
                "diff_schema_version": DIFF_SCHEMA_VERSION,
                "baseline": self.baseline_label,
                "new": self.new_label,
                "failed": self.failed,
                "failures": list(self.failures),
                "gates": self.gates,
                "checks": [g.to_dict() for g in self.checks],
                "changes": [c.to_dict() for c in self.changes],
                "bandwidth": [c.to_dict() for c in self.bandwidth],
                "new_findings": [f.to_dict() for f in self.new_findings],
                "resolved_findings": [f.to_dict() for f in self.resolved_findings],
                "notes": list(self.notes),
            }
        )


def diff(
    baseline: Side,
    new: Side,
    *,
    max_regression: str | float | None = None,
    max_exposed_regression: str | float | None = None,
    max_busbw_drop: str | float | None = None,
    fail_on_new: Severity | str | None = None,
    jobs: int | None = None,
    analysis: Mapping[str, Any] | None = None,
) -> DiffResult:
    """Compare `new` against `baseline` and apply the gates (see the module docstring:
    thresholds are percentages). `analysis`: keyword arguments of `analyze()` for a side
    given as traces (the rule selection, config and options; the rules run by default)."""
    from kineto_comm.render.formats import parse_fail_on

    step_gate = parse_percent(max_regression, "max_regression")
    exposed_gate = parse_percent(max_exposed_regression, "max_exposed_regression")
    bw_gate = parse_percent(max_busbw_drop, "max_busbw_drop")
    new_gate = parse_fail_on(fail_on_new, "fail_on_new")
    base_doc, base_label = load_side(baseline, jobs=jobs, analysis=analysis)
    new_doc, new_label = load_side(new, jobs=jobs, analysis=analysis)
    b, n = step_means(base_doc), step_means(new_doc)
    # The one step time where both sides have it; a document saved before it, the mean.
    step_key = "step_ns" if b["step_ns"] and n["step_ns"] else "wall_ns"
    failures: list[str] = []
    notes: list[str] = []
    checks: list[Gate] = []
    bw_ranks = [len(d.get("ranks", [])) for d in (base_doc, new_doc)]
    if bw_ranks[0] != bw_ranks[1]:
        notes.append(f"rank counts differ: {bw_ranks[0]} (baseline) vs {bw_ranks[1]} (new)")

    def change(name: str, key: str, gate: float | None, basis: str = "relative") -> Change:
        c = Change(name, "ns", b[key], n[key], gate=gate, gate_basis=basis)
        if gate is None:
            return c
        # The measured value the gate reads: growth over the baseline (relative), or over
        # the baseline's step time (share_of_step).
        measured = (
            c.relative
            if basis == "relative"
            else c.delta / b[step_key]  # type: ignore[operator]
            if c.delta is not None and b[step_key]
            else None
        )
        regressed = measured is not None and measured > gate
        checks.append(Gate(gate_of[basis], name, gate, measured, regressed))
        if regressed:
            what = f"{100 * measured:+.1f}%" + (
                "" if basis == "relative" else " of the baseline step"
            )
            failures.append(f"{name} {fmt_ns(c.delta)} ({what}) exceeds {pct(gate)}")
        return dataclasses.replace(c, regressed=regressed)

    step_name = "step time" if step_key == "step_ns" else "mean step time"
    gate_of = {"relative": "max_regression", "share_of_step": "max_exposed_regression"}
    changes = (
        change(step_name, step_key, step_gate),
        change("exposed communication per step", "exposed_comm_ns", exposed_gate, "share_of_step"),
        change("communication per step", "comm_ns", None),
        change("idle per step", "idle_ns", None),
    )
    if b[step_key] is None or n[step_key] is None:
        notes.append("step times are missing on one side: no step-time comparison")

    bb, nb = busbw_by_group(base_doc), busbw_by_group(new_doc)
    bandwidth = []
    for key in sorted(set(bb) | set(nb), key=lambda k: (k[0], str(k[1]))):
        coll, group = key
        c = Change(
            f"busbw {coll} group {group_name(group)}",
            "GB/s",
            bb.get(key),
            nb.get(key),
            higher_is_worse=False,
            gate=bw_gate,
        )
        regressed = bw_gate is not None and c.relative is not None and -c.relative > bw_gate
        if regressed:
            failures.append(
                f"{c.name} fell {100 * -(c.relative or 0):.1f}% "
                f"({fmt_bw(c.baseline)} -> {fmt_bw(c.new)}), more than {pct(bw_gate)}"  # type: ignore[arg-type]
            )
        bandwidth.append(dataclasses.replace(c, regressed=regressed))
    if bw_gate is not None:
        # The gate reads the largest drop over every (collective, group) both sides have.
        compared = [c for c in bandwidth if c.relative is not None]
        worst = min(compared, key=lambda c: c.relative or 0.0) if compared else None
        checks.append(
            Gate(
                "max_busbw_drop",
                worst.name if worst else "busbw",
                bw_gate,
                -worst.relative if worst and worst.relative is not None else None,
                any(c.regressed for c in bandwidth),
            )
        )

    base_f = {finding_key(f): f for f in map(as_finding, base_doc.get("findings") or [])}
    new_f = {finding_key(f): f for f in map(as_finding, new_doc.get("findings") or [])}
    added = tuple(f for k, f in new_f.items() if k not in base_f)
    resolved = tuple(f for k, f in base_f.items() if k not in new_f)
    if new_gate is not None:
        bad = [f for f in added if f.severity.level >= new_gate.level]
        checks.append(
            Gate(
                "fail_on_new",
                f"new findings at or above {new_gate.value}",
                new_gate.value,
                len(bad),
                bool(bad),
            )
        )
        if bad:
            codes = ", ".join(sorted({f.code for f in bad}))
            failures.append(f"{len(bad)} new finding(s) at or above {new_gate.value}: {codes}")
    gates = {
        "max_regression": step_gate,
        "max_exposed_regression": exposed_gate,
        "max_busbw_drop": bw_gate,
        "fail_on_new": new_gate.value if new_gate else None,
    }
    return DiffResult(
        base_label,
        new_label,
        changes,
        tuple(bandwidth),
        added,
        resolved,
        tuple(failures),
        tuple(notes),
        gates,
        tuple(checks),
    )


def pct(fraction: float) -> str:
    """A threshold as the percentage it was given as: 0.02 -> '2%', 0.005 -> '0.5%'."""
    return f"{100 * fraction:g}%"


def gate_text(gate: Gate) -> str:
    """A gate's measured value beside its threshold, for the PASSED/FAILED line:
    'step time +14.4%, exceeds max 2%'; 'busbw all_reduce group 0 -79.7%, within max drop
    90%'; 'new findings at or above error: 1, exceeds max 0'."""
    verdict = "exceeds" if gate.failed else "within"
    m = gate.measured
    if gate.name == "fail_on_new":
        value, limit = f"{gate.subject}: {m}", "0"
    else:
        limit = pct(gate.threshold)  # type: ignore[arg-type]
        if m is None:
            return f"{gate.subject} not measured (max {limit})"
        if gate.name == "max_busbw_drop":
            value, limit = f"{gate.subject} {-100 * m:+.1f}%", f"drop {limit}"
        elif gate.name == "max_exposed_regression":
            value = f"{gate.subject} {100 * m:+.1f}% of the baseline step"
        else:
            value = f"{gate.subject} {100 * m:+.1f}%"
    return f"{value}, {verdict} max {limit}"


def _fmt(value: float | None, unit: str) -> str:
    """A value in its unit for the text table."""
    if value is None:
        return "-"
    return fmt_ns(value) if unit == "ns" else fmt_bw(value)


def _fmt_delta(c: Change) -> str:
    """Signed change with its relative size."""
    if c.delta is None:
        return "-"
    sign = "+" if c.delta >= 0 else "-"
    size = fmt_ns(abs(c.delta)) if c.unit == "ns" else fmt_bw(abs(c.delta))
    rel = f" ({100 * c.relative:+.1f}%)" if c.relative is not None else ""
    return f"{sign}{size}{rel}"


def render_diff_text(result: DiffResult) -> str:
    """A plain-text summary: the changes, bandwidth, findings, then PASSED or FAILED."""
    lines = [f"kineto-comm diff: {result.baseline_label} -> {result.new_label}", ""]
    rows = [("metric", "baseline", "new", "change", "")]
    for c in (*result.changes, *result.bandwidth):
        flag = "REGRESSED" if c.regressed else ""
        rows.append((c.name, _fmt(c.baseline, c.unit), _fmt(c.new, c.unit), _fmt_delta(c), flag))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        lines.append(
            "  ".join(
                cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
                for i, cell in enumerate(r)
            ).rstrip()
        )
    lines.append("")
    for title, items in (("new", result.new_findings), ("resolved", result.resolved_findings)):
        lines.append(f"{len(items)} {title} finding(s)")
        for f in items:
            where = f" ranks {','.join(map(str, f.ranks))}" if f.ranks else ""
            group = f" group {f.process_group}" if f.process_group is not None else ""
            lines.append(f"  {f.severity.value:7} {f.code} {f.title}{group}{where}")
    for note in result.notes:
        lines.append(f"note: {note}")
    lines.append("")
    verdict = "FAILED" if result.failed else "PASSED"
    checked = "; ".join(map(gate_text, result.checks)) or "no gates"
    lines.append(f"{verdict}: {checked}")
    return "\n".join(lines) + "\n"


def render_diff_json(result: DiffResult) -> str:
    """`result.to_dict()` as strict JSON text."""
    return json.dumps(result.to_dict(), indent=2, default=str, allow_nan=False) + "\n"
