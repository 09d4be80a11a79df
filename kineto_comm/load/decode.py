"""Decode one Kineto / Chrome trace file into a Polars event table and its metadata.

Only the fields the analyses use are declared (msgspec skips the rest without building
objects), the `traceEvents` array is decoded in pieces of a few tens of MB cut at event
boundaries so decoded objects never outnumber one piece, and every piece is turned into
columns straight away. Timestamps become integer nanoseconds: Kineto writes microseconds,
as integers (old schema) or floats with three decimals relative to `baseTimeNanoseconds`
(new schema), and both are converted exactly.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from kineto_comm.errors import TraceError

try:  # isal's gzip inflate is ~2-3x faster than zlib's; optional.
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover - depends on the platform
    _zlib = zlib  # type: ignore[assignment]

PIECE_BYTES = 32 * 1024 * 1024
_READ_BYTES = 16 * 1024 * 1024
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")

# Categories kept from the event stream. Everything else (flows, instant events, python
# stacks, memory events, MTIA device events) is dropped before columns are built.
GPU_CATS = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"})
RUNTIME_CATS = frozenset({"cuda_runtime", "Runtime", "cuda_driver"})
CPU_CATS = frozenset({"cpu_op", "Operator", "user_annotation"})
_KEEP_CATS = GPU_CATS | RUNTIME_CATS | CPU_CATS
_DURATION_PH = frozenset({"X", "B", "E"})
_COMM_OP_PREFIXES = ("nccl:", "gloo:", "ucc:", "mpi:", "xccl:")


class Args(msgspec.Struct, gc=False, omit_defaults=True):
    """The `args` fields the analyses read; all optional, several with types seen to vary."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_old: int | None = msgspec.field(default=None, name="external id")
    correlation: int | None = None
    stream: int | str | None = None
    device: int | str | None = None
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: str | int | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: str | list[int] | None = msgspec.field(default=None, name="Process Group Ranks")
    pg_id: int | str | None = msgspec.field(default=None, name="Process Group ID")
    seq: int | str | None = msgspec.field(default=None, name="Seq")
    src_rank: int | None = msgspec.field(default=None, name="Src Rank")
    dst_rank: int | None = msgspec.field(default=None, name="Dst Rank")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    label: str | int | None = msgspec.field(default=None, name="name")


class Event(msgspec.Struct, gc=False):
    """One trace event, reduced to the fields used."""

    ph: str | None = None
    cat: str | None = None
    name: str | int | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    args: Args | None = None


class PGConfig(msgspec.Struct, gc=False):
    pg_name: str | int | None = None
    pg_desc: str | None = None
    pg_size: int | None = None
    ranks: list[int] | str | None = None
    backend_config: str | None = None


class DistInfo(msgspec.Struct, gc=False):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    pg_config: list[PGConfig] | None = None
    nccl_version: str | None = None


class DeviceProps(msgspec.Struct, gc=False):
    id: int | str | None = None
    name: str | None = None


class Top(msgspec.Struct, gc=False):
    traceEvents: list[Event] = msgspec.field(default_factory=list)  # noqa: N815 - JSON key
    distributedInfo: DistInfo | None = None  # noqa: N815
    deviceProperties: list[DeviceProps] | None = None  # noqa: N815
    displayTimeUnit: str | None = None  # noqa: N815
    baseTimeNanoseconds: int | None = None  # noqa: N815
    schemaVersion: int | None = None  # noqa: N815


_TOP = msgspec.json.Decoder(Top)
_EVENTS = msgspec.json.Decoder(list[Event])
_EMPTY_ARGS = Args()

