"""COMM301 overlap-interference: communication hidden behind compute still slows it down.

Reads the `interference` table (kineto_comm.analysis.interference: compute kernels of one
call site beside communication vs alone) and replays the compute run at its alone speed.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Edit,
    Finding,
    Option,
    Tables,
    job_platform,
    make_finding,
    mean_step_ns,
    replay_saving,
    rule,
)

from ._common import SHARE_OPTIONS, share_severity
from .capture import contention

# Kernel names shown in the message (the costliest first) and their length there.
TOP_KERNELS = 3
NAME_CHARS = 60


def _short(name: str) -> str:
    """A kernel name cut for a message (templates make them hundreds of characters long)."""
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 3] + "..."


def _ranks_text(ranks: list[int]) -> str:
    """Ranks as runs: 0-3, 6."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@rule(
    code="COMM301",
    name="overlap-interference",
    summary="Compute kernels run slower while communication overlaps them.",
    tables=("interference", "steps", "ranks", "offsets", "stragglers"),
    options=(
        Option(
            "min_slowdown",
            0.10,
            "A call site counts when its kernels beside communication are at least this much "
            "slower (a share: 0.10 = 10%) than alone.",
        ),
        *SHARE_OPTIONS,
    ),
)
def overlap_interference(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Reads the `interference` table: per rank, compute kernels of one call site (name and
    neighbours on the stream) that ran beside a communication kernel of their rank, against
    the same call site alone. Call sites at least `min_slowdown` slower beside communication
    are the cause; their extra time per step (the overlapped kernels at their alone speed)
    is what overlap costs. The saving is replayed on the model of time: each rank's compute
    shortened by that time (where the step ends in a chain of communication, which faster
    compute does not shorten, an upper bound). Stands down on CPU-only traces and where the
    ranks share one GPU (CAPT101: taking turns on a GPU slows kernels too, and that is the
    capture's).

    Why is this bad?
    Overlap hides communication, but NCCL's kernels take SMs (one per channel) and memory
    bandwidth from the compute beside them: a GEMM at 1.18 ms alone ran 2.08 ms overlapped
    (NVIDIA/nccl #1428; #1433: memory bandwidth even when SMs are left over). The hidden
    communication then costs step time after all, as slower compute.

    How to fix:
    Let NCCL take fewer SMs: NCCL_MAX_NCHANNELS (NCCL_MAX_CTAS from NCCL 2.17) caps its
    channels, one SM each (NCCL_MIN_NCHANNELS / NCCL_MIN_CTAS is the floor); check that the
    communication still hides. Leave SMs to communication in the matmuls
    (torch._C._set_sm_carveout_experimental, private, cuBLASLt paths). With
    CUDA_DEVICE_MAX_CONNECTIONS=1 kernels reach the GPU in launch order, so communication
    starts beside the compute it was scheduled with (Megatron requires it with sequence
    parallelism).
    """
    if job_platform(tables).host:
        return []
    need = ("rank", "kind", "name", "slowdown", "overlapped_ns", "extra_ns", "extra_ns_per_step")
    if not tables.has("interference", *need):
        return []
    capture = contention(tables)
    if capture is not None and capture.kind == "device":
        return []
    least = float(options["min_slowdown"])
    rows = tables["interference"].filter(
        (pl.col("kind") == "compute")
        & (pl.col("slowdown") >= least)
        & (pl.col("extra_ns_per_step") > 0)
    )
    if rows.height == 0 or not tables.has("steps", "rank", "step", "compute_ns"):
        return []
    step_ns = mean_step_ns(tables)
    if step_ns <= 0:
        return []
    per_rank = rows.group_by("rank").agg(
        extra=pl.col("extra_ns_per_step").sum(),
        over=pl.col("overlapped_ns").sum(),
        total=pl.col("extra_ns").sum(),
    )
    # Each rank's compute loses its extra time per step, spread over its windows' compute.
    windows = tables["steps"].select(
        pl.col("rank").cast(pl.Int64), pl.col("step").cast(pl.Int64), "compute_ns"
    )
    shares = windows.join(per_rank.select("rank", "extra"), on="rank", how="inner").select(
        "rank",
        "step",
        fraction=(pl.col("extra") / pl.col("compute_ns").clip(lower_bound=1)).clip(0.0, 1.0),
    )
    edit = Edit(
        "the overlapped compute kernels at their alone speed",
        pl.col("category") == "compute",
        shares,
    )
    saving = replay_saving(tables, edit)
    severity = share_severity(saving / step_ns, options)
    if severity is None:
        return []
    over, total = int(per_rank["over"].sum()), int(per_rank["total"].sum())
    slowdown = over / (over - total) - 1.0 if over > total else 0.0
    worst = per_rank.sort("extra", descending=True).row(0, named=True)
    ranks = per_rank["rank"].to_list()
    top = (
        rows.group_by("name")
        .agg(pl.col("extra_ns_per_step").sum(), pl.col("slowdown").median())
        .sort("extra_ns_per_step", descending=True)
        .head(TOP_KERNELS)
    )
    kernels = "; ".join(
        f"{_short(n)} {s:+.0%}" for n, s in zip(top["name"], top["slowdown"], strict=True)
    )
    ms = worst["extra"] / 1e6
    return [
        make_finding(
            overlap_interference,
            severity,
            f"Overlap slows compute by {slowdown:.0%} ({ms:.2f} ms per step)",
            f"overlap slows compute by {slowdown:.0%} ({ms:.2f} ms per step on rank "
            f"{worst['rank']}) on ranks {_ranks_text(ranks)}: {kernels}. Kernels beside "
            f"communication run slower than the same call sites alone; compute at its alone "
            f"speed would make the step {saving / 1e6:.2f} ms shorter "
            f"({saving / step_ns:.1%} of step time).",
            impact_ns_per_step=saving,
            step_ns=step_ns,
            ranks=ranks,
            evidence={
                "slowdown": round(slowdown, 4),
                "extra_ns_per_step": {
                    int(r): int(e) for r, e in per_rank.select("rank", "extra").iter_rows()
                },
                "call_sites": rows.height,
                "measured_sites": int(rows["measured"].sum())
                if "measured" in rows.columns
                else None,
                "top_kernels": top["name"].to_list(),
                "min_slowdown": least,
                "step_ns": step_ns,
                "saving_method": f"replay: {edit.name}",
            },
            edit=edit,
            advice=(
                "Let NCCL take fewer SMs: lower NCCL_MAX_NCHANNELS (NCCL_MAX_CTAS from NCCL "
                "2.17; NCCL_MIN_NCHANNELS is the floor), one SM per channel, and check that "
                "the communication still hides (NVIDIA/nccl #1428, #1433).",
                "Leave SMs to communication in the matmuls: "
                "torch._C._set_sm_carveout_experimental(n) (private, cuBLASLt matmuls).",
                "Set CUDA_DEVICE_MAX_CONNECTIONS=1 so kernels reach the GPU in launch order "
                "and communication overlaps the compute it was scheduled beside.",
            ),
        )
    ]
