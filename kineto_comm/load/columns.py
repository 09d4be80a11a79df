"""Decoded events into typed columns: a piece decoded by msgspec (`_object_columns`), and the
helpers the scanner's path shares with it (typed series, collective details, thread names, and
the `Input Dims` of communication annotations, read from the raw bytes only where a piece's ops
need them for their message sizes).

Repeated names share one copy (categorical, cast back to text); fields whose JSON type varies
(ints and strings) become text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any

import msgspec
import polars as pl

from kineto_comm.lazy import collect
from kineto_comm.load.events import (
    _ANNOTATION_PREFIXES,
    _BOUNDARY,
    _CAT_OF,
    _CODE,
    _COMM_OP,
    _DETAIL_FIELDS,
    _DEVICE_ROLES,
    _DURATION_PH,
    _EMPTY_ARGS,
    _F64,
    _FILE,
    _HOST_TOO,
    _HOST_WAIT,
    _I64,
    _INT_LIKE,
    _IS_OP,
    _NAME_KEY,
    _NCCL_SPANS,
    _PARAM_COMMS,
    _PARSED_INT,
    _PYTHON_ROW,
    _SHAPE,
    _SIZED_LONGEST,
    _SIZED_NAMES,
    _STR,
    ALL_TO_ALL_OP,
    HOST_SCHEMA,
    HOST_SPANS,
    HOST_WAIT_CALLS,
    META_CAT,
    OPS_SCHEMA,
    Args,
    Begin,
    End,
    Event,
    parse_int,
)


def _str_or_none(values: list[Any]) -> list[str | None]:
    return [None if v is None else str(v) for v in values]


def _series(name: str, values: list[Any], dtype: pl.DataType) -> pl.Series:
    """Build a typed column; fields whose JSON type varies (ints and strings) become text."""
    if name in _PARSED_INT:
        try:
            return pl.Series(name, values, dtype=_I64, strict=True)
        except (TypeError, OverflowError, pl.exceptions.PolarsError):
            text = pl.Series(name, _str_or_none(values), dtype=_STR)
            return pl.select(parse_int(pl.lit(text))).to_series().alias(name)
    if name in _INT_LIKE:
        try:
            return pl.Series(name, values, dtype=_I64, strict=True).cast(_STR)
        except (TypeError, OverflowError, pl.exceptions.PolarsError):
            return pl.Series(name, _str_or_none(values), dtype=_STR)
    if name == "name":
        # Event names repeat (a few hundred distinct kernel names, often 200 bytes long):
        # through a categorical, every row's string view points at one shared copy.
        try:
            return pl.Series(name, values, dtype=pl.Categorical, strict=True).cast(_STR)
        except (TypeError, OverflowError, pl.exceptions.PolarsError):
            pass
    try:
        return pl.Series(name, values, dtype=dtype, strict=True)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        return pl.Series(name, _str_or_none(values), dtype=_STR).cast(dtype, strict=False)


def _take(items: list[Any], idx: list[int]) -> list[Any]:
    """items[i] for i in idx, gathered in C."""
    if not idx:
        return []
    if len(idx) == 1:
        return [items[idx[0]]]
    return list(itemgetter(*idx)(items))


def _args_of(events: list[Event]) -> list[Args]:
    args = list(map(attrgetter("args"), events))
    if None in args:
        args = [_EMPTY_ARGS if a is None else a for a in args]
    return args


def _values(items: list[Any], attr: str) -> list[Any]:
    return list(map(attrgetter(attr), items))


# Columns read from every event of a role, and (for "detail" rows only) from their args.
_EVENT_ATTRS = {
    "name": "name",
    "pid": "pid",
    "tid": "tid",
    "ts_us": "ts",
    "dur_us": "dur",
}
_ARG_ATTRS = {
    "external_id": "external_id",
    "correlation": "correlation",
    "stream": "stream",
    "device": "device",
}
# Host coordinates only needed on the device when the args lack device/stream.
_FALLBACK = {"pid": "device", "tid": "stream"}


_SHAPE_COLUMNS = ("input_dims", "input_type", "concrete_inputs")


def _shapes(buf: bytearray | bytes, start: int, end: int) -> pl.DataFrame:
    """`Input Dims` / `Input type` of the communication annotations in buf[start:end], and
    the `Concrete Inputs` of the c10d ops among them.

    Each annotation is found by its name; its event runs from the last `{` before the name
    (Kineto writes `name` before `args`, and nothing before it nests) to the next event
    boundary. An event that does not decode that way is skipped: it only loses its size.
    """
    rows: list[tuple[Any, ...]] = []
    for at in _annotation_names(buf, start, end):
        open_at = buf.rfind(b"{", start, at)
        close = _BOUNDARY.search(buf, at, end)
        close_at = close.start() + 1 if close else buf.rfind(b"}", at, end) + 1
        if open_at < 0 or close_at <= 0:
            continue
        try:
            ev = _SHAPE.decode(memoryview(buf)[open_at:close_at])
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if ev.args is None:
            continue
        dims = bytes(ev.args.input_dims).decode("utf-8", "replace") or None
        kind = bytes(ev.args.input_type).decode("utf-8", "replace") or None
        values = None
        if ev.name is not None and ev.name.startswith("c10d::"):
            values = bytes(ev.args.concrete_inputs).decode("utf-8", "replace") or None
        rows.append((ev.name, ev.tid, ev.ts, dims, kind, values))
    if not rows:
        return pl.DataFrame()
    names, tids, tss, dims, kinds, values = map(list, zip(*rows, strict=True))
    return pl.DataFrame(
        [
            _series("name", names, _STR),
            _series("tid", tids, _STR),
            _series("ts_us", tss, _F64),
            pl.Series("input_dims", dims, dtype=_STR),
            pl.Series("input_type", kinds, dtype=_STR),
            pl.Series("concrete_inputs", values, dtype=_STR),
        ]
    ).unique(subset=["name", "tid", "ts_us"], keep="first")


def _lazy_shapes(buf: bytearray | bytes, start: int, end: int) -> Callable[[], pl.DataFrame]:
    """_shapes(buf, start, end), deferred until a piece turns out to need it."""
    return lambda: _shapes(buf, start, end)


def _annotation_names(buf: bytearray | bytes, start: int, end: int) -> list[int]:
    """Positions of `"name": "<backend>:...` values in buf[start:end] (found with bytes.find)."""
    found: list[int] = []
    for prefix in _ANNOTATION_PREFIXES:
        c10d = prefix == b'"c10d::'
        at = buf.find(prefix, start, end)
        while at >= 0:
            # (sliced, not startswith: the buffer may be a file's memory map)
            sized = not c10d or bytes(buf[at : at + _SIZED_LONGEST]).startswith(_SIZED_NAMES)
            if sized and _NAME_KEY.search(buf, max(start, at - 16), at):
                found.append(at)
            at = buf.find(prefix, at + 1, end)
    return sorted(found)


def _frame(
    events: list[Event],
    cat: pl.Series,
    phased: bool,
    schema: dict[str, pl.DataType],
    detail: pl.Expr | None,
    notes: _Annotations | None = None,
) -> pl.DataFrame:
    """One role's rows of one piece, with the collective columns (the rest of `schema`) of
    the rows where `detail` holds (null on the others). `cat` is the events' category
    column; `phased`: whether they may be other than complete (X) events."""
    n = len(events)
    cols: dict[str, pl.Series] = {}
    if "cat" in schema:
        cols["cat"] = cat
    args = _args_of(events) if any(k in schema for k in _ARG_ATTRS) else []
    for key, attr in _ARG_ATTRS.items():
        if key in schema:
            cols[key] = _series(key, _values(args, attr), schema[key])
    for key, attr in _EVENT_ATTRS.items():
        if key not in schema:
            continue
        fallback_for = _FALLBACK.get(key) if "device" in schema else None
        if fallback_for is None:
            cols[key] = _series(key, _values(events, attr), schema[key])
        elif cols[fallback_for].null_count():
            # Only the rows that lack a device/stream carry their host coordinates: the
            # same rows however the file is cut into pieces.
            host = _series(key, _values(events, attr), schema[key])
            cols[key] = pl.select(pl.when(cols[fallback_for].is_null()).then(host)).to_series()
    if "external_id" in cols and cols["external_id"].null_count():
        old = _series("old", _values(args, "external_id_old"), _I64)
        cols["external_id"] = cols["external_id"].fill_null(old)
    phs = _values(events, "ph") if phased else None
    cols["ph"] = (
        pl.Series("ph", phs, dtype=_STR, strict=False)
        if phs is not None
        else pl.repeat("X", n, dtype=_STR, eager=True).alias("ph")
    )
    frame = pl.DataFrame(list(cols.values()))

    def args_at(idx: list[int]) -> list[Args]:
        return _args_of(_take(events, idx)) if not args else _take(args, idx)

    idx = [] if detail is None else frame.select(pl.arg_where(detail)).to_series().to_list()
    details = _details(schema, idx, args_at)
    if details is not None:
        # Each row's position among the rows `idx` (null elsewhere) picks its values.
        at = pl.Series(dtype=pl.UInt32).extend_constant(None, n)
        at.scatter(idx, pl.int_range(len(idx), dtype=pl.UInt32, eager=True))
        frame = frame.with_columns(pl.lit(column).gather(at) for column in details.get_columns())
    frame = _with_shapes(frame, None if notes is None else [notes])
    if phs is not None and phs.count("X") != n:  # only complete events and B/E pairs last
        frame = frame.filter(pl.col("ph").is_in(list(_DURATION_PH)))
    return frame


def _details(
    schema: dict[str, pl.DataType], idx: list[int], args_at: Callable[[list[int]], list[Args]]
) -> pl.DataFrame | None:
    """The collective and stream-wait columns (those of `schema` in _DETAIL_FIELDS) of rows
    `idx` (communication kernels, stream waits or ops), a row each; `args_at(idx)` gives
    those rows' decoded args."""
    rest = [k for k in _DETAIL_FIELDS if k in schema]
    if not rest or not idx:
        return None
    sub_args = args_at(idx)
    sub = {key: _values(sub_args, key) for key in rest}
    if "pg_ranks" in sub:
        sub["pg_ranks"] = [str(r) if isinstance(r, list) else r for r in sub["pg_ranks"]]
    return pl.DataFrame([_series(k, v, schema[k]) for k, v in sub.items()])


