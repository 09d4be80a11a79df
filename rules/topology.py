"""NET102 tensor-parallel-across-hosts."""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Edit,
    Finding,
    Option,
    Severity,
    Tables,
    collective_exposure_lazy,
    group_roles,
    hosts_of,
    impact_per_step,
    make_finding,
    mean_step_ns,
    replay_saving,
    rule,
)

# Ranks per host where neither the option nor the traces say (an 8-GPU server).
DEFAULT_RANKS_PER_HOST = 8


def _report_hosts(tables: Tables) -> pl.DataFrame | None:
    """rank, host, host_source from the offsets table, where the hosts are known there (not
    `unknown`: a host per rank, which says nothing of the layout)."""
    if not tables.has("offsets", "rank", "host", "host_source"):
        return None
    hosts = tables["offsets"].select("rank", "host", "host_source")
    if hosts.height == 0 or (hosts["host_source"] == "unknown").all():
        return None
    return hosts


def _spans(groups: pl.DataFrame, hosts: pl.DataFrame) -> pl.DataFrame:
    """process_group, hosts: how many of the report's hosts each group's ranks are on (a
    rank without a trace counts as a host of its own)."""
    return (
        groups.select("process_group", rank=pl.col("ranks"))
        .explode("rank")
        .join(hosts.select("rank", "host"), on="rank", how="left")
        .group_by("process_group")
        .agg(hosts=pl.coalesce("host", pl.format("rank {}", "rank")).n_unique())
    )


@rule(
    code="NET102",
    name="tensor-parallel-across-hosts",
    summary="A tensor-parallel group spans several hosts instead of one NVLink domain.",
    tables=("process_groups", "collectives", "kernels", "steps", "offsets"),
    options=(
        Option(
            "ranks_per_host",
            0,
            "GPUs per host (ranks r and s share a host when r // ranks_per_host == "
            "s // ranks_per_host); 0: the report's hosts (the offsets table: --ranks-per-host, "
            "the traces' host names or device ids), 8 where the traces do not tell.",
        ),
        Option(
            "inter_host_slowdown",
            4.0,
            "How much slower the network is than the "
            "intra-host links; the impact assumes this speed-up once kept inside a host.",
        ),
    ),
)
def tensor_parallel_across_hosts(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Reads each tensor-parallel process group's ranks and counts the hosts they span: the
    report's hosts (the offsets table's `host`, the same grouping the clock alignment uses),
    or `ranks_per_host` consecutive ranks per host where that option is set or the traces
    do not tell (8). A group on more than one host is reported; the impact is the replayed
    saving of its exposed transfers running `inter_host_slowdown` times faster inside one
    host.

    Why is this bad?
    Tensor parallelism puts several all-reduces (or all-gather/reduce-scatter pairs) on the
    critical path of every layer, forward and backward. They need NVLink-class bandwidth and
    latency; over the inter-host network they dominate step time.

    How to fix:
    Keep the tensor-parallel size at most the GPUs per host and make TP the innermost
    (fastest varying) dimension of the rank layout (Megatron orders tp-cp-ep-dp-pp by
    default); check the launcher's rank-to-host mapping (torchrun --nnodes/--nproc-per-node,
    SLURM distribution); scale across hosts with data or pipeline parallelism instead.
    """
    roles = group_roles(tables)
    tp = roles.filter((pl.col("role") == "tensor_parallel") & pl.col("ranks").is_not_null())
    if tp.height == 0:
        return []
    per_host = int(options["ranks_per_host"])
    known = _report_hosts(tables) if per_host <= 0 else None
    if known is None:
        per_host = per_host if per_host > 0 else DEFAULT_RANKS_PER_HOST
        spanning = tp.with_columns(hosts=hosts_of(pl.col("ranks"), per_host))
        how = f"{per_host} ranks per host"
    else:
        spanning = tp.join(_spans(tp, known), on="process_group", how="left")
        how = f"hosts from {known['host_source'][0].replace('_', ' ')}"
    spanning = spanning.filter(pl.col("hosts") > 1)
    if spanning.height == 0:
        return []
    step_ns = mean_step_ns(tables)
    slow = max(1.0, float(options["inter_host_slowdown"]))

    def spanning_calls(view: Tables) -> pl.LazyFrame:
        exp = (
            collective_exposure_lazy(view)
            .select("rank", "step", "process_group", "exposed_ns")
            .with_columns(pl.col("process_group").cast(pl.String))
        )
        exp = exp.join(
            spanning.lazy().select("process_group"),
            on="process_group",
            how="semi",
            build_side="force_right",
        )
        return exp.with_columns(saved=pl.col("exposed_ns") * (1.0 - 1.0 / slow))

    impact = impact_per_step(spanning_calls, "saved", ["process_group"], tables=tables)
    spanning = spanning.join(impact, on="process_group", how="left")
    groups = spanning["process_group"].to_list()
    ranks = sorted({r for rs in spanning["ranks"].to_list() for r in rs})
    edit = Edit(
        f"run the spanning tensor-parallel groups' transfers {slow:g}x faster (one host)",
        (pl.col("category") == "transfer") & pl.col("process_group").is_in(groups),
        1.0 - 1.0 / slow,
    )
    total = replay_saving(tables, edit)
    share = total / step_ns if step_ns else 0.0
    return [
        make_finding(
            tensor_parallel_across_hosts,
            Severity.error if share >= 0.10 else Severity.warning,
            f"{len(groups)} tensor-parallel group(s) span several hosts",
            f"Tensor-parallel groups {', '.join(groups)} span up to "
            f"{int(spanning['hosts'].max())} hosts ({how}); their "
            f"collectives cross the network on every layer.",
            impact_ns_per_step=total,
            step_ns=step_ns,
            ranks=ranks,
            process_group=groups[0] if len(groups) == 1 else None,
            evidence={
                "process_groups": groups,
                "hosts_spanned": spanning["hosts"].to_list(),
                "hosts_from": how,
                "exposed_saved_ns_per_step": int(spanning["impact_ns"].fill_null(0).max() or 0),
                "step_ns": step_ns,
                "saving_method": f"replay: {edit.name}",
            },
            edit=edit,
            advice=(
                "Keep tensor_model_parallel_size <= GPUs per host and make TP the innermost "
                "rank dimension so each TP group stays on one host's NVLink.",
                "Check the launcher's rank placement (torchrun --nproc-per-node, SLURM "
                "--distribution=block).",
            ),
        )
    ]
