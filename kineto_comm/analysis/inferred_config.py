"""The training configuration the trace itself tells: parallel sizes, sharding, buckets, dtypes.

Why: the analytical model (kineto_comm.analytic, MODEL101) compares what a configuration
should communicate with what the trace moved, and nobody writes its `--model` file. Most of
that configuration is in the trace already: the process groups' roles and sizes
(analysis.roles), the pipeline's stages and micro-batches (analysis.pipeline), the framework's
annotations (analysis.framework) and the sizes and dtypes of the gradient collectives.
`inferred_config` reads them into one row, each value with its evidence, and null where the
trace does not tell (never a guess). Columns and rules: docs/tables.md, `inferred_config`.

DDP buckets: DDP closes a bucket once its gradients reach `bucket_cap_mb * 1024 * 1024`
bytes (torch's `bucket_bytes_cap`), so every bucket but the step's last (the leftover of the
first layers) holds at least the cap and less than the cap plus one gradient tensor.
`ddp_bucket_bytes` is the smallest such full bucket: an upper bound of the cap, within one
tensor of it. One bucket a step says only that every gradient fit under the cap (null).
"""

from __future__ import annotations

import polars as pl

from kineto_comm.analysis.sizes import UNKNOWN_GROUP
from kineto_comm.lazy import collect

SCHEMA = {
    "world_size": pl.Int64,
    "dp": pl.Int64,
    "tp": pl.Int64,
    "pp": pl.Int64,
    "ep": pl.Int64,
    "cp": pl.Int64,
    "framework": pl.String,
    "sharding": pl.String,
    "shard_stage": pl.Int64,
    "micro_batches": pl.Int64,
    "schedule": pl.String,
    "ddp_buckets": pl.Int64,
    "ddp_bucket_bytes": pl.Int64,
    "grad_collective": pl.String,
    "grad_calls_per_step": pl.Float64,
    "grad_dtype": pl.String,
    "grad_bytes_per_step": pl.Int64,
    "params": pl.Int64,
    "activation_dtype": pl.String,
    "activation_bytes": pl.Int64,
    "tp_calls_per_step": pl.Float64,
}
FIELDS = tuple(SCHEMA)
# The collectives' columns `inferred_config` reads.
CALL_COLUMNS = ("rank", "step", "collective", "process_group", "dtype", "bytes", "start_ns")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8": 1, "float64": 8}
_DP = ("data_parallel", "fsdp")
_P2P = ("send", "recv")


def tag_roles(calls: pl.LazyFrame, groups: pl.DataFrame) -> pl.LazyFrame:
    """The calls with their group's role (process_groups): a pooled group's calls ("?", no
    group named per call) by their kind and size where roles.py split the pool."""
    pg = pl.col("process_group").cast(pl.String).fill_null(UNKNOWN_GROUP)
    whole = groups.filter(pl.col("pooled_collective").is_null()).select(
        _pg="process_group", _role="role"
    )
    kinds = groups.filter(
        pl.col("pooled_collective").is_not_null() & pl.col("pooled_bytes").is_null()
    ).select(_pg="process_group", collective="pooled_collective", _kind="role")
    sized = groups.filter(pl.col("pooled_bytes").is_not_null()).select(
        _pg="process_group", collective="pooled_collective", bytes="pooled_bytes", _sized="role"
    )
    return (
        calls.with_columns(_pg=pg, bytes=pl.col("bytes").cast(pl.Int64))
        .join(whole.lazy(), on="_pg", how="left")
        .join(kinds.lazy(), on=["_pg", "collective"], how="left")
        .join(sized.lazy(), on=["_pg", "collective", "bytes"], how="left", nulls_equal=False)
        .with_columns(role=pl.coalesce("_sized", "_kind", "_role").fill_null("unknown"))
        .drop("_pg", "_role", "_kind", "_sized")
    )


