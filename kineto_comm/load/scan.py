"""Glue to the compiled scanner (_scan.c): it reads a piece, or a whole rank file, straight
into columns with no Python object per event (`Scanned`), and hands back what it leaves alone
(invalid JSON, text thread ids, unusual shapes) for msgspec to decode (pieces.py). Both paths
give the same tables (tests/test_scan.py). Optional: without the built extension, or with
KINETO_COMM_PURE_DECODER set, `_scanner` is None and only msgspec reads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import polars as pl

from kineto_comm.lazy import collect, collect_all
from kineto_comm.load.columns import (
    _ARG_ATTRS,
    _EVENT_ATTRS,
    _FALLBACK,
    _SIZED,
    _Annotations,
    _args_of,
    _details,
    _take,
    _threads,
    _wants_shapes,
    _with_shapes,
)
from kineto_comm.load.events import (
    _ANNOTATION,
    _CAT_OF,
    _CODE,
    _COMM_KERNEL_NAME,
    _COMM_OP,
    _COMPILED,
    _DETAIL_FIELDS,
    _DETAIL_TEXT,
    _DEVICE_ROLES,
    _EVENTS,
    _FILE,
    _HOST_TOO,
    _HOST_WAIT,
    _HOST_WAIT_NAMES,
    _IDS,
    _INT_LIKE,
    _NAME_TESTS,
    _NCCL_SPANS,
    _OP_PREFIXES,
    _OTHER_PHASES,
    _PARAM_COMMS,
    _PYTHON_ROW,
    _RUNTIME_READS,
    _STEP_MARK,
    _STR,
    ALL_TO_ALL_OP,
    ANCESTRY_PREFIXES,
    COLLECTIVE_SPAN,
    HOST_SCHEMA,
    HOST_SPANS,
    META_CAT,
    OPS_SCHEMA,
    SIZED_C10D,
    STREAM_WAIT,
)
from kineto_comm.load.read import _Whole

try:  # the compiled scanner (_scan.c): the same tables without Python objects; optional.
    from kineto_comm.load import _scan as _scanner
except ImportError:  # pragma: no cover - not built on this machine
    _scanner = None  # type: ignore[assignment]
if os.environ.get("KINETO_COMM_PURE_DECODER"):  # only msgspec (to compare, or to rule it out)
    _scanner = None  # type: ignore[assignment]


def _scanner_built() -> bool:
    """Whether the compiled scanner reads (tests set `_scanner` to None to rule it out)."""
    return _scanner is not None


class _Arrow:
    """A column handed over by the scanner through the Arrow C data interface."""

    def __init__(self, schema: Any, array: Any) -> None:
        self.capsules = (schema, array)

    def __arrow_c_array__(self, requested_schema: Any = None) -> tuple[Any, Any]:
        return self.capsules


# The scanner's category codes: the same as _CODE, metadata under b"".
_SCAN_CODES = {(b"" if cat == META_CAT else cat.encode()): code for cat, code in _CODE.items()}
_CATEGORY = pl.lit(_CAT_OF).gather(pl.col("code")).alias("cat")
_PH_OF = pl.Series("ph", [chr(i) if chr(i) in "XBEM" else None for i in range(128)], dtype=_STR)


@dataclass
class Scanned:
    """A piece read by the compiled scanner (or the whole files of a batch, one above the
    other: _scanned_batch): one row per kept event (device, runtime, CPU and metadata
    events) with columns code (category code, see _CODE) and role (code // 16), ph (its
    character code), name (a row of `names`), pid, tid, ts_us, dur_us, external_id,
    external_id_old, correlation, stream, device, _file (the file's position in the batch;
    0 for a piece), _detail (its row in `details`, see below) and the event's byte span in
    its file's `data` (span_start, span_end), from which metadata rows are decoded again
    with msgspec.

    `details` holds the collective fields of the events whose args have any (the scanner's
    details table: collective, in_nelems, out_nelems, group_size, dtype, pg_name, pg_desc,
    pg_ranks, seq, src_rank, dst_rank, text as rows of `names`), and `raw`: a value of a
    type those columns do not hold, so that event is decoded with msgspec too (rare).

    Names and phases stay codes until a role's rows are tabulated (_scanned_frame): most
    rows (runtime calls, CPU ops other than annotations) never need their name as text."""

    table: pl.DataFrame
    data: bytes | _Whole | None
    # One row per distinct name: the name and its _NAME_TESTS (_names).
    names: pl.DataFrame
    # Once `data` is let go (a file waiting for its batch, see _settle): the events of the
    # rows that need more fields, decoded beforehand; the table's `_obj` indexes them.
    decoded: list[Any] = field(default_factory=list)
    details: pl.DataFrame = field(default_factory=pl.DataFrame)

    def by_name(self, rows: pl.DataFrame, test: pl.Expr) -> pl.Series:
        """`test` (one of _NAME_TESTS) for these rows, from their names' (each name was
        tested once, not once per row)."""
        column = next(c for c, t in _NAME_TESTS.items() if t is test)
        return self.names.get_column(column).gather(rows.get_column("name")).fill_null(False)

    def names_where(self, test: str) -> pl.Expr:
        """The names (rows of `names`) for which `test` holds, as one list to test rows'
        `name` against (a few names: faster than a column gathered for every row)."""
        held = self.names.get_column(test).to_list()
        return pl.lit(
            pl.Series([i for i, yes in enumerate(held) if yes], dtype=pl.UInt32).implode()
        )

    def decode(self, rows: pl.DataFrame) -> list[Any]:
        """The events of these rows (of `table`), decoded with msgspec from their spans."""
        if self.data is None:
            return _take(self.decoded, rows["_obj"].to_list())
        view = memoryview(self.data)
        spans = zip(rows["span_start"].to_list(), rows["span_end"].to_list(), strict=True)
        text = b",".join(view[a:b] for a, b in spans)
        return _EVENTS.decode(b"[" + text + b"]")


def _needs_event(piece_: Scanned) -> pl.Expr:
    """The rows of a scanned piece whose events are decoded again with msgspec: metadata
    (thread names), and the events whose collective fields the scanner left to it (`raw`)."""
    meta = pl.col("role") == 3
    raw = (piece_.details.get_column("raw") == 1).arg_true() if piece_.details.height else None
    if raw is None or raw.is_empty():
        return meta
    return meta | pl.col("_detail").is_in(pl.lit(pl.Series([raw.to_list()], dtype=_IDS)))


# _NAME_TESTS for Python strings (the same tests; names are tested once each, as the
# scanner hands them over).
_COMM_KERNEL_RE = re.compile(_COMM_KERNEL_NAME)
_COLLECTIVE_SPAN_RE = re.compile(COLLECTIVE_SPAN)


def _names(names: list[str]) -> pl.DataFrame:
    """One row per distinct name of a piece: the name and its _NAME_TESTS."""
    device = [_COMM_KERNEL_RE.match(n) is not None or n == STREAM_WAIT for n in names]
    comm_op = [
        n.startswith(_PARAM_COMMS) or _COLLECTIVE_SPAN_RE.match(n) is not None for n in names
    ]
    op_name = [
        c
        or n.startswith((_STEP_MARK, _COMPILED))
        or n in SIZED_C10D
        or n.startswith(ANCESTRY_PREFIXES)
        for n, c in zip(names, comm_op, strict=True)
    ]
    span = [
        _span_kind(n) if c or n == ALL_TO_ALL_OP else 0 for n, c in zip(names, comm_op, strict=True)
    ]
    return pl.DataFrame(
        {
            "name": names,
            "_device_detail": device,
            "_op_name": op_name,
            "_comm_op": comm_op,
            "_span": span,
        },
        schema={
            "name": _STR,
            "_device_detail": pl.Boolean,
            "_op_name": pl.Boolean,
            "_comm_op": pl.Boolean,
            "_span": pl.UInt8,
        },
    )


def _span_kind(name: str) -> int:
    """What _settle counts of a communication op of this name: 1 a host-backend span, 2 an
    NCCL annotation, 3 a record_param_comms, 4 the all-to-all op (its split sizes), 0 none
    of them."""
    if name == ALL_TO_ALL_OP:
        return 4
    if name.startswith(HOST_SPANS):
        return 1
    if name.startswith(_NCCL_SPANS):
        return 2
    return 3 if name == _PARAM_COMMS else 0


def _settle(piece_: Scanned, notes: _Annotations) -> Scanned:
    """A file read whole by the scanner, made to wait for its batch without its bytes: the
    events that _scanned_columns will decode again are decoded now (in table order: the
    batch numbers them, see _scanned_batch), and its annotation sizes are read now if
    _needs_shapes will want them (the same test). The caller lets go of the bytes, so the
    next file reuses their memory."""
    table = piece_.table
    events = piece_.decode(table.filter(_needs_event(piece_)))
    # What _needs_shapes counts, over the communication CPU ops: each name's kind (host
    # span, NCCL annotation, record_param_comms) is found once, as the names are tested.
    kind = pl.lit(piece_.names.get_column("_span")).gather(pl.col("name"))
    if piece_.details.height:
        named = pl.lit(piece_.details.select(_SIZED).to_series()).gather(pl.col("_detail"))
    else:
        named = pl.lit(False)
    host, annotated, described, splits = (
        table.lazy()
        .filter(pl.col("role") == 2)
        .select(
            (kind == 1).sum().alias("host"),
            (kind == 2).sum().alias("annotated"),
            ((kind == 3) & named).sum().alias("described"),
            (kind == 4).any().alias("splits"),
        )
        .pipe(collect)
        .row(0)
    )
    wanted, _ = _wants_shapes(host > 0, annotated, described, notes.spare, bool(splits))
    shapes = notes.find() if wanted else None

    def find() -> pl.DataFrame:
        if shapes is None:
            raise AssertionError("annotation sizes wanted, but not read while the file was")
        return shapes

    notes.find = find
    return Scanned(piece_.table, None, piece_.names, events, piece_.details)


def _scan_piece(
    data: bytes | _Whole, start: int, stop: int, host: bool = True, link: bool = False
) -> tuple[Scanned, int] | None:
    """The events after data[start] up to data[stop] (stop < 0: the array's end), read by the
    compiled scanner, and where the array closed; None where msgspec has to decode them (no
    scanner, invalid JSON, or a shape the scanner leaves alone).

    Without `host` (the file keeps no host table) the scanner drops the CPU ops that are not
    `ops` rows (it may keep a few more, which _scanned_columns drops): on pp-8, 14,800 of
    23,800 rows a file. With `link` (a whole file) it gives the device rows their launch
    (launch_ts_us, launch_tid) and drops the runtime calls, unless some of them are B/E
    events: then they stay, for _join_launches (as in a piece, whose calls are not all its
    file's)."""
    if _scanner is None:
        return None
    ops = None if host else _OP_PREFIXES
    got = _scanner.scan(
        data,
        start,
        stop,
        _SCAN_CODES,
        _OTHER_PHASES,
        ops,
        _ANNOTATION,
        link,
        _HOST_WAIT_NAMES,
        _HOST_WAIT,
    )
    if got is None:
        return None
    _, columns, detail_columns, raw_names, end = got
    try:
        names = [
            msgspec.json.decode(b'"' + raw + b'"') if b"\\" in raw else raw.decode()
            for raw in raw_names
        ]
    except (UnicodeDecodeError, msgspec.DecodeError):
        return None  # msgspec reports it
    table = pl.DataFrame([pl.Series(_Arrow(schema, array)) for _, schema, array in columns])
    details = pl.DataFrame([pl.Series(_Arrow(sch, array)) for _, sch, array in detail_columns])
    # Series operations: no query to plan for two columns.
    role = (table.get_column("code") // 16).alias("role")
    file = pl.Series("_file", dtype=pl.Int64).extend_constant(0, table.height)
    table = table.hstack([role, file])
    return Scanned(table, data, _names(names), details=details), end


def _scanned_columns(
    piece_: Scanned, notes: list[_Annotations] | None, host: list[bool]
) -> dict[str, pl.DataFrame]:
    """_columns for a piece read by the scanner (or a batch of whole files: `notes` and
    `host` per file): the same tables, from its columns, with the `_file` column. The device
    rows carry the launches the scanner linked (_scan_piece); _assemble joins the others."""
    # A filter per role (rows keep their order): a sequential copy of each role's rows,
    # where one partition_by pass hashes the key and gathers them (a third slower on a
    # batch's 90,000 rows). Runtime calls (only where the scanner did not link the
    # launches: pieces, B/E calls) copy only the columns of a launch; CPU ops only the
    # annotations and communication ops unless some file keeps all of them.
    role = pl.col("role")
    table = piece_.table.lazy()
    op = (pl.col("code") == _CODE["user_annotation"]) | pl.col("name").is_in(
        piece_.names_where("_op_name")
    )
    by_role = collect_all(
        [
            table.filter(role == 0),
            table.filter(role == 1).select(_RUNTIME_READS),
            table.filter((role == 2) & (op if not any(host) else pl.lit(True))),
            table.filter(role == 3),
        ]
    )
    out: dict[str, pl.DataFrame] = {}
    for code, key, schema, detail in _DEVICE_ROLES:
        rows = by_role[code]
        if rows.height:
            linked = code == 0 and rows.get_column("launch_ts_us").null_count() < rows.height
            launch = _SCANNED_LAUNCH if linked else []
            out[key] = _scanned_frame(piece_, rows, schema, detail, None, launch)
        else:
            out[key] = pl.DataFrame(schema=schema)
    cpu = by_role[2]
    is_op = None  # without host tables, every row left is an op
    keeps: pl.Expr = pl.lit(True)  # which rows' files keep their host table (_columns)
    if any(host):
        is_op = cpu.select(op.fill_null(False)).to_series()
        if not all(host):  # only the files that keep all CPU ops keep the others
            keep_all = pl.lit(pl.Series(host, dtype=pl.Boolean)).gather(pl.col("_file"))
            keeps = keep_all
            cpu = cpu.filter(is_op | keep_all)
            is_op = cpu.select(op.fill_null(False)).to_series()
    frame = pl.DataFrame(schema=OPS_SCHEMA)
    if cpu.height:
        frame = _scanned_frame(piece_, cpu, OPS_SCHEMA, _COMM_OP, notes)
    out["ops"] = frame if is_op is None else frame.filter(is_op)
    out["host"] = (
        frame.clear()
        if is_op is None
        else frame.filter(~is_op & ~_PYTHON_ROW | (_HOST_TOO & keeps))
    )
    out["host"] = out["host"].select(*HOST_SCHEMA, *_FILE.intersection(frame.columns))
    meta = by_role[3]
    out["threads"] = _threads(piece_.decode(meta)).with_columns(meta["_file"])
    return out


# The device rows' launch columns as the scanner links them (null where it did not).
_SCANNED_LAUNCH = [
    pl.col("launch_ts_us"),
    pl.col("launch_tid").cast(_STR),
    pl.col("launch_dur_us"),
]


def _scanned_frame(
    piece_: Scanned,
    rows: pl.DataFrame,
    schema: dict[str, pl.DataType],
    detail: pl.Expr | None,
    notes: list[_Annotations] | None = None,
    launch: Sequence[pl.Expr] = (),
) -> pl.DataFrame:
    """_frame for one role's rows of a scanned piece (or batch); `launch`: the device rows'
    launch columns (_SCANNED_LAUNCH)."""
    cols: list[pl.Expr] = []
    if "cat" in schema:
        cols.append(_CATEGORY)
    if "external_id" in schema:
        cols.append(pl.coalesce("external_id", "external_id_old").alias("external_id"))
    cols += [pl.col(k) for k in _ARG_ATTRS if k in schema and k != "external_id"]
    for key in _EVENT_ATTRS:  # the scanner's columns carry these names
        if key not in schema:
            continue
        fallback_for = _FALLBACK.get(key) if "device" in schema else None
        if fallback_for is not None and not rows[fallback_for].null_count():
            continue
        if key == "name":
            col = pl.lit(piece_.names.get_column("name")).gather(pl.col("name")).alias("name")
        else:
            col = pl.col(key).cast(_STR) if key in _INT_LIKE else pl.col(key)
        if fallback_for is not None:
            # Only the rows that lack a device/stream carry their host coordinates (_frame).
            col = pl.when(pl.col(fallback_for).is_null()).then(col).alias(key)
        cols.append(col)
    rest = [k for k in _DETAIL_FIELDS if k in schema] if detail is not None else []
    held = piece_.by_name(rows, detail) if rest and detail is not None else None
    fields = _scanned_details(piece_, held, schema, rest) if held is not None and held.any() else []
    # The collective columns in the same query as the others (no join of them afterwards).
    frame = rows.select(
        *cols, *launch, pl.lit(_PH_OF).gather(pl.col("ph")).alias("ph"), "_file", *fields
    )
    raw = frame.drop_in_place("_raw").arg_true() if "_raw" in frame.columns else None
    if raw is not None and not raw.is_empty():
        spans = rows.select(c for c in ("span_start", "span_end", "_obj") if c in rows.columns)
        decoded = _details(schema, raw.to_list(), lambda i: _args_of(piece_.decode(spans[i])))
        assert decoded is not None
        frame = frame.with_columns(frame.get_column(k).scatter(raw, decoded[k]) for k in rest)
    return _with_shapes(frame, notes)


def _scanned_details(
    piece_: Scanned, held: pl.Series, schema: dict[str, pl.DataType], rest: list[str]
) -> list[pl.Expr]:
    """Over a scanned role's rows, the collective columns `rest` where `held` (the rows of
    communication kernels or ops; null elsewhere), from the scanner's details table, and
    `_raw`: the rows whose fields the scanner left to msgspec (their events are decoded)."""
    found, names = piece_.details, pl.lit(piece_.names.get_column("name"))
    if not found.height:  # no event of the piece has any
        return [pl.lit(None, dtype=schema[k]).alias(k) for k in rest]
    at = pl.when(pl.lit(held)).then(pl.col("_detail"))

    def value(column: str) -> pl.Expr:
        got = pl.lit(found.get_column(column)).gather(at)
        return names.gather(got) if column in _DETAIL_TEXT else got

    return [
        *[value(k).cast(schema[k]).alias(k) for k in rest],
        (value("raw") == 1).fill_null(False).alias("_raw"),
    ]
