"""Match each collective call across the ranks of its group, and measure what happened.

A call is identified on every rank by a key that does not depend on clocks: its group's
sequence number (`seq`) when the trace records it, else its position among the rank's calls
of the same (group, collective) (`order`). Point-to-point transfers are keyed by direction
and position (a send meets its recv; a send_recv by the pair); a transfer without a peer
(`unpaired`), or a call naming no group on a rank in groups of different ranks
(`ungrouped`), stays alone rather than meet another group's calls. Unequal call counts
leave some instances seen by fewer ranks (`ranks_seen`), reported, never an error.

With matches in hand, `instances` and `waits` compute (on aligned clocks) arrival skew, the
wait of every rank, the transfer time (the shortest duration: the rank that did not wait) and
algbw / busbw by the nccl-tests definitions (see bandwidth.py).
In full: docs/analyses.md, "Matching calls across ranks".
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

import polars as pl

from kineto_comm.analysis.bandwidth import algbw_gbps, busbw_gbps, group_size
from kineto_comm.keys import pair_key
from kineto_comm.lazy import collect, in_rank_order
from kineto_comm.model.names import POINT_TO_POINT
from kineto_comm.rank_store import RankStore, SpillFolder, as_store, keep

P2P = POINT_TO_POINT  # send, recv, send_recv: calls with one peer
MATCH_COLUMNS = (
    "rank",
    "device",
    "process_group",
    "collective",
    "peer",
    "seq",
    "call_index",
    "step",
    "group_size",
    "bytes",
    "start_ns",
    "end_ns",
    "duration_ns",
)
INSTANCE_COLUMNS = (
    "instance",
    "process_group",
    "collective",
    "key_kind",
    "key",
    "step",
    "ranks_seen",
    "group_size",
    "bytes",
    "first_start_ns",
    "last_start_ns",
    "arrival_skew_ns",
    "first_end_ns",
    "last_end_ns",
    "transfer_ns",
    "max_duration_ns",
    "last_rank",
    "algbw_gbps",
    "busbw_gbps",
)
WAIT_COLUMNS = (
    "instance",
    "rank",
    "start_ns",
    "end_ns",
    "duration_ns",
    "wait_ns",
    "arrived_last",
)


def match_keys(collectives: pl.DataFrame, ungrouped: Collection[int] = ()) -> pl.DataFrame:
    """Per-rank collective rows (their MATCH_COLUMNS) with `instance` (a match id),
    `key_kind` and `key` added (`ungrouped`: ranks_in_several_groups)."""
    return keyed_calls(RankStore.from_frame(collectives), ungrouped=ungrouped).frame()


def ranks_in_several_groups(ranks: pl.DataFrame) -> list[int]:
    """The ranks whose pg_config lists groups of different ranks (the ranks table's
    `pg_rank_sets` above 1): a call there that names no group cannot be told to be on one
    of them."""
    if "pg_rank_sets" not in ranks.columns:
        return []
    return sorted(ranks.filter(pl.col("pg_rank_sets") > 1).get_column("rank").to_list())


def ungrouped_warning(table: pl.DataFrame) -> list[str]:
    """A warning when some calls were kept alone for naming no group on ranks in several
    (`table`: the collective_instances): their waits, skew and stragglers are not measured,
    and their whole durations count as transfers."""
    if table.height == 0 or "key_kind" not in table.columns:
        return []
    alone = table.filter(pl.col("key_kind") == "ungrouped")
    if alone.height == 0:
        return []
    ranks = sorted(
        alone.get_column("key").str.extract(r"^r(-?\d+):", 1).cast(pl.Int64).unique().to_list()
    )
    shown = ", ".join(map(str, ranks[:8])) + (
        f" and {len(ranks) - 8} more" if len(ranks) > 8 else ""
    )
    return [
        f"{alone.height} calls name no process group on ranks {shown}, each of which is in "
        "groups of different ranks (pg_config; gloo traces record no group per call): which "
        "ranks each call joined cannot be told, so they are matched with no other rank's: "
        "no waits, arrival skew or stragglers are measured for them, and their whole "
        "durations count as transfers"
    ]


def keyed_calls(
    calls: RankStore, folder: SpillFolder | None = None, ungrouped: Collection[int] = ()
) -> RankStore:
    """`match_keys` of every rank's calls, a batch of whole ranks at a time (kept in `folder`
    when given): what identifies a call depends on one rank's rows, and only the distinct
    calls, one row each, are numbered over all ranks together. On the `ungrouped` ranks
    (ranks_in_several_groups), a call that names no group is matched with no other rank's."""
    columns = [c for c in MATCH_COLUMNS if c in calls.columns]
    if calls.height == 0:
        return RankStore.from_frame(
            calls.frame(columns=columns or None).with_columns(
                instance=pl.lit(None, dtype=pl.Int64),
                key_kind=pl.lit(None, dtype=pl.String),
                key=pl.lit(None, dtype=pl.String),
            )
        )
    # A group uses sequence numbers only if every one of its rows has one.
    p2p = pl.col("collective").is_in(P2P) & pl.col("peer").is_not_null()
    seq_groups = collect(
        calls.lazy(["process_group", "collective", "peer", "seq"])
        .filter(~p2p)
        .group_by(_pg=_PG)
        .agg(_all_seq=pl.col("seq").is_not_null().all())
        .filter(pl.col("_all_seq"))
        .select("_pg"),
        calls.height,
    ).get_column("_pg")

    alone = pl.Series(sorted(ungrouped), dtype=pl.Int64)

    def batches() -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
        return (_parts(b, seq_groups, alone) for b in calls.batches(columns=columns))

    # Two passes: number the distinct calls, then give each row its number. A small job's
    # batches are held between them; a big job's are read again.
    held = list(batches()) if folder is None else None
    numbered = _numbered(_distinct(parts for _, parts in held or batches()))
    out = []
    for rows, parts in held or batches():
        ids = parts.join(numbered, on=_IDS, how="left", maintain_order="left", nulls_equal=True)
        out.append(keep(rows.with_columns(ids.select("key_kind", "key", "instance")), folder))
    return RankStore(out, folder=folder)


