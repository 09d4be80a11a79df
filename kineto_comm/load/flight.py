"""Find and safely decode PyTorch Flight Recorder (FR) dumps: the per-rank buffers of recent
collectives that the NCCL watchdog writes when a job hangs.

A pickle dump is read by `SafeUnpickler`, which refuses every class: only dicts, lists,
tuples, strings, numbers, None and booleans load, so a file that names a class (and could
run code on load) is an error, never executed. Where the compiled reader (_frscan.c) is
built, it reads the pickle opcodes of plain data first, straight into the entry columns;
for anything else (a class, damage, an unusual field) it gives up and SafeUnpickler reads
the file, errors and all, so both paths give the same tables and the same errors.

JSON dumps (`_dump_fr_trace_json`) hold the same tables. A dump's rank comes from its file
name (`_dump_3`, `nccl_trace_rank_3`, `host-a_rank3`), else from its process groups (the one
rank in all of them). Format
versions 2.2 to 2.10 are read; the library version key is `nccl_version` up to 2.9 and
`comm_lib_version` from 2.10.
"""

from __future__ import annotations

import ast
import gc
import io
import json
import os
import pickle
import re
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cache
from multiprocessing import current_process, get_context
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from kineto_comm.errors import TraceError
from kineto_comm.load.discover import PICKLE_MAGIC, find_dumps

try:  # the compiled reader (_frscan.c): pickle dumps straight into columns; optional.
    from kineto_comm.load import _frscan
except ImportError:  # pragma: no cover - not built on this machine
    _frscan = None  # type: ignore[assignment]
if os.environ.get("KINETO_COMM_PURE_DECODER"):  # only the Python readers (to compare)
    _frscan = None  # type: ignore[assignment]

