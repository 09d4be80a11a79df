"""The report's tables as people read them: one home for what text, Markdown and HTML show.

Each `Section` is a titled table of display strings built from the same numbers as the JSON
document (`kineto_comm.render.json_doc`), with the JSON key it shows. The three human formats
render the same sections in the same order, with the same column names and the same number
formatting, so that a reader of any format gets the whole report (docs/json.md is the
reference for what each column means), and no two formats call one quantity by two names.

Formatting: times as fmt_ns, sizes in decimal units, bandwidths with three significant
digits in the unit that fits (fmt_bw: a gloo capture's 0.0082 GB/s is 8.23 MB/s), shares as
percentages, an unknown process group as UNKNOWN_GROUP.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from kineto_comm.analysis import steptime
from kineto_comm.analysis.roles import evidence_phrase
from kineto_comm.render.fmt import EXTREME_RANKS, MAX_RANK_ROWS, fmt_bytes, fmt_ns
from kineto_comm.render.json_doc import collective_totals
from kineto_comm.report import Report

# How an unknown process group is written in every human format.
UNKNOWN_GROUP = "?"
# Rows per section table; the JSON document has them all.
MAX_ROWS = 25
# A rank that is no straggler but delays the step by this share of it gets a sentence
# under the stragglers table saying why (its confidence).
STRAGGLER_NOTE_SHARE = 0.05


@dataclass(frozen=True)
class Section:
    """A titled table: `key` is the JSON document's field it shows, `right` the indexes of
    numeric columns (right-aligned), `note` a line under it (rows left out, a legend)."""

    key: str
    title: str
    header: tuple[str, ...]
    rows: list[tuple[str, ...]]
    right: frozenset[int] = field(default_factory=frozenset)
    note: str = ""


def _sig3(x: float) -> str:
    """`x` (>= 1 and < 1000, or 0) with three significant digits, no exponent."""
    if x == 0:
        return "0"
    rounded = float(f"{x:.3g}")  # 0.99999 -> 1.0, then printed as 1.00
    digits = max(0, 2 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:.{digits}f}"


def fmt_bw(gbps: float | None) -> str:
    """A bandwidth given in GB/s (1 GB = 1e9 bytes) with three significant digits, in the
    unit that keeps them (TB/s, GB/s, MB/s, KB/s, B/s): 97.67 -> '97.7 GB/s', 0.00823 ->
    '8.23 MB/s'."""
    if gbps is None or not math.isfinite(gbps):
        return "-"
    rate = gbps * 1e9
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if abs(rate) >= scale * 0.9995:  # 999.96 MB/s prints as 1.00 GB/s, not 1000 MB/s
            return f"{_sig3(rate / scale)} {unit}"
    return f"{_sig3(rate)} B/s"


def group(name: Any) -> str:
    """A process group's name, UNKNOWN_GROUP when there is none."""
    return UNKNOWN_GROUP if name is None or name == "" or name == "?" else str(name)


def pct(share: float | None) -> str:
    """A share (0..1) as a percentage with one decimal, '-' when unknown."""
    return "-" if share is None or not math.isfinite(share) else f"{100 * share:.1f}%"


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def ranks_text(ranks: Iterable[int] | None, limit: int = 12) -> str:
    """Ranks as compact ranges: [0,1,2,3,8] -> '0-3, 8' (at most `limit` ranges)."""
    values = sorted(set(ranks or ()))
    if not values:
        return "-"
    spans: list[tuple[int, int]] = []
    for r in values:
        if spans and r == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], r)
        else:
            spans.append((r, r))
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in spans[:limit]]
    more = f", ... ({len(values)} ranks)" if len(spans) > limit else ""
    return ", ".join(parts) + more


def _cut(rows: list[tuple[str, ...]], what: str = "row(s)") -> tuple[list[tuple[str, ...]], str]:
    if len(rows) <= MAX_ROWS:
        return rows, ""
    return rows[:MAX_ROWS], f"({len(rows) - MAX_ROWS} more {what} in --format json)"


