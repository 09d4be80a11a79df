"""How much memory a run may use, and what that decides: worker processes and piece size.

Peak memory of one rank's analysis grows with its trace: about WORKER_BASE (interpreter,
Polars, the piece being decoded; a file of up to decode.WHOLE_PIECES pieces is held whole,
which the share below covers) plus WORKER_SHARE of the uncompressed JSON (its tables;
measured 0.20 GiB at 153 MB, 0.44 GiB at 512 MB, 0.71 GiB at 1 GB, a slope near 0.6: see
bench/README.md; WORKER_SHARE keeps a margin). The parent holds every rank's reduced tables: about
PARENT_BASE plus PARENT_SHARE of all the JSON. A plan runs as many workers at once as the
limit holds (never fewer than one) and decodes smaller pieces (and reads only smaller
files whole) under small limits; the tables are the same whatever the plan.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from kineto_comm.errors import UsageError
from kineto_comm.load.decode import PIECE_BYTES

MiB = 1024 * 1024
GiB = 1024 * MiB
WORKER_BASE = 160 * MiB
WORKER_SHARE = 0.8
PARENT_BASE = 200 * MiB
PARENT_SHARE = 0.1
SPILLED_SHARE = 0.015
# Above this much JSON every rank's kernels, calls and steps stay in files (rank_store): the
# parent would hold ~PARENT_SHARE of it. Files cost a write and a read per rank: 256 x 10 MB
# took 4.4 s spilled, 3.7 s not, with a parent of 0.44 GiB (bench/README.md, thirty-fourth
# session).
SPILL_ABOVE = 4 * GiB
# A job of up to this much JSON runs in threads (kineto_comm.workers): a worker process
# takes a while to start, while the scanner and Polars run without the GIL. On 2 cores
# threads were faster up to 1.2 GB (64 x 10 MB: 0.95 s against 1.06 s; 2 x 600 MB: 1.9 s
# against 2.2-3.9 s), not at 2.6 GB (256 x 10 MB: 4.75 s against 4.46 s); on 16 cores
# they were faster at every size (2.6 GB: 2.76 s against 3.39 s), but the parent then holds
# every batch in flight: 1.1-1.2 GiB at 1-2.6 GB in 16 threads, against 0.3-0.5 GiB with
# processes. A bound in bytes keeps it there whatever the core count (bench/README.md,
# thirty-fourth and thirty-fifth sessions).
THREADS_BELOW = 1 * GiB
BATCH_BYTES = 64 * MiB  # rank files are modelled together up to this much JSON (batches)
MIN_PIECE = 1 * MiB
ENV = "KINETO_COMM_MEMORY_LIMIT"

_UNITS = {"": 1, "k": 1024, "m": MiB, "g": GiB, "t": 1024 * GiB}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from `8G`, `512MiB`, `1.5g` or a plain number (units are powers of 1024)."""
    m = _SIZE.match(text)
    if m is None:
        raise UsageError(f"not a memory size: {text!r} (use e.g. 8G, 512M)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def default_limit() -> int:
    """Three quarters of the memory available now (Linux), else half of physical memory."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 * 3 // 4
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 4 * GiB


def uncompressed_size(path: Path) -> int:
    """The JSON size of a trace file: a gzip file's trailer gives it (modulo 4 GiB)."""
    size = path.stat().st_size
    if not path.name.endswith(".gz") or size < 18:
        return size
    with open(path, "rb") as fh:
        fh.seek(-4, os.SEEK_END)
        isize = int.from_bytes(fh.read(4), "little")
    return isize if isize >= size else size * 8  # wrapped past 4 GiB: a typical ratio


@dataclass(frozen=True)
class Plan:
    """What a memory limit allows: `jobs` processes at once (this one included: it analyses
    files too, on top of the tables it holds), decoding `piece_bytes` at a time; with
    `spill`, every rank's kernels are kept in files rather than in the parent's memory; with
    `threads`, the jobs are threads of this process rather than processes. `batches` groups
    the files (by position) into the units of work (see `batches`)."""

    limit: int
    jobs: int
    piece_bytes: int
    spill: bool = False
    threads: bool = False
    warnings: tuple[str, ...] = ()
    batches: tuple[tuple[int, ...], ...] = ()


def plan(files: list[Path], limit: int, jobs: int) -> Plan:
    """The plan for analysing `files` with at most `jobs` workers within `limit` bytes."""
    sizes = {f: uncompressed_size(f) for f in files}
    piece = max(MIN_PIECE, min(PIECE_BYTES, limit // 64))
    total = sum(sizes.values())
    biggest = max(sizes, key=sizes.__getitem__, default=None)
    need = WORKER_BASE + int(WORKER_SHARE * sizes[biggest]) if biggest else WORKER_BASE
    # Kernels and calls go to files on a big job, or where holding them would leave no room
    # under the limit for a worker beside the parent.
    merged = PARENT_BASE + int(PARENT_SHARE * total)
    spill = total > SPILL_ABOVE or merged + need > limit
    parent = PARENT_BASE + int(SPILLED_SHARE * total) if spill else merged
    fits = max(1, (limit - parent) // need) if limit > parent else 1
    warnings = []
    if biggest is not None and parent + need > limit:
        warnings.append(
            f"{biggest}: analysing it needs about {(parent + need) / GiB:.1f} GiB, more than"
            f" the memory limit of {limit / GiB:.1f} GiB; going ahead with one worker"
        )
    jobs = max(1, min(jobs, fits))
    # A batch may hold what one worker's share of the limit holds, up to BATCH_BYTES.
    room = int(((limit - parent) // jobs - WORKER_BASE) / WORKER_SHARE)
    grouped = batches([sizes[f] for f in files], jobs, min(BATCH_BYTES, room))
    return Plan(limit, jobs, piece, spill, total <= THREADS_BELOW, tuple(warnings), grouped)


def batches(sizes: list[int], jobs: int, cap: int = BATCH_BYTES) -> tuple[tuple[int, ...], ...]:
    """Files (by position, consecutive ones) grouped into batches of about `cap` bytes of
    JSON at most, each batch's tables built (decode.decode_files) and modelled
    (per_rank.tabulate) by one set of queries: most of a query's cost on a small rank file
    is fixed, so a batch of small files costs little more than one. A file of half `cap` or
    more is a batch of its own. Batches are about equal in size and, where the files allow,
    as many as the workers or a multiple of them, so that the workers finish together."""
    if cap <= 0:
        return tuple((i,) for i in range(len(sizes)))
    total = sum(sizes)
    count = max(-(-total // cap), min(jobs, len(sizes)), 1)
    target = total / min(len(sizes) or 1, -(-count // jobs) * jobs)
    out: list[list[int]] = []
    slot, start, alone = -1, 0, False
    for i, s in enumerate(sizes):
        at = int((start + s / 2) // target) if target else 0  # where its middle falls
        big = 2 * s >= cap
        if not out or at != slot or big or alone:
            out.append([])
        out[-1].append(i)
        slot, start, alone = at, start + s, big
    return tuple(tuple(b) for b in out)