def _with_shapes(frame: pl.DataFrame, notes: list[_Annotations] | None) -> pl.DataFrame:
    """The CPU ops with the Input Dims / Input type of their annotations, where needed
    (`notes`: per file, the frame's `_file` column telling whose a row is)."""
    if notes is None:
        return frame
    batch = "_file" in frame.columns
    found = []
    for f in _needs_shapes(frame, notes):
        shapes = notes[f].find()
        if shapes.height:
            found.append(shapes.with_columns(_file=pl.lit(f, dtype=pl.Int64)) if batch else shapes)
    if found:
        keys = [*_FILE.intersection(frame.columns), "name", "tid", "ts_us"]
        shapes = pl.concat(found, how="vertical") if len(found) > 1 else found[0]
        frame = frame.join(shapes, on=keys, how="left", maintain_order="left")
    return frame


@dataclass
class _Annotations:
    """Sizes of the current piece's communication annotations (`find`: read from its raw
    bytes on demand), and `spare`: record_param_comms of the previous piece beyond its
    annotations (an op and its annotation cut apart by a piece boundary need no sizes)."""

    find: Callable[[], pl.DataFrame] = pl.DataFrame
    spare: int = 0


def _wants_shapes(
    host: bool, annotated: int, described: int, spare: int, splits: bool = False
) -> tuple[bool, int]:
    """Whether a piece's ops gain from annotation sizes, from its counts of host-backend
    spans, NCCL annotations and record_param_comms with collective args (`spare`: those of
    the previous piece beyond its annotations); and the spare this piece leaves. Host-backend
    spans always do, and so does a piece with an all-to-all op (`splits`: its split sizes
    are in its Concrete Inputs); NCCL annotations only when fewer record_param_comms carry
    args."""
    if host or splits:
        return True, spare
    available = described + spare
    return annotated > available, min(described, max(0, available - annotated))