def collectives(report: Report) -> Section | None:
    """Every collective over all ranks (json `collective_totals`): time is the kernel time
    (waiting included); algbw and busbw the medians over the calls' transfers
    (Report.collective_totals); `of link`, where the hardware table knows a group's link,
    the median speed_of_light (busbw / what the link should give: docs/hardware.md)."""
    totals = collective_totals(report)
    if not totals:
        return None
    known = any(c.get("speed_of_light") is not None for c in totals)
    sol = (
        (lambda c: "-" if c.get("speed_of_light") is None else f"{c['speed_of_light']:.0%}")
        if known
        else None
    )
    rows = [
        (
            c["collective"],
            group(c["process_group"]),
            c["dtype"] or "?",
            str(c["ranks"]),
            str(c["calls"]),
            fmt_bytes(c["mean_bytes"]),
            fmt_bytes(c["bytes"]),
            fmt_ns(c["time_ns"]),
            fmt_bw(c["algbw_gbps"]),
            fmt_bw(c.get("busbw_gbps")),
            *([] if sol is None else [sol(c)]),
        )
        for c in totals
    ]
    rows, note = _cut(rows)
    header = ("collective", "group", "dtype", "ranks", "calls", "mean size", "volume", "time")
    return Section(
        "collective_totals",
        "Collectives (all ranks)",
        (*header, "algbw", "busbw", *([] if sol is None else ["of link"])),
        rows,
        frozenset(range(3, 10 if sol is None else 11)),
        note,
    )


def skew(report: Report) -> Section | None:
    """Arrival skew and bus bandwidth per group and collective (json `skew`)."""
    table = report.skew_summary()
    if table.height == 0:
        return None
    rows = [
        (
            group(r["process_group"]),
            r["collective"],
            str(r["calls"]),
            str(r["ranks"]),
            fmt_ns(r["mean_skew_ns"]),
            fmt_ns(r["p95_skew_ns"]),
            fmt_bw(r["median_busbw_gbps"]),
            ", ".join(map(str, r["most_often_last_ranks"] or [])) or "-",
        )
        for r in table.iter_rows(named=True)
    ]
    rows, note = _cut(rows)
    return Section(
        "skew",
        "Across ranks: arrival skew and bus bandwidth (matched calls)",
        ("group", "collective", "calls", "ranks", "mean skew", "p95 skew", "busbw", "last rank"),
        rows,
        frozenset(range(2, 8)),
        (
            note + " last rank = the rank that arrived last at the most calls (skew above 5 us); "
            "ranks tied for it are all listed."
        ).strip(),
    )


def process_groups(report: Report, brief: bool = False) -> Section | None:
    """Each process group, its members and its inferred role (json `process_groups`);
    `brief`: the evidence as its deciding phrase (roles.evidence_phrase), for the terminal."""
    table = report.process_groups
    if table.height == 0:
        return None
    table = table.sort("bytes_per_step", descending=True, nulls_last=True)
    split = set()
    if "pooled_collective" in table.columns:
        split = set(table.filter(pl.col("pooled_collective").is_not_null())["process_group"])

    def name(r: dict[str, Any]) -> str:
        """The group, and for a pooled group split by kind of call (roles.py) the kind."""
        if r["process_group"] not in split and not r.get("pooled_collective"):
            return group(r["process_group"])
        if not r.get("pooled_collective"):
            return f"{group(r['process_group'])} (other calls)"
        size = "" if r.get("pooled_bytes") is None else " " + fmt_bytes(r["pooled_bytes"])
        return f"{group(r['process_group'])} ({r['pooled_collective']}{size})"

    rows = [
        (
            name(r),
            r["role"],
            "-" if r["size"] is None else str(r["size"]),
            ranks_text(r.get("ranks")),
            _num(r["calls_per_step"]),
            fmt_bytes(r["bytes_per_step"]),
            (evidence_phrase(r["evidence"]) if brief else r["evidence"]) or "",
        )
        for r in table.iter_rows(named=True)
    ]
    rows, note = _cut(rows)
    return Section(
        "process_groups",
        "Process groups and their inferred roles",
        ("group", "role", "size", "ranks", "calls/step", "bytes/step", "evidence"),
        rows,
        frozenset({2, 4, 5}),
        note,
    )