# Oldest and newest format versions read (the 2.2 .. 2.10); others load with a note.
VERSIONS = ((2, 2), (2, 10))
# A rank in a file name: `rank3`, `rank_3`, `rank-3`, `_dump_3`; else the trailing number.
_RANK_WORD = re.compile(r"(?i)(?:^|[^a-z])rank[-_.]?(\d+)(?!.*rank[-_.]?\d)")
_DUMP = re.compile(r"(?i)dump[-_.]?(\d+)")
_TRAILING = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle|bin))?$")
MAX_RANK = 2**31
# Dumps of more bytes than this are decoded by several processes (decode_dumps): starting a
# worker costs about a second, which about 40 MB of dumps take to decode on one core in
# Python, about 80 MB with the compiled reader (372 MB in 4.6-5.2 CPU-seconds).
PARALLEL_ABOVE = (80 if _frscan is not None else 48) * 2**20


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that loads plain data only: every class lookup is refused, so nothing a
    file names is imported or called (pickle's code-running paths all go through here)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused: the pickle names a class ({module}.{name})")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused: the pickle holds a persistent reference")


def safe_loads(data: bytes) -> Any:
    """The plain data in pickle bytes; pickle.UnpicklingError (or EOFError etc.) if it
    names a class or is damaged."""
    return SafeUnpickler(io.BytesIO(data)).load()


@dataclass(frozen=True)
class FlightDump:
    """One rank's Flight Recorder dump, decoded: the raw tables, and where its rank came from."""

    file: str
    rank: int
    rank_source: str
    version: str
    lib_version: str | None
    pg_config: dict[str, dict[str, Any]]
    pg_status: dict[str, dict[str, Any]]
    # One row per entry (schema ENTRY_SCHEMA), decoded once.
    entries: pl.DataFrame = field(repr=False)


def rank_from_file_name(path: str | Path) -> int | None:
    """A rank number in an FR dump's file name: `rank N` first (host names may hold digits),
    then `dump N`, then the number the name ends with."""
    name = Path(path).name
    for pattern in (_RANK_WORD, _DUMP, _TRAILING):
        m = pattern.search(name)
        if m and int(m.group(1)) < MAX_RANK:
            return int(m.group(1))
    return None


def parse_ranks(text: Any) -> list[int]:
    """pg_config's `ranks` ("[0, 1]", or already a list) as a list of ints."""
    if isinstance(text, (list, tuple)):
        return [int(r) for r in text]
    text = str(text).strip()
    if text in ("", "[]", "all"):
        return []
    return [int(r) for r in text.strip("[]").split(",") if r.strip()]


def _rank_from_groups(pg_config: dict[str, dict[str, Any]]) -> int | None:
    """The one rank that is in every process group of the dump (a rank's pg_config lists
    only its own groups), if there is exactly one."""
    common: set[int] | None = None
    for cfg in pg_config.values():
        ranks = set(parse_ranks(cfg.get("ranks", "")))
        if ranks:
            common = ranks if common is None else common & ranks
    return next(iter(common)) if common is not None and len(common) == 1 else None


def _version_ok(version: str) -> bool:
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        return False
    return VERSIONS[0] <= (major, minor) <= VERSIONS[1]


def _check_dump(obj: Any) -> str | None:
    """What is wrong with a decoded object as an FR dump, or None."""
    if not isinstance(obj, dict):
        return f"not a Flight Recorder dump (top level is {type(obj).__name__}, not a dict)"
    missing = [k for k in ("version", "entries") if k not in obj]
    if missing:
        return f"not a Flight Recorder dump (no {', '.join(missing)})"
    if not isinstance(obj["entries"], list):
        return "not a Flight Recorder dump (entries is not a list)"
    if not _version_ok(str(obj["version"])):
        return f"Flight Recorder format version {obj['version']!r} is not one of 2.2 .. 2.10"
    for key in ("pg_config", "pg_status"):
        if not isinstance(obj.get(key, {}), dict):
            return f"{key} is not a dict"
    for i, e in enumerate(obj["entries"]):
        if not isinstance(e, dict) or "profiling_name" not in e or "process_group" not in e:
            return f"entry {i} is not a Flight Recorder entry"
    return None


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off: decoding makes millions of containers, and each
    collection would walk them all again (a third of the decode time on 2,000-entry
    dumps); what a dump holds has no cycles, and any garbage is collected afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def read_dump(path: str | Path) -> FlightDump:
    """Decode one dump (pickle or JSON); TraceError naming the file and the problem."""
    got = _read_batch([str(path)])[0]
    if isinstance(got, FlightDump):
        return got
    raise TraceError(*got)


# A dump the compiled reader read: all but its entries, and their columns (_frscan.scan).
Scanned = tuple[FlightDump, dict[str, Any]]
_MALFORMED = (
    TypeError,
    ValueError,
    AttributeError,
    IndexError,
    KeyError,
    SyntaxError,
    RecursionError,
)


def _read_dump(path: str | Path) -> FlightDump | Scanned:
    file = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(file, exc.strerror or str(exc)) from None
    if not data:
        raise TraceError(file, "empty file")
    scanned = _frscan.scan(data) if _frscan is not None and data[:1] == PICKLE_MAGIC else None
    try:
        if scanned is not None:
            obj = scanned[0]
        else:
            obj = safe_loads(data) if data[:1] == PICKLE_MAGIC else json.loads(data)
    except pickle.UnpicklingError as exc:
        text = str(exc) if "refused" in str(exc) else f"bad pickle ({exc})"
        raise TraceError(file, text) from None
    except EOFError:
        raise TraceError(file, "truncated pickle (ends early)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(file, f"neither a pickle nor JSON ({exc})") from None
    except RecursionError:
        raise TraceError(file, "bad pickle (nested too deep)") from None
    except Exception as exc:  # any other damage a pickle stream can carry
        raise TraceError(file, f"bad pickle ({type(exc).__name__}: {exc})") from None
    problem = _check_dump(obj)
    if problem:
        raise TraceError(file, problem)
    pg_config = {str(k): v for k, v in (obj.get("pg_config") or {}).items()}
    rank = rank_from_file_name(file)
    source = "file name"
    if rank is None:
        rank, source = _rank_from_groups(pg_config), "process groups"
    if rank is None:
        raise TraceError(file, "no rank in the file name, and its process groups do not tell")
    lib = obj.get("comm_lib_version", obj.get("nccl_version"))
    try:
        # What the compiled reader read is tabulated with its batch (_finish); until then
        # one shared empty table stands in (building one per dump cost ~1 ms).
        entries = _no_entries() if scanned is not None else entries_frame(rank, obj["entries"])
    except _MALFORMED as exc:
        raise TraceError(file, _malformed(exc)) from None
    dump = FlightDump(
        file=file,
        rank=rank,
        rank_source=source,
        version=str(obj["version"]),
        lib_version=None if lib is None else str(lib),
        pg_config=pg_config,
        pg_status={str(k): v for k, v in (obj.get("pg_status") or {}).items()},
        entries=entries,
    )
    return dump if scanned is None else (dump, scanned[1])


@cache
def _no_entries() -> pl.DataFrame:
    return pl.DataFrame(schema=ENTRY_SCHEMA)


def _malformed(exc: Exception) -> str:
    return f"malformed entry ({type(exc).__name__}: {exc})"


Decoded = FlightDump | Scanned | tuple[str, str]


def _read_batch(paths: list[str]) -> list[FlightDump | tuple[str, str]]:
    """Decode dumps one after the other: each a FlightDump, or (file, problem)."""
    return _finish(_decode_batch(paths))


def _decode_batch(paths: list[str]) -> list[Decoded]:
    """Each dump decoded, its entries tabulated unless the compiled reader read them."""
    got: list[Decoded] = []
    with _gc_paused():
        for path in paths:
            try:
                got.append(_read_dump(path))
            except TraceError as exc:
                got.append((exc.file, exc.problem))
    return got


def _is_scanned(got: Decoded) -> bool:
    return isinstance(got, tuple) and isinstance(got[0], FlightDump)


def _finish(got: list[Decoded]) -> list[FlightDump | tuple[str, str]]:
    """The entries the compiled reader read tabulated, all in one query (scanned_frames);
    where that fails, each dump alone, so each malformed one gets its own error."""
    scanned = [g for g in got if _is_scanned(g)]
    try:
        frames = scanned_frames([(d.rank, cols) for d, cols in scanned])  # type: ignore[misc]
    except _MALFORMED:
        frames = None
    out: list[FlightDump | tuple[str, str]] = []
    done = iter(frames or [])
    for g in got:
        if not _is_scanned(g):
            out.append(g)  # type: ignore[arg-type]
            continue
        dump, cols = g  # type: ignore[misc]
        try:
            entries = next(done) if frames is not None else scanned_frame(dump.rank, cols)
            out.append(replace(dump, entries=entries))
        except _MALFORMED as exc:
            out.append((dump.file, _malformed(exc)))
    return out


def _batches(files: list[Path], sizes: list[int], n: int) -> list[list[str]]:
    """`files` cut into about `n` runs of consecutive files of about equal bytes."""
    share = max(1, sum(sizes) // n)
    out: list[list[str]] = [[]]
    held = 0
    for path, size in zip(files, sizes, strict=True):
        if held >= share and out[-1]:
            out.append([])
            held = 0
        out[-1].append(str(path))
        held += size
    return out


def decode_dumps(files: list[Path], jobs: int | None = None) -> list[FlightDump | TraceError]:
    """Every file decoded (read_dump), in order; on big jobs (PARALLEL_ABOVE bytes) spread
    over `jobs` processes (default: the cores): this one and `jobs - 1` spawned workers.

    Unpickling holds the GIL, so threads would not help. The batches go to a process pool;
    this process takes batches from the end, cancelling each one no worker has begun, so
    nothing waits for a worker to start (about a second: a fresh interpreter importing
    Polars) and a pool that cannot run (a worker killed, a script without a main guard)
    only moves the work here."""
    jobs = jobs if jobs is not None else os.cpu_count() or 1
    sizes = [p.stat().st_size if p.is_file() else 0 for p in files]
    if jobs < 2 or len(files) < 2 or sum(sizes) < PARALLEL_ABOVE or _inheriting():
        results = [_read_batch([str(p) for p in files])]
    else:
        batches = _batches(files, sizes, jobs * 8)
        results = _run_pool(batches, jobs - 1)
    return [r if isinstance(r, FlightDump) else TraceError(*r) for batch in results for r in batch]


def _inheriting() -> bool:
    """Whether this is a worker process still starting (re-importing a script that reads
    dumps at its top level): it must not start workers of its own."""
    return bool(getattr(current_process(), "_inheriting", False))


Packed = tuple[list[Decoded], list[int], pl.DataFrame]


def _read_packed(paths: list[str]) -> Packed:
    """_decode_batch in the form that travels back from a worker: the dumps without their
    entries, how many each had, and the entries Python tabulated as one table (one Arrow
    buffer to send, not one per dump). What the compiled reader read travels as its
    columns (compact buffers, quick to send) and is tabulated on arrival."""
    got = _decode_batch(paths)
    frames = [d.entries for d in got if isinstance(d, FlightDump)]
    table = pl.concat(frames) if frames else pl.DataFrame(schema=ENTRY_SCHEMA)
    empty = table.clear()
    return (
        [replace(d, entries=empty) if isinstance(d, FlightDump) else d for d in got],
        [f.height for f in frames],
        table,
    )


def _unpack(packed: Packed) -> list[FlightDump | tuple[str, str]]:
    """The dumps of `_read_packed`, each with its entries again."""
    got, heights, table = packed
    sizes = iter(heights)
    out: list[Decoded] = []
    at = 0
    for d in got:
        if isinstance(d, FlightDump):
            n = next(sizes)
            d = replace(d, entries=table.slice(at, n))
            at += n
        out.append(d)
    return _finish(out)


def _run_pool(batches: list[list[str]], workers: int) -> list[list[FlightDump | tuple[str, str]]]:
    results: list[list[FlightDump | tuple[str, str]] | None] = [None] * len(batches)
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_read_packed, b) for b in batches]
        for i in reversed(range(len(batches))):
            if futures[i].cancel():
                results[i] = _read_batch(batches[i])
        for i, future in enumerate(futures):
            if results[i] is None:
                try:
                    results[i] = _unpack(future.result())
                except Exception:  # the pool broke (a worker died): decode it here
                    results[i] = _read_batch(batches[i])
    return [r or [] for r in results]


def read_dumps(
    paths: list[str | Path], jobs: int | None = None
) -> tuple[list[FlightDump], list[TraceError], list[str]]:
    """Every dump under `paths`: the decoded ones, one error per unusable file (damaged, a
    duplicate rank, another job's), and warnings. `jobs`: processes decoding (see
    decode_dumps)."""
    dumps: list[FlightDump] = []
    errors: list[TraceError] = []
    for got in decode_dumps(find_dumps(paths), jobs):
        if isinstance(got, TraceError):
            errors.append(got)
        else:
            dumps.append(got)
    dumps, other_job = _one_job(dumps)
    errors.extend(other_job)
    owner: dict[int, str] = {}
    unique: list[FlightDump] = []
    for d in dumps:
        if d.rank in owner:
            errors.append(TraceError(d.file, f"duplicate rank {d.rank} (also {owner[d.rank]})"))
            continue
        owner[d.rank] = d.file
        unique.append(d)
    warnings = []
    versions = Counter(d.version for d in unique)
    if len(versions) > 1:
        warnings.append(
            "dumps of different format versions: "
            + ", ".join(f"{v} ({n} ranks)" for v, n in sorted(versions.items()))
        )
    return sorted(unique, key=lambda d: d.rank), errors, warnings


def _one_job(dumps: list[FlightDump]) -> tuple[list[FlightDump], list[TraceError]]:
    """The dumps of the job most of them come from: a dump whose process groups give other
    ranks under the same name than the majority's (another job's) is set aside."""
    if len(dumps) < 2:
        return dumps, []
    # Every rank lists the world group's ranks: each distinct text is parsed once.
    parsed: dict[str, str] = {}

    def ranks_of(cfg: dict[str, Any]) -> str:
        text = cfg.get("ranks", "")
        if not isinstance(text, str):
            return str(parse_ranks(text))
        if text not in parsed:
            parsed[text] = str(parse_ranks(text))
        return parsed[text]

    votes: Counter[tuple[str, str]] = Counter()
    for d in dumps:
        for name, cfg in d.pg_config.items():
            votes[(name, ranks_of(cfg))] += 1
    best: dict[str, tuple[int, str]] = {}
    for (name, ranks), n in votes.items():
        if name not in best or n > best[name][0]:
            best[name] = (n, ranks)
    kept: list[FlightDump] = []
    rejected: list[TraceError] = []
    for d in dumps:
        clash = [name for name, cfg in d.pg_config.items() if ranks_of(cfg) != best[name][1]]
        if clash:
            rejected.append(
                TraceError(
                    d.file,
                    f"from another job: process group {clash[0]} has ranks "
                    f"{d.pg_config[clash[0]].get('ranks')} here, {best[clash[0]][1]} in most"
                    " dumps; skipped",
                )
            )
        else:
            kept.append(d)
    return kept, rejected


def _op_parts(name: str) -> tuple[str, str, int | None, int | None]:
    """backend, op, local src, local dst from a profiling name (`nccl:send 0->3`)."""
    backend, _, rest = name.partition(":")
    op, _, meta = rest.partition(" ")
    src = dst = None
    if "->" in meta:
        s, d = meta.split("->", 1)
        src, dst = int(s), int(d)
    elif "<-" in meta:
        d, s = meta.split("<-", 1)
        src, dst = int(s), int(d)
    return backend, op or name, src, dst


def _frames_text(frames: Any, depth: int = 6) -> str | None:
    """The innermost frames of a recorded stack, one `name (file:line)` a line."""
    if not frames:
        return None
    lines = []
    for f in frames[:depth]:
        if isinstance(f, dict):
            lines.append(f"{f.get('name', '?')} ({f.get('filename', '?')}:{f.get('line', '?')})")
    return "\n".join(lines) or None


def _numel(sizes: Any) -> int:
    total = 0
    for shape in sizes or ():
        n = 1
        for d in shape or ():
            n *= int(d)
        total += n if shape else 0
    return total


ENTRY_SCHEMA = {
    "rank": pl.Int64,
    "pos": pl.Int64,
    "record_id": pl.Int64,
    "pg_id": pl.String,
    "process_group": pl.String,
    "group_desc": pl.String,
    "collective_seq_id": pl.Int64,
    "p2p_seq_id": pl.Int64,
    "op_id": pl.Int64,
    "is_p2p": pl.Boolean,
    "backend": pl.String,
    "op": pl.String,
    "src_local": pl.Int64,
    "dst_local": pl.Int64,
    "input_sizes": pl.String,
    "output_sizes": pl.String,
    "input_numel": pl.Int64,
    "output_numel": pl.Int64,
    "input_dtypes": pl.String,
    "output_dtypes": pl.String,
    "state": pl.String,
    "time_created_ns": pl.Int64,
    "time_started_ns": pl.Int64,
    "time_completed_ns": pl.Int64,
    "retired": pl.Boolean,
    "timeout_ms": pl.Int64,
    "thread_id": pl.String,
    "thread_name": pl.String,
    "frames": pl.String,
}
# Integer fields read as they are (FR key -> column); a value of another type reads as null.
_INTS = {
    "record_id": "record_id",
    "collective_seq_id": "collective_seq_id",
    "p2p_seq_id": "p2p_seq_id",
    "op_id": "op_id",
    "time_created_ns": "time_created_ns",
    "time_discovered_started_ns": "time_started_ns",
    "time_discovered_completed_ns": "time_completed_ns",
    "timeout_ms": "timeout_ms",
}
_NO_GROUP = ("?", "")


def _sizes(entries: list[dict[str, Any]], key: str) -> tuple[list[str], pl.Expr, pl.Expr]:
    """A sizes field printed per entry (repr), and the expressions that turn that text into
    JSON text and an element count: the few distinct texts are parsed as literals (never
    evaluated) and measured once, so pickle and JSON dumps give the same text."""
    texts = list(map(repr, [e.get(key) for e in entries]))
    canon: dict[str, str] = {}
    numel: dict[str, int] = {}
    for text in set(texts):
        value = ast.literal_eval(text)
        canon[text] = json.dumps(value)
        numel[text] = _numel(value)
    column = pl.col(key)
    return (
        texts,
        column.replace_strict(canon, return_dtype=pl.String),
        column.replace_strict(numel, return_dtype=pl.Int64),
    )


def _dtypes(entries: list[dict[str, Any]], key: str) -> list[str]:
    values = [e.get(key) for e in entries]
    try:
        return [",".join(v) if v else "" for v in values]
    except TypeError:  # not strings: print each one
        return [",".join(map(str, v or ())) for v in values]


def entries_frame(rank: int, entries: list[dict[str, Any]]) -> pl.DataFrame:
    """One rank's FR entries as a table (schema ENTRY_SCHEMA), built a column at a time:
    one pass over the entries per field, the profiling names and sizes parsed once per
    distinct value. Stacks are kept only for entries not completed (what a root is stuck
    in is the only place they are read), which spares most of the work on deep buffers."""
    n = len(entries)
    if n == 0:
        return pl.DataFrame(schema=ENTRY_SCHEMA)
    cols: dict[str, Any] = {
        "rank": pl.Series([rank] * n, dtype=pl.Int64),
        "pos": pl.Series(range(n), dtype=pl.Int64),
    }
    for key, name in _INTS.items():
        cols[name] = pl.Series([e.get(key) for e in entries], dtype=pl.Int64, strict=False)
    groups = [e.get("process_group") or _NO_GROUP for e in entries]
    cols["pg_id"] = [str(e.get("pg_id")) for e in entries]
    cols["process_group"] = [str(g[0]) for g in groups]
    cols["group_desc"] = [str(g[1]) if len(g) > 1 else "" for g in groups]
    names = [str(e.get("profiling_name", "")) for e in entries]
    parts = {name: _op_parts(name) for name in set(names)}
    for i, col in enumerate(("backend", "op", "src_local", "dst_local")):
        cols[col] = [parts[name][i] for name in names]
    cols["input_sizes"], in_text, in_numel = _sizes(entries, "input_sizes")
    cols["output_sizes"], out_text, out_numel = _sizes(entries, "output_sizes")
    cols["input_dtypes"] = _dtypes(entries, "input_dtypes")
    cols["output_dtypes"] = _dtypes(entries, "output_dtypes")
    states = [str(e.get("state", "")) for e in entries]
    cols["state"] = states
    # An entry that does not say whether it is p2p is one when it is a send or recv.
    cols["is_p2p"] = [
        bool(e["is_p2p"]) if "is_p2p" in e else parts[name][1] in ("send", "recv")
        for e, name in zip(entries, names, strict=True)
    ]
    cols["retired"] = [bool(e.get("retired", False)) for e in entries]
    cols["thread_id"] = [None if (t := e.get("thread_id")) is None else str(t) for e in entries]
    cols["thread_name"] = pl.Series(
        [e.get("thread_name") for e in entries], dtype=pl.String, strict=False
    )
    cols["frames"] = [
        None if s == "completed" else _frames_text(e.get("frames"))
        for s, e in zip(states, entries, strict=True)
    ]
    frame = pl.DataFrame(cols, schema={k: ENTRY_SCHEMA[k] for k in cols}, strict=False)
    return frame.with_columns(
        input_sizes=in_text, output_sizes=out_text, input_numel=in_numel, output_numel=out_numel
    ).select(list(ENTRY_SCHEMA))


def scanned_frame(rank: int, cols: dict[str, Any]) -> pl.DataFrame:
    """entries_frame from the compiled reader's columns (_frscan.scan): the same table."""
    return scanned_frames([(rank, cols)])[0]


def scanned_frames(dumps: list[tuple[int, dict[str, Any]]]) -> list[pl.DataFrame]:
    """scanned_frame of many dumps (rank, columns) in one query: their buffers joined, each
    string column's codes shifted onto the joined distinct texts, so the profiling names
    and sizes are still parsed once per distinct text, by the same functions."""
    sizes = [cols["n"] for _, cols in dumps]
    if not any(sizes):
        return [pl.DataFrame(schema=ENTRY_SCHEMA) for _ in dumps]
    n = sum(sizes)
    first = dumps[0][1]
    raw: dict[str, Any] = {}
    for key in first["ints"]:
        raw[key] = _joined([cols["ints"][key][0] for _, cols in dumps], np.int64)
        raw[f"{key}?"] = _joined([cols["ints"][key][1] for _, cols in dumps], np.bool_)
    texts: dict[str, list[Any]] = {}
    for key in first["strings"]:
        codes, distinct, shift = [], [None], 0
        for _, cols in dumps:
            code, more = cols["strings"][key]
            code = np.frombuffer(code, np.int32)
            codes.append(np.where(code > 0, code + shift, 0) if shift else code)
            distinct += more[1:]
            shift += len(more) - 1
        raw[f"{key}#"] = np.concatenate(codes)
        texts[key] = distinct
    raw["is_p2p#"] = _joined([cols["is_p2p"] for _, cols in dumps], np.uint8)
    raw["retired"] = _joined([cols["retired"] for _, cols in dumps], np.bool_)
    starts = np.cumsum([0, *sizes[:-1]])
    raw["rank"] = np.repeat(np.array([rank for rank, _ in dumps], np.int64), sizes)
    raw["pos"] = np.arange(n, dtype=np.int64) - np.repeat(starts, sizes)
    frames: list[str | None] = [None] * n
    for (_, cols), start in zip(dumps, starts.tolist(), strict=True):
        for at, value in zip(cols["frames_at"], cols["frames"], strict=True):
            frames[start + at] = _frames_text(value)
    raw["frames"] = pl.Series(frames, dtype=pl.String)

    def gather(key: str, values: list[Any], dtype: pl.DataType) -> pl.Expr:
        return pl.lit(pl.Series(values, dtype=dtype)).gather(pl.col(f"{key}#"))

    exprs: dict[str, pl.Expr] = {"rank": pl.col("rank"), "pos": pl.col("pos")}
    for key, name in _INTS.items():
        exprs[name] = pl.when(pl.col(f"{key}?")).then(pl.col(key))
    for key in ("pg_id", "process_group", "group_desc", "input_dtypes", "output_dtypes"):
        exprs[key] = gather(key, texts[key], pl.String)
    for key in ("state", "thread_id", "thread_name"):
        exprs[key] = gather(key, texts[key], pl.String)
    parts = {name: _op_parts(name) for name in set(texts["profiling_name"][1:])}
    for i, col in enumerate(("backend", "op", "src_local", "dst_local")):
        values = [None] + [parts[name][i] for name in texts["profiling_name"][1:]]
        exprs[col] = gather("profiling_name", values, ENTRY_SCHEMA[col])
    for key, numel in (("input_sizes", "input_numel"), ("output_sizes", "output_numel")):
        parsed = {t: ast.literal_eval(t) for t in set(texts[key][1:])}
        exprs[key] = gather(
            key, [None] + [json.dumps(parsed[t]) for t in texts[key][1:]], pl.String
        )
        exprs[numel] = gather(key, [None] + [_numel(parsed[t]) for t in texts[key][1:]], pl.Int64)
    # An entry that does not say whether it is p2p is one when it is a send or recv.
    exprs["is_p2p"] = (
        pl.when(pl.col("is_p2p#") == 2)
        .then(exprs["op"].is_in(["send", "recv"]))
        .otherwise(pl.col("is_p2p#") == 1)
    )
    exprs["retired"] = pl.col("retired")
    exprs["frames"] = pl.col("frames")
    table = pl.DataFrame(raw).select(**{k: exprs[k] for k in ENTRY_SCHEMA})
    return [table.slice(start, size) for start, size in zip(starts.tolist(), sizes, strict=True)]


def _joined(buffers: list[bytes], dtype: type) -> np.ndarray:
    return np.concatenate([np.frombuffer(b, dtype) for b in buffers])


def entries_table(dumps: list[FlightDump]) -> pl.DataFrame:
    """One row per FR entry of every rank (schema ENTRY_SCHEMA; docs/hang.md)."""
    if not dumps:
        return pl.DataFrame(schema=ENTRY_SCHEMA)
    return pl.concat([d.entries for d in dumps], rechunk=True)


def groups_table(dumps: list[FlightDump]) -> pl.DataFrame:
    """process_group, group_desc, ranks (sorted list): every group some dump configures."""
    seen: dict[str, tuple[str, list[int]]] = {}
    for d in dumps:
        for name, cfg in d.pg_config.items():
            if name not in seen:
                seen[name] = (str(cfg.get("desc", "")), sorted(parse_ranks(cfg.get("ranks", ""))))
    return pl.DataFrame(
        {
            "process_group": list(seen),
            "group_desc": [v[0] for v in seen.values()],
            "ranks": [v[1] for v in seen.values()],
        },
        schema={"process_group": pl.String, "group_desc": pl.String, "ranks": pl.List(pl.Int64)},
    )


def _pg_names(d: FlightDump) -> dict[str, str]:
    """pg_id (the rank's local number, pg_status's key) -> group name. Entries tell it
    exactly; for ids no entry names, groups are created in the same order on a rank, so
    the remaining ids and names are paired in creation order where both are numbers."""
    pairs = d.entries.select("pg_id", "process_group").unique("pg_id", keep="first")
    names: dict[str, str] = dict(pairs.iter_rows())
    ids = [i for i in d.pg_status if i not in names]
    left = [n for n in d.pg_config if n not in set(names.values())]
    if (
        ids
        and len(ids) == len(left)
        and all(x.isdigit() for x in ids + left)
        and len(d.pg_status) == len(d.pg_config)
    ):
        names.update(zip(sorted(ids, key=int), sorted(left, key=int), strict=True))
    return names


def status_table(dumps: list[FlightDump]) -> pl.DataFrame:
    """rank, process_group, last_enqueued, last_started, last_completed: pg_status of every
    rank, keyed by group name (null where a status's group cannot be named)."""
    rows = []
    for d in dumps:
        names = _pg_names(d)
        for pg_id, st in d.pg_status.items():
            if not isinstance(st, dict):
                continue
            rows.append(
                (
                    d.rank,
                    names.get(pg_id),
                    st.get("last_enqueued_collective"),
                    st.get("last_started_collective"),
                    st.get("last_completed_collective"),
                )
            )
    return pl.DataFrame(
        rows,
        schema={
            "rank": pl.Int64,
            "process_group": pl.String,
            "last_enqueued": pl.Int64,
            "last_started": pl.Int64,
            "last_completed": pl.Int64,
        },
        orient="row",
    ).filter(pl.col("process_group").is_not_null())


def dumps_table(dumps: list[FlightDump]) -> pl.DataFrame:
    """rank, file, rank_source, version, lib_version, entries: one row per dump."""
    return pl.DataFrame(
        {
            "rank": [d.rank for d in dumps],
            "file": [d.file for d in dumps],
            "rank_source": [d.rank_source for d in dumps],
            "version": [d.version for d in dumps],
            "lib_version": [d.lib_version for d in dumps],
            "entries": [d.entries.height for d in dumps],
        },
        schema={
            "rank": pl.Int64,
            "file": pl.String,
            "rank_source": pl.String,
            "version": pl.String,
            "lib_version": pl.String,
            "entries": pl.Int64,
        },
    )
