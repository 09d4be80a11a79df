"""CAPT101 capture-contention: the capture itself, not the workload, makes ranks wait.

Ranks that share one GPU take turns on it, and ranks that share too few CPU cores take
turns on those: arrival order, waits and stragglers then measure the capture. This module
judges the capture first (`contention`, which the straggler, imbalance and device rules
read to qualify or stand down) and reports it as one finding whose saving is replayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Edit,
    Finding,
    Tables,
    job_platform,
    make_finding,
    mean_step_ns,
    queue_shift,
    rank_lateness,
    replay_saving,
    rule,
    step_blame,
    step_times,
)

from ._common import SHARE_OPTIONS, share_severity

# Ranks have the same work when their compute kernel (or CPU op) counts differ by at most
# this share; ranks on one host's CPUs compete for its cores when, with the same work, the
# most compute is at least SPREAD times the least (gloo captures of 4 ranks on 2 cores:
# 1.4-1.9x; 2 ranks on 2 cores: 1.15-1.26x).
SAME_WORK = 0.02
SPREAD = 1.3
# Ranks on one device id take turns on it when their queued time (launched kernels that do
# not start while the device runs none of their work), summed over them, is at least this
# share of the step (the real one-GPU captures: 10-95%); without it the ids alone may be
# one GPU per host with no host names (a job's own synthetic traces: none queued).
QUEUED_SHARE = 0.05


@dataclass(frozen=True)
class Contention:
    """How the capture made ranks share hardware: `kind` "device" (ranks on one GPU: the
    same device id on the same host) or "cores" (CPU-only ranks of one host whose equal
    work took very different compute time); `ranks` those that share; `where` in words;
    `same_work` every rank ran the same number of compute kernels (or CPU ops);
    `compute_ns` per rank over the trace; `last_share` per rank, the share of its matched
    calls it arrived last at (the stragglers table's)."""

    kind: str
    ranks: tuple[int, ...]
    where: str
    same_work: bool
    compute_ns: dict[int, int]
    last_share: dict[int, float]

    @property
    def spread(self) -> float:
        """The most compute over the least, among the ranks that share."""
        vals = [v for r, v in self.compute_ns.items() if r in self.ranks]
        return max(vals) / min(vals) if vals and min(vals) > 0 else 1.0

    @property
    def most_late(self) -> int | None:
        """The rank most often last at a call (lowest on a tie); None without calls."""
        if not self.last_share:
            return None
        return min(self.last_share, key=lambda r: (-self.last_share[r], r))

    def words(self) -> str:
        """The capture's fact, for other findings' messages."""
        if self.kind == "device":
            return f"the {len(self.ranks)} ranks share {self.where} and take turns on it"
        return (
            f"the {len(self.ranks)} ranks share the CPU cores of {self.where} (the same work "
            f"takes {self.spread:.1f}x as long on one as on another)"
        )


def _per_rank(tables: Tables) -> pl.DataFrame:
    """rank, devices, device, kernels, compute_ns: per rank, its device ids (of device
    kernels), the one it uses, and its compute kernels (or CPU ops) and their time."""
    if not tables.has("kernels", "rank", "kind", "start_ns", "end_ns"):
        return pl.DataFrame(schema={"rank": pl.Int64})
    cols = ["rank", "kind", "start_ns", "end_ns"] + (
        ["device"] if tables.has("kernels", "device") else []
    )
    k = tables.lazy("kernels", cols)
    dev = pl.col("device") if "device" in cols else pl.lit(None, dtype=pl.Int64)
    compute = pl.col("kind") == "compute"
    return tables.collect(
        k.group_by(pl.col("rank").cast(pl.Int64)).agg(
            devices=dev.filter(dev >= 0).n_unique(),
            device=dev.filter(dev >= 0).first(),
            kernels=compute.sum().cast(pl.Int64),
            compute_ns=(pl.col("end_ns") - pl.col("start_ns")).filter(compute).sum(),
        )
    ).sort("rank")


def contention(tables: Tables) -> Contention | None:
    """The capture's contention (Contention), or None: ranks on the same host (the offsets
    table's `host`, the report's grouping: a header's host name, or every rank on one device
    id) that use the same one device id share a GPU when their queued time sums to
    QUEUED_SHARE of the step or more; CPU-only ranks (host timelines) of one host with the
    same work whose compute differs at least SPREAD times share its cores."""
    if not tables.has("offsets", "rank", "host"):
        return None
    hosts = tables["offsets"].select(pl.col("rank").cast(pl.Int64), pl.col("host").cast(pl.String))
    if hosts.height < 2:
        return None
    per = tables.once(("builtin", "capture_per_rank"), lambda: _per_rank(tables))
    if per.height < 2 or "kernels" not in per.columns:
        return None
    per = per.join(hosts, on="rank", how="inner")
    late = {}
    if tables.has("stragglers", "rank", "times_last", "instances"):
        s = tables["stragglers"].filter(pl.col("instances") > 0)
        late = {
            int(r): float(t) / float(n)
            for r, t, n in s.select("rank", "times_last", "instances").iter_rows()
        }
    counts = per["kernels"]
    same = bool(counts.min() and counts.max() <= counts.min() * (1 + SAME_WORK))  # type: ignore[operator]
    compute = {int(r): int(c or 0) for r, c in per.select("rank", "compute_ns").iter_rows()}
    if not job_platform(tables).host:
        one = (
            per.filter(pl.col("devices") == 1).group_by("host", "device").agg(ranks=pl.col("rank"))
        )
        shared = one.filter(pl.col("ranks").list.len() > 1).sort("host", "device")
        if shared.height == 0:
            return None
        ranks = tuple(sorted(r for g in shared["ranks"] for r in g))
        queued = queued_per_step(tables)
        if sum(queued.get(r, 0) for r in ranks) < QUEUED_SHARE * mean_step_ns(tables):
            return None
        where = (
            f"one GPU (device {shared['device'][0]} of {shared['host'][0]})"
            if shared.height == 1
            else f"{shared.height} GPUs, several ranks on each"
        )
        return Contention("device", ranks, where, same, compute, late)
    if not same:
        return None
    busy = per.group_by("host").agg(
        ranks=pl.col("rank"), lo=pl.col("compute_ns").min(), hi=pl.col("compute_ns").max()
    )
    busy = busy.filter((pl.col("ranks").list.len() > 1) & (pl.col("hi") >= SPREAD * pl.col("lo")))
    if busy.height == 0 or int(busy["lo"].min() or 0) <= 0:  # type: ignore[operator]
        return None
    ranks = tuple(sorted(r for g in busy["ranks"] for r in g))
    where = f"host {busy['host'][0]}" if busy.height == 1 else f"{busy.height} hosts"
    return Contention("cores", ranks, where, same, compute, late)


def _queued_per_step(tables: Tables) -> pl.DataFrame:
    """rank, queued_ns: per rank, the model of time's `queued` time per complete step."""
    done = step_times(tables).filter(pl.col("complete"))["step"]
    rows = tables.collect(
        step_blame(tables)
        .filter((pl.col("category") == "queued") & pl.col("step").is_in(done.implode()))
        .group_by("rank")
        .agg(ns=pl.col("ns").sum())
    )
    n = max(1, done.len())
    return rows.select(pl.col("rank").cast(pl.Int64), queued_ns=(pl.col("ns") / n).cast(pl.Int64))


def queued_per_step(tables: Tables) -> dict[int, int]:
    """Per rank, its queued time per complete step (launched kernels that did not start
    while the device ran nothing of this rank's); once per rules run."""
    frame = tables.once(("builtin", "queued_per_step"), lambda: _queued_per_step(tables))
    return {int(r): int(q) for r, q in frame.iter_rows()}


def contention_fixed(tables: Tables, c: Contention) -> Edit:
    """The edit of a capture without contention: each rank alone on its hardware. Its
    queued time goes (what moving the other ranks off the device takes out: queue_shift)
    and, where the ranks have the same work, so do their waits for each other and each
    late rank's lateness (their order of arrival was the hardware's turns)."""
    keys = ["rank", "step", "category"]
    queued = queue_shift(tables).select(
        pl.col("rank").cast(pl.Int64),
        pl.col("step").cast(pl.Int64),
        category=pl.lit("queued"),
        fraction=pl.col("share").cast(pl.Float64),
    )
    parts = [queued]
    lateness = None
    if c.same_work:
        windows = step_times(tables).select(pl.col("step").cast(pl.Int64))
        ranks = pl.DataFrame({"rank": list(c.ranks)}, schema={"rank": pl.Int64})
        parts.append(
            ranks.join(windows, how="cross").with_columns(
                category=pl.lit("wait"), fraction=pl.lit(1.0)
            )
        )
        lateness = rank_lateness(tables, pl.col("category") == "wait").filter(
            pl.col("rank").is_in(list(c.ranks))
        )
    what = "other ranks moved off the device" if c.kind == "device" else "cores for every rank"
    name = f"each rank alone on its hardware ({what}: its queued time goes"
    name += ", and the ranks' waits for each other with it)" if c.same_work else ")"
    return Edit(
        name,
        pl.col("category").is_in(["queued", "wait"] if c.same_work else ["queued"]),
        pl.concat([p.select(*keys, "fraction") for p in parts]),
        lateness,
    )


@rule(
    code="CAPT101",
    name="capture-contention",
    summary="Ranks share a GPU or too few CPU cores: the capture, not the job, makes them wait.",
    tables=("offsets", "kernels", "steps", "stragglers"),
    options=SHARE_OPTIONS,
)
def capture_contention(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Judges the capture before the workload. Ranks on one host that use the same one device
    id share a GPU (the report's footer says so) when they take turns on it: their queued
    time (kernels launched while the device runs none of their work) sums to 5% of the step
    or more. CPU-only ranks (gloo) of one host whose work is the same (compute ops within 2%
    in number) but whose compute time differs 1.3x or more share too few cores. The saving
    is replayed on the model of time: each rank alone on its hardware, its `queued` time
    (kernels launched while other ranks held the device) removed and, where the ranks have
    the same work, their waits for each other and each late rank's lateness too (they
    arrived late in turn). The message gives the share of calls each rank arrived last at
    and whether the rank most often late has the least compute. The straggler (SYNC101),
    imbalance (SYNC104), device-contention (SYNC105) and bandwidth (NET101) findings read
    this rule's verdict and qualify or stand down; `--ranks-per-host 1` (one GPU per host)
    turns the shared-GPU reading off.

    Why is this bad?
    Ranks that take turns on one device (or on too few cores) arrive at collectives in the
    order the hardware served them, not by their work: the critical path rotates through
    ranks with equal work, call ends spread, a rank's lateness is its own queued time.
    Straggler, imbalance and bandwidth figures then describe the capture; advice drawn from
    them (pack sequences, the data loader, NCCL tuning) buys nothing on the real job.

    How to fix:
    Capture again with each rank on its own GPU (torchrun --nproc-per-node equal to the GPUs,
    torch.cuda.set_device(LOCAL_RANK)) and, for CPU-only jobs, no more ranks per host than it
    has cores to spare (torch.set_num_threads, OMP_NUM_THREADS, taskset); read the other
    findings after that. If ranks must share a GPU, NVIDIA MPS runs their kernels side by side
    instead of time-slicing them.
    """
    c = contention(tables)
    if c is None:
        return []
    edit = contention_fixed(tables, c)
    saving = replay_saving(tables, edit)
    step_ns = mean_step_ns(tables)
    share = saving / step_ns if step_ns else 0.0
    sev = share_severity(share, options)
    if sev is None:
        return []
    queued = queued_per_step(tables)
    worst_q = max(queued.values(), default=0)
    ms = {r: v / 1e6 for r, v in c.compute_ns.items() if r in c.ranks}
    turns = ", ".join(f"rank {r} {s:.0%}" for r, s in sorted(c.last_share.items()))
    late = c.most_late
    if c.kind == "device":
        title = (
            f"{len(c.ranks)} ranks share {c.where}: taking turns on it costs "
            f"{saving / 1e6:.2f} ms per step"
        )
        fact = (
            f"Ranks {_span(c.ranks)} run on {c.where}, so the device time-slices them: a "
            f"rank's launched kernels wait while the others hold it (up to "
            f"{worst_q / 1e6:.2f} ms per step on one rank)"
        )
    else:
        title = (
            f"{len(c.ranks)} ranks share the CPU cores of {c.where}: contention costs "
            f"{saving / 1e6:.2f} ms per step"
        )
        fact = (
            f"Ranks {_span(c.ranks)} run on the CPUs of {c.where} and compete for its cores: "
            f"with the same work ({_work(tables)} "
            f"compute ops each) their compute takes {min(ms.values()):.1f}-"
            f"{max(ms.values()):.1f} ms over the trace ({c.spread:.1f}x)"
        )
    if c.same_work and c.kind == "device":
        fact += f"; every rank runs the same {_work(tables)} compute kernels"
    if turns:
        fact += f". Arrived last at the shared calls: {turns}"
        if late is not None and c.same_work and ms:
            least = min(ms, key=lambda r: (ms[r], r))
            if least == late:
                fact += (
                    f"; rank {late}, the most often late, has the least compute "
                    f"({ms[late]:.1f} ms): its lateness is not its own work"
                )
            elif max(c.last_share.values()) <= 1.5 / max(1, len(c.ranks)):
                fact += " (the last rank rotates: contention, not imbalance)"
    gone = (
        "each rank's queued time" if c.kind == "device" else "",
        "the ranks' waits for each other" if c.same_work else "",
    )
    fact += (
        f". With hardware of its own for each rank, {' and '.join(g for g in gone if g)} "
        "would go: the step would be "
        f"{saving / 1e6:.2f} ms shorter ({share:.1%} of {step_ns / 1e6:.2f} ms), replayed. "
        "Straggler, imbalance and bandwidth figures of this capture measure the sharing, "
        "not the job."
    )
    gpu = (
        "Capture again with one rank per GPU (torchrun --nproc-per-node = GPUs, "
        "torch.cuda.set_device(LOCAL_RANK)) before acting on straggler, imbalance or "
        "bandwidth findings: on a shared GPU the arrival order and the collectives' times are "
        "the device's time-slicing."
    )
    cpu = (
        "Capture again with no more ranks per host than it has cores to spare (leave cores "
        "for gloo's communication threads; torch.set_num_threads / OMP_NUM_THREADS = cores "
        "per rank, taskset) before acting on straggler or imbalance findings."
    )
    advice = (
        (
            gpu,
            "If ranks must share a GPU, run them under NVIDIA MPS so that their kernels "
            "run side by side instead of in turns.",
        )
        if c.kind == "device"
        else (cpu,)
    )
    return [
        make_finding(
            capture_contention,
            sev,
            title,
            fact,
            impact_ns_per_step=saving,
            step_ns=step_ns,
            ranks=c.ranks,
            evidence={
                "kind": c.kind,
                "where": c.where,
                "same_work": c.same_work,
                "compute_ns": {str(r): v for r, v in sorted(c.compute_ns.items())},
                "compute_spread": round(c.spread, 3),
                "last_share": {str(r): round(v, 3) for r, v in sorted(c.last_share.items())},
                "queued_ns_per_step": {str(r): v for r, v in sorted(queued.items())},
                "step_ns": step_ns,
                "saving_method": f"replay: {edit.name}",
            },
            edit=edit,
            advice=advice,
        )
    ]


def _work(tables: Tables) -> int:
    """The compute kernels (or CPU ops) of the rank with the fewest."""
    per = tables.once(("builtin", "capture_per_rank"), lambda: _per_rank(tables))
    return int(per["kernels"].min() or 0) if "kernels" in per.columns else 0  # type: ignore[arg-type]


def _span(ranks: tuple[int, ...]) -> str:
    """Ranks in words: 0-3 when consecutive, else listed."""
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))