def pipeline(report: Report) -> Section | None:
    """Pipeline stages (p > 1 only): their ranks, idle share of the step against the ideal
    (p-1)/(m+p-1) (json `pipeline`)."""
    table = report.pipeline
    if table.height == 0:
        return None
    table = table.filter(pl.col("stages") > 1)
    if table.height == 0:
        return None
    stages = (
        table.group_by("stage")
        .agg(
            ranks=pl.col("rank").unique().sort(),
            stages=pl.col("stages").first(),
            micro_batches=pl.col("micro_batches").first(),
            bubble=pl.col("bubble_fraction").mean(),
            theory=pl.col("theory_fraction").first(),
        )
        .sort("stage")
    )
    rows = [
        (
            str(r["stage"]),
            ranks_text(r["ranks"]),
            str(r["stages"]),
            "-" if r["micro_batches"] is None else str(r["micro_batches"]),
            pct(r["bubble"]),
            pct(r["theory"]),
        )
        for r in stages.iter_rows(named=True)
    ]
    rows, note = _cut(rows, "stage(s)")
    return Section(
        "pipeline",
        "Pipeline: idle share of each stage's step (bubble) vs (p-1)/(m+p-1)",
        ("stage", "ranks", "p", "m", "bubble", "theory"),
        rows,
        frozenset({2, 3, 4, 5}),
        note,
    )


def message_sizes(report: Report) -> Section | None:
    """Share of calls and time in small messages per group and collective (json
    `message_size_summary`)."""
    table = report.message_size_summary
    if table.height == 0:
        return None
    rows = [
        (
            group(r["process_group"]),
            r["collective"],
            str(r["calls"]),
            fmt_bytes(r["bytes"]),
            fmt_ns(r["time_ns"]),
            pct(r["calls_lt_64k_share"]),
            pct(r["time_lt_64k_share"]),
            pct(r["calls_lt_1m_share"]),
            pct(r["time_lt_1m_share"]),
        )
        for r in table.sort("time_ns", descending=True, nulls_last=True).iter_rows(named=True)
    ]
    rows, note = _cut(rows)
    return Section(
        "message_size_summary",
        "Message sizes: share of calls and time below 64 KB and 1 MB",
        ("group", "collective", "calls", "volume", "time")
        + ("calls < 64 KB", "time < 64 KB", "calls < 1 MB", "time < 1 MB"),
        rows,
        frozenset(range(2, 9)),
        note,
    )


def storms(report: Report) -> Section | None:
    """Runs of small back-to-back collectives (json `storms`)."""
    table = report.storms
    if table.height == 0:
        return None
    worst = (
        table.group_by("process_group", "collective")
        .agg(
            runs=pl.len(),
            calls=pl.col("calls").sum(),
            time_ns=pl.col("time_ns").sum(),
            busbw=pl.col("busbw_gbps").median(),
            reference=pl.col("reference_busbw_gbps").max(),
        )
        .sort(["time_ns", "process_group", "collective"], descending=[True, False, False])
    )
    rows = [
        (
            group(r["process_group"]),
            r["collective"],
            str(r["runs"]),
            str(r["calls"]),
            fmt_ns(r["time_ns"]),
            fmt_bw(r["busbw"]),
            fmt_bw(r["reference"]),
        )
        for r in worst.iter_rows(named=True)
    ]
    rows, note = _cut(rows)
    return Section(
        "storms",
        "Small-message storms",
        ("group", "collective", "runs", "calls", "time", "busbw", "large-message busbw"),
        rows,
        frozenset(range(2, 7)),
        note,
    )


def _summarised(table: pl.DataFrame, what: str, brief: bool) -> tuple[pl.DataFrame, str]:
    """A per-rank `table` (sorted, most telling first) as the text report's per-rank table
    shows a big job (`brief`, above MAX_RANK_ROWS ranks): the first and the last
    EXTREME_RANKS rows around a "median" row (each numeric column's median, the other
    columns' most common value); `rank` becomes text. With the note that says so."""
    if not brief or table.height <= MAX_RANK_ROWS:
        return table.with_columns(pl.col("rank").cast(pl.String)), ""
    numeric = [c for c, t in table.schema.items() if t.is_numeric() and c != "rank"]
    median = table.select(
        pl.lit("median").alias("rank"),
        *[pl.col(c).median().cast(table.schema[c]) for c in numeric],
        *[pl.col(c).mode().sort().first() for c in table.columns if c not in (*numeric, "rank")],
    ).select(table.columns)
    ends = [
        part.with_columns(pl.col("rank").cast(pl.String))
        for part in (table.head(EXTREME_RANKS), table.tail(EXTREME_RANKS))
    ]
    note = (
        f"{table.height} ranks: the {EXTREME_RANKS} with the {what[0]} and the {EXTREME_RANKS}"
        f" with the {what[1]}, and each column's median (every rank: --format json or html)"
    )
    return pl.concat([ends[0], median, ends[1]], how="vertical_relaxed"), note


