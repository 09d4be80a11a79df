"""A file's RawTrace from its pieces' tables (or a batch of whole files' tables, keyed by
`_file`): times (times.py), host waits split off the device rows, launches joined to their
kernels where the scanner has not linked them, and what the header says (rank, groups,
devices), each value range-checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import polars as pl

from kineto_comm.keys import pair_key
from kineto_comm.lazy import collect, collect_all, split
from kineto_comm.load.discover import MAX_RANKS
from kineto_comm.load.events import (
    _HOST_WAIT_CAT,
    GPU_SCHEMA,
    HOST_SCHEMA,
    OPS_SCHEMA,
    RUNTIME_SCHEMA,
    WAITS_SCHEMA,
    DeviceProps,
    RawTrace,
    Top,
)
from kineto_comm.load.times import _out_of_range, _timed


@dataclass
class _About:
    """What a file says besides its events: header and trailer, size, decoding warnings,
    whether its host table was left out, and whether its end was cut off."""

    name: str
    tops: list[Top]
    nbytes: int
    warnings: list[str]
    host_skipped: bool
    cut_off: bool = False


def _assemble(files: list[_About], parts: list[dict[str, pl.DataFrame]]) -> list[RawTrace]:
    """The files' RawTraces from their pieces' tables: one file's pieces, or one piece
    holding several files (rows keyed by `_file`, their position in `files`). The device
    rows' launches come from the runtime calls, where the scanner has not linked them."""
    many = len(files) > 1
    bases = [_base_ns(about.tops) for about in files]
    for about, used in zip(files, bases, strict=True):
        if (stated := _stated_base_ns(about.tops)) != used:
            about.warnings.append(
                f"{about.name}: baseTimeNanoseconds {stated} is out of range; ignored"
                " (times stay on the trace's own clock)"
            )
    base = pl.lit(pl.Series(bases, dtype=pl.Int64)).gather("_file") if many else pl.lit(bases[0])

    out_of_range: dict[tuple[int, str], int] = {}

    def timed(key: str, schema: dict[str, pl.DataType]) -> pl.LazyFrame:
        frames = [p[key] for p in parts]
        # A role's pieces as one table (a piece without collective rows lacks their columns).
        rows = pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else frames[0]
        # Not the runtime calls: they only link launches, and the scanner drops those of a
        # whole file before they become rows (the warning must not depend on the path).
        for i, name, n in _out_of_range(rows, many) if key != "runtime" else ():
            out_of_range[i, name] = out_of_range.get((i, name), 0) + n
        # No rows, no `_file` column to find each row's base by.
        return _timed(rows, schema, base if rows.height else pl.lit(0), many)

    # The roles' queries run together: one plan, on the pool's threads at once. Runtime calls
    # are left where the scanner linked the launches (_scan_piece), to join them otherwise.
    roles = {"gpu": GPU_SCHEMA, "ops": OPS_SCHEMA, "host": HOST_SCHEMA}
    if any(p["runtime"].height for p in parts):
        roles["runtime"] = RUNTIME_SCHEMA
    tables = dict(zip(roles, collect_all([timed(k, t) for k, t in roles.items()]), strict=True))
    threads = [p["threads"] if many else p["threads"].drop("_file", strict=False) for p in parts]
    tables["threads"] = pl.concat(threads, how="vertical") if len(threads) > 1 else threads[0]
    for (i, name), n in sorted(out_of_range.items()):
        what = "dropped" if name in ("ts", "dur") else "taken as unknown"
        files[i].warnings.append(
            f"{files[i].name}: {n} event{'s' if n > 1 else ''} with `{name}` out of range; {what}"
        )
    # The host waits, found among the runtime calls by name, came with the device rows.
    gpu = tables["gpu"]
    waited = gpu.get_column("cat") == _HOST_WAIT_CAT
    keys = [c for c in ("_file",) if c in gpu.columns]
    if waited.any():
        tables["waits"] = gpu.filter(waited).select(*keys, *WAITS_SCHEMA)
        tables["gpu"] = gpu = gpu.filter(~waited)
    else:
        tables["waits"] = gpu.clear().select(*keys, *WAITS_SCHEMA)
    calls = tables.pop("runtime", None)
    if calls is not None and calls.height and gpu.height:
        tables["gpu"] = _join_launches(gpu, calls)
    split = {key: _per_file(frame, len(files)) for key, frame in tables.items()}
    return [_raw(about, {key: split[key][i] for key in split}) for i, about in enumerate(files)]


def _per_file(frame: pl.DataFrame, n: int) -> list[pl.DataFrame]:
    """A table's rows per file (by `_file`), without that column."""
    if "_file" not in frame.columns:
        return [frame] if n == 1 else [frame.clear()] * n  # no rows: nothing to split
    return split(frame, "_file", n, keep_key=False)


def _base_ns(tops: list[Top]) -> int:
    """The file's baseTimeNanoseconds: 0 without one, or with one so far out (a damaged
    header) that times from it would not fit the tables' int64 nanoseconds."""
    base = _stated_base_ns(tops)
    return base if abs(base) <= _MAX_BASE_NS else 0


