"""NET101 low-bus-bandwidth."""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import (
    Edit,
    Finding,
    Option,
    Tables,
    busbw_factor,
    collective_exposure_lazy,
    group_size,
    impact_per_step,
    job_platform,
    launch_floor,
    make_finding,
    mean_step_ns,
    replay_saving,
    rule,
)

from ._common import P2P, share_severity, with_roles
from .capture import contention


def _link_advice(backend: str | None, nccl_tests: str) -> tuple[str, ...]:
    """How to check a slow group's link: NCCL's tests and transport settings, or, for a gloo
    job (TCP between the ranks' hosts, none of NCCL's knobs), its network interface."""
    if backend == "gloo":
        return (
            "gloo moves data over TCP: check which network interface it uses "
            "(GLOO_SOCKET_IFNAME), its speed and errors (ethtool, ip -s link), and measure the "
            "link between these ranks' hosts (iperf3) against a healthy group's.",
            "On GPUs, run the group on the NCCL backend.",
        )
    return (
        nccl_tests,
        "Check the transport with NCCL_DEBUG=INFO (NVLink/P2P/IB vs SOCKET), "
        "NCCL_IB_HCA and NCCL_SOCKET_IFNAME, GPU-NIC affinity (nvidia-smi topo -m) "
        "and link errors or down-trained links (ibstat, ethtool).",
    )