def offsets(report: Report, brief: bool = False) -> Section | None:
    """Per-rank clock offsets put on rank 0's clock (json `offsets`), largest first;
    `brief`: a big job's largest and smallest around the median (`_summarised`)."""
    table = report.offsets
    if table.height == 0:
        return None
    table = table.sort(pl.col("offset_ns").abs(), "rank", descending=[True, False])
    table, summary = _summarised(table, ("largest offsets", "smallest"), brief)
    rows = [
        (
            r["rank"],
            fmt_ns(r["offset_ns"]),
            fmt_ns(r["residual_ns"]),
            str(r["matched"]),
            r["method"] or "-",
        )
        for r in table.iter_rows(named=True)
    ]
    rows, note = _cut(rows, "rank(s)")
    note = summary or note
    return Section(
        "offsets",
        "Clock offsets: each rank's clock against rank 0's (from collective end times)",
        ("rank", "offset", "residual", "matched calls", "method"),
        rows,
        frozenset({1, 2, 3}),
        note,
    )


def _straggler_legend(report: Report, table: pl.DataFrame) -> str:
    """What the stragglers table measures, and why a rank whose delay is a large share of
    the step is no straggler (its confidence), so the table and the findings agree."""
    skew = report.skew_summary()
    p2p = skew.height > 0 and bool(skew["collective"].is_in(["send", "recv", "send_recv"]).any())
    legend = (
        "last in = share of the rank's own calls (in its groups) it arrived last at: ranks of "
        "different groups can each be last in 100%; delay/step = the step time its lateness "
        "costs; others' wait/step = the other ranks' waits for it, summed over those ranks; "
        "straggler = confidence (share of steps it was the most late x its share of all "
        "lateness) >= 0.5 and delay >= 20 us. "
        + (
            "Point-to-point calls (send/recv) are left out: their arrival order is the "
            "pipeline's schedule (the skew table's last rank for them). "
            if p2p
            else "Point-to-point calls are left out. "
        )
    )
    step_ns = steptime.job_step_ns(report.step_times) if report.step_times.height else 0
    if step_ns:
        big = table.filter(
            ~pl.col("is_straggler") & (pl.col("delay_ns") >= STRAGGLER_NOTE_SHARE * step_ns)
        )
        for r in big.sort("delay_ns", descending=True).head(2).iter_rows(named=True):
            won = r["confidence"] / r["late_share"] if r["late_share"] else 0.0
            legend += (
                f"Rank {r['rank']} delays the step {fmt_ns(r['delay_ns'])} "
                f"({pct(r['delay_ns'] / step_ns)} of it) but is no straggler: its confidence "
                f"{r['confidence']:.2f} is below 0.5 (the most late in {won:.0%} of the steps, "
                f"{pct(r['late_share'])} of all lateness): no one rank is consistently late. "
            )
    return legend.strip()


def stragglers(report: Report, brief: bool = False) -> Section | None:
    """How often each rank arrives last and what that costs the others (json
    `stragglers`): stragglers first, then by delay; `brief`: a big job's most and least
    delaying ranks around the median (`_summarised`). The note says what each column
    measures (`_straggler_legend`)."""
    table = report.stragglers
    if table.height == 0:
        return None
    table = table.sort(["is_straggler", "delay_ns", "rank"], descending=[True, True, False])
    legend = _straggler_legend(report, table)
    table, summary = _summarised(table, ("most delay", "least"), brief)
    rows = [
        (
            r["rank"],
            "yes" if r["is_straggler"] else "no",
            pct(r["last_share"]),
            fmt_ns(r["delay_ns"]),
            fmt_ns(r["caused_wait_ns_per_step"]),
            _num(r["confidence"], ".2f"),
        )
        for r in table.iter_rows(named=True)
    ]
    rows, note = _cut(rows, "rank(s)")
    note = " ".join(n for n in (summary or note, legend) if n)
    return Section(
        "stragglers",
        "Stragglers: ranks that arrive last in shared collective calls",
        ("rank", "straggler", "last in", "delay/step", "others' wait/step", "confidence"),
        rows,
        frozenset({2, 3, 4, 5}),
        note,
    )


