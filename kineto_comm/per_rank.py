"""Everything that needs only one rank's file: decode, model, and time breakdown.

`process_file` (one file) and `tabulate` (several decoded files, modelled together) are
self-contained and return compact tables per file, so they can run in a worker process (the
tables travel back as Arrow IPC, see `to_wire`) or on another machine. Ranks are
provisional here (what the file says); the merge step assigns final ones.
"""

from __future__ import annotations

import io
import uuid
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from kineto_comm.analysis.attribution import with_places
from kineto_comm.analysis.framework import rank_markers
from kineto_comm.analysis.overlap import COMPUTE_EDGES, breakdowns
from kineto_comm.frames import read_frame, write_frame
from kineto_comm.lazy import collect_all, split
from kineto_comm.lazy import stack as stack_frames
from kineto_comm.load.decode import COLLECTIVE_SPAN, RawTrace, decode_file
from kineto_comm.load.discover import rank_from_name
from kineto_comm.model.collectives import build_collectives
from kineto_comm.model.kernels import KERNEL_COLUMNS, build_kernels
from kineto_comm.model.steps import assign_steps, cpu_steps, device_windows
from kineto_comm.rank_store import layout

TABLES = ("kernels", "collectives", "steps", "totals")
# What a rank's `meta` holds (RankTables.meta): part of the cache's key, so that an entry
# written before a field was added is a miss, not a hit without it.
META_FIELDS = (
    "backend",
    "devices",
    "device_props",
    "timeline",
    "base_time_ns",
    "host_name",
    "bytes",
    "has_step_markers",
    "groups",
    "pg_rank_sets",
)
# The tables with a row per kernel, call or step: what big jobs keep in files
# (kineto_comm.rank_store).
SPILLED = ("kernels", "collectives", "steps")


@dataclass
class RankTables:
    """One file's tables and metadata. `rank` is what the file claims (or None)."""

    file: str
    rank: int | None
    world_size: int | None
    meta: dict[str, Any] = field(default_factory=dict)
    kernels: pl.DataFrame = field(default_factory=pl.DataFrame)
    collectives: pl.DataFrame = field(default_factory=pl.DataFrame)
    steps: pl.DataFrame = field(default_factory=pl.DataFrame)
    totals: pl.DataFrame = field(default_factory=pl.DataFrame)
    warnings: list[str] = field(default_factory=list)
    # Table name -> the Arrow IPC file its rows were written to (`spill`); the table is then
    # empty, meta["rows"][name] says how many rows the file holds and meta["layouts"][name]
    # its columns' fingerprint (kineto_comm.rank_store.layout).
    files: dict[str, str] = field(default_factory=dict)
    # The rank the model wrote into the rows (`provisional`): `with_rank` relabels the tables
    # in memory, not those in `files`. None: not known.
    held: int | None = None

    @classmethod
    def from_parts(cls, header: dict[str, Any], frames: dict[str, pl.DataFrame]) -> RankTables:
        """Rebuild from `header()` and the TABLES frames (cache entries, worker results)."""
        return cls(
            file=header["file"],
            rank=header["rank"],
            world_size=header["world_size"],
            meta=header["meta"],
            warnings=header["warnings"],
            files=header.get("files") or {},
            held=header.get("held"),
            **frames,
        )

    def header(self) -> dict[str, Any]:
        """Everything but the tables, JSON-serialisable."""
        return {
            "file": self.file,
            "rank": self.rank,
            "world_size": self.world_size,
            "meta": self.meta,
            "warnings": self.warnings,
            "files": self.files,
            "held": self.held,
        }

    def with_rank(self, rank: int) -> RankTables:
        """The same tables with the final rank written into every `rank` column."""
        if rank == self.rank:  # the columns hold the rank the file claims: already final
            return self
        relabel = {
            name: getattr(self, name).with_columns(rank=pl.lit(rank, dtype=pl.Int64))
            for name in TABLES
            if name not in self.files  # rows in a file keep `held` (RankStore relabels them)
        }
        return replace(self, rank=rank, **relabel)


