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
EXPECTED_SCHEMA = {
    "process_group": pl.String,
    "collective": pl.String,
    "scope": pl.String,
    "gpu": pl.String,
    "link": pl.String,
    "network": pl.String,
    "expected_busbw_gbps": pl.Float64,
    "source": pl.String,
}


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
    regex = not _patterns_compile(table)
    for kind, entries in table.items():
        for key, entry in entries.items():
            _check(f"hardware.{kind}.{key}", entry, kind == "gpu", regex)
    return table


def _patterns_compile(table: Mapping[str, Any]) -> bool:
    """True when every `match` pattern of the table compiles, tried in one query (one per
    pattern is a query per model); False sends `_check` to try each, to name the bad one."""
    try:
        patterns = [p for es in table.values() for e in es.values() for p in e.get("match", [])]
        pl.select(pl.lit("").str.contains(f"(?i){p}").alias(str(i)) for i, p in enumerate(patterns))
    except Exception:  # noqa: BLE001 (whatever it is, `_check` says it for the entry)
        return False
    return True


def _merge(into: dict[str, Any], values: Mapping[str, Any]) -> None:
    for k, v in values.items():
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _check(where: str, entry: Mapping[str, Any], gpu: bool, regex: bool = True) -> None:
    """ValueError for what the analysis cannot use (`regex`: each pattern tried too)."""
    if gpu and not (isinstance(entry.get("match"), list) and entry["match"]):
        raise ValueError(f"{where}.match must be a list of patterns")
    for pattern in entry.get("match", []) if regex else []:
        try:  # Polars' (Rust) regex syntax: the one the names are matched with
            pl.select(pl.lit("").str.contains(f"(?i){pattern}"))
        except (pl.exceptions.PolarsError, TypeError) as exc:
            why = str(exc).strip().splitlines()
            raise ValueError(
                f"{where}.match: {pattern!r} is no pattern ({why[-1] if why else exc})"
            ) from None
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
    return pl.select(_model_of(pl.lit(name, pl.String), table)).item()


def gpu_frame(table: Mapping[str, Any]) -> pl.DataFrame:
    """One row per model of the table: gpu, gpu_label, link, bf16_tflops, hbm_tbps."""
    rows = [
        {
            "gpu": key,
            "gpu_label": e.get("label", key),
            "link": e.get("link"),
            "bf16_tflops": e.get("bf16_tflops"),
            "hbm_tbps": e.get("hbm_tbps"),
        }
        for key, e in table["gpu"].items()
    ]
    return pl.DataFrame(rows, schema={k: RANK_SCHEMA[k] for k in RANK_COLUMNS[7:]})


def _model_of(name: pl.Expr, table: Mapping[str, Any]) -> pl.Expr:
    """gpu_of as an expression: the first entry (in the table's order) a pattern of which
    matches the name, case-insensitive; null for none."""
    out = pl.lit(None, pl.String)
    for key, entry in reversed(list(table["gpu"].items())):
        pattern = "|".join(f"(?:{p})" for p in entry.get("match", []))
        out = pl.when(name.str.contains(f"(?i){pattern}")).then(pl.lit(key)).otherwise(out)
    return out