# The inferred configuration's values as shown, in order (label, column).
_CONFIG_ROWS = (
    ("parallel sizes", None),
    ("framework", "framework"),
    ("sharding", "sharding"),
    ("micro-batches", "micro_batches"),
    ("schedule", "schedule"),
    ("DDP buckets per step", "ddp_buckets"),
    ("DDP bucket (cap at most)", "ddp_bucket_bytes"),
    ("gradients", "grad_collective"),
    ("parameters", "params"),
    ("activations", "activation_bytes"),
)


def configuration(report: Report, brief: bool = False) -> Section | None:
    """The configuration the trace tells (json `inferred_config`), each value with its
    evidence (`brief`, the terminal's: values only), and whether the analytical model ran on
    it (the note)."""
    table = getattr(report, "inferred_config", None)
    if not isinstance(table, pl.DataFrame) or table.height == 0:
        return None
    r = table.row(0, named=True)
    ev = r.get("evidence") or {}
    rows = []
    for label, col in _CONFIG_ROWS:
        if col is None:
            sizes = "  ".join(
                f"{k}={'?' if r[k] is None else r[k]}" for k in ("dp", "tp", "pp", "ep", "cp")
            )
            why = "; ".join(f"{k}: {ev[k]}" for k in ("dp", "tp", "pp") if ev.get(k))
            rows.append((label, sizes, why))
            continue
        value = r.get(col)
        if value is None:
            continue
        if col in ("ddp_bucket_bytes", "activation_bytes"):
            text = fmt_bytes(value)
            if col == "activation_bytes" and r.get("activation_dtype"):
                text += f" {r['activation_dtype']}"
        elif col == "grad_collective":
            text = (
                f"{value} {r.get('grad_dtype') or '?'}, "
                f"{fmt_bytes(r.get('grad_bytes_per_step'))}/step in "
                f"{_num(r.get('grad_calls_per_step'), 'g')} call(s)"
            )
        elif col == "params":
            text = f"{value:,}"
        elif col == "sharding":
            text = f"{value} (stage {r.get('shard_stage')})"
        else:
            text = str(value)
        rows.append((label, text, ev.get(col) or ""))
    source = report.options.get("model_source")
    note = (
        "Analytical model: from --model (it replaces the inferred configuration)."
        if source == "file"
        else "Analytical model: run on this configuration (MODEL101; info findings only)."
        if source == "inferred"
        else f"Analytical model: not run: {report.options.get('model_note') or 'no configuration'}."
    )
    header = ("setting", "value", "evidence")
    if brief:
        header, rows = header[:2], [row[:2] for row in rows]
    return Section(
        "inferred_config",
        "Configuration (inferred from the trace)",
        header,
        rows,
        frozenset(),
        note,
    )


def model_comparison(report: Report) -> Section | None:
    """Expected (the analytical model, `--model`) vs measured communication per role and
    collective (json `model_comparison`)."""
    table = report.model_comparison
    if table.height == 0:
        return None

    def dev(v: float | None) -> str:
        return "-" if v is None else f"{v:+.0f}%"

    rows = [
        (
            r["role"],
            r["collective"],
            _num(r["expected_calls_per_step"]),
            _num(r["measured_calls_per_step"]),
            dev(r["calls_dev_pct"]),
            fmt_bytes(r["expected_bytes_per_step"]),
            fmt_bytes(r["measured_bytes_per_step"]),
            dev(r["bytes_dev_pct"]),
            r["measured_dtype"] or "-",
            "yes" if r["flagged"] else "no",
            r["causes"] or "",
        )
        for r in table.iter_rows(named=True)
    ]
    rows, note = _cut(rows)
    return Section(
        "model_comparison",
        "Analytical model vs measured (per step)",
        ("role", "collective", "calls expected", "calls measured", "calls dev")
        + ("bytes expected", "bytes measured", "bytes dev", "dtype", "flagged", "likely causes"),
        rows,
        frozenset(range(2, 8)),
        note,
    )


