"""NET101 low-bus-bandwidth."""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Edit,
    Finding,
    Option,
    Severity,
    Tables,
    busbw_factor,
    collective_exposure_lazy,
    impact_per_step,
    make_finding,
    mean_step_ns,
    replay_saving,
    rule,
    severity_for,
)

from ._common import with_roles


@rule(
    code="NET101",
    name="low-bus-bandwidth",
    summary="Large messages reach far less bus bandwidth than comparable groups or the link.",
    tables=("collectives", "kernels", "steps", "collective_instances", "process_groups"),
    options=(
        Option("min_bytes", 1 << 20, "Only messages of at least this many bytes count."),
        Option(
            "link_busbw_gbps",
            0.0,
            "Bus bandwidth the links should give (GB/s); 0: "
            "compare with the best group of the same role and collective.",
        ),
        Option("min_ratio", 0.5, "Report a group below this fraction of the reference."),
        Option("warn_share", 0.03, "Warn when the slowness costs this share of step time."),
        Option("error_share", 0.10, "Error at this share of step time."),
    ),
)
def low_bus_bandwidth(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Computes the bus bandwidth (nccl-tests definition, waits excluded) of every collective of
    at least `min_bytes`, takes each process group's median per collective, and compares it
    with `link_busbw_gbps` or, when that is not given, the best median of the groups with the
    same role and collective. A group below `min_ratio` of that reference is reported; the
    impact is the replayed saving of its exposed transfers at the reference bandwidth.

    Why is this bad?
    Large messages should run at link speed. A group far below its peers points at a slow or
    degraded link (a NIC at lower speed, a missing NVLink, PCIe instead of NVLink, traffic
    through the wrong NIC or GPU-direct RDMA disabled) and slows every collective on it.

    How to fix:
    Check that group's hosts: nccl-tests all_reduce_perf across them, NCCL_DEBUG=INFO
    (transport: NVLS/P2P/NET-IB vs SOCKET), NCCL_IB_HCA / NCCL_SOCKET_IFNAME, GPU-NIC
    affinity and PCIe topology (nvidia-smi topo -m), link errors (ibstat, ethtool).
    """
    if not tables.has("collectives"):
        return []
    used = ("rank", "step", "process_group", "collective", "call_index", "bytes")

    def big_calls(view: Tables) -> pl.LazyFrame:
        exp = collective_exposure_lazy(view, transfer_only=True).select(
            *used, "group_size", "ranks_seen", "transfer_ns", "exposed_ns"
        )
        big = exp.filter(
            (pl.col("bytes") >= options["min_bytes"])
            & (pl.col("transfer_ns") > 0)
            & pl.col("collective").is_in(["send", "recv", "send_recv", "unknown"]).not_()
        )
        size = pl.col("group_size").fill_null(pl.col("ranks_seen"))
        busbw = pl.col("bytes") * busbw_factor(pl.col("collective"), size) / pl.col("transfer_ns")
        return with_roles(tables, big.with_columns(busbw=busbw))

    big = big_calls(tables)
    # Medians hold every value: on a big job, of an evenly spread sample of the calls.
    groups = tables.collect(
        tables.sample(big)
        .group_by("process_group", "collective", "role")
        .agg(median_busbw=pl.col("busbw").median(), calls=pl.len())
    )
    if groups.height == 0:
        return []
    link = float(options["link_busbw_gbps"])
    ref = pl.lit(link) if link > 0 else pl.col("median_busbw").max().over("role", "collective")
    groups = groups.with_columns(reference=ref).with_columns(
        ratio=pl.col("median_busbw") / pl.col("reference")
    )
    slow = groups.filter(pl.col("ratio") < options["min_ratio"])
    if slow.height == 0:
        return []

    def slow_calls(view: Tables) -> pl.LazyFrame:
        rows = big_calls(view).join(
            slow.lazy().select("process_group", "collective", "ratio"),
            on=["process_group", "collective"],
            how="inner",
            build_side="force_right",
        )
        return rows.with_columns(lost=pl.col("exposed_ns") * (1.0 - pl.col("ratio")))

    causes = impact_per_step(slow_calls, "lost", ["process_group"], tables=tables).join(
        slow.group_by("process_group").agg(
            pl.col("collective"),
            pl.col("median_busbw").min(),
            pl.col("reference").max(),
            pl.col("role").first(),
        ),
        on="process_group",
    )
    step_ns = mean_step_ns(tables)
    out = []
    for c in causes.sort("impact_ns", descending=True).iter_rows(named=True):
        mine = slow.filter(pl.col("process_group") == c["process_group"])
        fraction: pl.Expr = pl.lit(0.0)
        for coll, ratio in mine.select("collective", "ratio").iter_rows():
            fraction = pl.when(pl.col("collective") == coll).then(1.0 - ratio).otherwise(fraction)
        edit = Edit(
            f"run group {c['process_group']}'s {', '.join(c['collective'])} at "
            f"{c['reference']:.1f} GB/s bus bandwidth",
            (pl.col("category") == "transfer")
            & (pl.col("process_group") == c["process_group"])
            & pl.col("collective").is_in(list(c["collective"])),
            fraction,
        )
        saving = replay_saving(tables, edit)
        share = saving / step_ns if step_ns else 0.0
        sev = severity_for(share, options["warn_share"], options["error_share"]) or Severity.info
        out.append(
            make_finding(
                low_bus_bandwidth,
                sev,
                f"Group {c['process_group']} reaches {c['median_busbw']:.1f} GB/s bus "
                f"bandwidth of {c['reference']:.1f}",
                f"Large {', '.join(c['collective'])} calls on group {c['process_group']} "
                f"({c['role']}) run at a median {c['median_busbw']:.1f} GB/s bus bandwidth "
                f"against {c['reference']:.1f} GB/s "
                f"({'the link' if link > 0 else 'the best comparable group'}); the exposed "
                f"part of the difference costs {c['impact_ns'] / 1e6:.2f} ms per step on the "
                f"worst rank; at the reference the step would be {saving / 1e6:.2f} ms "
                "shorter.",
                impact_ns_per_step=saving,
                step_ns=step_ns,
                ranks=c["ranks"] or [],
                steps=c["steps"] or [],
                process_group=c["process_group"],
                evidence={
                    "collectives": c["collective"],
                    "median_busbw_gbps": round(c["median_busbw"], 2),
                    "reference_busbw_gbps": round(c["reference"], 2),
                    "reference": "link_busbw_gbps" if link > 0 else "best group",
                    "exposed_lost_ns_per_step": int(c["impact_ns"]),
                    "step_ns": step_ns,
                    "saving_method": f"replay: {edit.name}",
                },
                edit=edit,
                advice=(
                    "Run nccl-tests (all_reduce_perf -b 1M -e 1G) on exactly these ranks' "
                    "hosts and compare with a healthy group.",
                    "Check the transport with NCCL_DEBUG=INFO (NVLink/P2P/IB vs SOCKET), "
                    "NCCL_IB_HCA and NCCL_SOCKET_IFNAME, GPU-NIC affinity (nvidia-smi topo -m) "
                    "and link errors or down-trained links (ibstat, ethtool).",
                ),
            )
        )
    return out
