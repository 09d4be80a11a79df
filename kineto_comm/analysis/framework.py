"""What the trace shows of the training framework: the settings advice must fit.

Advice that names a setting the job already uses (`batch_isend_irecv` on a pipeline that
batches its point-to-point calls), or one its framework rejects (FSDP1 flags on an FSDP2
model, Megatron's `--overlap-p2p-communication` without the interleaved schedule), costs an
expert's trust in the rest. The markers are in the trace already: the annotations PyTorch,
FSDP2, DDP and TorchRec record, the calls' timing and the pipeline's order of sends and
receives. The `framework` table (docs/tables.md) is their one home; rules read it, never the
annotations.

Two passes: `rank_markers` per file, where the CPU annotations still are (per_rank), and
`framework_table` over every rank (batched point-to-point calls, the pipeline schedule).
The table's kinds and columns in full: the comment below the imports.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.lazy import collect

# In full (the module docstring says what and why):
#
# What the trace shows of the training framework: the settings advice must fit.
#
# Advice that names a setting the job already uses (`batch_isend_irecv` on a pipeline that
# batches its point-to-point calls), or one its framework rejects (FSDP1 flags on an FSDP2
# model, Megatron's `--overlap-p2p-communication` without the interleaved schedule), costs an
# expert's trust in the rest. The markers are in the trace already: the annotations PyTorch,
# FSDP2, DDP and TorchRec record (`FSDP::pre_forward`, `DistributedDataParallel.forward`,
# `## sparse_data_dist ##`, `Optimizer.step#Shampoo.step`), the calls' timing and the
# pipeline's order of sends and receives. The `framework` table (docs/tables.md) is their one
# home; rules read it, never the annotations.
#
# Two passes. `rank_markers` runs per file where the CPU annotations still are (per_rank:
# they are not kept after it): the frameworks its annotation names point to, its optimizers,
# the CPU time of its phases per step, and the device-to-host copies that held its thread.
# `framework_table` adds what needs every rank (batched point-to-point calls, the pipeline
# schedule) and returns the table, one row per rank and marker:
#
#     rank, kind, name, within, count, ns_per_step
#
# kind       framework (name: fsdp1, fsdp2, ddp, torchrec, torchrec_pipeline), optimizer (name:
#            the optimizer class, `Shampoo`, `FusedAdam`), phase (name: a `## ... ##` or
#            `Optimizer.*` annotation: the CPU phases of a step), blocking_copy (a copy whose
#            launch returned only when it ended: `.item()`, `.cpu()`, `.to()` of a device
#            tensor; name: the copy's, `Memcpy DtoH (Device -> Pageable)`; `within`: the
#            innermost phase around it), p2p (name: batched, one NCCL
#            kernel for a send and a receive; overlapped, a send and a receive in flight
#            together as separate calls: batch_isend_irecv, isend/irecv), schedule (name:
#            gpipe, 1f1b, interleaved; on every rank of the pipeline), in_use (name: foreach,
#            multi_tensor_apply kernels of torch.optim's foreach/fused paths; inductor,
#            torch.compile's Triton kernels; torch_compile, a compiled graph's CPU ops,
#            CompiledFunction, whatever the backend; count: its kernels or ops).
# count      how many times it occurs in the rank's trace.
# ns_per_step  CPU time inside the rank's steps per step (phases, optimizer steps, blocking
#            copies); null where time means nothing (framework, p2p, schedule).

SCHEMA = {
    "rank": pl.Int64,
    "kind": pl.String,
    "name": pl.String,
    "within": pl.String,
    "count": pl.Int64,
    "ns_per_step": pl.Int64,
}
# Annotation names -> the framework they show (first match wins, in this order).
FRAMEWORKS = (
    ("fsdp2", r"^FSDP::"),
    ("fsdp1", r"^FullyShardedDataParallel\."),
    ("ddp", r"^DistributedDataParallel\."),
    # TorchRec's TrainPipelineSparseDist (and its subclasses) names the stages it overlaps.
    ("torchrec_pipeline", r"^## (wait_)?sparse_data_dist ##$|^## sdd_|^## copy_batch_to_gpu ##$"),
    ("torchrec", r"^## .*(KJT|PooledEmbedding|all2all_data|EmbeddingArch).* ##$"),
)
OPTIMIZER = r"^Optimizer\.step#(\w+)\.step"
PHASE = r"^## .+ ##$|^Optimizer\.(step|zero_grad)#"
# The collectives' columns framework_table reads.
P2P_COLUMNS = ("rank", "step", "collective", "peer", "start_ns", "end_ns")
# Kernels that show a setting in use (kind in_use): torch.optim's foreach and fused paths
# launch multi_tensor_apply kernels; torch.compile's Inductor launches Triton kernels named
# triton_*.
IN_USE = (("foreach", r"multi_tensor_apply_kernel"), ("inductor", r"^triton_"))
# CPU ops that show torch.compile in use whatever its backend (in_use torch_compile): the
# autograd functions of a compiled graph, and newer PyTorch's region annotation.
COMPILED = r"^CompiledFunction|^Torch-Compiled Region"
# A copy that held its launching thread this long was waited for (a synchronous copy).
BLOCKING_NS = 1_000_000


def rank_markers(
    ops: pl.DataFrame, kernels: pl.DataFrame, marks: pl.DataFrame, n: int
) -> list[list[dict[str, Any]]]:
    """Per file (the `rank` column holds its position, 0..n-1), its marker rows as JSON-ready
    dicts (without `rank`): kept in the file's metadata, which the cache and the workers
    carry. `ops`: the CPU annotations (RawTrace.ops); `kernels`: with launch_ns,
    launch_end_ns, launch_tid; `marks`: the ProfilerStep windows (model.steps.cpu_steps)."""
    out: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    parts = [_kernels_in_use(kernels)]
    if ops.height:
        parts += _annotation_markers(ops, kernels, marks)
    columns = [c for c in SCHEMA]
    rows = collect(
        pl.concat([q.select(columns) for q in parts], how="vertical_relaxed").sort(
            "rank", "kind", "ns_per_step", "name", descending=[False, False, True, False]
        )
    )
    for part in rows.partition_by("rank", as_dict=False):
        rank = int(part["rank"][0])
        if 0 <= rank < n:
            out[rank] = part.drop("rank").to_dicts()
    return out


def _kernels_in_use(kernels: pl.DataFrame) -> pl.LazyFrame:
    """Per rank, the settings its kernels show in use (IN_USE), with their kernel count."""
    if kernels.height == 0 or "name" not in kernels.columns:
        return pl.LazyFrame(schema=SCHEMA)
    k = kernels.lazy().select(pl.col("rank").cast(pl.Int64), "name")
    return pl.concat(
        [
            k.filter(pl.col("name").str.contains(pattern))
            .group_by("rank")
            .agg(count=pl.len().cast(pl.Int64))
            .with_columns(
                kind=pl.lit("in_use"),
                name=pl.lit(key),
                within=pl.lit(None, pl.String),
                ns_per_step=pl.lit(None, pl.Int64),
            )
            .select(list(SCHEMA))
            for key, pattern in IN_USE
        ],
        how="vertical_relaxed",
    )


def _annotation_markers(
    ops: pl.DataFrame, kernels: pl.DataFrame, marks: pl.DataFrame
) -> list[pl.LazyFrame]:
    """The markers the CPU annotations show: frameworks, phases, optimizers, blocking copies."""
    notes = (
        ops.lazy()
        .filter(pl.col("cat") == "user_annotation")
        .select("rank", "name", "tid", "start_ns", "end_ns")
    )
    steps = marks.lazy().group_by("rank").agg(n_steps=pl.len())
    frameworks = [
        notes.filter(pl.col("name").str.contains(pattern))
        .group_by("rank")
        .agg(count=pl.len())
        .with_columns(kind=pl.lit("framework"), name=pl.lit(key), within=pl.lit(None, pl.String))
        .with_columns(ns_per_step=pl.lit(None, pl.Int64))
        for key, pattern in FRAMEWORKS
    ]
    phases = notes.filter(pl.col("name").str.contains(PHASE))
    in_steps = _in_steps(phases, marks)
    timed = (
        in_steps.group_by("rank", "name")
        .agg(count=pl.len(), ns=pl.col("ns").sum())
        .join(steps, on="rank", how="left")
        .with_columns(ns_per_step=(pl.col("ns") // pl.col("n_steps").fill_null(1)))
        .drop("ns", "n_steps")
    )
    phase_rows = timed.with_columns(kind=pl.lit("phase"), within=pl.lit(None, pl.String))
    optimizer_rows = (
        timed.filter(pl.col("name").str.contains(OPTIMIZER))
        .with_columns(
            kind=pl.lit("optimizer"),
            name=pl.col("name").str.extract(OPTIMIZER, 1),
            within=pl.lit(None, pl.String),
        )
        .group_by("rank", "kind", "name", "within")
        .agg(pl.col("count").sum(), pl.col("ns_per_step").sum())
    )
    copies = _blocking_copies(phases, kernels, marks, steps)
    compiled = (
        ops.lazy()
        .filter(pl.col("name").str.contains(COMPILED))
        .group_by("rank")
        .agg(count=pl.len())
        .with_columns(
            kind=pl.lit("in_use"),
            name=pl.lit("torch_compile"),
            within=pl.lit(None, pl.String),
            ns_per_step=pl.lit(None, pl.Int64),
        )
    )
    return [*frameworks, phase_rows, optimizer_rows, copies, compiled]


def _in_steps(spans: pl.LazyFrame, marks: pl.DataFrame) -> pl.LazyFrame:
    """Each span's time inside the step windows of its rank (`ns`), one row per span
    and step it overlaps; spans outside every step are left out."""
    windows = marks.lazy().select("rank", "cpu_start_ns", "cpu_end_ns")
    return (
        spans.join(windows, on="rank", how="inner")
        .with_columns(
            ns=pl.min_horizontal("end_ns", "cpu_end_ns")
            - pl.max_horizontal("start_ns", "cpu_start_ns")
        )
        .filter(pl.col("ns") > 0)
        .drop("cpu_start_ns", "cpu_end_ns")
    )


def _blocking_copies(
    phases: pl.LazyFrame, kernels: pl.DataFrame, marks: pl.DataFrame, steps: pl.LazyFrame
) -> pl.LazyFrame:
    """The copies whose launch call held its thread BLOCKING_NS or more, per rank and
    innermost phase around the launch (the latest-starting phase on the thread that holds
    it; "-" where none does)."""
    if kernels.height == 0 or "launch_end_ns" not in kernels.columns:
        return pl.LazyFrame(schema=SCHEMA)
    held = (
        kernels.lazy()
        .filter(
            (pl.col("kind") == "memcpy")
            & ((pl.col("launch_end_ns") - pl.col("launch_ns")) >= BLOCKING_NS)
        )
        .select(
            "rank",
            "name",
            tid=pl.col("launch_tid").cast(pl.String),
            start_ns=pl.col("launch_ns"),
            end_ns=pl.col("launch_end_ns"),
        )
        .drop_nulls(["tid", "start_ns", "end_ns"])
        .sort("start_ns")
    )
    around = (
        phases.select(
            "rank",
            tid=pl.col("tid").cast(pl.String),
            at=pl.col("start_ns"),
            upto="end_ns",
            within="name",
        )
        .drop_nulls(["at"])
        .sort("at")
    )
    named = held.join_asof(
        around,
        left_on="start_ns",
        right_on="at",
        by=["rank", "tid"],
        strategy="backward",
        check_sortedness=False,  # both sorted by time above; `by` groups keep that order
    ).with_columns(
        within=pl.when(pl.col("upto") >= pl.col("end_ns")).then("within").otherwise(pl.lit("-"))
    )
    return (
        _in_steps(named.select("rank", "name", "within", "start_ns", "end_ns"), marks)
        .group_by("rank", "name", "within")
        .agg(count=pl.len(), ns=pl.col("ns").sum())
        .join(steps, on="rank", how="left")
        .select(
            "rank",
            kind=pl.lit("blocking_copy"),
            name="name",
            within="within",
            count="count",
            ns_per_step=pl.col("ns") // pl.col("n_steps").fill_null(1),
        )
    )


def framework_table(
    meta: dict[int, dict[str, Any]], collectives: pl.LazyFrame | None, pipeline: pl.DataFrame
) -> pl.DataFrame:
    """The `framework` table: every rank's markers (`meta[rank]["framework"]`), its batched
    point-to-point calls, and the pipeline schedule on the pipeline's ranks."""
    rows = [
        {"rank": rank, **row}
        for rank, about in sorted(meta.items())
        for row in (about.get("framework") or [])
    ]
    parts = [pl.DataFrame(rows, schema=SCHEMA)]
    if collectives is None:
        return parts[0]
    p2p = collect(
        collectives.filter(pl.col("collective").is_in(["send", "recv", "send_recv"])).select(
            P2P_COLUMNS
        )
    )
    # Only a pipeline's calls (a single rank's send_recv can be an all-to-all's pieces).
    staged = pipeline.filter(pl.col("stages") > 1) if pipeline.height else pipeline
    p2p = (
        p2p.filter(pl.col("rank").is_in(staged["rank"].unique().implode()))
        if staged.height
        else p2p.clear()
    )
    if p2p.height:
        parts.append(_batched(p2p))
        parts.append(_schedule(p2p, staged))
    return pl.concat(parts, how="vertical_relaxed").sort("rank", "kind", "name")


