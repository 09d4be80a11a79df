"""Where a run's time went: `KINETO_COMM_TIMINGS=1` prints each stage's seconds to stderr.

The stages of `report` (imports, per-rank decode and model, merge, cross-rank, each rule,
the model of time, rendering) wrap their work in `stage(name)`; a name with a slash
("per-rank/decode") is a part of the stage before it and is printed indented under it.
A stage run in several threads at once adds up its threads' seconds (a big job's worker
processes keep their parts: only the per-rank stage's own time shows). CPU seconds, beside
the wall time, are the steadier number on a shared machine. The table is printed once,
when the process that imported this module exits (not by worker processes), so users and
bench/ read the same split. Off (the default), `stage` returns one shared do-nothing
context: no clock is read and nothing is kept.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

ENV = "KINETO_COMM_TIMINGS"
ENABLED = os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no")

_OFF: AbstractContextManager[None] = nullcontext()
_started = time.perf_counter()
_started_cpu = time.process_time()
_seconds: dict[str, float] = {}
_cpu: dict[str, float] = {}
_lock = threading.Lock()
_open = threading.local()  # each thread's stages in progress, innermost last
_main_open: list[str] = []


def stage(name: str) -> AbstractContextManager[None]:
    """A context that adds its wall and CPU time to stage `name` (when timings are on)."""
    return _timed(name) if ENABLED else _OFF


def since_start(name: str) -> None:
    """Stage `name` is what ran from this module's import to now (the CLI's own start:
    building the command line and parsing the arguments)."""
    if ENABLED:
        _add(name, time.perf_counter() - _started, time.process_time() - _started_cpu)


def begin(name: str) -> Callable[[], None]:
    """Start stage `name` where a `with` block would indent a long stretch of code; call
    what it returns to end it."""
    if not ENABLED:
        return _nothing
    _add(name, 0.0, 0.0)  # listed where it starts, before the parts it holds
    _opened().append(name)
    start, cpu = time.perf_counter(), _cpu_now()

    def end() -> None:
        _add(name, time.perf_counter() - start, _cpu_now() - cpu)
        _close(name)

    return end


def _nothing() -> None:
    return None


def _opened() -> list[str]:
    if threading.current_thread() is threading.main_thread():
        return _main_open
    if not hasattr(_open, "names"):
        _open.names = []
    return _open.names


def _close(name: str) -> None:
    names = _opened()
    if name in names:
        del names[len(names) - 1 - names[::-1].index(name)]


def current() -> str:
    """The innermost stage in progress in this thread, else in the main thread (a thread
    a stage starts works for it), else ""; for bench/count_collects.py."""
    names = _opened() or _main_open
    return names[-1] if names else ""


def _cpu_now() -> float:
    """CPU seconds: the process's in the main thread (a stage there owns the threads it
    starts), a worker thread's own elsewhere (its part of a stage several threads share)."""
    if threading.current_thread() is threading.main_thread():
        return time.process_time()
    return time.thread_time()


def _add(name: str, seconds: float, cpu: float) -> None:
    with _lock:
        _seconds[name] = _seconds.get(name, 0.0) + seconds
        _cpu[name] = _cpu.get(name, 0.0) + cpu


@contextmanager
def _timed(name: str) -> Iterator[None]:
    _add(name, 0.0, 0.0)  # listed where it starts, before the parts it holds
    _opened().append(name)
    start, cpu = time.perf_counter(), _cpu_now()
    try:
        yield
    finally:
        _add(name, time.perf_counter() - start, _cpu_now() - cpu)
        _close(name)


def table() -> str:
    """The stages so far, in the order first seen, with seconds and share of the wall time
    since this module was imported (which is just after the interpreter and the CLI's own
    imports: the first line says how long the process had run by then)."""
    wall = time.perf_counter() - _started
    cpu = time.process_time() - _started_cpu
    lines = [f"timings ({ENV}): {wall:.3f} s since kineto_comm started ({cpu:.3f} s CPU)"]
    lines.append(f"  {'stage':<34} {'wall':>8}   {'share':>5}  {'CPU':>8}")
    with _lock:
        items = [(name, s, _cpu.get(name, 0.0)) for name, s in _seconds.items()]
    top = sum(s for name, s, _c in items if "/" not in name)
    top_cpu = sum(c for name, _s, c in items if "/" not in name)
    for name, seconds, used in items:
        depth = name.count("/")
        label = "  " * depth + name.rsplit("/", 1)[-1]
        share = 100 * seconds / wall
        lines.append(f"  {label:<34} {seconds:8.3f} s {share:5.1f}% {used:8.3f} s")
    other = f"  {'other (between stages)':<34} {wall - top:8.3f} s {'':6} {cpu - top_cpu:8.3f} s"
    lines.append(other)
    return "\n".join(lines)


def _print_at_exit() -> None:
    import multiprocessing  # here: the module is imported before anything else

    if multiprocessing.parent_process() is None and _seconds:
        print(table(), file=sys.stderr)


if ENABLED:
    atexit.register(_print_at_exit)
