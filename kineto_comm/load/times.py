"""Each role's rows as typed tables with exact times: B/E pairs made complete events, Kineto's
microseconds (integers in the old schema, floats with three decimals relative to
`baseTimeNanoseconds` in the new) as integer nanoseconds, exactly; and range checks: a time
or collective arg out of range is damage, dropped or made unknown, and counted for a warning.
"""

from __future__ import annotations

from math import isfinite
from typing import Any

import polars as pl

from kineto_comm.lazy import collect
from kineto_comm.load.discover import MAX_RANKS
from kineto_comm.load.events import _F64


def _pair_begin_end(events: pl.DataFrame) -> pl.DataFrame:
    """Turn matching B/E pairs (per file, pid, tid, nesting level) into X events with a
    duration."""
    if events.height == 0 or (events["ph"] == "X").all():
        return events
    where = [c for c in ("_file", "pid", "tid") if c in events.columns]
    be = events.filter(pl.col("ph").is_in(["B", "E"])).with_row_index("_i")
    be = be.sort([*where, "ts_us", "_i"]).with_columns(
        _d=pl.when(pl.col("ph") == "B").then(1).otherwise(-1)
    )
    be = be.with_columns(_depth=pl.col("_d").cum_sum().over(where))
    be = be.with_columns(
        _level=pl.when(pl.col("ph") == "B").then(pl.col("_depth")).otherwise(pl.col("_depth") + 1)
    )
    be = be.with_columns(_nth=pl.int_range(pl.len()).over([*where, "_level", "ph"]))
    begins = be.filter(pl.col("ph") == "B")
    ends = be.filter(pl.col("ph") == "E").select(
        *where, "_level", "_nth", pl.col("ts_us").alias("_end")
    )
    paired = (
        begins.join(ends, on=[*where, "_level", "_nth"], how="inner")
        .with_columns(ph=pl.lit("X"), dur_us=pl.col("_end") - pl.col("ts_us"))
        .select(events.columns)
    )
    return pl.concat([events.filter(pl.col("ph") == "X"), paired], how="vertical")


def _timed(
    events: pl.DataFrame, schema: dict[str, pl.DataType], base_ns: pl.Expr, many: bool = False
) -> pl.LazyFrame:
    """The query for a role's rows as `schema`'s columns (and `_file` for `many` files),
    B/E pairs made complete events, times in nanoseconds (see _to_ns): nothing is computed
    before it runs where the trace has no B/E events (the usual case)."""
    present = events.schema

    def column(k: str, t: pl.DataType) -> pl.Expr:
        if k not in present:
            return pl.lit(None, dtype=t).alias(k)
        if k in _ARG_RANGES:  # out of range: unknown (counted by _out_of_range)
            low, high, _ = _ARG_RANGES[k]
            inside = pl.col(k).is_between(low, high, closed="left")
            return pl.when(inside).then(pl.col(k).cast(t, strict=False))
        return pl.col(k).cast(t)

    typed = events.lazy().select(
        *[column(k, t) for k, t in schema.items()],
        *(["_file"] if many and "_file" in present else []),
    )
    if "ph" in events.columns and not (events["ph"] == "X").all():
        typed = _pair_begin_end(collect(typed)).lazy()
    ts = events.get_column("ts_us") if "ts_us" in events.columns else None
    clean = (
        ts is not None
        and ts.dtype == _F64
        and not ts.null_count()
        and isfinite(ts.sum())
        and _all_in_range(events, _TIME_RANGES)
    )
    query = _to_ns(typed, base_ns, clean)
    return query if events.height else pl.LazyFrame(schema=query.collect_schema())


# The largest |ts| and dur, in microseconds, taken as a time: 2^61 ns (73 years). With a
# base of at most _MAX_BASE_NS, start and end then fit int64 nanoseconds; an event beyond
# it is damage (a value near 2^63 would wrap), dropped with a warning (_out_of_range).
_MAX_US = 2**61 / 1000


def _in_range(columns: list[str]) -> pl.Expr:
    """Whether a row has a time, and its time and duration (of `columns`, where present)
    are within _TIME_RANGES: the rows _out_of_range counts as dropped are the ones dropped."""
    kept = pl.col("ts_us").is_not_null()
    for name, (low, high, _) in _TIME_RANGES.items():
        if name in columns:
            kept &= pl.col(name).is_null() | pl.col(name).is_between(low, high, closed="left")
    return kept