def _blame_detail() -> pl.Expr:
    """What a blame row is about, as people read it: the collective and group, the late
    rank waited for, the kernel a launch gap delayed."""
    grp = pl.col("process_group").fill_null(UNKNOWN_GROUP)
    call = pl.concat_str(
        pl.col("collective").fill_null("?"),
        pl.lit(" on "),
        grp,
        pl.lit(" ("),
        # A group whose role was not inferred is still a known group: "role unknown".
        pl.col("role").fill_null("unknown").replace("unknown", "role unknown"),
        pl.lit(")"),
    )
    cat = pl.col("category")
    return (
        pl.when(cat == "wait")
        .then(
            pl.concat_str(
                call,
                # No late rank among the traced ones (a rank not traced, or its own longer call).
                pl.format(", for rank {}", pl.col("late_rank")).fill_null(
                    pl.lit(", for no traced rank")
                ),
            )
        )
        .when(cat.is_in(["transfer", "pipeline_bubble"]))
        .then(call)
        .when(cat.is_in(["launch", "queued"]) & pl.col("collective").is_not_null())
        .then(pl.concat_str(pl.lit("before "), call))
        .when(cat.is_in(["launch", "queued"]) & pl.col("step_start").fill_null(False))
        .then(pl.lit("before the step's first kernel"))
        .when(cat.is_in(["launch", "queued"]))
        .then(pl.lit("before other kernels"))
        .otherwise(pl.lit(""))
    )


def step_blame(report: Report) -> Section | None:
    """Where the median and the worst step went: the critical rank's blame rows (json
    `step_blame`), each category's time and share of that step; they sum to the step."""
    times = report.step_times
    blame = report.step_blame
    if times.height == 0 or blame.height == 0 or "complete" not in times.columns:
        return None
    shown = steptime.median_and_worst(times)
    if not shown:
        return None
    median, worst = shown
    picked = [("median", median), ("worst", worst)]
    rows_by: dict[str, dict[tuple[str, str], int]] = {}
    order: dict[tuple[str, str], int] = {}
    for label, st in picked:
        part = (
            blame.filter((pl.col("step") == st["step"]) & (pl.col("rank") == st["critical_rank"]))
            .with_columns(detail=_blame_detail())
            .group_by("category", "detail")
            .agg(pl.col("ns").sum())
        )
        rows_by[label] = {(c, d): int(n) for c, d, n in part.iter_rows()}
        for key, n in rows_by[label].items():
            order[key] = max(order.get(key, 0), n)
    keys = sorted(order, key=lambda k: (-order[k], k))
    rows = []
    for key in keys:
        cells: list[str] = [key[0], key[1] or "-"]
        for label, st in picked:
            n = rows_by[label].get(key, 0)
            cells += [fmt_ns(n), pct(n / st["step_ns"] if st["step_ns"] else None)]
        rows.append(tuple(cells))
    rows, note = _cut(rows, "row(s)")

    def path(st: dict[str, Any]) -> str:
        chain = st.get("critical_path") or [st["critical_rank"]]
        return " <- ".join(f"rank {r}" for r in chain)

    legend = (
        f"median step {median['step']} ({fmt_ns(median['step_ns'])}, critical path "
        f"{path(median)}); worst step {worst['step']} ({fmt_ns(worst['step_ns'])}, critical "
        f"path {path(worst)}). A step lasts as long as its longest rank's window; its time is "
        "split on that rank's timeline; the critical path's ranks follow it back in time, each "
        "the one the rank before waited for at a collective or point-to-point call; launch, "
        "queued and other_idle are the window's idle time (nothing running) by cause "
        "(docs/tables.md step_blame, critical_path)."
    )
    accounts = getattr(report, "blame_accounts", None)
    if isinstance(accounts, pl.DataFrame) and accounts.height:
        # The blame against the findings (kineto_comm.analysis.reconcile): one line each.
        legend += " Against the findings: " + " ".join(accounts["text"].to_list())
    return Section(
        "step_blame",
        "Step time: where the median and the worst step went (critical rank)",
        ("category", "what", "median", "share", "worst", "share"),
        rows,
        frozenset({2, 3, 4, 5}),
        (note + " " + legend).strip(),
    )


