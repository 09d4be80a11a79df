"""Which files are traces, and which rank each one is.

Paths may be files or directories (searched recursively for `*.json` and `*.json.gz`,
which covers `*.pt.trace.json[.gz]`). A rank comes from the trace's
`distributedInfo.rank`, else from a rank number in the file name (`rank-3`, `rank_3`,
`rank3`), else from the file's position among the files that have neither. Two files
claiming one rank, and files from jobs of different sizes, are reported, not guessed at.
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
_TRUTH = re.compile(r"^truth-rank-\d+\.json$")
_RANK_IN_NAME = re.compile(r"(?i)(?:^|[^a-z])rank[-_.]?(\d+)")
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
