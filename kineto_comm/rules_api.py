"""The public rule API: what a rule is, the tables it reads, and helpers it may use.

A rule is a pure function from the analysis tables (docs/tables.md) to findings, plus the
metadata users see in `kineto-comm rules` / `kineto-comm explain CODE`:

    @rule(code="XMPL101", name="too-many-all-reduces", summary="...",
          tables=("collectives", "steps"), options=(Option("limit", 100, "..."),))
    def too_many_all_reduces(tables: Tables, options: dict) -> list[Finding]:
        '''What it does: ...  Why is this bad? ...  How to fix: ...'''

Everything here is stable: built-in rules (top-level `rules/`) use nothing else from
kineto_comm. This module computes no quantity: the derived tables (step times, blame, waits,
exposure, roles, the cost fit, ...) live in analysis/ and are read by name (`tables[name]`,
kineto_comm.analysis.derived) or through the readers below. Times are integer ns.
In full: docs/rules.md, "Writing a rule".
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from kineto_comm.analysis import derived, model_of_time
from kineto_comm.analysis.bandwidth import busbw_factor, group_size
from kineto_comm.analysis.costfit import job_merge_removal as merge_removal
from kineto_comm.analysis.exposure import collective_exposure, collective_exposure_lazy
from kineto_comm.analysis.impact import impact_per_step
from kineto_comm.analysis.model_of_time import launch_floor, n_steps, rank_lateness, step_time_ns
from kineto_comm.analysis.platform import Platform, hosts_of, job_platform
from kineto_comm.analysis.roles import call_roles
from kineto_comm.analysis.sizes import median_of_counts
from kineto_comm.analysis.steptime import LAUNCH_LATENCY_NS, Edit
from kineto_comm.analysis.waits import collective_waits
from kineto_comm.findings import Finding, Severity
from kineto_comm.lazy import in_rank_order
from kineto_comm.model.collectives import parse_ranks
from kineto_comm.tables import Tables

__all__ = [
    "LAUNCH_LATENCY_NS",
    "Edit",
    "Finding",
    "Option",
    "Platform",
    "Rule",
    "RuleFunction",
    "Severity",
    "Tables",
    "all_to_all_volume",
    "attribution",
    "busbw_factor",
    "collective_exposure",
    "collective_exposure_lazy",
    "collective_waits",
    "collective_waits_lazy",
    "cost_fit",
    "group_roles",
    "call_roles",
    "group_size",
    "hosts_of",
    "impact_per_step",
    "in_rank_order",
    "job_platform",
    "launch_floor",
    "make_finding",
    "mean_step_ns",
    "median_of_counts",
    "merge_removal",
    "n_steps",
    "parse_ranks",
    "queue_shift",
    "rank_lateness",
    "replay_saving",
    "replay_timeline",
    "rule",
    "saving_severity",
    "severity_for",
    "step_blame",
    "step_time_ns",
    "step_times",
]

CODE_RE = re.compile(r"^[A-Z]+[0-9]+$")
NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
DOC_SECTIONS = ("What it does", "Why is this bad?", "How to fix")
SOURCES = ("built-in", "plugin", "file")


@dataclass(frozen=True)
class Option:
    """One rule option: its name, default value (which fixes its type) and what it means."""

    name: str
    default: Any
    description: str

    def coerce(self, value: Any) -> Any:
        """`value` converted to the default's type; ValueError when it cannot be."""
        kind = type(self.default)
        if self.default is None or isinstance(value, kind):
            return value
        if kind is bool:
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
                return value.lower() in ("true", "1")
            raise ValueError(f"expected true or false, got {value!r}")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if kind in (int, float) and isinstance(value, str):
            return kind(value)
        if kind in (list, tuple) and isinstance(value, (list, tuple)):
            return kind(value)
        raise ValueError(f"expected {kind.__name__}, got {value!r}")


RuleFunction = Callable[["Tables", dict[str, Any]], "list[Finding]"]