def _sizes(groups: pl.DataFrame, world: int | None) -> tuple[dict[str, int | None], list[str]]:
    """dp, tp, pp, ep sizes from the groups' roles and sizes, with evidence. A role with no
    group is 1; a group of unknown size (gloo's pooled calls) is solved from world = dp*tp*pp
    where that leaves one answer."""
    size = {
        role: groups.filter(pl.col("role").is_in(roles))["size"].to_list()
        for role, roles in (("dp", _DP), ("tp", ("tensor_parallel",)), ("pp", ("pipeline",)))
    }
    size["ep"] = groups.filter(pl.col("role") == "expert")["size"].to_list()
    out: dict[str, int | None] = {}
    why: dict[str, str] = {}
    # Groups of unknown role (broadcasts, barriers...) that may be any of them; an
    # all-to-all group is none of dp, tp, pp.
    unsure = groups.filter(
        (pl.col("role") == "unknown")
        & ~pl.col("collectives").list.eval(pl.element() == "all_to_all").list.all()
    ).height
    for key, found in size.items():
        # A size of 1 is the ranks seen (one rank's file of a larger job), not the group.
        known = [s for s in found if s is not None and s > 1]
        if not found and unsure:
            out[key], why[key] = None, "no group has this role, but a group of unknown role"
        elif not found:
            out[key], why[key] = 1, "no group has this role"
        elif known:
            out[key], why[key] = max(known), f"groups of {max(known)} ranks with this role"
        else:
            out[key], why[key] = None, "its groups' sizes are not in the trace"
    unknown = [k for k in ("dp", "tp", "pp") if out[k] is None]
    others = ~pl.col("role").is_in([*_DP, "tensor_parallel", "pipeline"])
    solvable = world and not groups.filter(others).height
    if unknown and solvable:
        known = 1
        for k in ("dp", "tp", "pp"):
            known *= out[k] or 1
        rest = world // known if world % known == 0 else None
        if rest and len(unknown) == 1:
            out[unknown[0]] = rest
            why[unknown[0]] = f"world size {world} / the other sizes' product {known}"
        elif rest == 2 ** len(unknown):  # each role's groups hold 2 ranks or more
            for k in unknown:
                out[k] = 2
                why[k] = (
                    f"world size {world} = {known} x 2^{len(unknown)}: each of "
                    f"{', '.join(unknown)} has 2 ranks or more, so exactly 2"
                )
    if groups.filter(pl.col("role") == "unknown").height and out["ep"] == 1:
        a2a = groups.filter(
            (pl.col("role") == "unknown") & pl.col("collectives").list.contains("all_to_all")
        )
        if a2a.height:
            out["ep"], why["ep"] = None, "all-to-all of unknown purpose (expert or embedding?)"
    return out, [why[k] for k in ("dp", "tp", "pp", "ep")]


