"""The JSON report document and the facts every machine-readable format shares.

`document(report, fail_on)` (= `Report.to_dict()`) is the report's tables plus a `summary`
(mean step time, exposed communication, finding counts, the fail verdict),
`collective_totals` (collectives over all ranks with bus bandwidth), and the optional
cross-rank tables. It is the one source of numbers
for the Markdown, SARIF, JUnit and GitHub renderers and for `kineto_comm.diff`, so a saved
`--format json` file can be compared later without the traces. The schema is versioned and
documented field by field in docs/json.md (JSON Schema: docs/json-schema.json).

Also here: findings as `Finding` objects whatever form they arrived in, severity
comparisons, and the rule catalogue (the rules engine's registry when it is installed, else
what the findings themselves say), used by SARIF and JUnit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import polars as pl

from kineto_comm.analysis import steptime
from kineto_comm.findings import Finding, Severity, rank_findings
from kineto_comm.lazy import collect
from kineto_comm.rank_store import RankStore
from kineto_comm.report import SCHEMA_VERSION, Report
from kineto_comm.version import __version__

JSON_SCHEMA_URI = "https://kineto-comm.invalid/schemas/report-v1.json"
# The step metrics averaged per step (summary) and per rank (rank_means).
MEANS = ("wall_ns", "compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns", "idle_ns")
OPTIONAL_TABLES = (
    "message_sizes",
    "message_size_summary",
    "process_groups",
    "pipeline",
    "storms",
    "all_to_all_pairs",
    "all_to_all_loads",
    "framework",
    "hardware",
    "expected_busbw",
)


def as_finding(item: Finding | dict[str, Any]) -> Finding:
    """A Finding from a Finding or its `to_dict()` form (saved JSON reports hold dicts)."""
    if isinstance(item, Finding):
        return item
    if not isinstance(item, dict):
        raise TypeError(f"not a finding: {item!r}")
    window = item.get("window_ns")
    return Finding(
        code=str(item.get("code", "")),
        severity=Severity(item.get("severity", "warning")),
        title=str(item.get("title", "")),
        message=str(item.get("message", "")),
        impact_ns_per_step=int(item.get("impact_ns_per_step") or 0),
        step_share=item.get("step_share"),
        ranks=tuple(int(r) for r in item.get("ranks") or ()),
        steps=tuple(int(s) for s in item.get("steps") or ()),
        process_group=item.get("process_group"),
        window_ns=(int(window[0]), int(window[1])) if window else None,
        evidence=dict(item.get("evidence") or {}),
        advice=tuple(str(a) for a in item.get("advice") or ()),
        rule=str(item.get("rule") or ""),
    )


def findings_of(report: Report) -> list[Finding]:
    """The report's findings in the one order every format lists them (`rank_findings`)."""
    return list(rank_findings(as_finding(f) for f in report.findings))


def at_or_above(findings: list[Finding], fail_on: Severity) -> list[Finding]:
    """The findings whose severity is at least `fail_on`."""
    return [f for f in findings if f.severity.level >= fail_on.level]


def finding_key(f: Finding) -> tuple[str, str | None, tuple[int, ...]]:
    """Identity of a finding across runs: code, process group and ranks."""
    return (f.code, f.process_group, tuple(sorted(f.ranks)))


@dataclass(frozen=True)
class RuleInfo:
    """What SARIF and JUnit say about a rule: code, kebab name, one-line summary, help text."""

    code: str
    name: str
    summary: str
    help: str
    from_registry: bool = False


def registry_rules() -> list[RuleInfo] | None:
    """Rules known to the rules engine, or None when it is not installed or fails to load.

    Imported lazily: the engine is optional for rendering, and a broken plugin must not
    stop a report from being written.
    """
    try:
        from kineto_comm.rules_engine import registry
    except ImportError:
        return None
    try:
        reg = registry()
        rules = list(reg.rules.values())
    except Exception:  # a bad plugin or config must never break rendering
        return None
    return [
        RuleInfo(
            code=r.code,
            name=r.name,
            summary=r.summary.strip(),
            help=(r.doc or r.summary).strip(),
            from_registry=True,
        )
        for r in rules
    ]


