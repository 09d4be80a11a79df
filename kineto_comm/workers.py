"""Per-rank work on local processes: this process and `jobs - 1` spawned workers pull
batches of rank files (budget.batches) from one shared counter, so whoever is free takes the
next batch. Small jobs (budget.THREADS_BELOW) use threads of this process instead
(`run_threads`): a worker process takes longer to start than such a job takes, while the
compiled scanner and Polars run without the GIL, so threads overlap much of the work (two
threads ran 8 x 10 MB rank files 1.4x faster than one in the seventh session, 1.9x in the
eighth: bench/README.md).

Why this process works too: starting a worker costs ~0.7 s here (a fresh interpreter that
imports Polars), and files analysed in this process need no Arrow IPC round trip. On big
jobs (kernels kept in files, budget.SPILL_ABOVE) it does not: the start-up is then
negligible, and the parent's memory stays the merged tables, without a trace's working set.

Why a shared counter and not tasks handed out up front: a worker still starting up would
sit on files this process could already be working on (a small job is done before a worker
is up). A worker that dies (killed, out of memory) costs only the batch it was on, reported
as an error for each of its files.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import current_process, get_context
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from kineto_comm import cache
from kineto_comm.errors import TraceError, one_line
from kineto_comm.load.decode import RawTrace, decode_files
from kineto_comm.per_rank import RankTables, from_wire, process_file, spill, tabulate, to_wire
from kineto_comm.timings import stage

Outcome = tuple[str, Any]  # ('ok', RankTables) or ('error', message)
DIED = "the worker process analysing this file stopped unexpectedly (out of memory?)"


@dataclass(frozen=True)
class Settings:
    """What analysing a rank file needs besides its path (picklable: workers get it).

    comm_patterns: extra communication kernel patterns; cache_dir: the per-rank table cache;
    piece_bytes: decode piece size (kineto_comm.budget); spill_dir: where kernels go to
    files (kineto_comm.rank_store), None to keep them with the other tables.
    """

    comm_patterns: tuple[str, ...] = ()
    cache_dir: str | None = None
    piece_bytes: int | None = None
    spill_dir: str | None = None


def work(paths: list[str], settings: Settings) -> list[Outcome]:
    """The tables of a batch of rank files (see budget.batches), one outcome per file; never
    raises. The files are decoded together (decode_files) and modelled together
    (per_rank.tabulate); a file that fails costs only itself."""
    found: dict[int, RankTables] = {}
    keys: dict[int, str] = {}
    decoded: dict[int, RawTrace] = {}
    outcomes: dict[int, Outcome] = {}
    todo: list[int] = []
    for i, path in enumerate(paths):
        try:
            if settings.cache_dir is not None:
                keys[i] = cache.cache_key(path, settings.comm_patterns)
                hit = cache.load(Path(settings.cache_dir), keys[i])
                if hit is not None:
                    hit.file = path
                    found[i] = hit
                    continue
            todo.append(i)
        except Exception as exc:
            outcomes[i] = _failed(exc)
    with stage("per-rank/decode"):
        got = decode_files([paths[i] for i in todo], settings.piece_bytes)
    for i, raw in zip(todo, got, strict=True):
        if isinstance(raw, Exception):
            outcomes[i] = _failed(raw)
        else:
            decoded[i] = raw
    del got
    parsed = set(decoded)
    with stage("per-rank/model"):
        found.update(_modelled(decoded, paths, settings, outcomes))
    for i, tables in found.items():
        try:
            if settings.cache_dir is not None and i in parsed:
                cache.store(Path(settings.cache_dir), keys[i], tables)
            if settings.spill_dir is not None:
                tables = spill(tables, settings.spill_dir)
            outcomes[i] = "ok", tables
        except Exception as exc:
            outcomes[i] = _failed(exc)
    return [outcomes[i] for i in range(len(paths))]


def _modelled(
    decoded: dict[int, RawTrace], paths: list[str], settings: Settings, outcomes: dict[int, Outcome]
) -> dict[int, RankTables]:
    """The decoded files modelled together (`decoded` is emptied: tabulate frees the event
    tables as it goes). Should that fail, each file is analysed again on its own, so that a
    file that breaks the model costs only itself (its outcome goes to `outcomes`)."""
    order = list(decoded)
    raws = [decoded.pop(i) for i in order]
    try:
        return dict(zip(order, tabulate(raws, settings.comm_patterns), strict=True))
    except Exception as exc:
        if len(order) == 1:
            outcomes[order[0]] = _failed(exc)
            return {}
    done = {}
    for i in order:
        try:
            done[i] = process_file(paths[i], settings.comm_patterns, settings.piece_bytes)
        except Exception as exc:
            outcomes[i] = _failed(exc)
    return done


def _failed(exc: Exception) -> Outcome:
    """The outcome of a file whose analysis raised `exc`."""
    if isinstance(exc, TraceError):
        return "error", exc.problem
    if isinstance(exc, MemoryError):
        return "error", "out of memory while analysing this file"
    # A bug must not lose the other ranks' report.
    return "error", one_line(f"internal error while analysing ({type(exc).__name__}: {exc})")


Packed = tuple[list[str | None], dict[str, Any]]


def work_packed(paths: list[str], settings: Settings) -> Packed:
    """work() in the form that travels between processes: per file its problem (None when
    it was analysed), and the analysed files' tables as Arrow IPC (per_rank.to_wire)."""
    outcomes = work(paths, settings)
    problems = [None if status == "ok" else payload for status, payload in outcomes]
    return problems, to_wire([payload for status, payload in outcomes if status == "ok"])


