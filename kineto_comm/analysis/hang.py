"""Which rank hangs the job, from every rank's Flight Recorder (FR) dump.

Pure functions on the FR tables (kineto_comm.load.flight; columns in docs/hang.md):

1. `members`: per process group and member rank, the last collective it enqueued and
   completed (FR entries, and pg_status where the group carries only collectives: pg_status
   counts p2p and collectives on one counter) and its first one still pending.
2. `frontier`: per group, the first collective not completed by every member, and who
   completed it, who started it, who only scheduled it, who never got there, who has no dump.
3. `waits`: who waits for whom. A rank pending at collective s of a group waits for each
   member that never enqueued s; a pending send or recv waits for the peer that has not
   posted the matching recv or send. Both name a rank whose host stopped before the
   operation, which is what a hang's cause looks like to the others.
4. `roots`: the front of the wave. A rank is a root when (a) its peers completed a
   collective it did not (its GPU or NCCL stopped: "device"), (b) others wait for it and it
   waits for nobody and has nothing pending ("stopped": its Python thread stopped issuing
   work), or no dump ("no_dump"), (c) its call differs from the others' at the group's
   first incomplete collective (type, sizes, dtypes: "diverged"). Where nothing of that is
   found, a cycle of waits ("deadlock") or the ranks everybody waits on ("blocked") are named.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from kineto_comm.load.flight import (
    FlightDump,
    dumps_table,
    entries_table,
    groups_table,
    status_table,
)

# Collectives whose input sizes legitimately differ across ranks (fr_trace's exceptions).
_FREE_INPUT = ("all_to_all", "all_to_allv", "alltoall_base", "alltoall", "scatter")
_FREE_OUTPUT = ("all_to_all", "all_to_allv", "alltoall_base", "alltoall", "gather")
_FREE_DTYPES_IN = ("scatter", "broadcast")
_ALL_TO_ALL = ("all_to_all", "all_to_allv", "alltoall_base", "alltoall")


@dataclass(frozen=True)
class HangTables:
    """The decoded dumps as tables, plus the world they imply."""

    entries: pl.DataFrame
    groups: pl.DataFrame
    status: pl.DataFrame
    dumps: pl.DataFrame
    world: pl.DataFrame  # rank, has_dump: every rank some group names or some dump is


def tables_of(dumps: list[FlightDump]) -> HangTables:
    """The FR tables of decoded dumps (one job, one dump per rank)."""
    entries = entries_table(dumps)
    groups = _with_members_seen(groups_table(dumps), entries)
    dt = dumps_table(dumps)
    named = groups.select(rank=pl.col("ranks")).explode("rank").drop_nulls()
    world = (
        pl.concat([named, dt.select("rank")])
        .unique()
        .join(dt.select("rank", has_dump=pl.lit(True)), on="rank", how="left")
        .with_columns(pl.col("has_dump").fill_null(False))
        .sort("rank")
    )
    status = status_table(dumps)
    return HangTables(_with_done(entries, status), groups, _status_kept(status, entries), dt, world)


def _with_members_seen(groups: pl.DataFrame, entries: pl.DataFrame) -> pl.DataFrame:
    """The configured groups, plus the groups whose members pg_config does not give (gloo
    in torch 2.13 writes one nameless group with no ranks): their members are the ranks
    whose entries name them. A group with no ranks and no entries is dropped."""
    seen = entries.group_by("process_group").agg(
        seen_desc=pl.col("group_desc").first(), seen=pl.col("rank").unique().sort()
    )
    return (
        groups.join(seen, on="process_group", how="full", coalesce=True)
        .with_columns(
            group_desc=pl.coalesce(
                pl.when(pl.col("group_desc") != "").then("group_desc"), "seen_desc", pl.lit("")
            ),
            ranks=pl.when(pl.col("ranks").list.len() > 0).then("ranks").otherwise("seen"),
        )
        .filter(pl.col("ranks").list.len() > 0)
        .select("process_group", "group_desc", "ranks")
        .sort("process_group")
    )


def _status_kept(status: pl.DataFrame, entries: pl.DataFrame) -> pl.DataFrame:
    """pg_status without the completions of gloo groups: gloo counts a collective that
    timed out as completed (torch 2.13), so only its enqueued count is used."""
    gloo = entries.filter(pl.col("backend") == "gloo").select("process_group").unique()
    return status.with_columns(
        last_completed=pl.when(pl.col("process_group").is_in(gloo["process_group"].implode()))
        .then(None)
        .otherwise("last_completed")
    )


def _with_done(entries: pl.DataFrame, status: pl.DataFrame) -> pl.DataFrame:
    """The entries with `done`: state completed. Gloo records no states (every entry stays
    `scheduled`) and retires a call that timed out as it does one that completed, so a
    gloo collective is done where it is retired and every member that dumped issued it
    (its seq is at most the lowest any member enqueued); a gloo send/recv where retired."""
    coll = entries.filter(~pl.col("is_p2p"))
    enq = (
        pl.concat(
            [
                coll.group_by("rank", "process_group").agg(enq=pl.col("collective_seq_id").max()),
                status.select("rank", "process_group", enq="last_enqueued"),
            ]
        )
        .group_by("rank", "process_group")
        .agg(pl.col("enq").max())
    )
    floor = enq.group_by("process_group").agg(floor=pl.col("enq").min())
    gloo_done = pl.col("retired") & (
        pl.col("is_p2p") | (pl.col("collective_seq_id") <= pl.col("floor"))
    )
    return (
        entries.join(floor, on="process_group", how="left")
        .with_columns(
            done=(pl.col("state") == "completed")
            | ((pl.col("backend") == "gloo") & gloo_done.fill_null(False))
        )
        .drop("floor")
    )


def version_tuple(version: str) -> tuple[int, int]:
    """'2.10' -> (2, 10); (0, 0) when unreadable."""
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        return (0, 0)
    return (major, minor)


def dump_time_ns(entries: pl.DataFrame) -> int | None:
    """The latest time any dump records: the dumps were written at or after it."""
    if entries.height == 0:
        return None
    t = entries.select(
        pl.max_horizontal(
            pl.col("time_created_ns").max(),
            pl.col("time_started_ns").max(),
            pl.col("time_completed_ns").max(),
        )
    ).item()
    return None if t is None else int(t)


def members(t: HangTables) -> pl.DataFrame:
    """process_group, group_desc, rank, has_dump, enqueued, completed, first_pending,
    pending_since_ns: each member's collective progress in each group."""
    coll = t.entries.filter(~pl.col("is_p2p"))
    per = coll.group_by("rank", "process_group").agg(
        enq_e=pl.col("collective_seq_id").max(),
        done_e=pl.col("collective_seq_id").filter(pl.col("done")).max(),
        first_pending_e=pl.col("collective_seq_id").filter(~pl.col("done")).min(),
        pending_since_ns=pl.col("time_created_ns").filter(~pl.col("done")).min(),
    )
    # pg_status counts p2p and collectives on one counter: read it for collective-only groups.
    p2p_groups = t.entries.filter(pl.col("is_p2p")).select("process_group").unique()
    status = t.status.join(p2p_groups, on="process_group", how="anti")
    m = (
        t.groups.select("process_group", "group_desc", rank=pl.col("ranks"))
        .explode("rank")
        .drop_nulls("rank")
        .join(t.world, on="rank", how="left")
        .join(per, on=["rank", "process_group"], how="left")
        .join(status, on=["rank", "process_group"], how="left")
    )
    enq = pl.max_horizontal("enq_e", "last_enqueued")
    done = pl.max_horizontal("done_e", "last_completed")
    m = m.with_columns(enqueued=enq, completed=done)
    first = pl.coalesce(
        "first_pending_e",
        pl.when(pl.col("enqueued") > pl.col("completed")).then(pl.col("completed") + 1),
        pl.when(pl.col("completed").is_null() & pl.col("enq_e").is_not_null()).then(
            pl.col("enq_e")
        ),
    )
    return m.with_columns(first_pending=first).select(
        "process_group",
        "group_desc",
        "rank",
        "has_dump",
        "enqueued",
        "completed",
        "first_pending",
        "pending_since_ns",
    )


