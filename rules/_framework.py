"""What the trace shows of the framework, as the built-in rules' advice reads it.

The `framework` table (docs/tables.md; kineto_comm.analysis.framework) is the one home of
the settings a job already uses: advice never names one of them again, nor one the
framework seen rejects (FSDP1 flags on an FSDP2 model, Megatron's p2p overlap outside the
interleaved schedule). These helpers read it; they never read annotations themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from kineto_comm.rules_api import Tables

# The schedule's name in advice, by the table's `schedule` row.
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B"}

# What cuts an optimizer's CPU time, by its class (torch.optim's have fused kernels).
_FUSED = (
    ": torch.optim.{0}(fused=True) (or foreach=True) launches a few kernels for all "
    "parameters instead of several per parameter"
)
OPTIMIZER_ADVICE = {name: _FUSED.format(name) for name in ("Adam", "AdamW", "SGD", "Adagrad")}
OPTIMIZER_ADVICE["Shampoo"] = (
    ": compute its preconditioners less often (Distributed Shampoo's "
    "precondition_frequency) or spread them over the ranks (its distributed config)"
)


def markers(tables: Tables, kind: str, ranks: Sequence[int] | None = None) -> pl.DataFrame:
    """The framework table's rows of one kind (of `ranks` when given)."""
    table = tables["framework"]
    if table.height == 0 or "kind" not in table.columns:
        return pl.DataFrame(
            schema={"rank": pl.Int64, "name": pl.String, "within": pl.String, "count": pl.Int64}
            | {"ns_per_step": pl.Int64}
        )
    rows = table.filter(pl.col("kind") == kind)
    if ranks is not None:
        rows = rows.filter(pl.col("rank").is_in(list(ranks)))
    return rows


def uses(tables: Tables, kind: str, name: str, ranks: Sequence[int] | None = None) -> bool:
    """Whether the trace shows `name` of `kind` in use (on any of `ranks` when given)."""
    return bool((markers(tables, kind, ranks)["name"] == name).any())


def schedule(tables: Tables, ranks: Sequence[int] | None = None) -> str | None:
    """The pipeline schedule seen on `ranks` (gpipe, 1f1b, interleaved), None if unknown."""
    names = markers(tables, "schedule", ranks)["name"].unique().to_list()
    return names[0] if len(names) == 1 else None


def p2p_together(tables: Tables, ranks: Sequence[int] | None = None) -> bool:
    """Whether sends and receives are already issued together (batch_isend_irecv, isend and
    irecv in flight at once) on `ranks`."""
    return markers(tables, "p2p", ranks).height > 0


def cpu_holders(
    tables: Tables, ranks: Sequence[int], step_ns: float, min_share: float = 0.05
) -> list[str]:
    """Sentences naming what holds the CPU of `ranks` in a step: the optimizer steps, the
    copies that blocked the thread (with the phase around them), and the largest CPU phase
    that is neither the forward nor the backward, each from `min_share` of the step
    (`step_ns`), largest first; the mean over the ranks that show it."""
    if step_ns <= 0:
        return []
    out: list[tuple[float, str]] = []

    def mean(rows: pl.DataFrame, by: str) -> pl.DataFrame:
        return (
            rows.group_by(by)
            .agg(ns=pl.col("ns_per_step").mean(), count=pl.col("count").sum())
            .filter(pl.col("ns") >= min_share * step_ns)
            .sort("ns", descending=True)
        )

    for name, ns, _ in mean(markers(tables, "optimizer", ranks), "name").iter_rows():
        out.append(
            (
                ns,
                f"the optimizer step ({name}.step) holds the CPU {ns / 1e6:.2f} ms per step "
                f"({ns / step_ns:.0%} of the step)" + OPTIMIZER_ADVICE.get(name, ""),
            )
        )
    copies = markers(tables, "blocking_copy", ranks)
    for within, ns, _ in mean(copies, "within").iter_rows():
        where = "" if within in (None, "-") else f" in `{within}`"
        out.append(
            (
                ns,
                f"a device-to-host copy{where} blocks the CPU {ns / 1e6:.2f} ms per step "
                f"({ns / step_ns:.0%}) until the device catches up (.item(), .cpu(), "
                ".to() of a device tensor): copy into pinned memory with non_blocking=True "
                "and read it later, or drop the sync",
            )
        )
    phases = markers(tables, "phase", ranks).filter(
        ~pl.col("name").str.contains(r"(?i)^## (forward|backward|optimizer)( |:|##)")
        & ~pl.col("name").str.starts_with("Optimizer.")
    )
    # A phase that only wraps a blocking copy named above is that copy.
    named = copies.filter(pl.col("ns_per_step") >= min_share * step_ns)["within"].to_list()
    top = mean(phases.filter(~pl.col("name").is_in(named)), "name").head(1)
    for name, ns, _ in top.iter_rows():
        out.append((ns, f"`{name}` holds the CPU {ns / 1e6:.2f} ms per step ({ns / step_ns:.0%})"))
    return [text for _, text in sorted(out, key=lambda x: -x[0])]