def group_digests(groups: list[dict[str, Any]]) -> dict[str, int]:
    """pg_name -> a digest of the ranks its config lists (crc32 of the sorted list: the same
    in every process), for telling files of different jobs apart (analysis.jobs)."""
    return {
        str(g["pg_name"]): zlib.crc32(str(sorted(g["ranks"] or [])).encode())
        for g in groups
        if g.get("pg_name") is not None and isinstance(g.get("ranks"), list)
    }


def _process_groups(raws: list[RawTrace]) -> pl.DataFrame:
    rows = [
        {
            "rank": i,
            "pg_name": g["pg_name"],
            "pg_desc": g["pg_desc"],
            "pg_size": g["pg_size"],
            "ranks_text": str(g["ranks"]),
        }
        for i, raw in enumerate(raws)
        for g in raw.process_groups
        if g["pg_name"] is not None
    ]
    schema = {
        "rank": pl.Int64,
        "pg_name": pl.String,
        "pg_desc": pl.String,
        "pg_size": pl.Int64,
        "ranks_text": pl.String,
    }
    return pl.DataFrame(rows, schema=schema)


_ROLES = ("gpu", "ops", "host", "threads", "waits")


def stack(raws: list[RawTrace]) -> RawTrace:
    """The files' event tables that the model reads one above the other, each row with a
    `rank` column holding its file's position in `raws` (the model's tables are keyed by
    it)."""
    queries = [stack_frames([getattr(raw, role) for raw in raws], "rank") for role in _ROLES]
    stacked = dict(zip(_ROLES, collect_all(queries), strict=True))
    return replace(raws[0], file="", **stacked)


def process_file(
    path: str | Path, comm_patterns: tuple[str, ...] = (), piece_bytes: int | None = None
) -> RankTables:
    """Decode one trace and build its kernels, collectives, steps and totals tables
    (`piece_bytes`: see decode_file)."""
    return tabulate([decode_file(path, piece_bytes)], comm_patterns)[0]


def tabulate(raws: list[RawTrace], comm_patterns: tuple[str, ...] = ()) -> list[RankTables]:
    """The kernels, collectives, steps and totals tables of decoded files, in their order.

    Files with device activity are modelled together, as are those without (host
    timelines): each query runs once over all of them, keyed by file, rather than once per
    file. Most of a query's cost on a rank of a few MB is fixed (planning, thread hand-offs),
    so small rank files cost a fraction of what they would one by one. `raws` is emptied:
    the event tables are freed as soon as they are done with.
    """
    out: list[RankTables | None] = [None] * len(raws)
    groups = [
        [i for i, raw in enumerate(raws) if (raw.gpu.height > 0) == on_device]
        for on_device in (True, False)
    ]
    kept = [[raws[i] for i in group] for group in groups]
    raws.clear()
    for group, members in zip(groups, kept, strict=True):
        if group:
            for i, tables in zip(group, _model(members, comm_patterns), strict=True):
                out[i] = tables
    return [t for t in out if t is not None]