_PG = pl.col("process_group").fill_null("?")
_IDS = ["_pg", "key_kind", "_a", "_b", "_c", "_coll"]


def _distinct(batches: Iterable[pl.DataFrame]) -> pl.DataFrame:
    """The distinct rows of every batch. Merged whenever what is held has doubled: most
    calls are in every batch (each rank makes them), so one distinct set per batch would
    grow with the rank count (0.2 GiB at 8192 ranks)."""
    found: list[pl.DataFrame] = []
    held = merged = 0
    for batch in batches:
        found.append(batch.unique(_IDS))
        held += found[-1].height
        if len(found) > 1 and held > 2 * merged:
            found = [pl.concat(found).unique(_IDS)]
            held = merged = found[0].height
    return found[0] if len(found) == 1 else pl.concat(found).unique(_IDS)


def _parts(
    rows: pl.DataFrame, seq_groups: pl.Series, ungrouped: pl.Series
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Whole ranks' calls (in call order) and, row for row, the parts of their keys (the
    `ungrouped` ranks' calls without a group alone)."""
    rows = in_rank_order(rows)
    is_p2p = pl.col("collective").is_in(P2P)
    p2p = is_p2p & pl.col("peer").is_not_null()
    # A send_recv with a peer (a batch exchanging with one stage both ways) has no
    # direction: both ends key it by the pair, lower rank first.
    recv, both = pl.col("collective") == "recv", pl.col("collective") == "send_recv"
    sender = (
        pl.when(recv)
        .then(pl.col("peer"))
        .when(both)
        .then(pl.min_horizontal("rank", "peer"))
        .otherwise(pl.col("rank"))
    )
    receiver = (
        pl.when(recv)
        .then(pl.col("rank"))
        .when(both)
        .then(pl.max_horizontal("rank", "peer"))
        .otherwise(pl.col("peer"))
    )
    kind = (
        pl.when(p2p)
        .then(pl.lit("p2p"))
        .when(is_p2p)
        .then(pl.lit("unpaired"))
        .when(pl.col("process_group").is_null() & pl.col("rank").is_in(ungrouped.implode()))
        .then(pl.lit("ungrouped"))
        .when(_PG.is_in(seq_groups.implode()))
        .then(pl.lit("seq"))
        .otherwise(pl.lit("order"))
    )
    # Only the columns a key is made of (the rows themselves are not copied).
    parts = rows.select(
        "rank",
        "collective",
        "seq",
        "call_index",
        _pg=_PG,
        key_kind=kind,
        _sender=sender,
        _receiver=receiver,
    )
    # Positions among the rank's calls with the same direction or number, where some key
    # needs them (most jobs have no point-to-point transfers).
    kinds = set(parts.get_column("key_kind").unique())
    parts = parts.with_columns(
        _p2p_ordinal=_ordinal(parts, "rank", "_pg", "_sender", "_receiver")
        if "p2p" in kinds
        else pl.lit(None, dtype=pl.Int64),
        _seq_ordinal=_ordinal(parts, "rank", "_pg", "seq")
        if "seq" in kinds
        else pl.lit(None, dtype=pl.Int64),
    )
    # What identifies a call across ranks, by kind (the rank only for calls kept alone).
    k = pl.col("key_kind")
    alone = k.is_in(["unpaired", "ungrouped"])
    parts = parts.select(
        "_pg",
        "key_kind",
        _a=pl.when(k == "p2p")
        .then(pl.col("_sender"))
        .when(k == "seq")
        .then(pl.col("seq"))
        .when(alone)
        .then(pl.col("rank"))
        .otherwise(pl.col("call_index")),
        _b=pl.when(k == "p2p")
        .then(pl.col("_receiver"))
        .when(k == "seq")
        .then(pl.col("_seq_ordinal"))
        .when(alone)
        .then(pl.col("call_index")),
        _c=pl.when(k == "p2p").then(pl.col("_p2p_ordinal")),
        _coll=pl.when(alone | (k == "order")).then(pl.col("collective")),
    )
    return rows, parts


def _numbered(calls: pl.DataFrame) -> pl.DataFrame:
    """The distinct calls (their key parts) with their key and instance number: a dense rank
    in (group, kind, key) order."""
    k = pl.col("key_kind")
    key = (
        pl.when(k == "p2p")
        .then(pl.format("{}>{}#{}", pl.col("_a"), pl.col("_b"), pl.col("_c")))
        .when(k == "seq")
        .then(pl.format("{}.{}", pl.col("_a"), pl.col("_b")))
        .when(k.is_in(["unpaired", "ungrouped"]))
        .then(pl.format("r{}:{}#{}", pl.col("_a"), pl.col("_coll"), pl.col("_b")))
        .otherwise(pl.format("{}#{}", pl.col("_coll"), pl.col("_a")))
    )
    return calls.with_columns(key=key).with_columns(
        instance=pl.struct("_pg", "key_kind", "key").rank("dense").cast(pl.Int64) - 1
    )


def one_row_per_call(keyed: RankStore) -> bool:
    """Whether no rank has two rows for one call (nearly always so). A rank's rows are all
    in one batch, so each batch is tested alone, with one integer per row where the pair
    fits in one (kineto_comm.keys)."""
    for batch in keyed.batches(columns=["instance", "rank"]):
        pair = pair_key([batch], "instance", "rank")
        both = pl.struct("instance", "rank") if pair is None else pair
        if batch.select(both.filter(pl.col("instance").is_not_null()).is_duplicated().any()).item():
            return False
    return True


def _ordinal(rows: pl.DataFrame, *keys: str) -> pl.Series:
    """Each row's position among the rows with the same `keys`, in frame order.

    A sort and a scan of group boundaries: a window (`int_range().over(keys)`) builds one
    list per group and takes seconds with 100,000s of small groups (one per call and rank).
    """
    index = pl.int_range(pl.len(), dtype=pl.Int64)
    changed = pl.any_horizontal(pl.col(k).ne_missing(pl.col(k).shift(1)) for k in keys)
    first = pl.when(changed | (index == 0)).then(index).forward_fill()
    return (
        rows.select(*keys, _row=index)
        .sort(*keys, "_row")
        .select("_row", _ordinal=index - first)
        .sort("_row")
        .get_column("_ordinal")
    )


def instances(keyed: pl.DataFrame | RankStore) -> pl.DataFrame:
    """One row per matched call (see INSTANCE_COLUMNS and docs/tables.md).

    Aggregations into one group per call: on a big job the streaming engine runs them in
    bounded memory over every rank's rows. A call's attributes are those of its earliest
    row (ties: the lowest rank), its last rank that of its latest (ties: the highest)."""
    keyed = as_store(keyed)
    if keyed.height == 0:
        return pl.DataFrame(schema=_instance_schema())
    p2p = pl.col("key_kind") == "p2p"
    # Rows of one rank for one call count once (nearly always each rank has one).
    seen = pl.len() if one_row_per_call(keyed) else pl.col("rank").n_unique()
    when = ["start_ns", "rank"]
    table = (
        keyed.lazy()
        .group_by("instance")
        .agg(
            process_group=pl.col("process_group").first(),
            collective=pl.col("collective").sort_by(when).first(),
            key_kind=pl.col("key_kind").first(),
            key=pl.col("key").first(),
            step=pl.col("step").min(),
            ranks_seen=seen.cast(pl.Int64),
            group_size=pl.col("group_size").max(),
            bytes=pl.col("bytes").max(),
            first_start_ns=pl.col("start_ns").min(),
            last_start_ns=pl.col("start_ns").max(),
            first_end_ns=pl.col("end_ns").min(),
            last_end_ns=pl.col("end_ns").max(),
            transfer_ns=pl.col("duration_ns").min(),
            max_duration_ns=pl.col("duration_ns").max(),
            last_rank=pl.col("rank").sort_by(when).last(),
        )
    )
    n = pl.when(pl.col("collective") == "send_recv").then(2).otherwise(group_size())
    # A conditional inside the aggregation would hold every row on the streaming engine.
    table = table.with_columns(
        collective=pl.when(p2p).then(pl.lit("send_recv")).otherwise(pl.col("collective"))
    )
    return collect(
        table.with_columns(
            arrival_skew_ns=pl.col("last_start_ns") - pl.col("first_start_ns"),
            algbw_gbps=algbw_gbps(pl.col("bytes"), pl.col("transfer_ns")),
            busbw_gbps=busbw_gbps(pl.col("bytes"), pl.col("transfer_ns"), pl.col("collective"), n),
        )
        .select(INSTANCE_COLUMNS)
        .sort("first_start_ns", "instance"),
        keyed.height,
    )


def waits(
    keyed: pl.DataFrame | RankStore, table: pl.DataFrame, folder: SpillFolder | None = None
) -> RankStore:
    """One row per rank per instance, in (rank, instance) order: how long that rank's call
    waited for the group. Made a batch of whole ranks at a time (kept in `folder` when
    given)."""
    keyed = as_store(keyed)
    if keyed.height == 0:
        return RankStore.from_frame(
            pl.DataFrame(schema={c: pl.Int64 for c in WAIT_COLUMNS} | {"arrived_last": pl.Boolean})
        )
    last = table.lazy().select("instance", "last_start_ns", "last_rank", "ranks_seen")
    columns = ["instance", "rank", "start_ns", "end_ns", "duration_ns"]
    parts = []
    for batch in keyed.batches(columns=columns):
        found = collect(
            batch.lazy()
            .join(last, on="instance", how="left")
            .with_columns(
                # A kernel that ended before the last member arrived waited for no one: an
                # eager point-to-point send, which NCCL completes into the receiver's buffer
                # (on the H100 pipeline capture pp-4, 48 of its 144 calls, by up to 6.6 ms).
                wait_ns=pl.when(pl.col("end_ns") > pl.col("last_start_ns"))
                .then(pl.col("last_start_ns") - pl.col("start_ns"))
                .otherwise(0),
                arrived_last=(pl.col("rank") == pl.col("last_rank")) & (pl.col("ranks_seen") > 1),
            )
            .select(WAIT_COLUMNS)
            .sort("rank", "instance")
        )
        parts.append(keep(found, folder))
    return RankStore(parts, folder=folder)


def _instance_schema() -> dict[str, pl.DataType]:
    schema: dict[str, pl.DataType] = {c: pl.Int64() for c in INSTANCE_COLUMNS}
    for c in ("process_group", "collective", "key_kind", "key"):
        schema[c] = pl.String()
    schema["algbw_gbps"] = pl.Float64()
    schema["busbw_gbps"] = pl.Float64()
    return schema


def last_arrivals(waits: pl.DataFrame, instances: pl.DataFrame) -> pl.DataFrame:
    """rank, start_ns, wait_ns, last_rank, last_start_ns, p2p: per call of `waits` (the
    collective_waits rows of some ranks) in a matched instance, the rank that arrived last
    there and when (`collective_instances.last_rank`, `last_start_ns`), and whether it is a
    send/recv pair. One row per (rank, start_ns), the longest wait first. The one reading of
    "whom a call waited for" that the blame's `late_rank` and the critical path share."""
    schema = {
        "rank": pl.Int64,
        "start_ns": pl.Int64,
        "wait_ns": pl.Int64,
        "last_rank": pl.Int64,
        "last_start_ns": pl.Int64,
        "p2p": pl.Boolean,
    }
    need_w = {"instance", "rank", "start_ns", "wait_ns"}
    need_i = {"instance", "last_rank", "last_start_ns"}
    if not (waits.height and instances.height):
        return pl.DataFrame(schema=schema)
    if not (need_w <= set(waits.columns) and need_i <= set(instances.columns)):
        return pl.DataFrame(schema=schema)
    kind = (
        pl.col("key_kind").cast(pl.String) == "p2p"
        if "key_kind" in instances.columns
        else pl.lit(False)
    )
    return (
        waits.select(pl.col("instance", "rank", "start_ns", "wait_ns").cast(pl.Int64))
        .join(
            instances.select(
                pl.col("instance").cast(pl.Int64),
                pl.col("last_rank").cast(pl.Int64),
                pl.col("last_start_ns").cast(pl.Int64),
                p2p=kind.fill_null(False),
            ),
            on="instance",
        )
        .filter(pl.col("last_rank").is_not_null())
        .sort("rank", "start_ns", "wait_ns", "instance", descending=[False, False, True, False])
        .unique(["rank", "start_ns"], keep="first", maintain_order=True)
        .select(*schema)
    )