@dataclass(frozen=True)
class Rule:
    """A rule: metadata plus `check(tables, options) -> list[Finding]`.

    code: letters then digits (`COMM101`); the letters are the family.
    name: kebab-case (`exposed-communication`), also accepted by --select/--ignore.
    doc: the documentation with the sections What it does / Why is this bad? / How to fix.
    tables: the report tables the rule reads (names from docs/tables.md).
    source: built-in, plugin or file; origin: where it was loaded from.
    """

    code: str
    name: str
    summary: str
    doc: str
    check: RuleFunction
    options: tuple[Option, ...] = ()
    tables: tuple[str, ...] = ()
    source: str = "built-in"
    origin: str = ""

    def __post_init__(self) -> None:
        if not CODE_RE.match(self.code):
            raise ValueError(f"rule code {self.code!r} must be capital letters then digits")
        if not NAME_RE.match(self.name):
            raise ValueError(f"rule name {self.name!r} must be kebab-case")
        if not self.summary.strip() or "\n" in self.summary.strip():
            raise ValueError(f"rule {self.code}: summary must be one non-empty line")
        missing = [s for s in DOC_SECTIONS if s not in self.doc]
        if missing:
            raise ValueError(f"rule {self.code}: docstring lacks section(s) {', '.join(missing)}")
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            raise ValueError(f"rule {self.code}: duplicate option names")

    @property
    def family(self) -> str:
        """The code's letters: COMM101 -> COMM."""
        return re.match(r"^[A-Z]+", self.code).group(0)  # type: ignore[union-attr]

    def defaults(self) -> dict[str, Any]:
        """Option name -> default value."""
        return {o.name: o.default for o in self.options}

    def __call__(self, tables: Tables, options: dict[str, Any] | None = None) -> list[Finding]:
        """Run the check with defaults overridden by `options`."""
        return self.check(tables, {**self.defaults(), **(options or {})})


def rule(
    *,
    code: str,
    name: str,
    summary: str,
    tables: Sequence[str] = (),
    options: Sequence[Option] = (),
    doc: str | None = None,
) -> Callable[[RuleFunction], Rule]:
    """Decorator turning `check(tables, options) -> list[Finding]` into a Rule.

    The documentation is `doc` or the function's docstring.
    """

    def wrap(fn: RuleFunction) -> Rule:
        return Rule(
            code=code,
            name=name,
            summary=summary,
            doc=inspect.cleandoc(doc if doc is not None else (fn.__doc__ or "")),
            check=fn,
            options=tuple(options),
            tables=tuple(tables),
        )

    return wrap


def severity_for(share: float, warn: float, error: float) -> Severity | None:
    """error at >= `error`, warning at >= `warn`, None below (no finding)."""
    if share >= error:
        return Severity.error
    if share >= warn:
        return Severity.warning
    return None


# A finding's default floor: below this share of the step its fix buys too little to be
# more than info (a rule's own `info_share` option wins).
INFO_SHARE = 0.01


def saving_severity(share: float, options: Mapping[str, Any]) -> Severity | None:
    """The severity a fix that saves `share` of the step earns on a rule's ladder: error from
    its `error_share`, warning from its `warn_share`, info from its `info_share` (default
    INFO_SHARE), None below. The engine caps the severity of every finding of a rule with
    such options at this (rules_engine.settle_severity): a finding is as bad as what fixing
    it buys, whatever share of the step its cause shows."""
    floor = float(options.get("info_share", INFO_SHARE))
    warn, error = options.get("warn_share"), options.get("error_share")
    sev = None
    if warn is not None and error is not None:
        sev = severity_for(share, float(warn), float(error))
    if sev is None and share >= floor:
        sev = Severity.info
    return sev


def mean_step_ns(tables: Tables) -> int:
    """The job's step time (kineto_comm.analysis.steptime, docs/tables.md `step_times`): per
    step the longest rank's device window, averaged over the complete steps (step >= 0, not
    the last one when there are several, whose window is cut at its last kernel); without
    step markers the whole trace is one step. The same number as `step_time_ns`."""
    return step_time_ns(tables)


# Readers of the derived tables (kineto_comm.analysis.derived; docs/tables.md, "Derived
# tables"): each built once per Tables by its home in analysis/.


def step_times(tables: Tables) -> pl.DataFrame:
    """Per step: step, step_ns (the longest rank's window), critical_rank (that rank),
    ranks, complete (counts toward the job's step time): derived table `step_times`."""
    return derived.read(tables, "step_times")