# A record_param_comms that gives its call's size (so its annotation need not): a named
# collective with a message size in range (_ARG_RANGES). Counted on raw values, so whether
# sizes are read depends on the events alone, not on how the file is cut into pieces.
_SIZED = pl.col("collective").is_not_null() & pl.col("in_nelems").is_between(
    0, 2**40, closed="left"
).fill_null(False)


def _needs_shapes(cpu: pl.DataFrame, notes: list[_Annotations]) -> list[int]:
    """The files (positions in `notes`) whose ops gain from annotation sizes (_wants_shapes)."""
    name = pl.col("name")
    described = pl.lit(0, dtype=pl.UInt32)
    if "collective" in cpu.columns:
        described = ((name == _PARAM_COMMS) & _SIZED).sum()
    counts = [
        pl.any_horizontal(name.str.starts_with(p) for p in HOST_SPANS).any().alias("host"),
        pl.any_horizontal(name.str.starts_with(p) for p in _NCCL_SPANS).sum().alias("annotated"),
        described.alias("described"),
        (name == ALL_TO_ALL_OP).any().alias("splits"),
    ]
    if len(notes) > 1:
        rows = collect(cpu.lazy().group_by("_file").agg(counts).sort("_file")).rows()
    else:
        rows = [(0, *collect(cpu.lazy().select(counts)).row(0))]
    need = []
    for f, host, annotated, described_, splits in rows:
        want, notes[f].spare = _wants_shapes(host, annotated, described_, notes[f].spare, splits)
        if want:
            need.append(f)
    return need


