"""Which files are traces, and which rank each one is.

Paths may be files or directories (searched recursively for `*.json` and `*.json.gz`,
which covers `*.pt.trace.json[.gz]`). A rank comes from the trace's
`distributedInfo.rank`, else from a rank number in the file name (`rank-3`, `rank_3`,
`rank3`), else from the file's position among the files that have neither. Two files
claiming one rank, and files from jobs of different sizes, are reported, not guessed at.
Kineto's default file names also name the host (`HOST_IN_NAME`, read by
kineto_comm.analysis.align.hosts).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from kineto_comm.errors import TraceError

# Files that sit beside traces but are not traces (the generator's ground truth, and a
# capture's record of each call's phase and module: kineto_comm.capture.truth).
NOT_TRACES = frozenset({"truth.json"})
RANK_IN_NAME = r"(?i)(?:^|[^a-z])rank[-_.]?(\d+)"
_RANK_IN_NAME = re.compile(RANK_IN_NAME)
# Kineto's default trace file name, which torch's tensorboard_trace_handler also writes with
# its default worker name: {hostname}_{pid}.{timestamp}.pt.trace.json[.gz]. A pid has at most
# 7 digits (pid_max is at most 2^22), a timestamp (s, ms or ns since the epoch) 10 to 19.
# A pattern for Polars (kineto_comm.analysis.align reads the ranks' host names from it).
HOST_IN_NAME = (
    r"(?:^|[/\\])(?P<host>[^/\\]+)_(?P<pid>\d{1,7})\.\d{10,19}\.pt\.trace\.json(?:\.gz)?$"
)
_TRUTH = re.compile(r"^truth-rank-\d+\.json$")
# Ranks and world sizes at or above this are damage, not a job (no job has 2^31 ranks).
MAX_RANKS = 2**31


def _trace_files(folder: Path) -> list[Path]:
    """The trace files under `folder`, following symbolic links to folders (a job's ranks
    are often linked in from where each node wrote them), each real folder once (a link
    back up the tree is no loop)."""
    seen: set[tuple[int, int]] = set()
    hits: list[Path] = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        st = os.stat(root)
        if (st.st_dev, st.st_ino) in seen:
            dirs.clear()
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs.sort()
        for name in files:
            path = Path(root) / name
            if (
                name not in NOT_TRACES
                and not _TRUTH.match(name)
                and name.endswith((".json", ".json.gz"))
                and path.is_file()
            ):
                hits.append(path)
    return hits


def discover(paths: list[str | Path]) -> tuple[list[Path], list[TraceError]]:
    """Trace files under the given paths, in a stable order, and the paths that do not exist."""
    found: list[Path] = []
    missing: list[TraceError] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            hits = _trace_files(path)
            if not hits:
                missing.append(TraceError(str(path), "no .json or .json.gz trace files in it"))
            found.extend(sorted(hits))
        elif path.is_file():
            found.append(path)
        else:
            missing.append(TraceError(str(path), "no such file or directory"))
    unique = list(dict.fromkeys(p.resolve() for p in found))
    by_resolved = {p.resolve(): p for p in found}
    return [by_resolved[p] for p in unique], missing


def rank_from_name(path: str | Path) -> int | None:
    """A rank number written in the file name, if any."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m and int(m.group(1)) < MAX_RANKS else None


@dataclass(frozen=True)
class RankClaim:
    """What one decoded file says about its rank."""

    file: str
    rank: int | None
    world_size: int | None


@dataclass(frozen=True)
class Assignment:
    """Final ranks (file -> rank, with how it was found), rejected files and warnings."""

    ranks: dict[str, int]
    sources: dict[str, str]
    rejected: list[TraceError]
    warnings: list[str]


def assign_ranks(claims: list[RankClaim]) -> Assignment:
    """Give every file a rank: trace metadata, then file name, then order; reject duplicates."""
    ranks: dict[str, int] = {}
    sources: dict[str, str] = {}
    rejected: list[TraceError] = []
    owner: dict[int, str] = {}
    pending: list[str] = []

    # Where two files claim one rank, the claim its file name agrees with goes first: a
    # damaged rank-3 file claiming rank 0 must not push out rank-0's own file.
    def disputed(claim: RankClaim) -> bool:
        named = rank_from_name(claim.file)
        return claim.rank is not None and named is not None and named != claim.rank

    for claim in sorted(claims, key=disputed):
        rank, source = claim.rank, "distributedInfo"
        if rank is None:
            rank, source = rank_from_name(claim.file), "file name"
        if rank is None:
            pending.append(claim.file)
            continue
        if rank in owner:
            rejected.append(
                TraceError(claim.file, f"duplicate rank {rank} (also in {owner[rank]}); skipped")
            )
            continue
        owner[rank] = claim.file
        ranks[claim.file] = rank
        sources[claim.file] = source
    next_free = 0
    for file in pending:
        while next_free in owner:
            next_free += 1
        owner[next_free] = file
        ranks[file] = next_free
        sources[file] = "file order"
    warnings = []
    sizes = {c.world_size for c in claims if c.world_size is not None and c.file in ranks}
    if len(sizes) > 1:
        detail = ", ".join(
            f"{c.world_size} in {Path(c.file).name}"
            for c in claims
            if c.world_size is not None and c.file in ranks
        )
        warnings.append(f"files come from jobs of different sizes (world_size {detail})")
    return Assignment(ranks=ranks, sources=sources, rejected=rejected, warnings=warnings)


# --- Flight Recorder dumps (kineto_comm.load.flight reads them) ---
# Found here, by their first bytes, so that `report` can tell a folder of dumps before it
# loads anything heavy (the hang report's modules, Polars).

# Pickle protocol 2+ starts with this opcode (PROTO); FR dumps use the default protocol.
PICKLE_MAGIC = b"\x80"
# Bytes read to tell an FR JSON dump from a Kineto trace.
PEEK_BYTES = 65536


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