@rule(
    code="NET101",
    name="low-bus-bandwidth",
    summary="Large messages reach far less bus bandwidth than comparable groups or the link.",
    tables=(
        "collectives",
        "kernels",
        "steps",
        "collective_instances",
        "process_groups",
        "expected_busbw",
        "hardware",
    ),
    options=(
        Option("min_bytes", 1 << 20, "Only messages of at least this many bytes count."),
        Option(
            "link_busbw_gbps",
            0.0,
            "Bus bandwidth the links should give (GB/s); 0: what the hardware table gives "
            "the group's link, else the best group of the same role and collective.",
        ),
        Option("min_ratio", 0.5, "Report a group below this fraction of the best group."),
        Option(
            "hardware_min_bytes",
            16 << 20,
            "Against the hardware table, only messages of at least this many bytes count.",
        ),
        Option(
            "min_speed_of_light",
            0.4,
            "Report a group below this fraction of what the hardware table gives its link.",
        ),
        Option("warn_share", 0.03, "Warn when the slowness costs this share of step time."),
        Option("error_share", 0.10, "Error at this share of step time."),
        Option("info_share", 0.01, "Report as info from this share (below: no finding)."),
    ),
)
def low_bus_bandwidth(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Computes the bus bandwidth (nccl-tests definition, waits excluded) of every collective of
    at least `min_bytes`, takes each process group's median per collective, and compares it
    with `link_busbw_gbps` or, when that is not given, with what the hardware table gives
    the group's link (the `expected_busbw` table, docs/hardware.md: its GPU's NVLink/xGMI/
    PCIe figure inside a host, the `--network` figure across hosts; its calls of at least
    `hardware_min_bytes` only, reported below `min_speed_of_light` of it), else with the best
    median of the groups with the same role and collective (reported below `min_ratio`).
    The hardware's figures are nccl-tests' at 256 MB and more; at 16 MiB a healthy link
    reaches about half of them, hence 0.4: below it more is wrong than the size. The
    impact is the replayed saving of its calls at the reference bandwidth: each call ends
    earlier by the time it saves, so its exposed tail shrinks by at most that, and the
    work after it starts earlier only as far as the CPU launched it (the CPU's launches
    stay where they are: a job whose device waits for its CPU once links are fast saves
    less; rules_api.launch_floor). Against the hardware, only the calls of at least
    `hardware_min_bytes` are replayed. Against the link or the hardware, where the
    group's large calls come in sizes 1.5x apart or more, a line through their times
    (latency + bytes / bandwidth) gives the latency that a call at link speed still pays
    (evidence `latency_ns`, `fitted_busbw_gbps`); with one size the latency counts as
    slowness (an overestimate by the latency's share of a call).

    Why is this bad?
    Large messages should run at link speed. A group far below its peers or what its
    hardware gives points at a slow or degraded link (a NIC at lower speed, a missing
    NVLink, PCIe instead of NVLink, traffic through the wrong NIC or GPU-direct RDMA
    disabled) and slows every collective on it.
    Ranks that share one GPU (CAPT101) move data at the capture's speed: the rule stands
    down there.

    How to fix:
    Check that group's hosts: nccl-tests all_reduce_perf across them, NCCL_DEBUG=INFO
    (transport: NVLS/P2P/NET-IB vs SOCKET), NCCL_IB_HCA / NCCL_SOCKET_IFNAME, GPU-NIC
    affinity and PCIe topology (nvidia-smi topo -m), link errors (ibstat, ethtool).
    """
    c = contention(tables)
    if c is not None and c.kind == "device":
        # Ranks time-slicing one GPU move data at the capture's speed, not the links':
        # CAPT101 reports the capture; link speeds are not read off it.
        return []
    out = _collective_findings(tables, options) + _p2p_findings(tables, options)
    return sorted(out, key=lambda f: -f.impact_ns_per_step)


def _collective_findings(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """NET101 on the collectives (point-to-point calls are _p2p_findings')."""
    if not tables.has("collectives"):
        return []
    used = ("rank", "step", "process_group", "collective", "call_index", "bytes", "end_ns")

    def big_calls(view: Tables) -> pl.LazyFrame:
        exp = collective_exposure_lazy(view, transfer_only=True).select(
            *used, "group_size", "ranks_seen", "transfer_ns", "exposed_ns"
        )
        big = exp.filter(
            (pl.col("bytes") >= options["min_bytes"])
            & (pl.col("transfer_ns") > 0)
            & pl.col("collective").is_in(["send", "recv", "send_recv", "unknown"]).not_()
        )
        size = group_size()
        busbw = pl.col("bytes") * busbw_factor(pl.col("collective"), size) / pl.col("transfer_ns")
        return with_roles(tables, big.with_columns(busbw=busbw))

    big = big_calls(tables)
    link = float(options["link_busbw_gbps"])
    expected = _expected(tables) if link <= 0 else None
    # Medians hold every value: on a big job, of an evenly spread sample of the calls. A
    # group the hardware table has a figure for is measured on its calls of at least
    # hardware_min_bytes (nccl-tests' figures are of large messages).
    sampled = tables.sample(big).join(
        expected.lazy() if expected is not None else _NO_EXPECTED.lazy(),
        on=["process_group", "collective"],
        how="left",
    )
    hw_big = pl.col("bytes") >= options["hardware_min_bytes"]
    groups = tables.collect(
        sampled.group_by("process_group", "collective", "role").agg(
            median_busbw=pl.col("busbw").median(),
            calls=pl.len(),
            hw_busbw=pl.col("busbw").filter(hw_big).median(),
            expected=pl.col("expected").first(),
            gpu=pl.col("gpu").first(),
            gpu_link=pl.col("gpu_link").first(),
            scope=pl.col("scope").first(),
        )
    )
    if groups.height == 0:
        return []
    against_hw = pl.col("expected").is_not_null() & pl.col("hw_busbw").is_not_null()
    best = pl.col("median_busbw").max().over("role", "collective")
    if link > 0:
        ref, kind, limit = pl.lit(link), pl.lit("link_busbw_gbps"), pl.lit(options["min_ratio"])
    else:
        ref = pl.when(against_hw).then("expected").otherwise(best)
        kind = pl.when(against_hw).then(pl.lit("hardware")).otherwise(pl.lit("best group"))
        limit = (
            pl.when(against_hw)
            .then(pl.lit(float(options["min_speed_of_light"])))
            .otherwise(pl.lit(float(options["min_ratio"])))
        )
    groups = groups.with_columns(
        median_busbw=pl.when(kind == "hardware").then("hw_busbw").otherwise("median_busbw"),
        reference=ref,
        reference_kind=kind,
        _limit=limit,
    ).with_columns(ratio=pl.col("median_busbw") / pl.col("reference"))
    slow = groups.filter(pl.col("ratio") < pl.col("_limit"))
    if slow.height == 0:
        return []

    # Against the link or the hardware, a call at link speed still pays its fixed latency:
    # where a group's calls come in several sizes, a line through their transfer times
    # (time = latency + bus bytes / bandwidth) gives both, and only the bandwidth's part is
    # saved.
    fitted = slow.filter(pl.col("reference_kind") != "best group")
    fits = _latency_fits(tables, big, fitted) if fitted.height else {}
    latency = pl.DataFrame(
        {
            "process_group": list(fits),
            "_latency": [float(f["latency_ns"]) for f in fits.values()],
        },
        schema={"process_group": pl.String, "_latency": pl.Float64},
    )

    def slow_calls(view: Tables) -> pl.LazyFrame:
        rows = big_calls(view).join(
            slow.lazy().select("process_group", "collective", "reference", "reference_kind"),
            on=["process_group", "collective"],
            how="inner",
            build_side="force_right",
        )
        # Against the hardware, only the calls it was measured on run at its figure.
        rows = rows.filter(
            (pl.col("reference_kind") != "hardware")
            | (pl.col("bytes") >= options["hardware_min_bytes"])
        ).drop("reference_kind")
        # A call run at the reference ends earlier by the time it saves; only its exposed
        # tail can shrink, by at most that.
        size = group_size()
        at_ref = pl.col("_latency").fill_null(0.0) + pl.col("bytes") * busbw_factor(
            pl.col("collective"), size
        ) / pl.col("reference")
        saved = (pl.col("transfer_ns") - at_ref).clip(lower_bound=0.0)
        return (
            rows.join(latency.lazy(), on="process_group", how="left")
            .with_columns(lost=pl.min_horizontal(pl.col("exposed_ns").cast(pl.Float64), saved))
            .drop("_latency")
        )

    causes = impact_per_step(slow_calls, "lost", ["process_group"], tables=tables).join(
        slow.sort("collective")
        .group_by("process_group")
        .agg(
            pl.col("collective"),  # in one order, whatever the grouping's
            pl.col("median_busbw").min(),
            pl.col("reference").max(),
            pl.col("role").first(),
            pl.col("reference_kind").first(),
            # The collective of the lowest share: the one the message names.
            pl.col("collective").sort_by("ratio").first().alias("worst"),
            pl.col("median_busbw").sort_by("ratio").first().alias("worst_busbw"),
            pl.col("reference").sort_by("ratio").first().alias("worst_reference"),
            pl.col("gpu").first(),
            pl.col("gpu_link").first(),
            pl.col("scope").first(),
        ),
        on="process_group",
    )
    step_ns = mean_step_ns(tables)
    # The slow groups' calls, read once: per rank, step and collective, the share of the
    # exposed transfer the faster calls save (the blame's transfer rows are per rank, step
    # and collective), and where each saves it (a call's end), for the launch floor.
    calls = tables.collect(
        slow_calls(tables).select(
            pl.col("process_group").cast(pl.String),
            pl.col("rank").cast(pl.Int64),
            pl.col("step").cast(pl.Int64),
            pl.col("collective").cast(pl.String),
            "end_ns",
            "lost",
            "exposed_ns",
        )
    )
    shares = (
        calls.group_by("process_group", "rank", "step", "collective")
        .agg(_lost=pl.col("lost").sum(), _exposed=pl.col("exposed_ns").sum())
        .with_columns(
            _share=pl.when(pl.col("_exposed") > 0)
            .then(pl.col("_lost") / pl.col("_exposed"))
            .otherwise(0.0),
        )
    )
    out = []
    for c in causes.sort("impact_ns", descending=True).iter_rows(named=True):
        fit = fits.get(c["process_group"])
        mine = pl.col("process_group") == c["process_group"]
        # The CPU launches as before: a window shrinks only as far as its kernels' launches
        # let them move (launch_floor).
        floor = launch_floor(
            tables,
            calls.filter(mine & (pl.col("lost") > 0)).select(
                "rank", "step", at_ns="end_ns", remove_ns="lost"
            ),
        )
        # A share per (rank, step, collective) of the group's transfer rows, joined on them.
        fraction = (
            shares.filter(mine)
            .join(floor.select("rank", "step", "share"), on=["rank", "step"], how="left")
            .select(
                "rank",
                "step",
                "collective",
                fraction=pl.col("_share") * pl.col("share").fill_null(1.0),
            )
        )
        edit = Edit(
            f"run group {c['process_group']}'s {', '.join(c['collective'])} at "
            f"{c['reference']:.1f} GB/s bus bandwidth (the CPU's launches unchanged)",
            (pl.col("category") == "transfer")
            & (pl.col("process_group") == c["process_group"])
            & pl.col("collective").is_in(list(c["collective"])),
            fraction,
            shortens=True,
        )
        saving = replay_saving(tables, edit)
        share = saving / step_ns if step_ns else 0.0
        # A slow group whose faster calls would not shorten the step is no finding.
        sev = share_severity(share, options)
        if sev is None:
            continue
        if c["reference_kind"] == "hardware":
            speed = f"run at {_hardware_words(c)}"
        else:
            against = "the link" if c["reference_kind"] == "link_busbw_gbps" else "the best"
            speed = (
                f"run at a median {c['median_busbw']:.1f} GB/s bus bandwidth against "
                f"{c['reference']:.1f} GB/s ({against}"
                f"{' comparable group' if against == 'the best' else ''})"
            )
        out.append(
            make_finding(
                low_bus_bandwidth,
                sev,
                f"Group {c['process_group']} reaches {c['median_busbw']:.1f} GB/s bus "
                f"bandwidth of {c['reference']:.1f}",
                f"Large {', '.join(c['collective'])} calls on group {c['process_group']} "
                f"({c['role']}) {speed}; the exposed "
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
                    "reference": c["reference_kind"],
                    "exposed_lost_ns_per_step": int(c["impact_ns"]),
                    "latency_ns": None if fit is None else int(fit["latency_ns"]),
                    "fitted_busbw_gbps": None if fit is None else round(fit["busbw_gbps"], 2),
                    "step_ns": step_ns,
                    "saving_method": f"replay: {edit.name}",
                    # Against the hardware table: its model, link and the share reached.
                    **(
                        {
                            "gpu": c["gpu"],
                            "link": c["gpu_link"],
                            "speed_of_light": round(c["worst_busbw"] / c["worst_reference"], 4),
                        }
                        if c["reference_kind"] == "hardware"
                        else {}
                    ),
                },
                edit=edit,
                advice=_link_advice(
                    job_platform(tables).backend,
                    "Run nccl-tests (all_reduce_perf -b 1M -e 1G) on exactly these ranks' "
                    + (
                        f"hosts: at 256 MB and more this link should reach about "
                        f"{c['worst_reference']:.0f} GB/s bus bandwidth for "
                        f"{c['worst']} (docs/hardware.md)."
                        if c["reference_kind"] == "hardware"
                        else "hosts and compare with a healthy group."
                    ),
                ),
            )
        )
    return out


def _p2p_findings(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """NET101 on point-to-point groups (a pipeline's sends and receives), from the matched
    send/recv pairs of collective_instances (each pair's shortest call is its transfer).
    Their messages (a micro-batch's activations) are latency-bound at link speed, so a
    group is compared with the best group of its role only, never with `link_busbw_gbps`.
    The saving is replayed on the group's pipeline_bubble rows (its calls' time lives
    there, with the waits for the neighbouring stage): each row loses what its calls save
    at the reference (median transfer at its size less bytes / reference), at most its
    time, where it is on the rank's timeline; a row that waited for the other stage loses
    its transfer's saving, and the replay re-times the wait itself, so the stages waiting
    for these calls gain as much as the other stage runs earlier."""
    if not tables.has("collective_instances", "transfer_ns", "key_kind", "busbw_gbps"):
        return []
    pairs = with_roles(
        tables,
        tables["collective_instances"]
        .filter(
            pl.col("collective").is_in(P2P)
            & (pl.col("ranks_seen") > 1)
            & (pl.col("bytes") >= options["min_bytes"])
            & (pl.col("transfer_ns") > 0)
        )
        .select(
            pl.col("process_group").cast(pl.String),
            "bytes",
            "transfer_ns",
            busbw="busbw_gbps",  # the instances' own (nccl-tests: factor 1 for send/recv)
        ),
    )
    if pairs.height == 0:
        return []
    groups = (
        pairs.group_by("process_group", "role")
        .agg(median_busbw=pl.col("busbw").median(), calls=pl.len())
        .with_columns(reference=pl.col("median_busbw").max().over("role"))
        .with_columns(ratio=pl.col("median_busbw") / pl.col("reference"))
    )
    slow = groups.filter((pl.col("ratio") < options["min_ratio"]) & (pl.col("calls") > 0))
    if slow.height == 0:
        return []
    # Per group and message size, the time a call saves at the reference.
    sizes = (
        pairs.join(slow.select("process_group", "reference"), on="process_group")
        .group_by("process_group", "bytes")
        .agg(_t=pl.col("transfer_ns").median(), reference=pl.col("reference").first())
        .with_columns(
            _saved=(pl.col("_t") - pl.col("bytes") / pl.col("reference")).clip(lower_bound=0)
        )
        .select("process_group", "bytes", "_saved")
    )
    calls = tables.collect(
        collective_exposure_lazy(tables, transfer_only=True)
        .filter(pl.col("collective").is_in(P2P))
        .select(
            pl.col("rank").cast(pl.Int64),
            pl.col("step").cast(pl.Int64),
            pl.col("process_group").cast(pl.String),
            "bytes",
            "exposed_ns",
        )
        .join(sizes.lazy(), on=["process_group", "bytes"], how="inner")
        .with_columns(
            lost=pl.min_horizontal(pl.col("exposed_ns").cast(pl.Float64), pl.col("_saved"))
        )
    )
    step_ns = mean_step_ns(tables)
    out = []
    for g in slow.sort("ratio", "process_group").iter_rows(named=True):
        mine = calls.filter(pl.col("process_group") == g["process_group"])
        per = mine.group_by("rank", "step").agg(
            remove_ns=pl.col("lost").sum().round().cast(pl.Int64)
        )
        if per.height == 0:
            continue
        # Taken out where the transfers are: each of the group's pipeline rows loses what
        # its calls save (the group's mean over its sizes), at most its time; a row holds
        # one call on the timeline, several in the blame's sums. The replay moves what
        # follows them; where a row waited for the neighbouring stage, its transfer's
        # saving counts after that stage's arrival (the edit shortens).
        saved = float(mine["_saved"].mean() or 0.0)
        edit = Edit(
            f"run group {g['process_group']}'s point-to-point transfers at "
            f"{g['reference']:.1f} GB/s (the best {g['role']} group's)",
            (pl.col("category") == "pipeline_bubble")
            & (pl.col("process_group") == g["process_group"]),
            pl.when(pl.col("ns") > 0)
            .then(pl.col("calls").cast(pl.Float64) * saved / pl.col("ns"))
            .otherwise(0.0),
            shortens=True,
        )
        saving = replay_saving(tables, edit)
        share = saving / step_ns if step_ns else 0.0
        sev = share_severity(share, options)
        if sev is None:
            continue
        ranks = sorted(per["rank"].unique().to_list())
        lost = impact_per_step(mine.select("rank", "step", "lost"), "lost", tables=tables)
        lost_ns = int(lost["impact_ns"][0]) if lost.height else 0
        out.append(
            make_finding(
                low_bus_bandwidth,
                sev,
                f"Group {g['process_group']} reaches {g['median_busbw']:.1f} GB/s "
                f"point-to-point of {g['reference']:.1f}",
                f"Point-to-point transfers on group {g['process_group']} ({g['role']}) run "
                f"at a median {g['median_busbw']:.1f} GB/s against {g['reference']:.1f} GB/s "
                f"(the best {g['role']} group); the exposed part of the difference costs "
                f"{lost_ns / 1e6:.2f} ms per step on the worst rank; at the reference the "
                f"step would be {saving / 1e6:.2f} ms shorter.",
                impact_ns_per_step=saving,
                step_ns=step_ns,
                ranks=ranks,
                steps=lost["steps"][0].to_list() if lost.height else [],
                process_group=g["process_group"],
                evidence={
                    "collectives": ["send_recv"],
                    "median_busbw_gbps": round(g["median_busbw"], 2),
                    "reference_busbw_gbps": round(g["reference"], 2),
                    "reference": "best group",
                    "exposed_lost_ns_per_step": lost_ns,
                    "step_ns": step_ns,
                    "saving_method": f"replay: {edit.name}",
                },
                edit=edit,
                advice=_link_advice(
                    job_platform(tables).backend,
                    "Run nccl-tests (sendrecv_perf -b 1M -e 1G) between exactly these "
                    "neighbouring stages' hosts and compare with a healthy pipeline.",
                ),
            )
        )
    return out


# No expectation (the `expected_busbw` table's columns NET101 joins, without rows).
_NO_EXPECTED = pl.DataFrame(
    schema={
        "process_group": pl.String,
        "collective": pl.String,
        "expected": pl.Float64,
        "gpu": pl.String,
        "gpu_link": pl.String,
        "scope": pl.String,
    }
)


def _expected(tables: Tables) -> pl.DataFrame:
    """Per (process_group, collective): what the hardware table gives the group's link
    (the `expected_busbw` table, analysis/hardware.py), with the GPU model's name; none
    where ranks share a GPU (CAPT101 then stands the rule down) or the link is unknown."""
    if not tables.has("expected_busbw", "expected_busbw_gbps"):
        return _NO_EXPECTED
    exp = tables["expected_busbw"]
    labels = pl.DataFrame(schema={"gpu": pl.String, "label": pl.String})
    if tables.has("hardware", "gpu", "gpu_label"):
        labels = tables["hardware"].select("gpu", label="gpu_label").drop_nulls().unique("gpu")
    return (
        exp.join(labels, on="gpu", how="left")
        .select(
            pl.col("process_group").cast(pl.String),
            pl.col("collective").cast(pl.String),
            expected=pl.col("expected_busbw_gbps"),
            gpu=pl.coalesce("label", "gpu"),
            gpu_link=pl.col("link"),
            scope=pl.col("scope"),
        )
        .cast(_NO_EXPECTED.schema)
    )


def _hardware_words(c: dict[str, Any]) -> str:
    """'X GB/s of the Y GB/s an H100 SXM NVLink4/NVSwitch all_reduce reaches (nccl-tests),
    Z%': the group's collective furthest below its figure."""
    share = c["worst_busbw"] / c["worst_reference"] if c["worst_reference"] else 0.0
    link = _link_name(c)
    return (
        f"{c['worst_busbw']:.1f} GB/s of the {c['worst_reference']:.1f} GB/s {link} "
        f"{c['worst']} reaches (nccl-tests), {100 * share:.0f}%"
    )


# A latency fit needs message sizes this far apart (largest / smallest bus bytes).
FIT_MIN_SPREAD = 1.5


def _latency_fits(tables: Tables, big: pl.LazyFrame, slow: pl.DataFrame) -> dict[str, dict]:
    """Per slow group whose large calls come in sizes at least FIT_MIN_SPREAD apart: the
    least-squares line through (bus bytes, median transfer time) of each size, over its
    slow collectives: `latency_ns` (the intercept, at least 0) and `busbw_gbps` (1 / slope).
    Groups with one size (or a line that does not fit) are left out: their saving counts
    the latency as bandwidth."""
    size = pl.col("group_size").fill_null(pl.col("ranks_seen"))
    points = tables.collect(
        big.join(
            slow.lazy().select("process_group", "collective"),
            on=["process_group", "collective"],
            how="inner",
        )
        .with_columns(_bus=pl.col("bytes") * busbw_factor(pl.col("collective"), size))
        .group_by("process_group", "_bus")
        .agg(_t=pl.col("transfer_ns").median())
    )
    out: dict[str, dict] = {}
    for (group,), rows in points.group_by(["process_group"]):
        x, y = rows["_bus"].cast(pl.Float64), rows["_t"].cast(pl.Float64)
        if rows.height < 2 or x.min() <= 0 or x.max() < FIT_MIN_SPREAD * x.min():
            continue
        mx, my = x.mean(), y.mean()
        var = float(((x - mx) ** 2).sum())
        slope = float(((x - mx) * (y - my)).sum()) / var if var > 0 else 0.0
        if slope <= 0:
            continue
        latency = max(0.0, float(my - slope * mx))
        if latency >= float(y.min()):
            continue
        out[str(group)] = {"latency_ns": latency, "busbw_gbps": 1.0 / slope}
    return out


def replay_at_hardware(
    tables: Tables, groups: list[str], collective: str, min_bytes: int = 16 << 20
) -> tuple[float, float, str] | None:
    """What running `collective` on `groups` at the bus bandwidth the hardware table gives
    their link would save: (replayed saving ns per step, expected GB/s, the link in words),
    or None where the table gives none. Its calls of at least `min_bytes` end earlier by
    transfer - bus bytes / expected (a fixed latency counted as slowness), their exposed
    tails shrink by at most that, the CPU's launches unchanged (as NET101's replay)."""
    expected = _expected(tables).filter(
        pl.col("process_group").is_in(groups) & (pl.col("collective") == collective)
    )
    if expected.height == 0 or collective in P2P:
        return None
    calls = tables.collect(
        collective_exposure_lazy(tables, transfer_only=True)
        .filter(
            pl.col("process_group").is_in(groups)
            & (pl.col("collective") == collective)
            & (pl.col("bytes") >= min_bytes)
            & (pl.col("transfer_ns") > 0)
        )
        .join(expected.lazy().select("process_group", "expected"), on="process_group")
        .with_columns(
            saved=(
                pl.col("transfer_ns")
                - pl.col("bytes")
                * busbw_factor(pl.col("collective"), group_size())
                / pl.col("expected")
            ).clip(lower_bound=0.0)
        )
        .select(
            pl.col("rank").cast(pl.Int64),
            pl.col("step").cast(pl.Int64),
            "end_ns",
            "exposed_ns",
            lost=pl.min_horizontal(pl.col("exposed_ns").cast(pl.Float64), pl.col("saved")),
        )
    )
    worst = expected.sort("expected").row(0, named=True)
    words = f"{worst['expected']:.0f} GB/s, what {_link_name(worst)} {collective} reaches"
    if calls.height == 0:
        return 0.0, float(worst["expected"]), words
    floor = launch_floor(
        tables,
        calls.filter(pl.col("lost") > 0).select("rank", "step", at_ns="end_ns", remove_ns="lost"),
    )
    fraction = (
        calls.group_by("rank", "step")
        .agg(_lost=pl.col("lost").sum(), _exposed=pl.col("exposed_ns").sum())
        .join(floor.select("rank", "step", "share"), on=["rank", "step"], how="left")
        .select(
            "rank",
            "step",
            collective=pl.lit(collective),
            fraction=pl.when(pl.col("_exposed") > 0)
            .then(pl.col("_lost") / pl.col("_exposed"))
            .otherwise(0.0)
            * pl.col("share").fill_null(1.0),
        )
    )
    edit = Edit(
        f"run {collective} on groups {', '.join(groups)} at {worst['expected']:.1f} GB/s bus "
        "bandwidth (the hardware table's; the CPU's launches unchanged)",
        (pl.col("category") == "transfer")
        & pl.col("process_group").is_in(groups)
        & (pl.col("collective") == collective),
        fraction,
        shortens=True,
    )
    return float(replay_saving(tables, edit)), float(worst["expected"]), words


def _link_name(row: dict[str, Any]) -> str:
    """'an H100 SXM NVLink4/NVSwitch', 'a 400 Gb/s InfiniBand (NDR) ... across hosts': the
    article as the name is read out (an H100, an MI300X, a V100, a B200)."""
    if row["scope"] == "inter-node":
        where = f"{row['gpu_link']} across hosts"
    else:
        where = f"{row['gpu']} {row['gpu_link']}"
    return ("an " if where[:1].upper() in "AEFHILMNORSX" else "a ") + where
