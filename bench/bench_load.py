"""Time kineto-comm's analyze() against HTA's TraceAnalysis load on the same trace files.

Each tool runs in its own child process so that its peak RSS is measured alone (wait4's
ru_maxrss). Throughput is MB of uncompressed JSON per second of wall time.

    python bench/bench_load.py --size-mb 150            # generate a 1-rank job, compare
    python bench/bench_load.py --dir path/to/traces     # existing files
    python bench/bench_load.py --size-mb 150 --no-hta   # kineto-comm only

Generated files are kept under bench/out/ (git-ignored) and reused.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# This checkout's package, for generating traces here (the timed children run in REPO).
sys.path.insert(0, str(REPO))

KINETO = """
import sys, time
from kineto_comm import analyze
t = time.perf_counter()
r = analyze(sys.argv[1:], jobs=int(__import__('os').environ.get('BENCH_JOBS', '1')))
dt = time.perf_counter() - t
assert not r.errors, r.errors
print(dt, r.kernels.height, r.collectives.height)
"""

# The floor the issue names: msgspec decoding the whole file into the same typed Structs
# (no columns, no analysis), measured in the same run so that the VM's mood is shared.
FLOOR = """
import gzip, sys, time
from kineto_comm.load.events import _TOP
best = 0.0
for path in sys.argv[1:]:
    data = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        top = _TOP.decode(data)
        runs.append(time.perf_counter() - t)
        del top
    best += min(runs)
print(best)
"""

HTA = """
import sys, time, logging
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
dt = time.perf_counter() - t
a.get_comm_comp_overlap(visualize=False)
print(dt, time.perf_counter() - t)
"""


def uncompressed_bytes(path: Path) -> int:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            return sum(len(b) for b in iter(lambda: fh.read(1 << 24), b""))
    return path.stat().st_size


def run_child(
    code: str, args: list[str], env: dict[str, str] | None = None
) -> tuple[str, float, float]:
    """Run python -c code args; return (stdout, wall seconds, peak RSS in GB)."""
    # Output goes to files, not pipes: a child that writes more than a pipe holds (HTA logs
    # a line per rank file) would block on a full pipe while this waits for it to end.
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        t = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=out_file,
            stderr=err_file,
            env={**os.environ, **(env or {})},
            cwd=REPO,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        out_file.seek(0)
        err_file.seek(0)
        out = out_file.read().decode(errors="replace")
        err = err_file.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child failed: {err[-2000:]}")
    return out.strip(), wall, usage.ru_maxrss / 1024 / 1024  # KiB -> GiB


def generate(size_mb: float, ranks: int) -> Path:
    out = HERE / "out" / f"baseline-dp-{ranks}r-{int(size_mb)}mb"
    if not (out / "truth.json").exists():
        from kineto_comm.synth import generate as synth

        synth("baseline", out, ranks=ranks, layout="dp", size_mb=size_mb, seed=0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=150.0, help="MB per rank file to generate")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--dir", type=Path, help="use the trace files in this directory instead")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--jobs", type=int, default=1, help="kineto-comm worker processes")
    ap.add_argument("--repeat", type=int, default=3, help="kineto-comm runs (best is kept)")
    args = ap.parse_args()

    folder = args.dir or generate(args.size_mb, max(args.ranks, 2))
    files = sorted(
        p
        for p in folder.iterdir()
        if p.name.endswith((".json", ".json.gz")) and p.name != "truth.json"
    )
    if not args.dir:
        files = files[: args.ranks]
    total = sum(uncompressed_bytes(f) for f in files) / 1e6
    print(
        f"files: {len(files)} in {folder}, {total:,.0f} MB uncompressed; "
        f"cpus: {os.cpu_count()}; python {sys.version.split()[0]}"
    )

    runs = []
    for _ in range(args.repeat):
        out, wall, rss = run_child(KINETO, [str(f) for f in files], {"BENCH_JOBS": str(args.jobs)})
        runs.append((float(out.split()[0]), wall, rss))
    inner, wall, rss = min(runs)
    print(
        f"kineto-comm analyze(): {inner:6.2f} s  ({total / inner:6.1f} MB/s)  "
        f"process wall {wall:.2f} s  peak RSS {rss:.2f} GiB ({rss * 1073.7 / total:.2f}x input)"
    )

    out, _, _ = run_child(FLOOR, [str(f) for f in files])
    floor = float(out)
    print(
        f"msgspec typed decode alone (the floor): {floor:6.2f} s ({total / floor:6.1f} MB/s); "
        f"kineto-comm takes {inner / floor:.2f}x the floor"
    )

    if not args.no_hta:
        with tempfile.TemporaryDirectory() as tmp:
            for f in files:  # HTA reads every json in a folder: give it only the traces
                shutil.copy(f, Path(tmp) / f.name)
            out, hwall, hrss = run_child(HTA, [tmp])
        load, with_overlap = map(float, out.split())
        print(
            f"HTA TraceAnalysis load: {load:6.2f} s  ({total / load:6.1f} MB/s)  "
            f"+overlap {with_overlap:.2f} s  peak RSS {hrss:.2f} GiB"
        )
        print(f"ratio (HTA load / kineto-comm analyze): {load / inner:.1f}x")
    print(
        json.dumps(
            {"mb": round(total, 1), "kineto_s": round(inner, 3), "kineto_rss_gib": round(rss, 3)}
        )
    )


if __name__ == "__main__":
    main()
