"""Calls of Polars' query engine in one `report` run, by stage (issue 81).

Every DataFrame operation Polars runs eagerly is a lazy query collected at once, so the
calls of its engine's `collect` (polars/lazyframe/engine.py, as the issue's cProfile
counted them) are the queries a run plans and runs: explicit lazy collects, and eager
operations one at a time; a `collect_all` of several plans is one call. Each call is put
in the stage of kineto_comm.timings in progress (the innermost), and called eager when it
comes from Polars' own eager path (`_collect_eager`), else explicit. Per-rank work runs in
threads here (a small job), so its calls are counted too; a big job's worker processes are
not.

    python3 bench/count_collects.py sample_traces/ddp-4 tests/data/h100-nccl/fsdp-4
    python3 bench/count_collects.py --sites 30 sample_traces/ddp-4   # + the busiest call sites

Run from the repository root with PYTHONPATH set to the tree to measure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections import Counter
from pathlib import Path
from types import FrameType

os.environ["KINETO_COMM_TIMINGS"] = "1"  # stages tracked; read when kineto_comm loads

import polars as pl  # noqa: E402
from polars.lazyframe import engine  # noqa: E402


def _site(frame: FrameType | None, polars_dir: str) -> str:
    """The first caller outside Polars: `file:line function` (where the query was asked)."""
    while frame is not None and frame.f_code.co_filename.startswith(polars_dir):
        frame = frame.f_back
    if frame is None:
        return "?"
    name = frame.f_code.co_filename.rsplit("kineto_comm", 1)[-1].lstrip("/_")
    return f"{name}:{frame.f_lineno} {frame.f_code.co_name}"


def count(
    folder: Path, sites: Counter[tuple[str, str]] | None = None
) -> tuple[Counter[str], Counter[str]]:
    """(calls by stage, explicit calls by stage) of `report FOLDER --format json`; `sites`,
    when given, counts calls by (stage, call site)."""
    from kineto_comm import timings
    from kineto_comm.cli import main

    calls: Counter[str] = Counter()
    explicit: Counter[str] = Counter()
    original = engine._LocalEngine.collect
    polars_dir = str(Path(pl.__file__).parent)

    def counted(self, lf, **kwargs):  # type: ignore[no-untyped-def]
        where = timings.current() or "(no stage)"
        calls[where] += 1
        frame, eager = sys._getframe(1), False
        while frame is not None and frame.f_code.co_filename.startswith(polars_dir):
            eager = eager or frame.f_code.co_name == "_collect_eager"
            frame = frame.f_back
        explicit[where] += not eager
        if sites is not None:
            sites[where, _site(sys._getframe(1), polars_dir)] += 1
        return original(self, lf, **kwargs)

    def counted_all(self, lfs, **kwargs):  # type: ignore[no-untyped-def]
        where = timings.current() or "(no stage)"
        calls[where] += 1  # several plans, one call of the engine
        explicit[where] += 1
        if sites is not None:
            sites[where, _site(sys._getframe(1), polars_dir)] += 1
        return original_all(self, lfs, **kwargs)

    original_all = engine._LocalEngine.collect_all
    engine._LocalEngine.collect = counted  # type: ignore[method-assign]
    engine._LocalEngine.collect_all = counted_all  # type: ignore[method-assign]
    timings._seconds.clear()
    argv = sys.argv
    sys.argv = ["kineto-comm", "report", str(folder), "--format", "json", "--exit-zero"]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main()
    finally:
        sys.argv = argv
        engine._LocalEngine.collect = original  # type: ignore[method-assign]
        engine._LocalEngine.collect_all = original_all  # type: ignore[method-assign]
    return calls, explicit


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", type=Path, nargs="+")
    ap.add_argument("--sites", type=int, default=0, metavar="N", help="the N busiest call sites")
    args = ap.parse_args()
    for folder in args.folders:
        sites: Counter[tuple[str, str]] = Counter()
        calls, explicit = count(folder, sites if args.sites else None)
        print(f"{folder}: {sum(calls.values())} calls ({sum(explicit.values())} explicit)")
        # Stages in the order they ran; a stage's line counts its own calls, not its parts'.
        from kineto_comm import timings

        for name in [*timings._seconds, "(no stage)"]:
            if calls[name]:
                label = "  " * name.count("/") + name
                print(f"  {label:<28} {calls[name]:5d} ({explicit[name]} explicit)")
        rules = [name for name in calls if name.startswith("rules")]
        n, e = sum(calls[r] for r in rules), sum(explicit[r] for r in rules)
        print(f"  {'rules, all':<28} {n:5d} ({e} explicit)")
        for (stage, site), k in sites.most_common(args.sites):
            print(f"  {k:5d}  {stage:<16} {site}")
        timings._seconds.clear()  # no timings table at exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
