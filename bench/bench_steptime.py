"""What the model of time (issue 51: blame of every step, replays of every finding's fix and
of all of them together) adds to `kineto-comm report`'s wall time, against another tree (the
previous commit) in the same run.

    python3 bench/bench_steptime.py BASE_TREE [--ranks 64 --size-mb 10 --runs 3]

BASE_TREE is a checkout of the commit to compare with (e.g. `git worktree add /tmp/base
fb63403`, with the compiled scanner copied into its kineto_comm/load/). Each run is a fresh
child process per tree, alternated, timing what `report` does: analyze() with every rule,
then the text report. The child also times the model of time alone (step_model on the
analysed Report, its blame built afresh) where the tree has it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scale import job  # noqa: E402

CHILD = """
import sys, time, os
t = time.perf_counter()
from kineto_comm import analyze
from kineto_comm.render.formats import render
r = analyze(sys.argv[1], jobs=int(os.environ['BENCH_JOBS']))
render(r, 'text')
total = time.perf_counter() - t
model = -1.0
try:
    from kineto_comm.rules_engine import step_model
    from kineto_comm.rules_api import Tables
    t = time.perf_counter()
    step_model(Tables(r), r.findings)
    model = time.perf_counter() - t
except ImportError:
    pass
print(total, model, len(r.findings))
"""


def run(tree: Path, folder: Path, jobs: int) -> tuple[float, float, int]:
    """One child on `tree`: report's seconds, the model of time's seconds, findings."""
    env = {**os.environ, "PYTHONPATH": str(tree), "BENCH_JOBS": str(jobs)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("base", type=Path, help="checkout of the commit to compare with")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--size-mb", type=float, default=10.0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--folder", type=Path, help="traces to run on (no job is generated)")
    args = ap.parse_args()
    folder = args.folder or job(args.ranks, args.size_mb)
    this = HERE.parent
    base_t, this_t, model_t, base_m = [], [], [], []
    for i in range(args.runs):
        b = run(args.base, folder, args.jobs)
        n = run(this, folder, args.jobs)
        base_t.append(b[0])
        this_t.append(n[0])
        model_t.append(n[1])
        base_m.append(b[1])
        print(
            f"run {i + 1}: base {b[0]:.2f} s ({b[2]} findings; model of time alone "
            f"{b[1]:.2f} s), this {n[0]:.2f} s ({n[2]} findings; model of time alone "
            f"{n[1]:.2f} s)",
            flush=True,
        )
    mb, mt = median(base_t), median(this_t)
    print(
        f"median of {args.runs}: base {mb:.2f} s, this {mt:.2f} s ({(mt / mb - 1):+.1%}); "
        f"the model of time alone: base {median(base_m):.2f} s, this {median(model_t):.2f} s "
        f"({median(model_t) / mt:.1%} of report)"
    )


if __name__ == "__main__":
    main()
