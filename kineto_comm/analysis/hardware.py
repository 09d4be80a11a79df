"""What the hardware should give: each rank's GPU model and each group's expected bus bandwidth.

The table (kineto_comm/data/hardware.toml, docs/hardware.md) holds, per GPU model, the bus
bandwidth nccl-tests reaches at large sizes between the GPUs of one host, and per network
(`--network`) across hosts, each figure with its source. A rank's model comes from its
trace header's deviceProperties (the entry for the device id its kernels ran on), never
from a guess: a trace without one (gloo, CPU-only) has no expectation. A group is
intra-node when every rank is on one host (the offsets table's hosts, when they were
inferred); across hosts, only a network the user names has a figure, times the fewest
ranks the group has on one host (each GPU drives its own NIC), at most the intra-node one.
Ranks that share one device (time-sliced captures) have no expectation: their data moves
at the capture's speed. `speed_of_light` = achieved busbw / expected: how much of what the
link should give a call reached.
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Mapping
from importlib import resources
from typing import Any

import polars as pl

# The table's collective names: send, recv and send_recv share sendrecv_perf's figure.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
_AS_TABLE = {"send": "send_recv", "recv": "send_recv", "send_recv": "send_recv"}
_FIGURES = ("bf16_tflops", "hbm_tbps", "busbw_gbps")
# The config's [hardware] keys: the network between hosts, the GPU model of every rank (over
# what the traces say), overrides of the table's entries: gpu.KEY.FIELD, networks.NAME.FIELD.
CONFIG_KEYS = ("network", "gpu_model", "gpu", "networks")
RANK_COLUMNS = (
    "rank",
    "host",
    "device_id",
    "device_name",
    "sms",
    "memory_bytes",
    "compute_capability",
    "gpu",
    "gpu_label",
    "link",
    "bf16_tflops",
    "hbm_tbps",
)
RANK_SCHEMA = {
    "rank": pl.Int64,
    "host": pl.String,
    "device_id": pl.Int64,
    "device_name": pl.String,
    "sms": pl.Int64,
    "memory_bytes": pl.Int64,
    "compute_capability": pl.String,
    "gpu": pl.String,
    "gpu_label": pl.String,
    "link": pl.String,
    "bf16_tflops": pl.Float64,
    "hbm_tbps": pl.Float64,
}
LINK_COLUMNS = ("process_group", "scope", "gpu", "link", "ranks_per_host")
EXPECTED_COLUMNS = ("expected_busbw_gbps", "speed_of_light")


def load_table(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The hardware table, the package's file with `overrides` (the config's [hardware]
    section: `gpu.KEY.FIELD`, `network.NAME.FIELD`, deep-merged) on top. ValueError naming
    the key for a value that is not a positive number or a model without `match`."""
    text = resources.files("kineto_comm").joinpath("data/hardware.toml").read_text("utf-8")
    table = tomllib.loads(text)
    for kind in ("gpu", "network"):
        extra = (overrides or {}).get(kind, {})
        if not isinstance(extra, Mapping):
            raise ValueError(f"hardware.{kind} must be a table")
        for key, values in extra.items():
            if not isinstance(values, Mapping):
                raise ValueError(f"hardware.{kind}.{key} must be a table")
            entry = table[kind].setdefault(key, {})
            _merge(entry, copy.deepcopy(dict(values)))
    for kind, entries in table.items():
        for key, entry in entries.items():
            _check(f"hardware.{kind}.{key}", entry, kind == "gpu")
    return table


def _merge(into: dict[str, Any], values: Mapping[str, Any]) -> None:
    for k, v in values.items():
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _check(where: str, entry: Mapping[str, Any], gpu: bool) -> None:
    """ValueError for what the analysis cannot use."""
    if gpu and not (isinstance(entry.get("match"), list) and entry["match"]):
        raise ValueError(f"{where}.match must be a list of patterns")
    for pattern in entry.get("match", []):
        try:
            re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise ValueError(f"{where}.match: {pattern!r} is no pattern ({exc})") from None
    busbw = entry.get("busbw_gbps", {})
    if not isinstance(busbw, Mapping):
        raise ValueError(f"{where}.busbw_gbps must be a table of collective = GB/s")
    figures = {f"busbw_gbps.{k}": v for k, v in busbw.items()}
    figures |= {k: entry[k] for k in ("bf16_tflops", "hbm_tbps") if k in entry}
    for name, v in figures.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{where}.{name} must be a number > 0, got {v!r}")
    unknown = set(busbw) - set(COLLECTIVES)
    if unknown:
        raise ValueError(
            f"{where}.busbw_gbps: unknown collective(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(COLLECTIVES)}"
        )


def gpu_of(name: str | None, table: Mapping[str, Any]) -> str | None:
    """The table's key for a deviceProperties name: the first entry one of whose patterns
    matches (case-insensitive); None for no name or no match."""
    if not name:
        return None
    for key, entry in table["gpu"].items():
        if any(re.search(p, name, re.IGNORECASE) for p in entry.get("match", [])):
            return key
    return None