# Columns of each per-role table (see RawTrace), with their types.
_STR = pl.String()
_I64 = pl.Int64()
_F64 = pl.Float64()
_COMMON = {"ph": _STR, "pid": _STR, "tid": _STR, "ts_us": _F64, "dur_us": _F64}
_COLL = {
    "collective": _STR,
    "in_nelems": _I64,
    "out_nelems": _I64,
    "group_size": _I64,
    "dtype": _STR,
    "pg_name": _STR,
    "pg_desc": _STR,
    "pg_ranks": _STR,
    "seq": _I64,
}
GPU_SCHEMA = {
    **_COMMON,
    "cat": _STR,
    "name": _STR,
    "external_id": _I64,
    "correlation": _I64,
    "stream": _STR,
    "device": _STR,
    **_COLL,
}
RUNTIME_SCHEMA = {**_COMMON, "name": _STR, "external_id": _I64, "correlation": _I64}
OPS_SCHEMA = {
    **_COMMON,
    "cat": _STR,
    "name": _STR,
    "external_id": _I64,
    **_COLL,
    "src_rank": _I64,
    "dst_rank": _I64,
    "input_dims": _STR,
    "input_type": _STR,
}
HOST_SCHEMA = {**_COMMON, "name": _STR}
_INT_LIKE = frozenset({"pid", "tid", "stream", "device", "pg_name"})


@dataclass
class RawTrace:
    """One file's events split by role, with exact start_ns/end_ns, and its metadata.

    - `gpu`: kernels, memcpy and memset on the device timeline (GPU_SCHEMA).
    - `runtime`: CUDA/HIP runtime and driver calls on the host, to link launches (RUNTIME_SCHEMA).
    - `ops`: communication ops (record_param_comms, nccl:*, gloo:*) and user annotations
      such as ProfilerStep#N (OPS_SCHEMA).
    - `host`: every other CPU op: name, where and when it ran (HOST_SCHEMA).
    - `threads`: process/thread name metadata (kind, pid, tid, label).
    """

    file: str
    gpu: pl.DataFrame
    runtime: pl.DataFrame
    ops: pl.DataFrame
    host: pl.DataFrame
    threads: pl.DataFrame
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    device_names: list[str] = field(default_factory=list)
    base_time_ns: int = 0
    nbytes: int = 0
    warnings: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- bytes


