"""Per-rank work on local processes: this process and `jobs - 1` spawned workers pull rank
files from one shared counter, so whoever is free takes the next file. Small jobs
(budget.THREADS_BELOW) use threads of this process instead (`run_threads`): a worker
process takes longer to start than such a job takes, while the compiled scanner and Polars
run without the GIL, so threads overlap much of the work (two threads ran 8 x 10 MB rank
files 1.4x faster than one in the seventh session, 1.9x in the eighth: bench/README.md).

Why this process works too: starting a worker costs ~0.7 s here (a fresh interpreter that
imports Polars), and files analysed in this process need no Arrow IPC round trip. On big
jobs (kernels kept in files, budget.SPILL_ABOVE) it does not: the start-up is then
negligible, and the parent's memory stays the merged tables, without a trace's working set.

Why a shared counter and not tasks handed out up front: a worker still starting up would
sit on files this process could already be working on (a small job is done before a worker
is up). A worker that dies (killed, out of memory) costs only the file it was on, reported
as an error for that file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from kineto_comm import cache
from kineto_comm.errors import TraceError
from kineto_comm.per_rank import RankTables, from_wire, process_file, spill, to_wire

Outcome = tuple[str, Any]  # ('ok', RankTables or its wire form) or ('error', message)
DIED = "the worker process analysing this file stopped unexpectedly (out of memory?)"


@dataclass(frozen=True)
class Settings:
    """What analysing a rank file needs besides its path (picklable: workers get it).

    comm_patterns: extra communication kernel patterns; cache_dir: the per-rank table cache;
    piece_bytes: decode piece size (kineto_comm.budget); spill_dir: where kernels go to
    files (kineto_comm.kernel_store), None to keep them with the other tables.
    """

    comm_patterns: tuple[str, ...] = ()
    cache_dir: str | None = None
    piece_bytes: int | None = None
    spill_dir: str | None = None


def work(path: str, settings: Settings, wire: bool = True) -> Outcome:
    """One rank file's tables; never raises. They travel as Arrow IPC (`to_wire`) unless
    they stay in this process (`wire=False`)."""
    try:
        tables = _tables(path, settings)
        if settings.spill_dir is not None:
            tables = spill(tables, settings.spill_dir)
        return "ok", to_wire(tables) if wire else tables
    except TraceError as exc:
        return "error", exc.problem
    except MemoryError:
        return "error", "out of memory while analysing this file"
    except Exception as exc:  # a bug must not lose the other ranks' report
        return "error", f"internal error while analysing ({type(exc).__name__}: {exc})"


def _tables(path: str, settings: Settings) -> RankTables:
    patterns, piece_bytes = settings.comm_patterns, settings.piece_bytes
    if settings.cache_dir is None:
        return process_file(path, patterns, piece_bytes)
    key = cache.cache_key(path, patterns)
    tables = cache.load(Path(settings.cache_dir), key)
    if tables is None:
        tables = process_file(path, patterns, piece_bytes)
        cache.store(Path(settings.cache_dir), key, tables)
    tables.file = path
    return tables


def unwire(outcome: Outcome) -> Outcome:
    """A worker's outcome with its tables decoded as soon as it arrives (the IPC bytes are
    then dropped: holding every rank's bytes until the end would double the memory)."""
    status, payload = outcome
    return (status, from_wire(payload)) if status == "ok" else outcome


def _take(counter: Any, n: int) -> int | None:
    """The next file index nobody has taken yet, or None when all are taken."""
    with counter.get_lock():
        i = counter.value
        if i >= n:
            return None
        counter.value = i + 1
        return i


def _pull(names: list[str], counter: Any, out: Connection, settings: Settings) -> None:
    """Worker process: take files until none are left, sending each outcome when done."""
    while (i := _take(counter, len(names))) is not None:
        out.send(("start", i, None))
        out.send(("done", i, work(names[i], settings)))
    out.close()


def run_threads(
    names: list[str],
    jobs: int,
    settings: Settings,
    progress: Callable[[int, int], None] | None = None,
) -> list[Outcome]:
    """Every file's outcome, in the order of `names`, using up to `jobs` threads of this
    process."""
    n = len(names)
    results: list[Outcome | None] = [None] * n
    with ThreadPoolExecutor(max_workers=min(jobs, n)) as pool:
        futures = {pool.submit(work, name, settings, False): i for i, name in enumerate(names)}
        for done, future in enumerate(as_completed(futures), 1):
            results[futures[future]] = future.result()
            if progress is not None:
                progress(done, n)
    return [r if r is not None else ("error", DIED) for r in results]


def run_local(
    names: list[str],
    jobs: int,
    settings: Settings,
    progress: Callable[[int, int], None] | None = None,
) -> list[Outcome]:
    """Every file's outcome, in the order of `names`, using up to `jobs` processes."""
    n = len(names)
    results: list[Outcome | None] = [None] * n
    lock = threading.Lock()
    done = 0

    def store(i: int, outcome: Outcome) -> None:
        nonlocal done
        with lock:
            results[i] = outcome
            done += 1
            if progress is not None:
                progress(done, n)

    ctx = get_context("spawn")
    counter = ctx.Value("q", 0)
    procs, conns = [], []
    # With the kernels going to files, this process only merges: its memory is then the
    # merged tables alone, not also the working set of the largest trace.
    merge_only = settings.spill_dir is not None
    for _ in range(min(jobs, n) - (0 if merge_only else 1)):
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_pull, args=(names, counter, send, settings), daemon=True)
        proc.start()
        send.close()
        procs.append(proc)
        conns.append(receive)
    collector = threading.Thread(target=_collect, args=(conns, store), daemon=True)
    collector.start()
    try:
        while not merge_only and (i := _take(counter, n)) is not None:
            store(i, work(names[i], settings, False))
        collector.join()
    finally:
        for proc in procs:
            if proc.is_alive() and collector.is_alive():  # interrupted: stop the workers
                proc.terminate()
            proc.join()
    return [r if r is not None else ("error", DIED) for r in results]


def _collect(conns: list[Connection], store: Callable[[int, Outcome], None]) -> None:
    """Receive the workers' outcomes until every worker has closed its pipe."""
    current: dict[Connection, int | None] = {c: None for c in conns}
    live = list(conns)
    while live:
        for conn in wait(live):
            assert isinstance(conn, Connection)
            try:
                kind, i, outcome = conn.recv()
            except (EOFError, OSError):  # the worker is gone
                live.remove(conn)
                if current[conn] is not None:
                    store(current[conn], ("error", DIED))
                continue
            if kind == "start":
                current[conn] = i
            else:
                current[conn] = None
                store(i, unwire(outcome))