def step_blame(tables: Tables) -> pl.LazyFrame:
    """Every rank's step windows split into blame categories (rank, step, category,
    collective, process_group, role, late_rank, last_call, calls, ns; per (rank, step) the
    ns sum to the window), as a lazy query: derived table `rank_blame`."""
    return derived.read(tables, "rank_blame")


def replay_timeline(tables: Tables) -> pl.LazyFrame:
    """What the replay re-times (windows, events, tail chains), as a lazy query: derived
    table `replay_timeline`."""
    return derived.read(tables, "replay_timeline")


def collective_waits_lazy(tables: Tables) -> pl.LazyFrame:
    """collective_waits() as a lazy query (see Tables.lazy): derived table `call_waits`."""
    return derived.read(tables, "call_waits")


def group_roles(tables: Tables) -> pl.DataFrame:
    """process_group -> role, size, ranks (list[int]): derived table `group_roles`."""
    return derived.read(tables, "group_roles")


def cost_fit(tables: Tables) -> pl.DataFrame:
    """Per (process_group, collective): its calls' cost as latency + bytes / bandwidth
    (calls, sizes, median_bytes, median_ns, latency_ns, busbw_gbps, latency_share, method):
    derived table `cost_fit`."""
    return derived.read(tables, "cost_fit")


def attribution(tables: Tables) -> pl.DataFrame:
    """Per phase x module x role x collective: exposed, wait and bubble ns per step, over
    the ranks and on the critical rank (docs/tables.md): derived table `attribution`."""
    return derived.read(tables, "attribution")


def all_to_all_volume(tables: Tables) -> pl.DataFrame:
    """Per process group and rank: its all-to-all calls, sent_bytes, received_bytes,
    received_vs_mean, call_imbalance: derived table `all_to_all_volume`."""
    return derived.read(tables, "all_to_all_volume")


def queue_shift(tables: Tables) -> pl.DataFrame:
    """rank, step, removed_ns, allowed_ns, share: per window holding queued time, what
    moving the device's other work off the rank takes out: derived table `queue_shift`."""
    return derived.read(tables, "queue_shift")


def replay_saving(tables: Tables, *edits: Edit) -> int:
    """The step time (ns per step) the edits save, replayed together on the model of time
    (kineto_comm.analysis.steptime): each rank's windows lose what the edits remove, each
    step lasts as long as its longest rank's new window, and the saving is the job's step
    time less the new one. Never more than the step; several edits never save more than
    the largest share each row loses to one of them (overlaps are not added up)."""
    return model_of_time.replay_saving(tables, *edits)


def make_finding(
    rule_: Rule | str,
    severity: Severity,
    title: str,
    message: str,
    *,
    impact_ns_per_step: float,
    step_ns: int,
    ranks: Sequence[int] = (),
    steps: Sequence[int] = (),
    process_group: str | None = None,
    window_ns: tuple[int, int] | None = None,
    evidence: dict[str, Any] | None = None,
    advice: Sequence[str] = (),
    edit: Edit | None = None,
) -> Finding:
    """A Finding with `step_share = impact / step_ns` (unrounded: each format rounds it once,
    so a message and its annotation give one number) and JSON-safe ints, sorted ranks.

    `edit`: the change that fixes the cause, as the model of time replays it (its saving
    is what `replay_saving(tables, edit)` gives); the report replays every finding's edit
    together for the saving of all fixes at once."""
    code = rule_.code if isinstance(rule_, Rule) else rule_
    impact = max(0, int(round(impact_ns_per_step or 0)))
    return Finding(
        code=code,
        severity=severity,
        title=title,
        message=message,
        impact_ns_per_step=impact,
        step_share=impact / step_ns if step_ns > 0 else None,
        ranks=tuple(sorted({int(r) for r in ranks})),
        steps=tuple(sorted({int(s) for s in steps})),
        process_group=process_group,
        window_ns=(int(window_ns[0]), int(window_ns[1])) if window_ns else None,
        evidence=dict(evidence or {}),
        advice=tuple(advice),
        rule=rule_.name if isinstance(rule_, Rule) else "",
        edit=edit,
    )