def inferred_config(
    process_groups: pl.DataFrame,
    calls: pl.LazyFrame | None,
    pipeline: pl.DataFrame,
    framework: pl.DataFrame,
    world_size: int | None,
    rows: int = 0,
) -> pl.DataFrame:
    """One row (SCHEMA, plus `evidence`, a struct of one text per value): the configuration
    the trace tells. `calls`: CALL_COLUMNS (None: no calls; per step: over the steps a rank's
    calls fall in); the other tables as the Report holds them; `rows`: the calls' count (a
    big job's are aggregated on the streaming engine)."""
    ev: dict[str, str | None] = dict.fromkeys(FIELDS)
    row: dict[str, object] = dict.fromkeys(FIELDS)
    row["world_size"] = world_size
    ev["world_size"] = "ranks' distributedInfo.world_size"
    if world_size == 1:
        for key in ("dp", "tp", "pp", "ep", "cp"):
            row[key], ev[key] = 1, "world size 1"
    if process_groups.height == 0 or calls is None:
        return _frame(row, ev)
    sizes, why = _sizes(process_groups, world_size)
    for key, text in zip(("dp", "tp", "pp", "ep"), why, strict=True):
        row[key], ev[key] = sizes[key], text
    ev["cp"] = "context parallelism: no group role says it (analysis.roles has none)"

    # Each rank's calls per step, by role (steps >= 0; the whole trace when it has none).
    tagged = tag_roles(calls, process_groups)
    stepped = tagged.filter(pl.col("step") >= 0)
    if collect(stepped.select(pl.len()), rows).item() == 0:
        stepped = tagged.with_columns(step=pl.lit(0, pl.Int64))
    n_steps = collect(
        stepped.select("rank", "step").unique().group_by("rank").agg(n=pl.len()), rows
    )
    per_role = (
        stepped.group_by("role", "collective", "rank")
        .agg(
            calls=pl.len(), nbytes=pl.col("bytes").sum(), sized=pl.col("bytes").is_not_null().all()
        )
        .join(n_steps.lazy(), on="rank")
        .group_by("role", "collective")
        .agg(
            calls=(pl.col("calls") / pl.col("n")).mean(),
            nbytes=(pl.col("nbytes") / pl.col("n")).mean(),
            sized=pl.col("sized").all(),
        )
        .pipe(collect, rows)
    )

    def stat(roles: tuple[str, ...], coll: str, col: str) -> float | None:
        hit = per_role.filter(pl.col("role").is_in(roles) & (pl.col("collective") == coll))
        return None if hit.height == 0 else float(hit[col].sum())

    def dtype_of(roles: tuple[str, ...], colls: tuple[str, ...]) -> str | None:
        d = (
            stepped.filter(
                pl.col("role").is_in(roles)
                & pl.col("collective").is_in(colls)
                & pl.col("dtype").is_not_null()
            )
            .group_by("dtype")
            .len()
            .sort("len", "dtype", descending=[True, False])
            .pipe(collect, rows)
        )
        return d["dtype"][0] if d.height else None

    # Framework: the annotations first, else what the groups do.
    names = set(framework.filter(pl.col("kind") == "framework")["name"].to_list())
    fsdp_group = process_groups.filter(pl.col("role") == "fsdp").height > 0
    if names & {"fsdp1", "fsdp2"}:
        row["framework"] = "fsdp"
        ev["framework"] = f"annotations of {', '.join(sorted(names & {'fsdp1', 'fsdp2'}))}"
    elif "ddp" in names:
        row["framework"] = "ddp"
        ev["framework"] = "DistributedDataParallel.* annotations"
    elif fsdp_group:
        row["framework"] = "zero"
        ev["framework"] = "a group all-gathers and reduce-scatters, no FSDP annotation"
    elif (row["tp"] or 1) > 1 or (row["pp"] or 1) > 1:
        row["framework"] = "megatron-like"
        ev["framework"] = "tensor or pipeline parallel groups, no DDP or FSDP annotation"
    else:
        row["framework"] = "unknown"
        ev["framework"] = "no framework annotation, no tensor or pipeline parallel group"

    # Sharding: gathers of parameters and reductions of gradients on the data-parallel groups.
    ag = stat(("fsdp",), "all_gather", "nbytes")
    rs = stat(("fsdp",), "reduce_scatter", "nbytes") or stat(("fsdp",), "all_reduce", "nbytes")
    if fsdp_group and ag and rs:
        ratio = ag / rs
        if ratio >= 1.25:
            row["sharding"], row["shard_stage"] = "full_shard", 3
        else:
            row["sharding"], row["shard_stage"] = "shard_grad_op", 2
        ev["sharding"] = ev["shard_stage"] = (
            f"all-gathered bytes {ratio:.2f}x the reduced gradients per step "
            + ("(parameters gathered again in backward)" if ratio >= 1.25 else "(once per step)")
        )
    elif row["dp"] and row["dp"] > 1:
        row["sharding"], row["shard_stage"] = "none", 0
        ev["sharding"] = ev["shard_stage"] = "data-parallel groups all-reduce, no all-gather"

    # Pipeline: stages and micro-batches from the pipeline table (sends per stage per step).
    if pipeline.height:
        mb = pipeline["micro_batches"].drop_nulls()
        if mb.len():
            row["micro_batches"] = int(mb.median())  # type: ignore[arg-type]
            ev["micro_batches"] = "pipeline table: activations each stage sends per step"
        sched = framework.filter(pl.col("kind") == "schedule")["name"].unique().to_list()
        if len(sched) == 1:
            row["schedule"], ev["schedule"] = sched[0], "framework table: the order of sends"
    elif row["pp"] == 1:
        row["micro_batches"] = None
        ev["micro_batches"] = "no pipeline: micro-batches do not show in the communication"

    # Gradients: dtype, bytes per rank and step, DDP buckets.
    grad_roles = ("data_parallel",) if row["shard_stage"] in (0, None) else ("fsdp",)
    grad_coll = "all_reduce"
    if grad_roles == ("fsdp",) and stat(grad_roles, "reduce_scatter", "calls"):
        grad_coll = "reduce_scatter"  # else gloo's all_reduce in its place (roles.py)
    g_bytes = stat(grad_roles, grad_coll, "nbytes")
    if g_bytes is not None:
        row["grad_collective"] = grad_coll
        row["grad_calls_per_step"] = stat(grad_roles, grad_coll, "calls")
        row["grad_dtype"] = dtype_of(grad_roles, (grad_coll,))
        ev["grad_collective"] = ev["grad_calls_per_step"] = ev["grad_dtype"] = (
            f"the {grad_coll} calls of the {' / '.join(grad_roles)} groups, per rank and step"
        )
    sized = per_role.filter(pl.col("role").is_in(grad_roles))["sized"].all()
    if g_bytes and sized:
        m = 1 if row["shard_stage"] in (0, 1, None) else (row["micro_batches"] or 1)
        row["grad_bytes_per_step"] = round(g_bytes / m)
        ev["grad_bytes_per_step"] = "gradient bytes each rank reduces per step (mean over ranks)"
        width = DTYPE_BYTES.get(row["grad_dtype"] or "")
        if width and None not in (row["tp"], row["pp"]):
            row["params"] = round(g_bytes / m / width * row["tp"] * row["pp"])  # type: ignore[operator]
            ev["params"] = (
                f"gradient bytes per rank and step / {width} ({row['grad_dtype']}) x tp x pp "
                "(a stage's shard of the model, times the shards)"
            )
    if row["shard_stage"] == 0:
        _buckets(stepped, row, ev, rows)

    # Activations: the tensor-parallel all-reduce's message, else the pipeline's send.
    tp_calls = stat(("tensor_parallel",), "all_reduce", "calls")
    act_roles, act_colls = ("tensor_parallel",), ("all_reduce",)
    if not tp_calls:
        act_roles, act_colls = ("pipeline",), _P2P
    msg = (
        stepped.filter(pl.col("role").is_in(act_roles) & pl.col("collective").is_in(act_colls))
        .select(pl.col("bytes").median(), pl.col("bytes").is_null().any().alias("unsized"))
        .pipe(collect, rows)
    )
    if msg["bytes"][0] is not None and not msg["unsized"][0]:
        row["activation_bytes"] = int(msg["bytes"][0])
        row["activation_dtype"] = dtype_of(act_roles, act_colls)
        ev["activation_bytes"] = ev["activation_dtype"] = (
            f"median message of the {act_roles[0]} {' / '.join(act_colls)} calls"
        )
    if tp_calls:
        row["tp_calls_per_step"] = tp_calls
        ev["tp_calls_per_step"] = "tensor-parallel all-reduces per rank and step"
    return _frame(row, ev)