def rule_catalog(report: Report, findings: list[Finding] | None = None) -> list[RuleInfo]:
    """Every rule to describe: the rules that ran (when known), then codes only findings name.

    `report.options["rules_run"]` (a list of codes), when the analysis recorded it, limits
    the registry's rules to those that actually ran; otherwise the whole registry is used.
    """
    found = findings_of(report) if findings is None else findings
    known = registry_rules() or []
    ran = report.options.get("rules_run") if isinstance(report.options, dict) else None
    if ran is not None:
        wanted = {str(c) for c in ran}
        known = [r for r in known if r.code in wanted]
    out = {r.code: r for r in known}
    for f in found:
        if f.code in out:
            continue
        advice = "\n".join(f"- {a}" for a in f.advice)
        out[f.code] = RuleInfo(
            code=f.code,
            name=f.rule or f.code.lower(),
            summary=f.title or f.code,
            help=f"{f.title}\n\nHow to fix:\n{advice}" if advice else (f.title or f.code),
        )
    return sorted(out.values(), key=lambda r: r.code)


def clean(value: Any) -> Any:
    """`value` with NaN/inf replaced by None and tuples as lists, so it is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, Severity):
        return value.value
    return value


def counted(report: Report) -> pl.Expr:
    """The step windows per-step means are over: every rank's windows of the job's complete
    steps (`step_times.complete`: numbered, and not the last of several, whose window is cut
    at its last kernel), the steps the job's step time is the mean of; without the model's
    step times, the numbered windows, or all windows when no step is numbered."""
    times = report.step_times
    if times.height and {"step", "complete"} <= set(times.columns):
        steps = times.filter(pl.col("complete"))["step"]
        if steps.len():
            return pl.col("step").is_in(steps.implode())
    store = report.rank_steps
    if store.height and "step" in store.columns:
        query = store.lazy(["step"]).select((pl.col("step") >= 0).any())
        if collect(query, store.height).item():
            return pl.col("step") >= 0
    return pl.lit(True)


def _distinct_steps(store: RankStore, kept: pl.Expr) -> int:
    """How many distinct (rank, step) pairs the rows `kept` selects hold, counted a window
    of ranks at a time: over every rank at once the count holds every pair."""
    if store.height == 0 or not {"rank", "step"} <= set(store.columns):
        return 0
    per = store.per_window(
        lambda view: (
            view.lazy(["rank", "step"])
            .filter(kept)
            .group_by("rank")
            .agg(n=pl.col("step").n_unique())
        )
    )
    return int(per["n"].sum())


def summary(report: Report, findings: list[Finding], fail_on: Severity) -> dict[str, Any]:
    """The headline numbers: per-step means over every rank's windows of the complete steps
    (`counted`), the job's step time and savings, and the verdict."""
    store = report.rank_steps
    names = store.columns
    kept = counted(report)
    stats = collect(
        store.lazy()
        .filter(kept)
        .select(*[pl.col(c).mean() for c in MEANS if c in names], _n=pl.len()),
        store.height,
    ).row(0, named=True)
    n = stats["_n"]
    mean: dict[str, float | None] = {
        col: float(stats[col]) if n and stats.get(col) is not None else None for col in MEANS
    }
    wall = mean["wall_ns"]
    by_sev = {s.value: sum(1 for f in findings if f.severity is s) for s in Severity}
    failing = at_or_above(findings, fail_on)

    def share(col: str) -> float | None:
        v = mean[col]
        return None if v is None or not wall else v / wall

    def as_int(v: float | None) -> int | None:
        return None if v is None or not math.isfinite(v) else int(round(v))

    return {
        "ranks": report.ranks.height,
        "world_size": int(report.ranks["world_size"].max())  # type: ignore[arg-type]
        if report.ranks.height and report.ranks["world_size"].null_count() < report.ranks.height
        else None,
        "steps": _distinct_steps(store, kept) if n else 0,
        "step_windows": n,
        "mean_step_ns": as_int(wall),
        "mean_compute_ns": as_int(mean["compute_ns"]),
        "mean_comm_ns": as_int(mean["comm_ns"]),
        "mean_overlap_ns": as_int(mean["overlap_ns"]),
        "mean_exposed_comm_ns": as_int(mean["exposed_comm_ns"]),
        "mean_idle_ns": as_int(mean["idle_ns"]),
        "exposed_comm_share": share("exposed_comm_ns"),
        "idle_share": share("idle_ns"),
        "overlap_share": None
        if not mean["comm_ns"] or mean["overlap_ns"] is None
        else mean["overlap_ns"] / mean["comm_ns"],
        "findings": {**by_sev, "total": len(findings)},
        "fail_on": fail_on.value,
        "failed": bool(failing),
        "failing_findings": len(failing),
        **_savings(report, findings),
        "configuration": _configuration(report),
    }


