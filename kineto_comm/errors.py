"""Errors that name a trace file and what is wrong with it, for one-line reporting."""

from __future__ import annotations


class TraceError(Exception):
    """A trace file that cannot be used; the message is meant to be printed as one line."""

    def __init__(self, file: str, problem: str) -> None:
        problem = one_line(problem)
        super().__init__(f"{file}: {problem}")
        self.file = file
        self.problem = problem


def one_line(text: str) -> str:
    """`text` as one line: its first line (a library's message can run to many, such as
    Polars' plan dumps), with a mark that more was left out."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[0] + (" (...)" if len(lines) > 1 else "")


class UsageError(Exception):
    """Bad arguments or configuration (not a trace problem): printed as one line, exit 2."""