def _buckets(
    stepped: pl.LazyFrame, row: dict[str, object], ev: dict[str, str | None], rows: int
) -> None:
    """DDP's gradient buckets per step and the smallest full one (module doc)."""
    dp = (
        stepped.filter((pl.col("role") == "data_parallel") & (pl.col("collective") == "all_reduce"))
        .sort("rank", "step", "start_ns")
        .group_by("rank", "step", maintain_order=True)
        .agg(
            n=pl.len(),
            full=pl.col("bytes").slice(0, pl.len() - 1).min(),
            unsized=pl.col("bytes").is_null().any(),
        )
        .pipe(collect, rows)
    )
    if dp.height == 0:
        return
    n = int(dp["n"].median())  # type: ignore[arg-type]
    row["ddp_buckets"] = n
    ev["ddp_buckets"] = "gradient all-reduces per rank and step (median)"
    if dp["unsized"].any():
        ev["ddp_bucket_bytes"] = "the gradient all-reduces' sizes are not in the trace"
    elif n > 1:
        row["ddp_bucket_bytes"] = int(dp["full"].min())  # type: ignore[arg-type]
        ev["ddp_bucket_bytes"] = (
            "the smallest full bucket (all but each step's last all-reduce): DDP fills a "
            "bucket to bucket_cap_mb * 2^20 bytes, so the cap is at most this, within one "
            "gradient tensor"
        )
    else:
        ev["ddp_bucket_bytes"] = (
            "one bucket per step: every gradient fit under the cap, which the trace does not tell"
        )


def _frame(row: dict[str, object], ev: dict[str, str | None]) -> pl.DataFrame:
    """The one-row table: SCHEMA's columns and the `evidence` struct."""
    out = pl.DataFrame([row], schema=SCHEMA)
    evidence = pl.DataFrame([ev], schema=dict.fromkeys(FIELDS, pl.String))
    return out.with_columns(evidence=evidence.to_struct())


def empty() -> pl.DataFrame:
    """The table of a report with no calls: every value null."""
    return _frame(dict.fromkeys(FIELDS), dict.fromkeys(FIELDS))


__all__ = ["CALL_COLUMNS", "FIELDS", "SCHEMA", "empty", "inferred_config", "tag_roles"]