def rank_hardware(
    devices: Mapping[int, list[dict[str, Any]]],
    device_ids: pl.DataFrame,
    hosts: pl.DataFrame,
    table: Mapping[str, Any],
    gpu_model: str | None = None,
) -> pl.DataFrame:
    """RANK_COLUMNS per rank of `devices` ({rank: its header's deviceProperties, as dicts
    of id, name, sms, memory_bytes, compute_capability}): the device its kernels ran on
    (`device_ids`: rank, device; the listed device of that id, else the only one listed),
    its model in `table` and that model's figures. `gpu_model` (the config's) names the
    model of every rank with a device. `hosts`: rank, host (null where unknown)."""
    ids = {
        int(r): int(d)
        for r, d in device_ids.filter(pl.col("device") >= 0)
        .group_by("rank")
        .agg(pl.col("device").min())
        .iter_rows()
    }
    host = dict(hosts.select("rank", "host").iter_rows()) if hosts.height else {}
    rows = []
    for rank, listed in sorted(devices.items()):
        dev_id = ids.get(rank)
        chosen = next((d for d in listed if d.get("id") == dev_id), None)
        if chosen is None and len(listed) == 1:
            chosen = listed[0]
        key = None
        if chosen is not None:
            key = gpu_model if gpu_model else gpu_of(chosen.get("name"), table)
        entry = table["gpu"].get(key, {}) if key else {}
        chosen = chosen or {}
        rows.append(
            {
                "rank": rank,
                "host": host.get(rank),
                "device_id": dev_id,
                "device_name": chosen.get("name"),
                "sms": chosen.get("sms"),
                "memory_bytes": chosen.get("memory_bytes"),
                "compute_capability": chosen.get("compute_capability"),
                "gpu": key,
                "gpu_label": entry.get("label", key),
                "link": entry.get("link"),
                "bf16_tflops": entry.get("bf16_tflops"),
                "hbm_tbps": entry.get("hbm_tbps"),
            }
        )
    return pl.DataFrame(rows, schema=RANK_SCHEMA)


def group_links(
    members: pl.DataFrame, ranks: pl.DataFrame, host_source: str | None
) -> pl.DataFrame:
    """LINK_COLUMNS per process group of `members` (process_group, rank): `scope`
    (`intra-node`, `inter-node`, `shared device`: ranks on one GPU, or null: hosts not
    known, or a rank whose calls ran on no device), the group's GPU model (null unless
    every rank has the same one), the link and the fewest ranks it has on one host.
    `ranks`: rank_hardware's table; `host_source`: how the hosts were inferred (offsets
    table; `unknown` is no layout)."""
    known_hosts = host_source not in (None, "unknown")
    per = members.select(pl.col("process_group").cast(pl.String), pl.col("rank").cast(pl.Int64))
    per = per.unique().join(ranks, on="rank", how="left")
    on_host = per.group_by("process_group", "host").agg(n=pl.len())
    fewest = on_host.group_by("process_group").agg(ranks_per_host=pl.col("n").min())
    agg = per.group_by("process_group").agg(
        n=pl.len(),
        hosts=pl.col("host").n_unique(),
        null_hosts=pl.col("host").null_count(),
        devices=pl.struct("host", "device_id").n_unique(),
        null_devices=pl.col("device_id").null_count(),
        models=pl.col("gpu").n_unique(),
        null_models=pl.col("gpu").null_count(),
        gpu=pl.col("gpu").first(),
        link=pl.col("link").first(),
    )
    scope = (
        # A rank whose calls ran on no device (gloo: the host) moves no data over the GPUs'.
        pl.when(pl.col("null_devices") > 0)
        .then(pl.lit(None, pl.String))
        .when(pl.col("devices") < pl.col("n"))
        .then(pl.lit("shared device"))
        .when(~pl.lit(known_hosts) | (pl.col("null_hosts") > 0))
        .then(pl.lit(None, pl.String))
        .when(pl.col("hosts") == 1)
        .then(pl.lit("intra-node"))
        .otherwise(pl.lit("inter-node"))
    )
    one_model = (pl.col("models") == 1) & (pl.col("null_models") == 0)
    return (
        agg.join(fewest, on="process_group", how="left")
        .select(
            "process_group",
            scope=scope,
            gpu=pl.when(one_model).then("gpu"),
            link=pl.when(one_model).then("link"),
            ranks_per_host=pl.col("ranks_per_host").cast(pl.Int64),
        )
        .sort("process_group")
    )