def unpack(packed: Packed) -> list[Outcome]:
    """A batch's outcomes from `work_packed`, decoded as soon as they arrive (the IPC bytes
    are then dropped: holding every batch's bytes until the end would double the memory)."""
    problems, wire = packed
    tables = iter(from_wire(wire))
    return [("ok", next(tables)) if p is None else ("error", p) for p in problems]


Batches = list[list[int]]  # indices into the file names: the files analysed together


def _take(counter: Any, n: int) -> int | None:
    """The next batch nobody has taken yet, or None when all are taken."""
    with counter.get_lock():
        i = counter.value
        if i >= n:
            return None
        counter.value = i + 1
        return i


def _paths(names: list[str], batch: list[int]) -> list[str]:
    return [names[i] for i in batch]


def _pull(
    names: list[str], batches: Batches, counter: Any, out: Connection, settings: Settings
) -> None:
    """Worker process: take batches until none are left, sending each one's outcomes when
    done."""
    while (b := _take(counter, len(batches))) is not None:
        out.send(("start", b, None))
        out.send(("done", b, work_packed(_paths(names, batches[b]), settings)))
    out.close()


class _Results:
    """Outcomes per file as batches finish, with progress counted in files."""

    def __init__(
        self, names: list[str], batches: Batches, progress: Callable[[int, int], None] | None
    ) -> None:
        self.batches = batches
        self.outcomes: list[Outcome | None] = [None] * len(names)
        self.progress = progress
        self.done = 0
        self.lock = threading.Lock()

    def store(self, b: int, outcomes: list[Outcome]) -> None:
        with self.lock:
            for i, outcome in zip(self.batches[b], outcomes, strict=True):
                self.outcomes[i] = outcome
            self.done += len(outcomes)
            if self.progress is not None:
                self.progress(self.done, len(self.outcomes))

    def died(self, b: int) -> None:
        self.store(b, [("error", DIED)] * len(self.batches[b]))

    def all(self) -> list[Outcome]:
        return [r if r is not None else ("error", DIED) for r in self.outcomes]


def run_here(
    names: list[str],
    batches: Batches,
    settings: Settings,
    progress: Callable[[int, int], None] | None = None,
) -> list[Outcome]:
    """Every file's outcome, in the order of `names`, one batch after the other in this
    thread."""
    results = _Results(names, batches, progress)
    for b, batch in enumerate(batches):
        results.store(b, work(_paths(names, batch), settings))
    return results.all()


def run_threads(
    names: list[str],
    batches: Batches,
    jobs: int,
    settings: Settings,
    progress: Callable[[int, int], None] | None = None,
) -> list[Outcome]:
    """Every file's outcome, in the order of `names`, using up to `jobs` threads of this
    process."""
    results = _Results(names, batches, progress)
    with ThreadPoolExecutor(max_workers=min(jobs, len(batches))) as pool:
        futures = {
            pool.submit(work, _paths(names, batch), settings): b for b, batch in enumerate(batches)
        }
        for future in as_completed(futures):
            results.store(futures[future], future.result())
    return results.all()


def run_local(
    names: list[str],
    batches: Batches,
    jobs: int,
    settings: Settings,
    progress: Callable[[int, int], None] | None = None,
) -> list[Outcome]:
    """Every file's outcome, in the order of `names`, using up to `jobs` processes.

    Batches that no worker took (the workers could not start: e.g. a script that calls
    analyze() without an `if __name__ == "__main__":` guard, whose workers fail on
    re-importing it) are analysed in this process once the workers are gone, rather than
    lost."""
    if getattr(current_process(), "_inheriting", False):
        # This is a worker starting up, re-importing a script that runs analyze() at its
        # top level: it cannot start workers of its own. It stops with one line, and the
        # process that started it analyses the files.
        raise SystemExit(
            "kineto-comm: a worker process stopped while starting: the script calls"
            ' analyze() outside `if __name__ == "__main__":`, so the main process analyses'
            " the files alone"
        )
    n = len(batches)
    results = _Results(names, batches, progress)
    ctx = get_context("spawn")
    counter = ctx.Value("q", 0)
    procs, conns = [], []
    # With the kernels going to files, this process only merges: its memory is then the
    # merged tables alone, not also the working set of the largest trace.
    merge_only = settings.spill_dir is not None
    for _ in range(min(jobs, n) - (0 if merge_only else 1)):
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_pull, args=(names, batches, counter, send, settings), daemon=True
        )
        proc.start()
        send.close()
        procs.append(proc)
        conns.append(receive)
    collector = threading.Thread(target=_collect, args=(conns, results), daemon=True)
    collector.start()

    def pull_here() -> None:
        while (b := _take(counter, n)) is not None:
            results.store(b, work(_paths(names, batches[b]), settings))

    try:
        if not merge_only:
            pull_here()
        collector.join()
        pull_here()  # batches left by workers that never ran
    finally:
        for proc in procs:
            if proc.is_alive() and collector.is_alive():  # interrupted: stop the workers
                proc.terminate()
            proc.join()
    return results.all()


def _collect(conns: list[Connection], results: _Results) -> None:
    """Receive the workers' outcomes until every worker has closed its pipe."""
    current: dict[Connection, int | None] = {c: None for c in conns}
    live = list(conns)
    while live:
        for conn in wait(live):
            assert isinstance(conn, Connection)
            try:
                kind, b, packed = conn.recv()
            except (EOFError, OSError):  # the worker is gone
                live.remove(conn)
                if current[conn] is not None:
                    results.died(current[conn])
                continue
            if kind == "start":
                current[conn] = b
            else:
                current[conn] = None
                results.store(b, unpack(packed))
