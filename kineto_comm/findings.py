"""What a rule reports: one finding per cause, with its cost in step time and what to change."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

# `evidence.saving_method` of a finding whose saving is its rule's own number, with no edit
# for the model of time to replay: capped at the step, said so wherever it is shown.
CLAIMED = "claimed by the rule"


class Severity(str, Enum):  # noqa: UP042 (StrEnum would change str() of a member)
    """How bad a finding is; ordered info < warning < error."""

    info = "info"
    warning = "warning"
    error = "error"

    @property
    def level(self) -> int:
        return {"info": 0, "warning": 1, "error": 2}[self.value]


def parse_severity(value: str | Severity) -> Severity:
    """A Severity from its name (case-insensitive); ValueError naming the choices."""
    if isinstance(value, Severity):
        return value
    try:
        return Severity(value.strip().lower())
    except ValueError:
        choices = ", ".join(s.value for s in Severity)
        raise ValueError(f"unknown severity {value!r}; choose one of {choices}") from None


@dataclass(frozen=True)
class Finding:
    """One problem found in the traces.

    impact_ns_per_step is the step time that fixing the cause could recover (the ranking key);
    step_share is that impact over the mean step time. evidence holds the numbers behind the
    finding (JSON-serialisable), advice the concrete changes to try, most specific first.
    """

    code: str
    severity: Severity
    title: str
    message: str
    impact_ns_per_step: int = 0
    step_share: float | None = None
    ranks: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()
    process_group: str | None = None
    window_ns: tuple[int, int] | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    advice: tuple[str, ...] = ()
    rule: str = ""
    # The fix as the model of time replays it (kineto_comm.analysis.steptime.Edit), or None
    # where no edit models it; not part of the JSON form nor of equality.
    edit: Any = field(default=None, compare=False, repr=False)

    @property
    def claimed(self) -> bool:
        """The saving is the rule's own claim, not a replay (`CLAIMED`; kept in JSON)."""
        return str(self.evidence.get("saving_method", "")).startswith(CLAIMED)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (stable field names)."""
        return {
            "code": self.code,
            "rule": self.rule,
            "severity": self.severity.value,
            "title": self.title,
            "message": self.message,
            "impact_ns_per_step": int(self.impact_ns_per_step),
            "step_share": self.step_share,
            "ranks": list(self.ranks),
            "steps": list(self.steps),
            "process_group": self.process_group,
            "window_ns": list(self.window_ns) if self.window_ns else None,
            "evidence": self.evidence,
            "advice": list(self.advice),
        }


def rank_findings(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """The worse severity first, then the most step time saved, then the code; ties by ranks
    and title, so the same report always lists its findings in the same order. Severity
    leads so that a warning is never listed (or cut off) behind infos that save more."""

    def key(f: Finding) -> tuple[Any, ...]:
        return (-f.severity.level, -int(f.impact_ns_per_step), f.code, list(f.ranks), f.title)

    return tuple(sorted(findings, key=key))