def frontier(m: pl.DataFrame, entries: pl.DataFrame) -> pl.DataFrame:
    """Per group stuck at a collective: process_group, group_desc, seq (the first collective
    not completed by every member), op, and the member ranks by what they did with it:
    completed, started, scheduled, never_reached, no_dump."""
    dumped = m.filter(pl.col("has_dump"))
    stuck = (
        dumped.group_by("process_group")
        .agg(
            seq=pl.col("first_pending").min(),
            lowest_done=pl.col("completed").min(),
        )
        .filter(pl.col("seq").is_not_null())
    )
    coll = entries.filter(~pl.col("is_p2p")).select(
        "rank", "process_group", seq="collective_seq_id", state_at="state", op_at="op"
    )
    at = (
        m.join(stuck.select("process_group", "seq"), on="process_group")
        .join(coll, on=["rank", "process_group", "seq"], how="left")
        .with_columns(
            what=pl.when(~pl.col("has_dump"))
            .then(pl.lit("no_dump"))
            .when(pl.col("completed") >= pl.col("seq"))
            .then(pl.lit("completed"))
            .when(pl.col("state_at") == "started")
            .then(pl.lit("started"))
            .when(pl.col("enqueued") >= pl.col("seq"))
            .then(pl.lit("scheduled"))
            .otherwise(pl.lit("never_reached"))
        )
    )
    cols = ("completed", "started", "scheduled", "never_reached", "no_dump")
    return (
        at.group_by("process_group", "group_desc", "seq")
        .agg(
            op=pl.col("op_at").drop_nulls().mode().first(),
            size=pl.len(),
            **{c: pl.col("rank").filter(pl.col("what") == c).sort() for c in cols},
        )
        .sort("process_group")
    )


