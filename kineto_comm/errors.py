"""Errors that name a trace file and what is wrong with it, for one-line reporting."""

from __future__ import annotations


class TraceError(Exception):
    """A trace file that cannot be used; the message is meant to be printed as one line."""

    def __init__(self, file: str, problem: str) -> None:
        super().__init__(f"{file}: {problem}")
        self.file = file
        self.problem = problem


class UsageError(Exception):
    """Bad arguments or configuration (not a trace problem): printed as one line, exit 2."""
