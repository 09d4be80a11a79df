"""What the job ran on: its communication backend, host-only ranks, ranks per host.

Why: advice differs by platform (gloo on CPUs has no CUDA streams to overlap on; NCCL's
settings are not gloo's), and a group spanning hosts crosses the network. Read from the
`ranks` table (the traces' `distributedInfo` and each rank's timeline).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from kineto_comm.analysis.view import TableView, memo


@dataclass(frozen=True)
class Platform:
    """What the job ran on, for advice that differs by it: `backend` is the communication
    backend the traces' `distributedInfo` names ("nccl", "gloo", ...; None where no rank names
    one or the ranks name different ones) and `host` whether every rank's timeline is the
    host's (CPU-only traces: gloo spans against the CPU's work), so no GPU is in the job."""

    backend: str | None
    host: bool


def job_platform(tables: TableView) -> Platform:
    """The job's `Platform`, from the `ranks` table (its `backend` and `timeline` columns):
    read once per rules run (most rules ask)."""
    return memo(tables, "platform", lambda: _job_platform(tables))


def _job_platform(tables: TableView) -> Platform:
    """`job_platform`, computed."""
    if not tables.has("ranks", "backend", "timeline"):
        return Platform(None, False)
    ranks = tables["ranks"]
    backends = ranks["backend"].drop_nulls().unique()
    timelines = set(ranks["timeline"].drop_nulls().unique()) - {"none"}
    return Platform(backends.item() if backends.len() == 1 else None, timelines == {"host"})


def hosts_of(ranks: pl.Expr, ranks_per_host: int) -> pl.Expr:
    """Number of distinct hosts a list of ranks spans (rank // ranks_per_host)."""
    return (ranks.list.eval(pl.element() // max(1, ranks_per_host))).list.n_unique()