def _configuration(report: Report) -> dict[str, Any] | None:
    """The inferred configuration's values (its evidence is in the `inferred_config` table)
    and where the analytical model's configuration came from: `model_source` "file"
    (--model), "inferred", or null with `model_note` saying why the model did not run."""
    table = getattr(report, "inferred_config", None)
    if not isinstance(table, pl.DataFrame) or table.height == 0:
        return None
    values = {k: v for k, v in table.row(0, named=True).items() if k != "evidence"}
    return {
        **values,
        "model_source": report.options.get("model_source"),
        "model_note": report.options.get("model_note"),
    }


def _savings(report: Report, findings: list[Finding]) -> dict[str, Any]:
    """The step time (the model of time's: per step the longest rank's window, mean over
    the complete steps) and what the findings' fixes save together (their edits replayed
    at once: never more than the step; the sum is of the replayed findings' savings, the
    rules' own claims left out). A report without the model (built by hand) falls back on
    the three largest savings, capped at the step."""
    saved = report.savings or {}
    total = sum(int(f.impact_ns_per_step) for f in findings)
    if "joint_saving_ns" in saved:
        joint = int(saved["joint_saving_ns"])
        step = saved.get("step_ns")
        total = int(saved.get("sum_of_savings_ns", total))
    else:
        step = None
        joint = sum(sorted((int(f.impact_ns_per_step) for f in findings), reverse=True)[:3])
    return {
        "step_ns": step,
        "estimated_savings_ns_per_step": joint,
        "sum_of_savings_ns": total,
        "savings_overlap": total > joint,
    }


def collective_totals(report: Report) -> list[dict[str, Any]]:
    """Collectives over all ranks per (collective, process_group, dtype), with bandwidths
    (Report.collective_totals)."""
    return report.collective_totals().to_dicts()


def document(report: Report, fail_on: Severity = Severity.error) -> dict[str, Any]:
    """The full JSON document: the report's tables plus summary, collective totals and the
    optional tables, each rank's step rows as dicts."""
    base = report._to_dict(lambda rank, rows: [] if rows is None else rows().to_dicts())
    return _document(report, fail_on, base)


def _document(report: Report, fail_on: Severity, doc: dict[str, Any]) -> dict[str, Any]:
    findings = findings_of(report)
    doc["$schema"] = JSON_SCHEMA_URI
    doc["findings"] = [f.to_dict() for f in findings]
    doc["summary"] = summary(report, findings, fail_on)
    doc["collective_totals"] = collective_totals(report)
    for name in ("step_times", "critical_path", "critical_path_kernels", "step_blame"):
        table = getattr(report, name, None)
        doc[name] = table.to_dicts() if isinstance(table, pl.DataFrame) else []
    # The kernel-level path of the median and the worst step only (the steps the reports
    # show; every step's is on the Report): a row per kernel on the path of every step was
    # most of the document on a big job (2.9 of 3.7 MB at 64 ranks x 10 MB).
    kernels = getattr(report, "critical_path_kernels", None)
    if isinstance(kernels, pl.DataFrame) and kernels.height:
        shown = [int(s["step"]) for s in steptime.median_and_worst(report.step_times)]
        doc["critical_path_kernels"] = kernels.filter(pl.col("step").is_in(shown)).to_dicts()
    for name in OPTIONAL_TABLES:
        table = getattr(report, name, None)
        doc[name] = table.to_dicts() if isinstance(table, pl.DataFrame) else []
    return clean(doc)


