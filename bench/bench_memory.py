"""Where the parent's memory goes: peak RSS of `analyze()` per stage, on an existing job.

    python bench/bench_memory.py bench/out/scale-dp-64r-250mb   # made by bench_scale.py

RSS is sampled every 5 ms in this process (the parent: worker processes are not counted, as in
bench_scale.py) and charged to the stage running at the time: the per-rank work (`_run`), the
merge (`_contiguous`) and each step of the cross-rank analysis. A stage's figure is the highest
RSS seen while it ran, so the biggest step up between consecutive lines is where the peak is
made. Polars' allocator keeps freed memory for a while, so a step's figure also holds what the
steps before it freed and it has not reused: compare runs, not single lines.
"""

from __future__ import annotations

import argparse
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kineto_comm  # noqa: E402,F401  (the package, so that its analyze module is importable)
from kineto_comm.analysis import crossrank  # noqa: E402

ANALYZE = sys.modules["kineto_comm.analyze"]
# The cross-rank steps: the analysis functions cross_rank() calls by name.
STEPS = [
    name
    for name, value in vars(crossrank).items()
    if callable(value)
    and getattr(value, "__module__", "").startswith("kineto_comm.analysis.")
    and name != "cross_rank"
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("folder", help="a job's trace folder")
    args = ap.parse_args()

    current = ["start"]
    peak: dict[str, int] = {}
    order: list[str] = []
    process = psutil.Process()

    def sample() -> None:
        while True:
            stage = current[0]
            if stage not in peak:
                order.append(stage)
            peak[stage] = max(peak.get(stage, 0), process.memory_info().rss)
            time.sleep(0.005)

    def timed(module: Any, name: str) -> None:
        inner = getattr(module, name)

        def run(*a: Any, **k: Any) -> Any:
            current[0] = name
            try:
                return inner(*a, **k)
            finally:
                current[0] = f"after {name}"

        setattr(module, name, run)

    for name in ("_run", "_contiguous", "cross_rank"):
        timed(ANALYZE, name)
    for name in STEPS:
        timed(crossrank, name)
    threading.Thread(target=sample, daemon=True).start()
    time.sleep(0.02)
    start = time.perf_counter()
    report = ANALYZE.analyze(args.folder)
    wall = time.perf_counter() - start
    current[0] = "done"
    time.sleep(0.05)
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{report.ranks.height} ranks in {wall:.1f} s; parent peak RSS {maxrss:.0f} MiB")
    for stage in order:
        print(f"  {stage:24s} {peak[stage] / 2**20:8.1f} MiB")


if __name__ == "__main__":
    main()
