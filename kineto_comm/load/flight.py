"""Find and safely decode PyTorch Flight Recorder (FR) dumps: the per-rank buffers of recent
collectives that the NCCL watchdog writes when a job hangs.

A pickle dump is read by `SafeUnpickler`, which refuses every class: only dicts, lists,
tuples, strings, numbers, None and booleans load, so a file that names a class (and could
run code on load) is an error, never executed. JSON dumps (`_dump_fr_trace_json`) hold the
same tables. A dump's rank comes from its file name (`_dump_3`, `nccl_trace_rank_3`,
`host-a_rank3`), else from its process groups (the one rank in all of them). Format
versions 2.2 to 2.10 are read; the library version key is `nccl_version` up to 2.9 and
`comm_lib_version` from 2.10.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from kineto_comm.errors import TraceError

# Pickle protocol 2+ starts with this opcode (PROTO); FR dumps use the default protocol.
PICKLE_MAGIC = b"\x80"
# Oldest and newest format versions read (the 2.2 .. 2.10); others load with a note.
VERSIONS = ((2, 2), (2, 10))
# A rank in a file name: `rank3`, `rank_3`, `rank-3`, `_dump_3`; else the trailing number.
_RANK_WORD = re.compile(r"(?i)(?:^|[^a-z])rank[-_.]?(\d+)(?!.*rank[-_.]?\d)")
_DUMP = re.compile(r"(?i)dump[-_.]?(\d+)")
_TRAILING = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle|bin))?$")
# Bytes read to tell an FR JSON dump from a Kineto trace.
PEEK_BYTES = 65536
MAX_RANK = 2**31


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
    # One tuple per entry, in ENTRY_SCHEMA's column order (decoded once, checked on read).
    rows: list[tuple[Any, ...]] = field(repr=False)


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


def read_dump(path: str | Path) -> FlightDump:
    """Decode one dump (pickle or JSON); TraceError naming the file and the problem."""
    file = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(file, exc.strerror or str(exc)) from None
    if not data:
        raise TraceError(file, "empty file")
    try:
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
        rows = [_entry_row(rank, i, e) for i, e in enumerate(obj["entries"])]
    except (TypeError, ValueError, AttributeError, IndexError) as exc:
        raise TraceError(file, f"malformed entry ({type(exc).__name__}: {exc})") from None
    return FlightDump(
        file=file,
        rank=rank,
        rank_source=source,
        version=str(obj["version"]),
        lib_version=None if lib is None else str(lib),
        pg_config=pg_config,
        pg_status={str(k): v for k, v in (obj.get("pg_status") or {}).items()},
        rows=rows,
    )


def looks_like_dump(path: Path) -> bool:
    """Whether a file is an FR dump by its first bytes: a pickle, or JSON naming the FR
    tables (pg_config / pg_status) and not Kineto's traceEvents."""
    try:
        with open(path, "rb") as f:
            head = f.read(PEEK_BYTES)
    except OSError:
        return False
    if head[:1] == PICKLE_MAGIC:
        return True
    stripped = head.lstrip()
    if not stripped.startswith(b"{") or b'"traceEvents"' in head:
        return False
    return b'"pg_config"' in head or b'"pg_status"' in head or b'"entries"' in head


def find_dumps(paths: list[str | Path]) -> list[Path]:
    """The FR dump files under the given files and folders (by content), in a stable order."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            if looks_like_dump(path):
                found.append(path)
            continue
        if not path.is_dir():
            continue
        for root, dirs, files in os.walk(path, followlinks=True):
            dirs.sort()
            for name in sorted(files):
                p = Path(root) / name
                if not name.endswith(".gz") and p.is_file() and looks_like_dump(p):
                    found.append(p)
    return list(dict.fromkeys(found))


def read_dumps(paths: list[str | Path]) -> tuple[list[FlightDump], list[TraceError], list[str]]:
    """Every dump under `paths`: the decoded ones, one error per unusable file (damaged, a
    duplicate rank, another job's), and warnings."""
    dumps: list[FlightDump] = []
    errors: list[TraceError] = []
    for path in find_dumps(paths):
        try:
            dumps.append(read_dump(path))
        except TraceError as exc:
            errors.append(exc)
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
    votes: Counter[tuple[str, str]] = Counter()
    for d in dumps:
        for name, cfg in d.pg_config.items():
            votes[(name, str(parse_ranks(cfg.get("ranks", ""))))] += 1
    best: dict[str, tuple[int, str]] = {}
    for (name, ranks), n in votes.items():
        if name not in best or n > best[name][0]:
            best[name] = (n, ranks)
    kept: list[FlightDump] = []
    rejected: list[TraceError] = []
    for d in dumps:
        clash = [
            name
            for name, cfg in d.pg_config.items()
            if str(parse_ranks(cfg.get("ranks", ""))) != best[name][1]
        ]
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


def _entry_row(rank: int, pos: int, e: dict[str, Any]) -> tuple[Any, ...]:
    backend, op, src, dst = _op_parts(str(e.get("profiling_name", "")))
    pg = e.get("process_group") or ("?", "")
    is_p2p = bool(e.get("is_p2p", op in ("send", "recv")))
    return (
        rank,
        pos,
        e.get("record_id"),
        str(e.get("pg_id")),
        str(pg[0]),
        str(pg[1]) if len(pg) > 1 else "",
        e.get("collective_seq_id"),
        e.get("p2p_seq_id"),
        e.get("op_id"),
        is_p2p,
        backend,
        op,
        src,
        dst,
        json.dumps(e.get("input_sizes")),
        json.dumps(e.get("output_sizes")),
        _numel(e.get("input_sizes")),
        _numel(e.get("output_sizes")),
        ",".join(map(str, e.get("input_dtypes") or ())),
        ",".join(map(str, e.get("output_dtypes") or ())),
        str(e.get("state", "")),
        e.get("time_created_ns"),
        e.get("time_discovered_started_ns"),
        e.get("time_discovered_completed_ns"),
        bool(e.get("retired", False)),
        e.get("timeout_ms"),
        None if e.get("thread_id") is None else str(e.get("thread_id")),
        e.get("thread_name"),
        _frames_text(e.get("frames")),
    )


def entries_table(dumps: list[FlightDump]) -> pl.DataFrame:
    """One row per FR entry of every rank (schema ENTRY_SCHEMA; docs/hang.md)."""
    rows = [row for d in dumps for row in d.rows]
    # strict=False: a value of another type (a damaged dump) reads as null, not an error.
    return pl.DataFrame(rows, schema=ENTRY_SCHEMA, orient="row", strict=False)


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
    names: dict[str, str] = {}
    for row in d.rows:
        names.setdefault(row[3], row[4])
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
            "entries": [len(d.rows) for d in dumps],
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