def rank_means(report: Report) -> list[dict[str, Any]]:
    """Per rank (in rank order): rank, device, timeline, `steps` (how many of the job's
    complete steps it has a window in, `counted`; all its windows when it has none of them)
    and the mean per step of MEANS (None without values).

    What the Markdown and HTML pages show per rank, from the steps table in one
    aggregation: the JSON document's per-step rows of every rank are not built for them."""
    ranks = report.ranks.sort("rank")
    info = [c for c in ("rank", "device", "timeline") if c in ranks.columns]
    store = report.rank_steps
    cols = [c for c in MEANS if c in store.columns]
    if store.height and {"rank", "step"} <= set(store.columns):
        # Per rank the means over its windows of the counted steps, or over all of its
        # windows when it has none: one aggregation over every rank's steps, a state per rank.
        numbered = counted(report)
        per = collect(
            store.lazy(["rank", "step", *cols])
            .group_by("rank")
            .agg(
                numbered.sum().alias("_numbered"),
                pl.len().alias("_all"),
                *[pl.col(c).filter(numbered).mean().alias(f"_n_{c}") for c in cols],
                *[pl.col(c).mean().alias(f"_a_{c}") for c in cols],
            ),
            store.height,
        )
        some = pl.col("_numbered") > 0
        per = per.select(
            "rank",
            pl.when(some).then("_numbered").otherwise("_all").cast(pl.UInt32).alias("steps"),
            *[pl.when(some).then(f"_n_{c}").otherwise(f"_a_{c}").alias(c) for c in cols],
        )
        ranks = ranks.select(info).join(per, on="rank", how="left")
    else:
        ranks = ranks.select(info)
    count = pl.col("steps").fill_null(0) if "steps" in ranks.columns else pl.lit(0)
    ranks = ranks.with_columns(
        count.alias("steps"),
        *[pl.lit(None, pl.Float64).alias(c) for c in MEANS if c not in ranks.columns],
    )
    return clean(ranks.to_dicts())


def overview(report: Report, fail_on: Severity = Severity.error) -> dict[str, Any]:
    """What the Markdown and HTML pages show: the JSON document's summary, collective totals,
    errors, warnings and versions, with `ranks` from rank_means (no per-step rows)."""
    findings = findings_of(report)
    return clean(
        {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "kineto-comm", "version": __version__},
            "summary": summary(report, findings, fail_on),
            "ranks": rank_means(report),
            "collective_totals": collective_totals(report),
            "errors": [{"file": f, "message": m} for f, m in report.errors],
            "warnings": list(report.warnings),
        }
    )


def render_json(report: Report, fail_on: Severity = Severity.error) -> str:
    """The document as strict JSON text (no NaN), indented, with a trailing newline: what
    `json.dumps(document(report), indent=2)` gives, joined from `json_pieces`."""
    return "".join(json_pieces(report, fail_on))


def json_pieces(report: Report, fail_on: Severity = Severity.error) -> Iterator[str]:
    """`render_json`'s text in pieces, to be written one after the other.

    Each rank's step rows are turned into text one rank at a time and put in place of a
    placeholder: a job of two thousand ranks and a thousand steps has two million step
    rows, about a GB of text, several times that as Python objects. Written piece by piece
    (kineto_comm.render.formats.write), only one rank's rows are held at once."""
    tokens: dict[str, Callable[[], pl.DataFrame] | None] = {}

    def placeholder(rank: int, rows: Callable[[], pl.DataFrame] | None) -> str:
        token = f"@kineto-comm-steps-{len(tokens)}@"
        tokens[token] = rows
        return token

    doc = _document(report, fail_on, report._to_dict(placeholder))
    text = json.dumps(doc, indent=2, default=str, allow_nan=False) + "\n"
    del doc
    at = 0
    for token in list(tokens):
        rows = tokens.pop(token)  # each rank's rows are let go once written
        # The key is part of the match: a file name equal to a token stays a quoted text.
        key = f'"steps": "{token}"'
        found = text.index(key, at)
        indent = found - text.rindex("\n", 0, found) - 1
        yield text[at:found] + '"steps": '
        yield _rows_json(pl.DataFrame() if rows is None else rows(), " " * indent)
        at = found + len(key)
    yield text[at:]


def _rows_json(rows: pl.DataFrame, pad: str) -> str:
    """`json.dumps(rows.to_dicts(), indent=2)` with `pad` after each newline, built by one
    query where every column is an integer (a rank's step rows): turning each row into a
    dict and then into text took 3 minutes for the 3.9 million step rows of 4096 ranks
    (bench/README.md, twenty-fifth session). Other columns go the way of json.dumps."""
    if rows.height == 0:
        return "[]"
    if not all(dtype.is_integer() for dtype in rows.dtypes):
        text = json.dumps(clean(rows.to_dicts()), indent=2, default=str, allow_nan=False)
        return text.replace("\n", "\n" + pad)
    parts: list[pl.Expr] = []
    for i, name in enumerate(rows.columns):
        head = ("{" if i == 0 else ",") + f"\n{pad}    {json.dumps(name)}: "
        parts += [pl.lit(head), pl.col(name).cast(pl.String).fill_null("null")]
    parts.append(pl.lit(f"\n{pad}  }}"))
    objects = pl.concat_str(parts).str.join(f",\n{pad}  ")
    return f"[\n{pad}  " + rows.select(objects).item() + f"\n{pad}]"
