"""Flight Recorder dumps of a hung job with a known cause (ground truth for the hang analysis).

A job of `ranks` ranks runs `steps` rounds of one all_reduce on the world group and one on
each pair group (ranks 2i, 2i+1); then one fault stops it:

- `gpu`: the faulty rank issues the next collectives, its pair peer completes the first
  of them, but the faulty rank never sees it complete (a GPU or NCCL stop).
- `stopped`: the faulty rank stops issuing work (a Python thread that stopped).
- `skip`: the faulty rank skips one world all_reduce, issues the next one, and stops there.
- `size`, `dtype`, `type`: the faulty rank calls the next world collective with another
  size, dtype or collective type; every rank then waits in it.
- `missing`: like `stopped`, and the faulty rank leaves no dump.

`write_dumps` writes one dump per rank (`_dump_N`, pickle, or JSON with `fmt="json"`) in a
chosen format version, and returns the truth: {"fault", "roots", "version", ...}.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FAULTS = ("gpu", "stopped", "skip", "size", "dtype", "type", "missing")
SIZE = 1024
T0 = 1_700_000_000_000_000_000
STEP_NS = 1_000_000


def _entry(
    record: int,
    pg: tuple[str, str],
    pg_id: int,
    seq: int,
    op: str,
    state: str,
    t: int,
    *,
    size: int = SIZE,
    dtype: str = "Float",
    version: tuple[int, int] = (2, 9),
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "record_id": record,
        "pg_id": pg_id,
        "process_group": pg,
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": t,
        "input_sizes": [[size]],
        "input_dtypes": [dtype],
        "output_sizes": [[size]],
        "output_dtypes": [dtype],
        "state": state,
        "time_discovered_started_ns": t + 10 if state != "scheduled" else None,
        "time_discovered_completed_ns": t + 100 if state == "completed" else None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": False,
        "frames": [
            {"name": "train_step", "filename": "train.py", "line": 42},
            {"name": "main", "filename": "train.py", "line": 7},
        ],
    }
    if version >= (2, 6):
        e["thread_id"] = "140000"
        e["thread_name"] = "MainThread"
    return e


def iter_dumps(
    ranks: int = 8,
    fault: str = "stopped",
    faulty: int = 3,
    steps: int = 4,
    version: str = "2.9",
    entries_per_rank: int | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(rank, dump dict) of one generated hang, a rank at a time (big jobs need not be held
    whole)."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; choose one of {', '.join(FAULTS)}")
    if ranks < 2 or ranks % 2 or not 0 <= faulty < ranks:
        raise ValueError("ranks must be even and at least 2, faulty one of them")
    v = tuple(int(p) for p in version.split("."))
    world = ("0", "default_pg")
    steps = entries_per_rank // 2 if entries_per_rank else steps
    for r in range(ranks):
        pair = (str(1 + r // 2), "PAIR_GROUP")
        peer_pair = faulty // 2 == r // 2
        entries: list[dict[str, Any]] = []
        t = T0
        rec = 0
        world_done = pair_done = 0

        def add(pg: tuple[str, str], pg_id: int, seq: int, state: str, **kw: Any) -> None:
            nonlocal rec, t
            entries.append(  # noqa: B023 (called only within this iteration)
                _entry(rec, pg, pg_id, seq, kw.pop("op", "all_reduce"), state, t, version=v, **kw)
            )
            rec += 1
            t += STEP_NS

        for s in range(1, steps + 1):
            add(world, 0, s, "completed")
            add(pair, 1, s, "completed")
        world_done = pair_done = steps
        w_next, p_next = steps + 1, steps + 1
        me = r == faulty
        if fault in ("stopped", "missing"):
            if not me:
                add(world, 0, w_next, "scheduled")
        elif fault == "gpu":
            # The faulty rank and its pair peer issue the pair collective; the peer sees it
            # complete, the faulty rank does not (its GPU stopped); both then issue the world
            # collective, which can never complete.
            if peer_pair:
                add(pair, 1, p_next, "scheduled" if me else "completed")
                pair_done += 0 if me else 1
            add(world, 0, w_next, "scheduled")
        elif fault == "skip":
            # The faulty rank skips world collective w_next: its next one is numbered
            # w_next, matches the others' w_next, and it then stops; the others go on to
            # w_next + 1, which it never issues.
            add(world, 0, w_next, "completed")
            if me:
                world_done = w_next
            else:
                world_done = w_next
                add(world, 0, w_next + 1, "scheduled")
        else:
            kw: dict[str, Any] = {}
            if me and fault == "size":
                kw["size"] = SIZE * 2
            if me and fault == "dtype":
                kw["dtype"] = "BFloat16"
            if me and fault == "type":
                kw["op"] = "broadcast"
            add(world, 0, w_next, "scheduled", **kw)
        if fault == "missing" and me:
            continue
        enq_world = max((e["collective_seq_id"] for e in entries if e["pg_id"] == 0), default=0)
        enq_pair = max((e["collective_seq_id"] for e in entries if e["pg_id"] == 1), default=0)
        dump: dict[str, Any] = {
            "version": version,
            "pg_config": {
                "0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(ranks)))},
                pair[0]: {
                    "name": pair[0],
                    "desc": "PAIR_GROUP",
                    "ranks": str([r - r % 2, r - r % 2 + 1]),
                },
            },
            "pg_status": {
                "0": {
                    "last_enqueued_collective": enq_world,
                    "last_started_collective": -1,
                    "last_completed_collective": world_done,
                },
                "1": {
                    "last_enqueued_collective": enq_pair,
                    "last_started_collective": -1,
                    "last_completed_collective": pair_done,
                },
            },
            "entries": entries,
        }
        dump["comm_lib_version" if v >= (2, 10) else "nccl_version"] = "2.21.5"
        yield r, dump


def job_dumps(
    ranks: int = 8,
    fault: str = "stopped",
    faulty: int = 3,
    steps: int = 4,
    version: str = "2.9",
    entries_per_rank: int | None = None,
) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """The dumps (rank -> dump dict) and the truth of one generated hang."""
    dumps = dict(iter_dumps(ranks, fault, faulty, steps, version, entries_per_rank))
    return dumps, truth_of(ranks, fault, faulty, version)


def truth_of(ranks: int, fault: str, faulty: int, version: str) -> dict[str, Any]:
    """What the analysis should find in a generated hang: the roots and their kind."""
    return {
        "fault": fault,
        "faulty": faulty,
        "roots": [faulty],
        "ranks": ranks,
        "version": version,
        "kind": {
            "gpu": "device",
            "stopped": "stopped",
            "skip": "stopped",
            "missing": "no_dump",
            "size": "diverged",
            "dtype": "diverged",
            "type": "diverged",
        }[fault],
    }


def write_dumps(
    out: str | Path,
    ranks: int = 8,
    fault: str = "stopped",
    faulty: int = 3,
    version: str = "2.9",
    fmt: str = "pickle",
    **kw: Any,
) -> dict[str, Any]:
    """Write `_dump_N` files (pickle or JSON) and truth.json into `out`; the truth."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for r, d in iter_dumps(ranks, fault, faulty, version=version, **kw):
        path = out / f"_dump_{r}"
        if fmt == "json":
            path.write_text(json.dumps(d))
        else:
            path.write_bytes(pickle.dumps(d))
    truth = truth_of(ranks, fault, faulty, version)
    (out / "truth.json").write_text(json.dumps(truth))
    return truth