def _stated_base_ns(tops: list[Top]) -> int:
    return int(next((t.baseTimeNanoseconds for t in tops if t.baseTimeNanoseconds), None) or 0)


# A quarter of int64's range (year 2116): room for the trace's own times on top.
_MAX_BASE_NS = 2**62


def _raw(about: _About, tables: dict[str, pl.DataFrame]) -> RawTrace:
    """One file's RawTrace: its tables and what its header and trailer say."""
    tops = about.tops
    info = next((t.distributedInfo for t in tops if t.distributedInfo is not None), None)
    devices = next((t.deviceProperties for t in tops if t.deviceProperties), None) or []

    def checked(value: int | None, low: int, field: str) -> int | None:
        """`value` where it can be what `field` says (low <= value < MAX_RANKS), else None
        with a warning: a damaged rank or size must not take a rank or wrap a table."""
        if value is None or low <= value < MAX_RANKS:
            return value
        about.warnings.append(f"{about.name}: {field} {value} is out of range; ignored")
        return None

    groups = []
    if info is not None and info.pg_config:
        for pg in info.pg_config:
            ranks = pg.ranks
            if isinstance(ranks, str):
                ranks = _parse_int_list(ranks)
            kept = [r for r in ranks or [] if checked(r, 0, "a pg_config rank") is not None]
            groups.append(
                {
                    "pg_name": None if pg.pg_name is None else str(pg.pg_name),
                    "pg_desc": pg.pg_desc,
                    "pg_size": checked(pg.pg_size, 1, "pg_config pg_size") or len(kept),
                    "ranks": kept,
                    "backend_config": pg.backend_config,
                }
            )
    if info is None and about.cut_off:
        about.warnings.append(
            f"{about.name}: no distributedInfo before the cut (Kineto may write it after the"
            " events); the rank comes from the file name or order"
        )
    return RawTrace(
        file=about.name,
        **tables,
        rank=None if info is None else checked(info.rank, 0, "distributedInfo.rank"),
        world_size=None
        if info is None
        else checked(info.world_size, 1, "distributedInfo.world_size"),
        backend=None if info is None else info.backend,
        process_groups=groups,
        device_names=[d.name or "?" for d in devices],
        devices=[_device(d) for d in devices],
        base_time_ns=_base_ns(tops),
        host_name=next((t.host_name for t in tops if t.host_name), None),
        nbytes=about.nbytes,
        warnings=about.warnings,
        host_skipped=about.host_skipped,
    )


def _device(d: DeviceProps) -> dict[str, Any]:
    """A deviceProperties entry as the hardware analysis reads it (analysis/hardware.py)."""
    major, minor = _whole(d.computeMajor), _whole(d.computeMinor)
    return {
        "id": _whole(d.id),
        "name": d.name,
        "sms": _whole(d.numSms),
        "memory_bytes": _whole(d.totalGlobalMem),
        "compute_capability": None if major is None else f"{major}.{minor or 0}",
    }


def _whole(value: Any) -> int | None:
    """A header's whole number (int, or its digits as text), else None; int64's range."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= 2**63:
        return None
    return value


def _join_launches(gpu: pl.DataFrame, runtime: pl.DataFrame) -> pl.DataFrame:
    """`gpu` with launch_ns, launch_end_ns and launch_tid from the first runtime call with
    each row's file and correlation (`_file` where the tables hold several files), in the
    rows' order, where the scanner has not linked them (kineto_comm/load/_scan.c,
    link_launches: a file linked there has no runtime calls left here). Only the key columns
    of the (wide) kernel table take part in the join. Where they fit, file and correlation
    are one integer key (kineto_comm.keys): an order-keeping join on two keys
    took twice as long."""
    by = ["_file"] if "_file" in gpu.columns and "_file" in runtime.columns else []
    pair = pair_key([runtime, gpu], "_file", "correlation") if by else None
    on = [*by, "correlation"] if pair is None else ["_key"]
    key = [pl.col(c) for c in on] if pair is None else [pair.alias("_key")]
    calls = (
        runtime.lazy()
        .select(*key, launch_ns="start_ns", launch_end_ns="end_ns", launch_tid="tid")
        .drop_nulls(on)
        .unique(on, keep="first", maintain_order=True)
    )
    joined = gpu.lazy().select(*key).join(calls, on=on, how="left", maintain_order="left")
    found = collect(joined.select("launch_ns", "launch_end_ns", "launch_tid")).get_columns()
    if "launch_ns" not in gpu.columns:
        return gpu.with_columns(found)
    return gpu.with_columns(pl.coalesce(gpu.get_column(f.name), f).alias(f.name) for f in found)


def _parse_int_list(text: str) -> list[int]:
    """The integers in `text` ("[0, 1]"), as written (range is checked by the caller)."""
    return [int(x) for x in re.findall(r"-?\d+", text)]