def _read_blocks(path: Path) -> Iterator[bytes]:
    """Yield the file's (decompressed) bytes in blocks; a truncated gzip stream just ends."""
    with open(path, "rb") as fh:
        head = fh.read(2)
        fh.seek(0)
        if head != b"\x1f\x8b":
            while block := fh.read(_READ_BYTES):
                yield block
            return
        inflater = _zlib.decompressobj(31)
        data = b""
        while True:
            if not data:
                data = fh.read(_READ_BYTES // 8)
                if not data:
                    break
            try:
                out = inflater.decompress(data, _READ_BYTES)
            except Exception as exc:  # corrupt deflate data
                raise _Corrupt(f"gzip data is corrupt ({exc})") from exc
            data = inflater.unconsumed_tail
            if out:
                yield out
            if inflater.eof:
                data = inflater.unused_data  # a concatenated gzip member may follow
                if not data:
                    data = fh.read(_READ_BYTES // 8)
                    if not data:
                        break
                inflater = _zlib.decompressobj(31)
        tail = inflater.flush()
        if tail:
            yield tail


class _Corrupt(Exception):
    pass


def _pieces(blocks: Iterator[bytes]) -> Iterator[tuple[bytes, bool]]:
    """Cut the byte stream into (piece, is_last) at candidate event boundaries.

    A cut is made only after the `traceEvents` key, at the last `},{` of a full buffer.
    Whether a cut really was between two top-level events is checked later by decoding.
    """
    held: list[bytes] = []
    size = 0
    seen_events = False
    for block in blocks:
        held.append(block)
        size += len(block)
        if size < PIECE_BYTES:
            continue
        buf = b"".join(held)
        held, size = [], 0
        if not seen_events:
            at = buf.find(b'"traceEvents"')
            if at < 0:
                held, size = [buf], len(buf)
                continue
            seen_events = True
        else:
            at = 0
        cut = None
        for m in _BOUNDARY.finditer(buf, max(at, len(buf) - 4 * 1024 * 1024)):
            cut = m
        if cut is None:
            held, size = [buf], len(buf)
            continue
        yield buf[: cut.start() + 1], False
        rest = buf[cut.end() - 1 :]
        held, size = [rest], len(rest)
    yield b"".join(held), True


# ---------------------------------------------------------------------------- decode


def _decode_piece(piece: bytes, first: bool, last: bool, bare_list: bool) -> Top:
    """Decode one piece, wrapping it so it is a complete JSON document."""
    if bare_list:
        text = (b"" if first else b"[") + piece + (b"" if last else b"]")
        return Top(traceEvents=_EVENTS.decode(text))
    if first and last:
        return _TOP.decode(piece)
    if first:
        return _TOP.decode(piece + b"]}")
    if last:
        return _TOP.decode(b'{"traceEvents":[' + piece)
    return Top(traceEvents=_EVENTS.decode(b"[" + piece + b"]"))


def _salvage(piece: bytes, first: bool, bare_list: bool) -> tuple[Top, int] | None:
    """Recover the complete events of a piece cut off mid-write; return (top, bytes dropped)."""
    cuts = [m.start() + 1 for m in _BOUNDARY.finditer(piece)]
    for end in reversed(cuts[-64:]):
        body = piece[:end]
        try:
            if bare_list:
                return Top(traceEvents=_EVENTS.decode((b"" if first else b"[") + body + b"]")), len(
                    piece
                ) - end
            if first:
                return _TOP.decode(body + b"]}"), len(piece) - end
            return _TOP.decode(b'{"traceEvents":[' + body + b"]}"), len(piece) - end
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    return None


def _str_or_none(values: list[Any]) -> list[str | None]:
    return [None if v is None else str(v) for v in values]


def _series(name: str, values: list[Any], dtype: pl.DataType) -> pl.Series:
    """Build a typed column; fields whose JSON type varies (ints and strings) become text."""
    if name in _INT_LIKE:
        try:
            return pl.Series(name, values, dtype=_I64, strict=True).cast(_STR)
        except (TypeError, OverflowError, pl.exceptions.PolarsError):
            return pl.Series(name, _str_or_none(values), dtype=_STR)
    try:
        return pl.Series(name, values, dtype=dtype, strict=True)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        return pl.Series(name, _str_or_none(values), dtype=_STR).cast(dtype, strict=False)


def _frame(events: list[Event], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Columns of `schema` from events; args fields read through an args list built once."""
    if not events:
        return pl.DataFrame(schema=schema)
    args = [_EMPTY_ARGS if a is None else a for a in map(attrgetter("args"), events)]
    cols: dict[str, list[Any]] = {}
    for key in schema:
        if key == "ts_us":
            cols[key] = list(map(attrgetter("ts"), events))
        elif key == "dur_us":
            cols[key] = list(map(attrgetter("dur"), events))
        elif key in _EVENT_FIELDS:
            cols[key] = list(map(attrgetter(key), events))
        elif key in ("input_dims", "input_type"):
            cols[key] = [bytes(r).decode("utf-8", "replace") or None for r in map(
                attrgetter(key), args)]
        else:
            cols[key] = list(map(attrgetter(key), args))
    if "external_id" in cols and None in cols["external_id"]:
        old = map(attrgetter("external_id_old"), args)
        cols["external_id"] = [o if v is None else v for v, o in zip(cols["external_id"], old)]
    if "pg_ranks" in cols and any(isinstance(r, list) for r in cols["pg_ranks"]):
        cols["pg_ranks"] = [str(r) if isinstance(r, list) else r for r in cols["pg_ranks"]]
    return pl.DataFrame([_series(k, v, schema[k]) for k, v in cols.items()])


_EVENT_FIELDS = frozenset({"ph", "cat", "name", "pid", "tid"})


def _is_comm_op(name: object) -> bool:
    return isinstance(name, str) and (
        name == "record_param_comms" or name.startswith(_COMM_OP_PREFIXES)
    )


def _columns(events: list[Event]) -> dict[str, pl.DataFrame]:
    """Split decoded events by role and turn each group into a table."""
    gpu: list[Event] = []
    runtime: list[Event] = []
    ops: list[Event] = []
    host: list[Event] = []
    meta: list[Event] = []
    for e in events:
        ph = e.ph
        if ph not in _DURATION_PH:
            if ph == "M":
                meta.append(e)
            continue
        cat = e.cat
        if cat in GPU_CATS:
            gpu.append(e)
        elif cat in RUNTIME_CATS:
            runtime.append(e)
        elif cat in CPU_CATS:
            name = e.name
            if cat == "user_annotation" or _is_comm_op(name) or (
                isinstance(name, str) and name.startswith("ProfilerStep#")
            ):
                ops.append(e)
            else:
                host.append(e)
    return {
        "gpu": _frame(gpu, GPU_SCHEMA),
        "runtime": _frame(runtime, RUNTIME_SCHEMA),
        "ops": _frame(ops, OPS_SCHEMA),
        "host": _frame(host, HOST_SCHEMA),
        "threads": pl.DataFrame(
            {
                "kind": pl.Series(_str_or_none([e.name for e in meta]), dtype=_STR),
                "pid": _series("pid", [e.pid for e in meta], _STR),
                "tid": _series("tid", [e.tid for e in meta], _STR),
                "label": pl.Series(
                    _str_or_none([None if e.args is None else e.args.label for e in meta]),
                    dtype=_STR,
                ),
            }
        ),
    }


def decode_file(path: str | Path) -> RawTrace:
    """Decode one trace file. Raises TraceError (one line) when nothing usable is in it."""
    path = Path(path)
    name = str(path)
    warnings: list[str] = []
    parts: list[dict[str, pl.DataFrame]] = []
    tops: list[Top] = []
    nbytes = 0
    first = True
    bare_list = False
    pending = b""
    try:
        for piece, last in _pieces(_read_blocks(path)):
            nbytes += len(piece)
            if first and not pending:
                stripped = piece[:65536].lstrip()
                if not stripped:
                    raise TraceError(name, "file is empty")
                if stripped[:1] not in (b"{", b"["):
                    raise TraceError(name, "not a JSON trace (does not start with '{' or '[')")
                bare_list = stripped[:1] == b"["
            pending = piece if not pending else pending + b"," + piece
            try:
                top = _decode_piece(pending, first, last, bare_list)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                if not last:
                    continue  # the cut was not between two events: join with the next piece
                salvaged = _salvage(pending, first, bare_list)
                if salvaged is None:
                    if not parts:
                        raise TraceError(name, _describe(exc)) from None
                    warnings.append(f"{name}: trace is cut off; events after the cut are lost")
                    break
                top, dropped = salvaged
                warnings.append(
                    f"{name}: trace is cut off (truncated JSON); kept the events before the cut,"
                    f" dropped the last {dropped} bytes"
                )
            pending = b""
            first = False
            tops.append(top)
            parts.append(_columns(top.traceEvents))
            top.traceEvents = []
    except _Corrupt as exc:
        if not parts:
            raise TraceError(name, str(exc)) from None
        warnings.append(f"{name}: {exc}; kept the events before the damage")
    except OSError as exc:
        raise TraceError(name, f"cannot read file ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise TraceError(name, "not a JSON trace (binary data)") from None
    if not parts:
        raise TraceError(name, "no trace events found")
    return _assemble(name, parts, tops, nbytes, warnings)


def _describe(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "truncated" in text.lower():
        return "JSON is truncated before the first complete event"
    return f"invalid JSON trace ({text})"


def _assemble(
    name: str,
    parts: list[dict[str, pl.DataFrame]],
    tops: list[Top],
    nbytes: int,
    warnings: list[str],
) -> RawTrace:
    info = next((t.distributedInfo for t in tops if t.distributedInfo is not None), None)
    base = next((t.baseTimeNanoseconds for t in tops if t.baseTimeNanoseconds), None) or 0
    devices = next((t.deviceProperties for t in tops if t.deviceProperties), None) or []

    def table(key: str) -> pl.DataFrame:
        frames = [p[key] for p in parts]
        frame = pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]
        return frame if key == "threads" else _to_ns(_pair_begin_end(frame), int(base))

    groups = []
    if info is not None and info.pg_config:
        for pg in info.pg_config:
            ranks = pg.ranks
            if isinstance(ranks, str):
                ranks = _parse_int_list(ranks)
            groups.append(
                {
                    "pg_name": None if pg.pg_name is None else str(pg.pg_name),
                    "pg_desc": pg.pg_desc,
                    "pg_size": pg.pg_size if pg.pg_size is not None else len(ranks or []),
                    "ranks": list(ranks or []),
                    "backend_config": pg.backend_config,
                }
            )
    return RawTrace(
        file=name,
        gpu=table("gpu"),
        runtime=table("runtime"),
        ops=table("ops"),
        host=table("host"),
        threads=table("threads"),
        rank=None if info is None else info.rank,
        world_size=None if info is None else info.world_size,
        backend=None if info is None else info.backend,
        process_groups=groups,
        device_names=[d.name or "?" for d in devices],
        base_time_ns=int(base),
        nbytes=nbytes,
        warnings=warnings,
    )


def _parse_int_list(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", text)]


def _pair_begin_end(events: pl.DataFrame) -> pl.DataFrame:
    """Turn matching B/E pairs (per pid, tid, nesting level) into X events with a duration."""
    if events.height == 0 or (events["ph"] == "X").all():
        return events
    be = events.filter(pl.col("ph").is_in(["B", "E"])).with_row_index("_i")
    be = be.sort(["pid", "tid", "ts_us", "_i"]).with_columns(
        _d=pl.when(pl.col("ph") == "B").then(1).otherwise(-1)
    )
    be = be.with_columns(_depth=pl.col("_d").cum_sum().over(["pid", "tid"]))
    be = be.with_columns(
        _level=pl.when(pl.col("ph") == "B").then(pl.col("_depth")).otherwise(pl.col("_depth") + 1)
    )
    be = be.with_columns(_nth=pl.int_range(pl.len()).over(["pid", "tid", "_level", "ph"]))
    begins = be.filter(pl.col("ph") == "B")
    ends = be.filter(pl.col("ph") == "E").select(
        "pid", "tid", "_level", "_nth", pl.col("ts_us").alias("_end")
    )
    paired = (
        begins.join(ends, on=["pid", "tid", "_level", "_nth"], how="inner")
        .with_columns(ph=pl.lit("X"), dur_us=pl.col("_end") - pl.col("ts_us"))
        .select(events.columns)
    )
    return pl.concat([events.filter(pl.col("ph") == "X"), paired], how="vertical")


def _to_ns(events: pl.DataFrame, base_ns: int) -> pl.DataFrame:
    """Add exact integer-nanosecond start/end columns (absolute when the trace gives a base)."""
    ts = pl.col("ts_us")
    whole = ts.floor()
    start = (
        whole.cast(pl.Int64) * 1000 + ((ts - whole) * 1000).round().cast(pl.Int64) + pl.lit(base_ns)
    )
    dur = (pl.col("dur_us").fill_null(0.0).clip(lower_bound=0.0) * 1000).round().cast(pl.Int64)
    return events.filter(ts.is_not_null() & ts.is_finite()).with_columns(
        start_ns=start, end_ns=start + dur
    )
