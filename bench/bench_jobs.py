"""`analyze()` on one job under several settings, each in fresh processes, alternated.

    python bench/bench_jobs.py bench/out/scale-dp-64r-10mb 16:threads 16:processes 4:threads
    python bench/bench_jobs.py FOLDER 16:threads:4    # with POLARS_MAX_THREADS=4
    python bench/bench_jobs.py FOLDER 2:threads::0,1  # pinned to cores 0 and 1 (taskset)

A setting is JOBS:MODE[:POLARS_MAX_THREADS[:CPUS]]. MODE `threads` or `processes` sets
budget.THREADS_BELOW so that the job runs in threads of the parent or in worker processes
whatever its size; `auto` leaves the budget's choice. Each run is a new interpreter (a
first call, as the CLI makes), the settings take turns, and the median wall time is
printed with the parent's peak RSS (the workers' own excluded) and the parent's CPU time
(imports included). Used to choose the threads/processes threshold and to see what
`--jobs` does on a many-core machine (bench/README.md, thirty-fifth session).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from statistics import median

CHILD = """
import sys, time, resource
import kineto_comm.budget as budget
mode = sys.argv[3]
if mode != "auto":
    budget.THREADS_BELOW = 1 << 62 if mode == "threads" else -1
from kineto_comm import analyze
t = time.perf_counter()
report = analyze(sys.argv[1], jobs=int(sys.argv[2]))
wall = time.perf_counter() - t
assert not report.errors, report.errors[:2]
usage = resource.getrusage(resource.RUSAGE_SELF)
print(wall, usage.ru_maxrss / 2**20, usage.ru_utime + usage.ru_stime)
"""


def run(folder: str, setting: str) -> tuple[float, float, float]:
    jobs, mode, threads, cpus = (setting.split(":") + ["", ""])[:4]
    env = dict(os.environ)
    if threads:
        env["POLARS_MAX_THREADS"] = threads
    cmd = [sys.executable, "-c", CHILD, folder, jobs, mode]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise SystemExit(f"{setting}: {out.stderr.strip().splitlines()[-1]}")
    wall, peak, cpu = map(float, out.stdout.split())
    return wall, peak, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("settings", nargs="+", help="JOBS:MODE[:POLARS_MAX_THREADS[:CPUS]]")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    got: dict[str, list[tuple[float, float, float]]] = {s: [] for s in args.settings}
    for i in range(args.runs):
        for s in args.settings if i % 2 == 0 else args.settings[::-1]:
            got[s].append(run(args.folder, s))
    name = os.path.basename(os.path.normpath(args.folder))
    for s, runs in got.items():
        walls = [w for w, _, _ in runs]
        print(
            f"{name} {s}: wall median {median(walls):.3f} s"
            f" (all {', '.join(f'{w:.3f}' for w in walls)}),"
            f" parent peak {max(p for _, p, _ in runs):.2f} GiB,"
            f" parent CPU {median(c for _, _, c in runs):.2f} s"
        )


if __name__ == "__main__":
    main()