def rank_hardware(
    devices: Mapping[int, list[dict[str, Any]]],
    device_ids: pl.DataFrame,
    hosts: pl.DataFrame,
    table: Mapping[str, Any],
    gpu_model: str | None = None,
) -> pl.DataFrame:
    """RANK_COLUMNS per rank of `devices` ({rank: its header's deviceProperties, as dicts
    of id, name, sms, memory_bytes, compute_capability}): the device its kernels ran on
    (`device_ids`: rank, device; the listed device of that id), its model in `table` and
    that model's figures (a rank with no device calls: the only device its header lists).
    `gpu_model` (the config's) names the model of every rank with a device. `hosts`: rank,
    host (null where unknown)."""
    schema = {
        "rank": pl.Int64,
        "id": pl.Int64,
        "name": pl.String,
        "sms": pl.Int64,
        "memory_bytes": pl.Int64,
        "compute_capability": pl.String,
    }
    listed = pl.DataFrame(
        [{**d, "rank": r} for r, ds in devices.items() for d in ds], schema=schema, strict=False
    ).with_columns(_listed=pl.len().over("rank"))
    ranks = pl.DataFrame({"rank": sorted(devices)}, schema={"rank": pl.Int64})
    ids = (
        device_ids.filter(pl.col("device") >= 0)
        .group_by(pl.col("rank").cast(pl.Int64))
        .agg(device_id=pl.col("device").min().cast(pl.Int64))
    )
    host = hosts.select(pl.col("rank").cast(pl.Int64), "host") if hosts.height else None
    per = ranks.join(ids, on="rank", how="left")
    by_id = per.join(listed, left_on=["rank", "device_id"], right_on=["rank", "id"], how="inner")
    only = per.join(listed.filter(pl.col("_listed") == 1), on="rank", how="inner").drop("id")
    chosen = pl.concat([by_id, only], how="diagonal_relaxed").unique("rank", keep="first")
    named = pl.col("name")
    model = pl.lit(gpu_model) if gpu_model else _model_of(named, table)
    out = (
        per.join(chosen.drop("device_id"), on="rank", how="left")
        .with_columns(
            gpu=pl.when(named.is_not_null() | pl.col("device_id").is_not_null()).then(model),
            host=pl.lit(None, pl.String),
        )
        .rename({"name": "device_name"})
    )
    if host is not None:
        out = out.drop("host").join(host, on="rank", how="left")
    out = out.join(gpu_frame(table), on="gpu", how="left")
    return out.select(RANK_COLUMNS).cast(RANK_SCHEMA).sort("rank")


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
    """EXPECTED_SCHEMA: what each group's link should give per collective of the table
    (send and recv as send_recv). Intra-node: its model's figure. Inter-node: the
    network's per GPU times the fewest ranks the group has on one host, at most the
    model's intra-node figure (link_figures); none without a network. No scope or no
    model: no rows."""
    intra = pl.DataFrame(
        [
            {
                "gpu": key,
                "collective": coll,
                "_intra": float(v),
                "_link": e.get("link"),
                "_source": e.get("source", {}).get("busbw_gbps"),
            }
            for key, e in table["gpu"].items()
            for coll, v in e.get("busbw_gbps", {}).items()
        ],
        schema={
            "gpu": pl.String,
            "collective": pl.String,
            "_intra": pl.Float64,
            "_link": pl.String,
            "_source": pl.String,
        },
    )
    net = table["network"].get(network) if network else None
    per_gpu = pl.DataFrame(
        {
            "collective": list((net or {}).get("busbw_gbps", {})),
            "_net": [float(v) for v in (net or {}).get("busbw_gbps", {}).values()],
        },
        schema={"collective": pl.String, "_net": pl.Float64},
    )
    across = pl.col("scope") == "inter-node"
    rows = (
        links.filter(pl.col("scope").is_in(["intra-node", "inter-node"]))
        .join(intra, on="gpu", how="inner")
        .join(per_gpu, on="collective", how="left")
        .filter(~across | pl.col("_net").is_not_null())
    )
    fewest = pl.col("ranks_per_host").fill_null(1).clip(lower_bound=1).cast(pl.Float64)
    return rows.select(
        "process_group",
        "collective",
        "scope",
        "gpu",
        link=pl.when(across).then(pl.lit((net or {}).get("label", network))).otherwise("_link"),
        network=pl.when(across).then(pl.lit(network)),
        expected_busbw_gbps=pl.when(across)
        .then(pl.min_horizontal("_intra", pl.col("_net") * fewest))
        .otherwise("_intra"),
        source=pl.when(across).then(pl.lit((net or {}).get("source"))).otherwise("_source"),
    ).cast(EXPECTED_SCHEMA)


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