def _model(raws: list[RawTrace], comm_patterns: tuple[str, ...]) -> list[RankTables]:
    """tabulate() for files that all have device activity, or all have none. `raws` keeps
    only their metadata: their tables are now the stacked ones."""
    on_device = raws[0].gpu.height > 0
    stacked = stack(raws)
    raws[:] = [replace(r, **{role: pl.DataFrame() for role in _ROLES}) for r in raws]
    groups = _process_groups(raws)
    marks = cpu_steps(stacked)
    marked = set(marks["rank"].to_list())
    rows = assign_steps(build_kernels(stacked, comm_patterns), marks)
    # The event tables are done with: free them before the rest (peak memory).
    stacked = replace(
        stacked,
        gpu=stacked.gpu.clear(),
        host=stacked.host.clear(),
        threads=stacked.threads.clear(),
        waits=stacked.waits.clear(),
    )
    kernels = rows.select(KERNEL_COLUMNS)
    # The framework's markers: from the CPU annotations, which are not kept after this.
    found = rank_markers(stacked.ops, kernels, marks, len(raws))
    collectives = with_places(build_collectives(rows, stacked, groups), rows, stacked.ops)
    del rows
    windows = device_windows(kernels, marks)
    # Per step and over all device activity (inside steps or not), in one sweep.
    whole = kernels.group_by("rank").agg(
        window=pl.lit(0, dtype=pl.Int64),
        start_ns=pl.col("start_ns").min(),
        end_ns=pl.col("end_ns").max(),
    )
    step_metrics, totals = breakdowns(kernels, [windows.rename({"step": "window"}), whole])
    steps = windows.join(
        step_metrics.drop("start_ns", "end_ns").rename({"window": "step"}),
        on=["rank", "step"],
        how="left",
    ).sort("rank", "start_ns", maintain_order=True)
    totals = totals.drop("window", *COMPUTE_EDGES)
    # Each row's rank: the provisional one; `_file` keeps the file's position to split by.
    claims = pl.Series([provisional(r) for r in raws], dtype=pl.Int64)
    relabel = {"_file": pl.col("rank"), "rank": pl.lit(claims).gather(pl.col("rank"))}
    frames = {"kernels": kernels, "collectives": collectives, "steps": steps, "totals": totals}
    labelled = collect_all([frames[name].lazy().with_columns(**relabel) for name in TABLES])
    parts = {
        name: split(frame, "_file", len(raws), keep_key=False)
        for name, frame in zip(TABLES, labelled, strict=True)
    }
    del frames, labelled
    calls = _collective_spans(stacked.ops, raws)
    return [
        _rank_tables(
            raw,
            {name: parts[name][i] for name in parts},
            on_device,
            i in marked,
            calls[i],
            found[i],
        )
        for i, raw in enumerate(raws)
    ]


def provisional(raw: RawTrace) -> int:
    """The rank a file's rows hold until ranks are assigned (kineto_comm.load.discover): the
    one the trace claims, else the one in its name, else -1. Usually the final one, so the
    files a worker writes need no relabelling (kineto_comm.rank_store)."""
    if raw.rank is not None:
        return raw.rank
    named = rank_from_name(raw.file)
    return -1 if named is None else named


def _collective_spans(ops: pl.DataFrame, raws: list[RawTrace]) -> list[int]:
    """Per file, its collective calls on the host (only counted for world-size-1 files,
    whose warning quotes it)."""
    if not any(raw.world_size == 1 for raw in raws):
        return [0] * len(raws)
    counts = ops.group_by("rank").agg(pl.col("name").str.contains(COLLECTIVE_SPAN).sum())
    found = dict(zip(counts["rank"].to_list(), counts["name"].to_list(), strict=True))
    return [int(found.get(i) or 0) for i in range(len(raws))]