def _object_columns(
    events: list[Event],
    notes: _Annotations | None = None,
    host: bool = True,
) -> dict[str, pl.DataFrame]:
    """Split a piece's events decoded by msgspec by role (by category, looked up in C) and
    tabulate each role; `notes` supplies the annotations' Input Dims / Input type when they
    are needed. Without `host`, the CPU ops that are neither communication nor annotations are
    left out. (decode._columns takes either kind of piece.)"""
    cats = _values(events, "cat")
    tagged = not (events and isinstance(events[0], Event))
    if not tagged:  # the permissive fallback: M has no class
        cats = [META_CAT if e.ph == "M" else c for e, c in zip(events, cats, strict=True)]
    codes = pl.Series("cat", list(map(_CODE.get, cats)), dtype=pl.UInt8)
    del cats
    calls = ((codes // 16) == 1).arg_true()
    if len(calls):  # the host waits among the runtime calls, by name
        named = pl.Series(_values(_take(events, calls.to_list()), "name"), dtype=_STR, strict=False)
        waits = calls.filter(named.is_in(HOST_WAIT_CALLS).fill_null(False))
        if len(waits):
            codes = codes.scatter(waits, _HOST_WAIT)
    roles = codes // 16
    # Only B/E events (and the permissive classes) need their phase read one by one.
    phased = not tagged or not {Begin, End}.isdisjoint(map(type, events))
    out: dict[str, pl.DataFrame] = {}

    def pick(role: int) -> tuple[list[Any], pl.Series]:
        idx = (roles == role).arg_true()
        cat = _CAT_OF.gather(codes.gather(idx))
        return _take(events, idx.to_list()), cat

    for code, role, schema, detail in _DEVICE_ROLES:
        picked, cat = pick(code)
        if picked:
            out[role] = _frame(picked, cat, phased, schema, detail)
        else:
            out[role] = pl.DataFrame(schema=schema)
    cpu, cat = pick(2)
    if not host:  # only the ops: pick them by name and category before building columns
        names = pl.Series("name", _values(cpu, "name"), dtype=_STR, strict=False)
        keys = pl.DataFrame([names, cat])
        keep = keys.select(pl.arg_where(_IS_OP)).to_series()
        cpu, cat = _take(cpu, keep.to_list()), cat.gather(keep)
    frame = pl.DataFrame(schema=OPS_SCHEMA)
    if cpu:
        frame = _frame(cpu, cat, phased, OPS_SCHEMA, _COMM_OP, notes)
    out["ops"] = frame.filter(_IS_OP)
    # A file that keeps its host table keeps the sized c10d ops there too (the host
    # timeline reads them); one that keeps none has none.
    kept = ~_IS_OP & ~_PYTHON_ROW | (_HOST_TOO if host else pl.lit(False))
    out["host"] = frame.filter(kept).select(list(HOST_SCHEMA))
    out["threads"] = _threads(_take(events, (roles == 3).arg_true().to_list()))
    return out


def _threads(meta: list[Any]) -> pl.DataFrame:
    """Process and thread names from metadata (M) events."""
    return pl.DataFrame(
        {
            "kind": pl.Series(_str_or_none([e.name for e in meta]), dtype=_STR),
            "pid": _series("pid", [e.pid for e in meta], _STR),
            "tid": _series("tid", [e.tid for e in meta], _STR),
            "label": pl.Series(
                _str_or_none([None if e.args is None else e.args.label for e in meta]),
                dtype=_STR,
            ),
        }
    )
