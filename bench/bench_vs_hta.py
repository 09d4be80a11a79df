"""`kineto-comm report` against HTA, whole processes, on every real trace folder (issue 81).

For each folder (sample_traces/*, tests/data/*/*, and a generated 8 x 50 MB job), each round
runs, one after the other: `python -P -m kineto_comm report FOLDER --format json` (the
JSON written to /dev/null) for this tree and, with `--base TREE`, another checkout, then
HTA 0.5's `TraceAnalysis` load + `get_comm_comp_overlap` + `get_temporal_breakdown` with
HTA_DISABLE_NS_ROUNDING=1. Everything is timed as a user waits for it: the whole process,
imports included (modules compiled to .pyc as an install has them). The table gives the
medians of wall and CPU seconds (the process's and its children's) and each tree's ratios
(HTA's time over kineto-comm's: above 1, kineto-comm is faster). The machine is shared:
the rounds alternate the tools so that load falls on all of them alike, and ratios are
the number to read, not seconds; on a loaded machine CPU seconds are the steadier ones.
A folder HTA cannot load is listed with HTA's last error line.

    python3 bench/bench_vs_hta.py --runs 3 --base /tmp/speed_base
    python3 bench/bench_vs_hta.py --runs 3 --only fsdp   # folders whose path holds "fsdp"
    python3 bench/bench_vs_hta.py --no-generated        # the real folders only

Run from the repository root. `--code TREE` times another tree's package as "this" (a
snapshot, so that the working tree can change while the bench runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from golden_reports import _holds_files  # noqa: E402

HTA = """
import sys, logging
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_comm_comp_overlap(visualize=False)
a.get_temporal_breakdown(visualize=False)
"""


def folders(generated: Path | None) -> list[Path]:
    """The real trace folders of the repository (relative paths), then the generated job."""
    found: list[Path] = []
    for pattern in ("sample_traces/*", "tests/data/*/*"):
        found += [p for p in sorted(Path().glob(pattern)) if p.is_dir() and _holds_files(p)]
    return found + ([generated] if generated else [])


def generated_job(ranks: int, size_mb: float) -> Path:
    """The synthetic baseline job under bench/out/ (written once, then reused)."""
    out = Path("bench/out") / f"vs-hta-{ranks}r-{int(size_mb)}mb"
    if not (out / "truth.json").exists():
        subprocess.run(
            [sys.executable, "-m", "kineto_comm", "synth", "baseline", "--ranks", str(ranks)]
            + ["--size-mb", str(size_mb), "--out", str(out)],
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    return out


def timed(argv: list[str], env: dict[str, str]) -> tuple[tuple[float, float] | None, str]:
    """Wall and CPU seconds (its own and its children's) of a whole process, None when it
    failed, and its last stderr line."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    ok = os.waitstatus_to_exitcode(status) in (0, 1)
    return ((wall, usage.ru_utime + usage.ru_stime) if ok else None), (lines[-1] if lines else "")


def mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6


def _env(**extra: str) -> dict[str, str]:
    """The children's environment: as installed, modules compiled once to .pyc (pip does at
    install; a PYTHONDONTWRITEBYTECODE=1 shell would recompile every module of the editable
    package on every run, ~0.35 s CPU that no user pays)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, **extra}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--code", type=Path, default=ROOT, help="tree to time (default: this one)")
    ap.add_argument("--base", type=Path, help="another tree to time too (the commit before)")
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        help="only folders whose path holds this (repeatable)",
    )
    ap.add_argument(
        "--generated-runs", type=int, help="rounds on the 8 x 50 MB job (default: --runs)"
    )
    ap.add_argument("--no-generated", action="store_true", help="skip the 8 x 50 MB job")
    args = ap.parse_args()
    os.chdir(ROOT)
    trees = {"this": args.code.resolve()} | ({"base": args.base.resolve()} if args.base else {})
    job = None if args.no_generated else generated_job(8, 50)
    chosen = [f for f in folders(job) if not args.only or any(o in str(f) for o in args.only)]
    chosen += [job] if job and job not in chosen else []
    for tree in trees.values():  # a first run writes the .pyc files: not timed
        argv = [sys.executable, "-P", "-m", "kineto_comm", "report", "sample_traces/tp-2"]
        timed([*argv, "-f", "json", "-o", os.devnull], _env(PYTHONPATH=str(tree)))
    print(f"medians of {args.runs} rounds, whole processes; ratio = HTA / kineto-comm")
    head = "".join(f" {n + ' wall':>9} {'ratio':>5} {n + ' CPU':>8} {'ratio':>5}" for n in trees)
    print(f"{'folder':<36} {'MB':>6}{head} {'HTA wall':>9} {'HTA CPU':>8}")
    for folder in chosen:
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in [*trees, "HTA"]}
        failed = ""
        runs = args.generated_runs if folder == job and args.generated_runs else args.runs
        for _ in range(runs):
            for name, tree in trees.items():
                argv = [sys.executable, "-P", "-m", "kineto_comm", "report", str(folder)]
                argv += ["--format", "json", "-o", os.devnull, "--exit-zero"]
                got, last = timed(argv, _env(PYTHONPATH=str(tree)))
                if got is None:
                    raise SystemExit(f"{name} failed on {folder}: {last}")
                times[name].append(got)
            if not failed:
                env = _env(HTA_DISABLE_NS_ROUNDING="1")
                got, last = timed([sys.executable, "-c", HTA, str(folder)], env)
                if got is None:
                    failed = last or "failed"
                else:
                    times["HTA"].append(got)
        med = {
            k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
            for k, v in times.items()
            if v
        }
        hta = med.get("HTA")
        cells = ""
        for name in trees:
            wall, cpu = med[name]
            ratios = (hta[0] / wall, hta[1] / cpu) if hta else (float("nan"),) * 2
            cells += f" {wall:9.2f} {ratios[0]:5.2f} {cpu:8.2f} {ratios[1]:5.2f}"
        tail = f" {hta[0]:9.2f} {hta[1]:8.2f}" if hta else f"  HTA cannot: {failed[:70]}"
        print(f"{str(folder):<36} {mb(folder):6.1f}{cells}{tail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