# Collective args beyond these are damage (a size near 2^63 wraps to a negative byte count):
# the value becomes unknown (null), with a warning. column -> (low, high, JSON field).
_ARG_RANGES = {
    "in_nelems": (0, 2**40, "In msg nelems"),
    "out_nelems": (0, 2**40, "Out msg nelems"),
    "group_size": (1, MAX_RANKS, "Group size"),
    "src_rank": (0, MAX_RANKS, "Src Rank"),
    "dst_rank": (0, MAX_RANKS, "Dst Rank"),
}
_TIME_RANGES = {"ts_us": (-_MAX_US, _MAX_US, "ts"), "dur_us": (-_MAX_US, _MAX_US, "dur")}


def _all_in_range(events: pl.DataFrame, ranges: dict[str, tuple[Any, Any, str]]) -> bool:
    """Whether every value of the `ranges` columns present is within its range (a few
    series reductions)."""
    for name, (low, high, _) in ranges.items():
        if name in events.columns and events.height:
            col = events.get_column(name)
            least, most = col.min(), col.max()
            if least is not None and (least < low or not most < high):  # type: ignore[operator]
                return False
    return True


def _out_of_range(events: pl.DataFrame, many: bool) -> list[tuple[int, str, int]]:
    """(file, JSON field, rows) of the values out of range: times (_MAX_US; the row is
    dropped) and collective args (_ARG_RANGES; the value is unknown). Files are numbered by
    `_file` when `many`."""
    ranges = {**_TIME_RANGES, **_ARG_RANGES}
    if _all_in_range(events, ranges):
        return []
    by = pl.col("_file") if many else pl.lit(0, pl.UInt32)
    checks = {}
    for name, (low, high, key) in ranges.items():
        if name in events.columns:
            col = pl.col(name)
            checks[key] = (col.is_not_null() & ~col.is_between(low, high, closed="left")).sum()
    counts = collect(events.lazy().group_by(by.alias("_file")).agg(**checks))
    return [
        (row["_file"], key, n)
        for row in counts.iter_rows(named=True)
        for key, n in row.items()
        if key != "_file" and n
    ]


def _to_ns(events: pl.LazyFrame, base_ns: pl.Expr, clean: bool) -> pl.LazyFrame:
    """Exact integer-nanosecond start/end columns (absolute when the trace gives a base) in
    place of the microsecond ones and the phase (every row is a complete event by now);
    rows without a time, or with one out of range (_MAX_US), are dropped unless `clean`
    says there are none. A launch (launch_ts_us, launch_dur_us) becomes launch_ns and
    launch_end_ns exactly as its runtime call's start and end do (null where it is out of
    range)."""
    ts = pl.col("ts_us")
    start = _ns(ts, base_ns)
    names = events.collect_schema().names()
    if not clean:
        # The runtime calls (no name: launches only) are kept or dropped by their start:
        # a duration out of range leaves the launch's end unknown, as the scanner does.
        calls = "name" not in names
        events = events.filter(_in_range([n for n in names if not (calls and n == "dur_us")]))
    times = {"start_ns": start, "end_ns": _end_ns(start, pl.col("dur_us"))}
    dropped = ["ph", "ts_us", "dur_us"]
    if "launch_ts_us" in names:
        # A launch out of range is no launch (as where its runtime call, dropped for it, is
        # joined after the scanner: _join_launches): neither time nor thread.
        launch = pl.col("launch_ts_us").abs() < _MAX_US
        at = _ns(pl.col("launch_ts_us"), base_ns)
        times["launch_ns"] = pl.when(launch).then(at)
        times["launch_end_ns"] = pl.when(launch).then(_end_ns(at, pl.col("launch_dur_us")))
        times["launch_tid"] = pl.when(launch).then(pl.col("launch_tid"))
        dropped += ["launch_ts_us", "launch_dur_us"]
    return events.with_columns(**times).drop(dropped)


def _end_ns(start_ns: pl.Expr, dur_us: pl.Expr) -> pl.Expr:
    """The end of an event that starts at `start_ns` and lasts `dur_us` microseconds (none
    or negative: 0; beyond _MAX_US, or not a number: unknown)."""
    known = dur_us.is_null() | (dur_us.abs() < _MAX_US)
    dur = (dur_us.fill_null(0.0).clip(lower_bound=0.0) * 1000).round().cast(pl.Int64, strict=False)
    return pl.when(known).then(start_ns + dur)


def _ns(ts: pl.Expr, base_ns: pl.Expr) -> pl.Expr:
    """Microseconds (float) as integer nanoseconds from `base_ns`: the whole microseconds
    and the rounded fraction apart, so that no nanosecond is lost to the float."""
    whole = ts.floor()
    # Not strict: a value out of range (a launch time, masked by the caller) is null, not an
    # error; every time kept is within _MAX_US.
    return (
        whole.cast(pl.Int64, strict=False) * 1000
        + ((ts - whole) * 1000).round().cast(pl.Int64, strict=False)
        + base_ns
    )