def _rank_tables(
    raw: RawTrace,
    frames: dict[str, pl.DataFrame],
    on_device: bool,
    marked: bool,
    calls: int,
    markers: list[dict[str, Any]] | None = None,
) -> RankTables:
    """One file's RankTables from its part of the model's tables (their rank: `provisional`)."""
    kernels, collectives = frames["kernels"], frames["collectives"]
    timeline = "device" if on_device else ("host" if kernels.height else "none")
    warnings = list(raw.warnings)
    if raw.world_size == 1 and collectives.height == 0 and calls:
        warnings.append(
            f"{raw.file}: world size 1: its {calls} collective calls moved no data between"
            " ranks (with one rank NCCL runs them as local copies, not kernels), so there"
            " is no communication to analyse"
        )
    if timeline == "none":
        warnings.append(
            f"{raw.file}: no device kernels and no host communication spans"
            " (a CPU-only trace, or a device whose events this tool does not read):"
            " nothing to break down"
        )
    meta = {
        "backend": raw.backend,
        "devices": raw.device_names,
        "device_props": raw.devices,
        "timeline": timeline,
        "base_time_ns": raw.base_time_ns,
        "host_name": raw.host_name,
        "bytes": raw.nbytes,
        "has_step_markers": marked,
        "groups": group_digests(raw.process_groups),
        # How many different rank lists its groups have (empty lists: unknown, not one).
        "pg_rank_sets": len({tuple(sorted(g["ranks"])) for g in raw.process_groups if g["ranks"]})
        or None,
        # What the trace shows of the framework (kineto_comm.analysis.framework).
        "framework": markers or [],
    }
    # Not the process groups' rank lists: every rank's copy would hold ranks x group size
    # values in the parent (they are in the calls' pg_ columns); a digest of each will do.
    return RankTables(
        file=raw.file,
        rank=raw.rank,
        world_size=raw.world_size,
        meta=meta,
        warnings=warnings,
        held=provisional(raw),
        **frames,
    )


def spill(tables: RankTables, folder: str | Path) -> RankTables:
    """The same tables with the kernels, collectives and steps (SPILLED) moved to Arrow IPC files in
    `folder` (see kineto_comm.rank_store: what keeps the parent's memory bounded on big
    jobs); a table that cannot be written stays in memory, with a warning."""
    files, rows, moved, warnings = dict(tables.files), {}, {}, list(tables.warnings)
    layouts = {}
    for name in SPILLED:
        if name in files:
            continue
        frame = getattr(tables, name)
        path = Path(folder) / f"{uuid.uuid4().hex}.arrow"
        try:
            write_frame(frame, path)
        except OSError as exc:
            path.unlink(missing_ok=True)
            warnings.append(
                f"{tables.file}: {name} kept in memory, could not write them to {folder} ({exc})"
            )
            continue
        # No columns left behind either: an empty frame's columns cost some 14 kB a rank
        # in the parent (0.1 GiB at 8192 ranks).
        files[name], rows[name], moved[name] = str(path), frame.height, pl.DataFrame()
        layouts[name] = layout(path)
    meta = {
        **tables.meta,
        "rows": {**tables.meta.get("rows", {}), **rows},
        "layouts": {**tables.meta.get("layouts", {}), **layouts},
    }
    return replace(tables, files=files, meta=meta, warnings=warnings, **moved)


def to_wire(batch: list[RankTables]) -> dict[str, Any]:
    """A picklable form of several files' tables, cheap to send between processes: their
    headers, and per table one Arrow IPC stream of every file's rows, one file after the
    other (one stream per batch: reading it back has a fixed cost, see from_wire)."""
    out: dict[str, Any] = {"headers": [t.header() for t in batch], "rows": {}, "ipc": {}}
    for name in TABLES:
        frames = [getattr(t, name) for t in batch if name not in t.files]
        out["rows"][name] = [getattr(t, name).height for t in batch]
        buf = io.BytesIO()
        write_frame(pl.concat(frames, how="vertical") if frames else pl.DataFrame(), buf)
        out["ipc"][name] = buf.getvalue()
    return out


def from_wire(wire: dict[str, Any]) -> list[RankTables]:
    """Inverse of `to_wire`: each file's tables are slices of the batch's (no copy)."""
    frames = {name: read_frame(wire["ipc"][name]) for name in TABLES}
    start = dict.fromkeys(TABLES, 0)
    out = []
    for i, header in enumerate(wire["headers"]):
        parts = {}
        for name in TABLES:
            if name in (header.get("files") or {}):  # in a file: no rows, no columns here
                parts[name] = pl.DataFrame()
                continue
            rows = wire["rows"][name][i]
            parts[name] = frames[name].slice(start[name], rows)
            start[name] += rows
        out.append(RankTables.from_parts(header, parts))
    return out
