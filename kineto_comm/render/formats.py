"""The output formats by name, rendering to text, and the exit code policy for CI.

Every renderer is a pure function `(report, fail_on) -> str`; `render(report, fmt, fail_on=)`
picks one by name, and `write` writes its text to a file or stream (the JSON document piece by
piece: a big job's holds a GB of per-step rows). `exit_code` is the policy the CLI applies
after writing the output: 0 when no finding is at or above `fail_on` (or `exit_zero`), 1 when
one is. Exit code 2 (tool or input errors) is the CLI's own decision and comes before this one.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TextIO

from kineto_comm.findings import Severity, parse_severity
from kineto_comm.render.json_doc import at_or_above, findings_of, json_pieces, render_json
from kineto_comm.render.output import open_output
from kineto_comm.report import Report

Renderer = Callable[[Report, Severity], str]


def render_text_str(report: Report, fail_on: Severity = Severity.error) -> str:
    """The rich text report as plain text, for files and non-terminals: COLUMNS wide when
    set, else render.text.DEFAULT_WIDTH."""
    from kineto_comm.render.text import render_text

    buf = io.StringIO()
    render_text(report, out=buf)
    return buf.getvalue()


# Each renderer's module is imported when its format is asked for, not with this one: a JSON
# or text report then loads no HTML, XML or SARIF code (~0.08 s of CPU, issue 81).


def render_markdown(report: Report, fail_on: Severity = Severity.error) -> str:
    """render.markdown's page."""
    from kineto_comm.render.markdown import render_markdown as markdown

    return markdown(report, fail_on)


def render_sarif(report: Report, fail_on: Severity = Severity.error) -> str:
    """render.sarif's log."""
    from kineto_comm.render.sarif import render_sarif as sarif

    return sarif(report, fail_on)


def render_junit(report: Report, fail_on: Severity = Severity.error) -> str:
    """render.junit's document."""
    from kineto_comm.render.junit import render_junit as junit

    return junit(report, fail_on)


def render_github(report: Report, fail_on: Severity = Severity.error) -> str:
    """render.github's annotations."""
    from kineto_comm.render.github import render_github as github

    return github(report, fail_on)


def render_html(report: Report, fail_on: Severity = Severity.error) -> str:
    """render.html's page."""
    from kineto_comm.render.html import render_html as html

    return html(report, fail_on)


FORMATS: dict[str, Renderer] = {
    "text": render_text_str,
    "json": render_json,
    "markdown": render_markdown,
    "sarif": render_sarif,
    "junit": render_junit,
    "github": render_github,
    "html": render_html,
}
# Formats whose text comes in pieces to write one after the other (`write`).
PIECES: dict[str, Callable[[Report, Severity], Iterable[str]]] = {"json": json_pieces}
# Formats that are not a report but an export of the traces, written by their own module
# (not `render`): perfetto, the clock-aligned timeline (kineto_comm.render.perfetto).
EXPORTS = ("perfetto",)
EXTENSIONS = {
    "text": ".txt",
    "json": ".json",
    "markdown": ".md",
    "sarif": ".sarif",
    "junit": ".xml",
    "github": ".txt",
    "html": ".html",
}


def parse_fail_on(value: str | Severity | None, name: str = "fail_on") -> Severity | None:
    """The level at or above which findings fail: a severity, or `never` (None: none fails);
    case-insensitive. The one reading of report's --fail-on and diff's --fail-on-new;
    ValueError naming `name` and the choices."""
    if value is None or isinstance(value, Severity):
        return value
    if value.strip().lower() == "never":
        return None
    try:
        return Severity(value.strip().lower())
    except ValueError:
        choices = ", ".join([*(s.value for s in Severity), "never"])
        raise ValueError(f"{name}: unknown severity {value!r}; choose one of {choices}") from None


def render(report: Report, fmt: str, *, fail_on: Severity | str = Severity.error) -> str:
    """`report` rendered in format `fmt` (a key of FORMATS)."""
    return _renderer(fmt)(report, parse_severity(fail_on))


def _renderer(fmt: str) -> Renderer:
    """The renderer of format `fmt`; ValueError naming the formats."""
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}") from None


def exit_code(
    report: Report, fail_on: Severity | str = Severity.error, exit_zero: bool = False
) -> int:
    """0 when nothing is at or above `fail_on` (always 0 with `exit_zero`), else 1."""
    if exit_zero:
        return 0
    return 1 if at_or_above(findings_of(report), parse_severity(fail_on)) else 0


def parse_also(spec: str) -> tuple[str, Path]:
    """`FORMAT=FILE` (the CLI's repeatable `--also`) -> (format, path); ValueError if bad."""
    fmt, sep, path = spec.partition("=")
    fmt = fmt.strip().lower()
    if not sep or not path.strip():
        raise ValueError(f"--also expects FORMAT=FILE, got {spec!r}")
    if fmt not in FORMATS and fmt not in EXPORTS:
        choices = ", ".join((*FORMATS, *EXPORTS))
        raise ValueError(f"unknown format {fmt!r} in --also; choose one of {choices}")
    return fmt, Path(path.strip())


def write(
    report: Report, fmt: str, out: Path | TextIO, *, fail_on: Severity | str = Severity.error
) -> None:
    """Render `fmt` into `out`: a path (`open_output`: UTF-8, gzip when its name ends in
    .gz) or a text stream. The same text as `render`, written in pieces where the format has
    them (PIECES), so that the whole text of a big job's JSON is never held at once."""
    renderer, severity = _renderer(fmt), parse_severity(fail_on)
    pieces = PIECES[fmt](report, severity) if fmt in PIECES else [renderer(report, severity)]
    if isinstance(out, Path):
        with open_output(out) as stream:
            for piece in pieces:
                stream.write(piece)
    else:
        for piece in pieces:
            out.write(piece)