def all_to_all(report: Report) -> Section | None:
    """Per group with all-to-alls, its receivers' loads and imbalance, a line per group
    (json `all_to_all_loads`, kineto_comm.analysis.alltoall)."""
    loads = report.all_to_all_loads
    if loads.height == 0 or "imbalance" not in loads.columns:
        return None
    steps = loads.group_by("process_group").agg(_steps=pl.col("step").n_unique())
    per_rank = (
        loads.group_by("process_group", "rank")
        .agg(_got=pl.col("received_bytes").sum())
        .join(steps, on="process_group")
        .with_columns(_got=pl.col("_got") / pl.col("_steps"))
        .sort("_got", "rank", descending=[True, False])
        .group_by("process_group", maintain_order=True)
        .agg(
            ranks=pl.len(),
            low=pl.col("_got").min(),
            high=pl.col("_got").first(),
            mean=pl.col("_got").mean(),
            busiest=pl.col("rank").first(),
        )
    )
    calls = (
        loads.group_by("process_group", "call_index")
        .agg(pl.col("imbalance").first(), pl.col("call").first())
        .group_by("process_group")
        .agg(
            imbalance=pl.col("imbalance").mean(),
            per_step=pl.col("call").n_unique(),
            worst=pl.col("call")
            .sort_by(["imbalance", "call"], descending=[True, False], nulls_last=True)
            .first(),
            worst_x=pl.col("imbalance").max(),
        )
    )
    table = per_rank.join(calls, on="process_group").sort("process_group")
    rows = [
        (
            group(r["process_group"]),
            str(r["ranks"]),
            str(r["per_step"]),
            f"{fmt_bytes(r['low'])} - {fmt_bytes(r['high'])}",
            str(r["busiest"]),
            f"{r['high'] / r['mean']:.2f}x" if r["mean"] else "-",
            "-" if r["imbalance"] is None else f"{r['imbalance']:.2f}x",
            "-" if r["worst_x"] is None else f"{r['worst']} ({r['worst_x']:.2f}x)",
        )
        for r in table.iter_rows(named=True)
    ]
    rows, note = _cut(rows)
    legend = (
        "received/step: the least and the most a rank receives per step; load max/mean: the "
        "busiest rank's over the mean rank's; imbalance: the mean exchange's busiest receiver "
        "over its mean receiver (an exchange ends when its busiest receiver is done); worst "
        "exchange: its order in the step (0 first)."
    )
    return Section(
        "all_to_all_loads",
        "All-to-all: what each rank receives, per group",
        (
            "group",
            "ranks",
            "exchanges/step",
            "received/step",
            "busiest rank",
            "load max/mean",
            "imbalance",
            "worst exchange",
        ),
        rows,
        frozenset(range(1, 8)),
        (note + " " + legend).strip(),
    )


# Rows of the attribution table the terminal shows (the other formats: MAX_ROWS).
ATTRIBUTION_BRIEF_ROWS = 10


def attribution(report: Report, brief: bool = False) -> Section | None:
    """Where the exposed communication, waits and bubbles come from (json `attribution`):
    per phase x module x role x collective, per step on the critical rank and over the
    ranks, largest first; the terminal shows the top rows."""
    table = getattr(report, "attribution", None)
    if not isinstance(table, pl.DataFrame) or table.height == 0:
        return None
    rows = [
        (
            r["phase"],
            r["module"],
            r["role"],
            r["collective"],
            fmt_ns(r["critical_exposed_ns"]),
            fmt_ns(r["critical_wait_ns"]),
            fmt_ns(r["critical_bubble_ns"]),
            fmt_ns(r["exposed_ns"] + r["wait_ns"] + r["bubble_ns"]),
            r["module_source"],
        )
        for r in table.iter_rows(named=True)
    ]
    limit = ATTRIBUTION_BRIEF_ROWS if brief else MAX_ROWS
    note = ""
    if len(rows) > limit:
        rows, note = rows[:limit], f"({len(rows) - limit} more row(s) in --format json)"
    legend = (
        "Per step: exposed transfer, exposed wait and pipeline bubble on each step's critical "
        "rank, and all three summed over the ranks; phase and module say where the calls were "
        "issued (module_source: how the module was found; hook: a backward hook whose "
        "parameters span modules; unknown: the trace shows no module) (docs/tables.md "
        "attribution)."
    )
    return Section(
        "attribution",
        "Where the exposed communication comes from: phase and module",
        (
            "phase",
            "module",
            "role",
            "collective",
            "exposed/step",
            "wait/step",
            "bubble/step",
            "all ranks/step",
            "module from",
        ),
        rows,
        frozenset({4, 5, 6, 7}),
        (note + " " + legend).strip(),
    )