def _p2p_pending(entries: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
    """Pending sends and recvs with global src and dst, numbered in order per direction."""
    p = entries.filter(pl.col("is_p2p") & ~pl.col("done") & pl.col("op").is_in(["send", "recv"]))
    p = p.join(groups.select("process_group", "ranks"), on="process_group", how="left")
    return p.with_columns(
        src=pl.col("ranks").list.get(pl.col("src_local"), null_on_oob=True),
        dst=pl.col("ranks").list.get(pl.col("dst_local"), null_on_oob=True),
    ).with_columns(
        k=pl.col("time_created_ns")
        .rank("ordinal")
        .over("process_group", "src", "dst", "op")
        .cast(pl.Int64)
    )


def waits(t: HangTables, m: pl.DataFrame) -> pl.DataFrame:
    """rank, waits_for, process_group, group_desc, kind (collective|p2p), seq, op,
    time_created_ns: rank is pending on an operation waits_for never issued."""
    schema_cols = (
        "rank",
        "waits_for",
        "process_group",
        "group_desc",
        "kind",
        "seq",
        "op",
        "time_created_ns",
    )
    waiting = m.filter(pl.col("first_pending").is_not_null() & pl.col("has_dump")).select(
        "process_group", "group_desc", "rank", "first_pending"
    )
    behind = m.select(
        "process_group", waits_for="rank", other_enq="enqueued", other_dump="has_dump"
    )
    ops = t.entries.filter(~pl.col("is_p2p")).select(
        "rank",
        "process_group",
        first_pending="collective_seq_id",
        op="op",
        time_created_ns="time_created_ns",
    )
    coll = (
        waiting.join(behind, on="process_group")
        .filter(
            (pl.col("rank") != pl.col("waits_for"))
            & (
                ~pl.col("other_dump")
                | pl.col("other_enq").is_null()
                | (pl.col("other_enq") < pl.col("first_pending"))
            )
        )
        .join(ops, on=["rank", "process_group", "first_pending"], how="left")
        .select(
            "rank",
            "waits_for",
            "process_group",
            "group_desc",
            kind=pl.lit("collective"),
            seq="first_pending",
            op="op",
            time_created_ns="time_created_ns",
        )
    )
    p = _p2p_pending(t.entries, t.groups)
    has = t.world.select(peer="rank", peer_dump="has_dump")
    # The k-th pending send src->dst pairs with the k-th pending recv at dst from src.
    counts = p.group_by("process_group", "src", "dst", "op").agg(n=pl.len())
    other = counts.with_columns(
        op=pl.when(pl.col("op") == "send").then(pl.lit("recv")).otherwise(pl.lit("send"))
    ).rename({"n": "posted"})
    p2p = (
        p.join(other, on=["process_group", "src", "dst", "op"], how="left")
        .with_columns(
            peer=pl.when(pl.col("op") == "send").then(pl.col("dst")).otherwise(pl.col("src"))
        )
        .join(has, on="peer", how="left")
        .filter(
            pl.col("peer").is_not_null()
            & (pl.col("peer") != pl.col("rank"))
            & (
                ~pl.col("peer_dump").fill_null(False)
                | (pl.col("k") > pl.col("posted").fill_null(0))
            )
        )
        .select(
            "rank",
            waits_for="peer",
            process_group="process_group",
            group_desc="group_desc",
            kind=pl.lit("p2p"),
            seq="p2p_seq_id",
            op=pl.format("{} {}->{}", "op", "src", "dst"),
            time_created_ns="time_created_ns",
        )
    )
    return pl.concat([coll.select(schema_cols), p2p.select(schema_cols)], how="vertical_relaxed")


def lagging(m: pl.DataFrame) -> pl.DataFrame:
    """rank, process_group, group_desc, seq, peers_completed: a rank pending at a collective
    that another member already completed (so the collective ran, and this rank's GPU or
    communicator never reported it done)."""
    best = m.group_by("process_group").agg(peers_completed=pl.col("completed").max())
    return (
        m.filter(pl.col("has_dump") & pl.col("first_pending").is_not_null())
        .join(best, on="process_group")
        .filter(pl.col("peers_completed") >= pl.col("first_pending"))
        .select(
            "rank",
            "process_group",
            "group_desc",
            seq="first_pending",
            peers_completed="peers_completed",
        )
    )


def mismatches(
    front: pl.DataFrame, entries: pl.DataFrame, groups: pl.DataFrame, version: str
) -> pl.DataFrame:
    """At each group's first incomplete collective, and at the one before it (the last
    that every member completed: a divergence the backend let pass, as gloo does an
    all_reduce of another size, hangs the call after it), the members whose call differs
    from the most common one, as fr_trace categorises it: COLLECTIVE_TYPE_MISMATCH,
    SIZE_OR_SYNTAX_MISMATCH, COLLECTIVE_DTYPE_MISMATCH, and all_to_all totals that do not add
    up (from format 2.4; coalesced entries from 2.7). Columns: process_group, group_desc,
    seq, kind, rank, op, expected, found."""
    v = version_tuple(version)
    at = front.select("process_group", "seq")
    calls = entries.filter(~pl.col("is_p2p")).join(
        pl.concat([at, at.with_columns(pl.col("seq") - 1)]),
        left_on=["process_group", "collective_seq_id"],
        right_on=["process_group", "seq"],
    )
    if v < (2, 7):
        calls = calls.filter(pl.col("op") != "coalesced")
    calls = calls.join(
        groups.select("process_group", size=pl.col("ranks").list.len()), on="process_group"
    ).with_columns(seq=pl.col("collective_seq_id"))
    out = []

    def odd(column: str, kind: str, where: pl.Expr | None = None) -> None:
        c = calls if where is None else calls.filter(where)
        common = c.group_by("process_group", "seq").agg(
            expected=pl.col(column).mode().sort().first(), n=pl.col(column).n_unique()
        )
        bad = (
            c.join(common, on=["process_group", "seq"])
            .filter((pl.col("n") > 1) & (pl.col(column) != pl.col("expected")))
            .select(
                "process_group",
                "group_desc",
                "seq",
                kind=pl.lit(kind),
                rank="rank",
                op="op",
                expected="expected",
                found=pl.col(column),
            )
        )
        out.append(bad)

    odd("op", "COLLECTIVE_TYPE_MISMATCH")
    same_type = pl.col("op") == pl.col("op").mode().first().over("process_group", "seq")
    odd("input_sizes", "SIZE_OR_SYNTAX_MISMATCH", same_type & ~pl.col("op").is_in(_FREE_INPUT))
    odd("output_sizes", "SIZE_OR_SYNTAX_MISMATCH", same_type & ~pl.col("op").is_in(_FREE_OUTPUT))
    odd(
        "input_dtypes",
        "COLLECTIVE_DTYPE_MISMATCH",
        same_type & ~pl.col("op").is_in(_FREE_DTYPES_IN) & (pl.col("input_numel") > 0),
    )
    if v >= (2, 4):
        a2a = calls.filter(pl.col("op").is_in(_ALL_TO_ALL))
        totals = a2a.group_by("process_group", "seq").agg(
            i=pl.col("input_numel").sum(),
            o=pl.col("output_numel").sum(),
            n=pl.len(),
            size=pl.col("size").first(),
        )
        bad = (
            a2a.join(totals, on=["process_group", "seq"])
            .filter((pl.col("n") == pl.col("size")) & (pl.col("i") != pl.col("o")))
            .select(
                "process_group",
                "group_desc",
                "seq",
                kind=pl.lit("SIZE_OR_SYNTAX_MISMATCH"),
                rank="rank",
                op="op",
                expected=pl.format("total in = total out ({})", "i"),
                found=pl.format("total out {}", "o"),
            )
        )
        out.append(bad)
    schema = {
        "process_group": pl.String,
        "group_desc": pl.String,
        "seq": pl.Int64,
        "kind": pl.String,
        "rank": pl.Int64,
        "op": pl.String,
        "expected": pl.String,
        "found": pl.String,
    }
    frames = [f.cast(schema) for f in out if f.height]  # type: ignore[arg-type]
    if not frames:
        return pl.DataFrame(schema=schema)
    return pl.concat(frames).unique().sort("process_group", "rank", "kind")


def _stuck_in(entries: pl.DataFrame) -> pl.DataFrame:
    """Per rank, its oldest pending entry: what it is stuck in."""
    return (
        entries.filter(~pl.col("done"))
        .sort("time_created_ns", "pos")
        .group_by("rank", maintain_order=True)
        .first()
        .select(
            "rank",
            stuck_group="process_group",
            stuck_group_desc="group_desc",
            stuck_op="op",
            stuck_seq=pl.when(pl.col("is_p2p")).then("p2p_seq_id").otherwise("collective_seq_id"),
            stuck_state="state",
            stuck_input_sizes="input_sizes",
            stuck_dtypes="input_dtypes",
            stuck_since_ns="time_created_ns",
            thread_name="thread_name",
            thread_id="thread_id",
            frames="frames",
        )
    )


def roots(
    t: HangTables, m: pl.DataFrame, w: pl.DataFrame, lag: pl.DataFrame, odd: pl.DataFrame
) -> pl.DataFrame:
    """The ranks the hang starts from: rank, kind (device | stopped | no_dump | diverged |
    deadlock | blocked), waited_by (ranks waiting on it directly), groups (where it is
    waited for or lags), what it last completed and is stuck in, and for how long."""
    pending = (
        t.entries.filter(~pl.col("done"))
        .select("rank")
        .unique()
        .join(
            m.filter(pl.col("first_pending").is_not_null()).select("rank").unique(),
            on="rank",
            how="full",
            coalesce=True,
        )
        .with_columns(pending=pl.lit(True))
    )
    out_deg = w.group_by("rank").agg(waits_on=pl.col("waits_for").unique().sort())
    into = w.group_by(rank="waits_for").agg(
        waited_by=pl.col("rank").unique().sort(),
        wait_groups=pl.col("group_desc").unique().sort(),
        # Prefer a collective's group: its counters say what the rank last completed.
        wait_group=pl.col("process_group").sort_by("kind", "process_group").first(),
    )
    base = (
        t.world.join(pending, on="rank", how="left")
        .join(out_deg, on="rank", how="left")
        .join(into, on="rank", how="left")
        .join(
            lag.group_by("rank").agg(lag_groups=pl.col("group_desc").unique().sort()),
            on="rank",
            how="left",
        )
        .join(
            odd.group_by("rank").agg(odd_kinds=pl.col("kind").unique().sort()),
            on="rank",
            how="left",
        )
        .with_columns(pl.col("pending").fill_null(False))
    )
    sink = pl.col("waited_by").is_not_null() & pl.col("waits_on").is_null()
    kind = (
        pl.when(~pl.col("has_dump") & pl.col("waited_by").is_not_null())
        .then(pl.lit("no_dump"))
        .when(pl.col("lag_groups").is_not_null())
        .then(pl.lit("device"))
        .when(sink & ~pl.col("pending"))
        .then(pl.lit("stopped"))
        .when(pl.col("odd_kinds").is_not_null())
        .then(pl.lit("diverged"))
    )
    found = base.with_columns(kind=kind)
    if found.filter(pl.col("kind").is_not_null()).height == 0 and w.height:
        # Nothing stopped on its own: a cycle of waits, or everybody waiting on ranks that
        # are themselves only blocked in operations already posted by all.
        found = base.with_columns(kind=pl.when(sink).then(pl.lit("blocked")))
        if found.filter(pl.col("kind").is_not_null()).height == 0:
            waited = pl.col("waited_by").is_not_null()
            found = base.with_columns(kind=pl.when(waited).then(pl.lit("deadlock")))
    # What it last completed: in the group it is stuck in, else where others wait for it.
    last = m.select(
        "rank",
        last_group="process_group",
        last_completed_group="group_desc",
        last_completed_seq="completed",
    )
    when = dump_time_ns(t.entries)
    r = (
        found.filter(pl.col("kind").is_not_null())
        .join(_stuck_in(t.entries), on="rank", how="left")
        .with_columns(last_group=pl.coalesce("stuck_group", "wait_group"))
        .join(last, on=["rank", "last_group"], how="left")
        .with_columns(
            stuck_for_ns=(pl.lit(when, dtype=pl.Int64) - pl.col("stuck_since_ns")),
            waited_by=pl.col("waited_by").fill_null([]),
            groups=pl.concat_list(
                pl.col("wait_groups").fill_null([]), pl.col("lag_groups").fill_null([])
            )
            .list.unique()
            .list.sort(),
        )
    )
    return r.select(
        "rank",
        "kind",
        "has_dump",
        "waited_by",
        "groups",
        "last_completed_group",
        "last_completed_seq",
        stuck_group="stuck_group",
        stuck_group_desc="stuck_group_desc",
        stuck_op="stuck_op",
        stuck_seq="stuck_seq",
        stuck_state="stuck_state",
        stuck_input_sizes="stuck_input_sizes",
        stuck_dtypes="stuck_dtypes",
        stuck_for_ns="stuck_for_ns",
        thread_name="thread_name",
        frames="frames",
    ).sort("rank")


HISTORY_SCHEMA = {
    "rank": pl.Int64,
    "traced": pl.Boolean,
    "instances": pl.Int64,
    "times_last": pl.Int64,
    "late_share": pl.Float64,
    "delay_ns": pl.Int64,
    "confidence": pl.Float64,
    "is_straggler": pl.Boolean,
    "most_late": pl.Boolean,
}


def history(roots: pl.DataFrame, stragglers: pl.DataFrame | None) -> pl.DataFrame:
    """Whether each root rank was already late before the hang, from the Kineto report of
    the same job (its `stragglers` table, the one home of that verdict): rank, traced (the
    Kineto traces hold the rank), instances, times_last, late_share, delay_ns, confidence,
    is_straggler, most_late (it caused the largest share of the lateness, straggler or
    not). Empty without Kineto traces."""
    if stragglers is None or stragglers.height == 0 or roots.height == 0:
        return pl.DataFrame(schema=HISTORY_SCHEMA)
    late = stragglers.select(
        "rank",
        "instances",
        "times_last",
        "late_share",
        "delay_ns",
        "confidence",
        "is_straggler",
        most_late=(pl.col("late_share") > 0) & (pl.col("late_share") == pl.col("late_share").max()),
        traced=pl.lit(True),
    )
    return (
        roots.select("rank")
        .join(late, on="rank", how="left")
        .with_columns(pl.col("traced").fill_null(False))
        .select(list(HISTORY_SCHEMA))
        .cast(HISTORY_SCHEMA)  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class HangAnalysis:
    """Every table of the hang analysis (docs/hang.md)."""

    tables: HangTables
    members: pl.DataFrame
    frontier: pl.DataFrame
    waits: pl.DataFrame
    lagging: pl.DataFrame
    mismatches: pl.DataFrame
    roots: pl.DataFrame
    version: str
    dump_time_ns: int | None

    def as_dict(self) -> dict[str, pl.DataFrame]:
        """The tables by the names rules read (hang_*)."""
        return {
            "hang_entries": self.tables.entries,
            "hang_groups": self.tables.groups,
            "hang_dumps": self.tables.dumps,
            "hang_world": self.tables.world,
            "hang_members": self.members,
            "hang_frontier": self.frontier,
            "hang_waits": self.waits,
            "hang_lagging": self.lagging,
            "hang_mismatches": self.mismatches,
            "hang_roots": self.roots,
        }


def analyse(t: HangTables) -> HangAnalysis:
    """All hang tables, from the dumps' tables."""
    versions = t.dumps["version"].unique().sort().to_list() if t.dumps.height else []
    version = str(versions[-1]) if versions else "0.0"
    m = members(t)
    front = frontier(m, t.entries)
    w = waits(t, m)
    lag = lagging(m)
    odd = mismatches(front, t.entries, t.groups, version)
    return HangAnalysis(
        tables=t,
        members=m,
        frontier=front,
        waits=w,
        lagging=lag,
        mismatches=odd,
        roots=roots(t, m, w, lag, odd),
        version=version,
        dump_time_ns=dump_time_ns(t.entries),
    )