def _batched(p2p: pl.DataFrame) -> pl.DataFrame:
    """Per rank, its point-to-point calls issued together: `batched`, one NCCL kernel for a
    send and a receive (`send_recv`: NCCL's batch_isend_irecv), or `overlapped`, a send and
    a receive in flight together as separate calls (a call that starts before the rank's
    previous call of the other direction ended: gloo's batch_isend_irecv, isend/irecv)."""
    ordered = p2p.sort("rank", "start_ns")
    before = pl.col("end_ns").cum_max().shift(1).over("rank")
    other = pl.col("collective") != pl.col("collective").shift(1).over("rank")
    kind = (
        pl.when(pl.col("collective") == "send_recv")
        .then(pl.lit("batched"))
        .when((other & (pl.col("start_ns") < before)).fill_null(False))
        .then(pl.lit("overlapped"))
    )
    return (
        ordered.with_columns(name=kind)
        .drop_nulls("name")
        .group_by("rank", "name")
        .agg(count=pl.len())
        .select(
            "rank",
            kind=pl.lit("p2p"),
            name="name",
            within=pl.lit(None, pl.String),
            count="count",
            ns_per_step=pl.lit(None, pl.Int64),
        )
    )


def _schedule(p2p: pl.DataFrame, pipeline: pl.DataFrame) -> pl.DataFrame:
    """The pipeline's schedule, from its last stage's order of calls in a step: in GPipe it
    receives every micro-batch's activations before it sends back any gradient; in 1F1B it
    sends micro-batch i's gradient before it receives micro-batch i+1 (with one micro-batch
    they look alike: GPipe). A first stage that exchanges with the last (a ring: virtual
    stages) is interleaved."""
    stages = pipeline.group_by("rank").agg(pl.col("stage").first(), pl.col("stages").first())
    last = stages.filter(pl.col("stage") == pl.col("stages") - 1)
    if last.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    send = pl.col("collective") == "send"
    recv = pl.col("collective") == "recv"
    early = (
        p2p.filter(pl.col("rank").is_in(last["rank"].implode()))
        .group_by("rank", "step")
        .agg(
            early=(pl.col("collective") == "send_recv").any()
            | (pl.col("start_ns").filter(send).min() < pl.col("start_ns").filter(recv).max())
        )
        .get_column("early")
        .fill_null(False)
        .any()
    )
    stage_of = stages.select(peer="rank", peer_stage="stage")
    ring = (
        p2p.join(stages.select("rank", "stage", "stages"), on="rank")
        .join(stage_of, on="peer", how="inner")
        .filter(
            (pl.col("stages") > 2)
            & (
                ((pl.col("stage") == 0) & (pl.col("peer_stage") == pl.col("stages") - 1))
                | ((pl.col("peer_stage") == 0) & (pl.col("stage") == pl.col("stages") - 1))
            )
        )
        .height
        > 0
    )
    name = "interleaved" if ring else ("1f1b" if early else "gpipe")
    return stages.select(
        "rank",
        kind=pl.lit("schedule"),
        name=pl.lit(name),
        within=pl.lit(None, pl.String),
        count=pl.lit(1, pl.Int64),
        ns_per_step=pl.lit(None, pl.Int64),
    )


def markers_of(table: pl.DataFrame, kind: str, name: str | None = None) -> pl.DataFrame:
    """The table's rows of one kind (and name)."""
    if table.height == 0:
        return table
    keep = pl.col("kind") == kind
    if name is not None:
        keep &= pl.col("name") == name
    return table.filter(keep)