# The pair matrices the Markdown and HTML reports draw: groups of at most this many ranks,
# at most this many exchanges of a step per group and matrices in all.
MATRIX_RANKS = 16
MATRIX_CALLS = 4
MATRICES = 8


@dataclass(frozen=True)
class PairMatrix:
    """One exchange of a group's steps (`call`) as a matrix: `cells[i][j]` the bytes rank
    `ranks[i]` sends rank `ranks[j]` per step (the mean over the steps), `received` each
    rank's column sum, `imbalance` the exchange's busiest receiver over its mean."""

    group: str
    call: int
    ranks: list[int]
    cells: list[list[float]]
    received: list[float]
    imbalance: float | None


def pair_matrices(report: Report, max_ranks: int = MATRIX_RANKS) -> tuple[list[PairMatrix], str]:
    """The all-to-all pair matrices (json `all_to_all_pairs`) to draw, and a note naming
    what was left out (groups above `max_ranks` ranks, exchanges, matrices beyond the caps)."""
    pairs = report.all_to_all_pairs
    if pairs.height == 0 or "bytes" not in pairs.columns:
        return [], ""
    steps = pairs.group_by("process_group", "call").agg(_steps=pl.col("step").n_unique())
    cells = (
        pairs.group_by("process_group", "call", "src_rank", "dst_rank")
        .agg(pl.col("bytes").sum())
        .join(steps, on=["process_group", "call"])
        .with_columns(per_step=pl.col("bytes") / pl.col("_steps"))
    )
    loads = report.all_to_all_loads
    imbalance = (
        loads.group_by("process_group", "call").agg(pl.col("imbalance").mean())
        if loads.height and "imbalance" in loads.columns
        else pl.DataFrame(
            schema={"process_group": pl.String, "call": pl.Int64, "imbalance": pl.Float64}
        )
    )
    out: list[PairMatrix] = []
    left: list[str] = []
    keys = cells.select("process_group", "call").unique().sort("process_group", "call")
    for pg, call in keys.iter_rows():
        mine = cells.filter((pl.col("process_group") == pg) & (pl.col("call") == call))
        ranks = sorted(set(mine["src_rank"].to_list()) | set(mine["dst_rank"].to_list()))
        if len(ranks) > max_ranks:
            left.append(f"group {group(pg)} ({len(ranks)} ranks)")
            continue
        if call >= MATRIX_CALLS or len(out) >= MATRICES:
            left.append(f"group {group(pg)} exchange {call}")
            continue
        at = {r: i for i, r in enumerate(ranks)}
        grid = [[0.0] * len(ranks) for _ in ranks]
        for src, dst, b in mine.select("src_rank", "dst_rank", "per_step").iter_rows():
            grid[at[src]][at[dst]] = float(b)
        x = imbalance.filter((pl.col("process_group") == pg) & (pl.col("call") == call))
        out.append(
            PairMatrix(
                group(pg),
                int(call),
                ranks,
                grid,
                [sum(row[j] for row in grid) for j in range(len(ranks))],
                x["imbalance"][0] if x.height else None,
            )
        )
    note = (
        f"Not drawn (the JSON report has them): {', '.join(dict.fromkeys(left))}." if left else ""
    )
    return out, note


BUILDERS = (
    collectives,
    skew,
    step_blame,
    configuration,
    attribution,
    process_groups,
    pipeline,
    message_sizes,
    storms,
    all_to_all,
    offsets,
    stragglers,
    model_comparison,
)


# The sections that take `brief` (the terminal's shorter form).
BRIEF = (configuration, process_groups, offsets, stragglers, attribution)


def sections(report: Report, brief: bool = False) -> list[Section]:
    """Every section with content, in the order the human formats show them. `brief` (the
    text report): the roles' evidence as one phrase and, above MAX_RANK_ROWS ranks, the
    per-rank offsets and stragglers summarised as the per-rank table is; the JSON, HTML and
    Markdown keep them whole."""
    built = (build(report, brief) if build in BRIEF else build(report) for build in BUILDERS)
    return [s for s in built if s is not None]
