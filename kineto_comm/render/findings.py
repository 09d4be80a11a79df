"""The "what to do first" section of the text report: ranked findings with their cost."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from kineto_comm.render.fmt import print_prose

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.2f} ms" if ns >= 100_000 else f"{ns / 1e3:.1f} us"


def render_findings(report: Any, console: Console, limit: int = 5) -> None:
    """Print the top `limit` findings (worse severity first, then the step time each could
    save: `rank_findings`): what, cost, first advice."""
    from kineto_comm.render.json_doc import findings_of

    findings = findings_of(report)
    if not findings:
        return
    console.print(
        "[bold]What to do first[/bold] (by severity, then the step time each could save)",
        markup=True,
    )
    for i, f in enumerate(findings[:limit], 1):
        sev = f.severity.value
        share = "" if f.step_share is None else f", {f.step_share:.0%} of step"
        ranks = ",".join(map(str, f.ranks[:8])) + ("..." if len(f.ranks) > 8 else "")
        where = f" (ranks {ranks})" if ranks else ""
        style = SEVERITY_STYLE.get(sev, "")
        # Wrapped at words, each item's lines under its text and the advice under its own.
        head = Text.from_markup(
            f"{i}. [{style}]{sev}[/] {f.code} {escape(f.title)} - saves up to "
            f"{_ms(f.impact_ns_per_step)} per step{share}{escape(claim_note(f))}{where}"
        )
        print_prose(console, head, hang=len(f"{i}. "))
        if f.advice:
            print_prose(console, f"-> {f.advice[0]}", indent=3, hang=3)
    if len(findings) > limit:
        print_prose(console, f"({len(findings) - limit} more findings in --format json)")
    line = all_fixes_line(report)
    if line:
        print_prose(console, line)
    print_prose(console, "`kineto-comm explain CODE` documents a rule.")
    console.print()


def claim_note(f: Any) -> str:
    """What follows a saving that is its rule's own number rather than a replay
    (`Finding.claimed`): ", claimed by the rule (...)", naming the claim when capped."""
    if not f.claimed:
        return ""
    claim = f.evidence.get("claimed_ns_per_step")
    capped = f"; its {_ms(int(claim))} capped at the step" if claim is not None else ""
    return f", claimed by the rule (not replayed{capped})"


def all_fixes_line(report: Any) -> str | None:
    """The joint replay of every finding's fix against the step (`report.savings`), saying
    when the findings' savings overlap, when together they buy more than their sum, and
    which savings are their rules' claims (left out of it): one sentence, as text, Markdown
    and HTML print it."""
    saved = getattr(report, "savings", None) or {}
    claimed = int(saved.get("claimed") or 0)
    if not (saved.get("step_ns") and (saved.get("replayed") or claimed)):
        return None
    claims = (
        f"{claimed} finding{'s' if claimed > 1 else ''} whose saving is the rule's own claim "
        "(not replayed, each capped at the step)"
    )
    if not saved.get("replayed"):
        return f"No fix is replayed: {claims}; do not add them."
    total, joint = saved["sum_of_savings_ns"], saved["joint_saving_ns"]
    line = (
        f"All fixes together: {_ms(joint)} of the {_ms(saved['step_ns'])} step "
        f"({joint / saved['step_ns']:.0%}), replayed on the model of time"
    )
    if saved.get("overlapping"):
        line += (
            f"; the findings' savings overlap (they claim some of the same time) and add "
            f"up to {_ms(total)}: do not add them"
        )
    elif joint > total:
        # A max-plus replay: where two causes each hold up the step on their own (two late
        # ranks, a rank late at one call and another's transfer), removing one leaves the
        # other on the critical path; together they buy more than apart (h200 pp-dp-8).
        line += (
            f"; more than the findings' {_ms(total)} added up: each fix alone leaves another "
            "cause on the critical path that the others remove"
        )
    if claimed:
        line += f"; not in it: {claims}"
    return line + "."