def expected_busbw(
    links: pl.DataFrame, table: Mapping[str, Any], network: str | None
) -> pl.DataFrame:
    """process_group, collective, scope, gpu, link, network, expected_busbw_gbps, source: what
    each group's link should give per collective of the table (send and recv as send_recv).
    Intra-node: its model's figure. Inter-node: the network's per GPU times the fewest
    ranks the group has on one host, at most the model's intra-node figure; none without a
    network. No scope or no model: no rows."""
    gpus = table["gpu"]
    net = table["network"].get(network) if network else None
    rows = []
    for g in links.iter_rows(named=True):
        entry = gpus.get(g["gpu"]) if g["gpu"] else None
        if entry is None or g["scope"] not in ("intra-node", "inter-node"):
            continue
        across = g["scope"] == "inter-node"
        if across and net is None:
            continue
        figures = link_figures(entry, net if across else None, g["ranks_per_host"] or 1)
        if across:
            link, source = net.get("label", network), net.get("source")  # type: ignore[union-attr]
        else:
            link, source = entry.get("link"), entry.get("source", {}).get("busbw_gbps")
        for coll, value in figures.items():
            rows.append(
                {
                    "process_group": g["process_group"],
                    "collective": coll,
                    "scope": g["scope"],
                    "gpu": g["gpu"],
                    "link": link,
                    "network": network if across else None,
                    "expected_busbw_gbps": value,
                    "source": source,
                }
            )
    schema = {
        "process_group": pl.String,
        "collective": pl.String,
        "scope": pl.String,
        "gpu": pl.String,
        "link": pl.String,
        "network": pl.String,
        "expected_busbw_gbps": pl.Float64,
        "source": pl.String,
    }
    return pl.DataFrame(rows, schema=schema)


def link_figures(
    gpu: Mapping[str, Any], network: Mapping[str, Any] | None = None, ranks_per_host: int = 1
) -> dict[str, float]:
    """Per collective, the bus bandwidth (GB/s) a group of `gpu`'s should reach: inside a
    host (`network` None) the model's figure; across hosts the network's per GPU times
    `ranks_per_host` (the fewest the group has on a host: each drives its own NIC), at
    most the model's figure. The synthetic jobs' healthy links are these (kineto_comm.synth)."""
    intra = {k: float(v) for k, v in gpu.get("busbw_gbps", {}).items()}
    if network is None:
        return intra
    per_gpu = network.get("busbw_gbps", {})
    k = max(1, ranks_per_host)
    return {c: min(v, float(per_gpu[c]) * k) for c, v in intra.items() if c in per_gpu}


def table_collective(collective: pl.Expr) -> pl.Expr:
    """A call's collective in the table's names (send and recv: send_recv)."""
    return collective.replace(_AS_TABLE)


def with_speed_of_light(instances: pl.DataFrame, expected: pl.DataFrame) -> pl.DataFrame:
    """`instances` (collective_instances) with EXPECTED_COLUMNS: its group's expected bus
    bandwidth for its collective and busbw / expected (null where either is unknown)."""
    if instances.height == 0 and not instances.columns:
        return instances
    right = expected.select(
        pl.col("process_group"),
        pl.col("collective").alias("_coll"),
        "expected_busbw_gbps",
    )
    right = right.rename({"process_group": "_pg"})
    out = instances.drop(EXPECTED_COLUMNS, strict=False).with_columns(
        _pg=pl.col("process_group").cast(pl.String),
        _coll=table_collective(pl.col("collective").cast(pl.String)),
    )
    out = out.join(right, on=["_pg", "_coll"], how="left", maintain_order="left")
    return out.drop("_pg", "_coll").with_columns(
        speed_of_light=pl.when(pl.col("expected_busbw_gbps") > 0).then(
            pl.col("busbw_gbps") / pl.col("expected_busbw_gbps")
        )
    )


def hardware_tables(
    devices: Mapping[int, list[dict[str, Any]]],
    calls: Any,
    offsets: pl.DataFrame,
    instances: pl.DataFrame,
    table: Mapping[str, Any],
    network: str | None = None,
    gpu_model: str | None = None,
) -> dict[str, pl.DataFrame]:
    """The Report's `hardware` (per rank) and `expected_busbw` (per group and collective)
    tables, and `collective_instances` with EXPECTED_COLUMNS. `calls`: the per-rank
    collective calls (a RankStore: rank, device, process_group); `offsets`: rank, host,
    host_source."""
    from kineto_comm.lazy import collect

    if calls.height and {"rank", "device", "process_group"} <= set(calls.columns):
        used = collect(calls.lazy(["rank", "device", "process_group"]).unique(), calls.height)
    else:
        used = pl.DataFrame(
            schema={"rank": pl.Int64, "device": pl.Int64, "process_group": pl.String}
        )
    hosts = offsets.select("rank", "host") if "host" in offsets.columns else pl.DataFrame()
    source = None
    if "host_source" in offsets.columns and offsets.height:
        source = offsets["host_source"][0]
    ranks = rank_hardware(devices, used.select("rank", "device"), hosts, table, gpu_model)
    members = used.filter(pl.col("process_group").is_not_null()).select("process_group", "rank")
    links = group_links(members, ranks, source)
    expected = expected_busbw(links, table, network)
    return {
        "hardware": ranks,
        "expected_busbw": expected,
        "collective_instances": with_speed_of_light(instances, expected),
    }
