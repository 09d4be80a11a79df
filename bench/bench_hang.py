"""Time the hang analysis of a big job's Flight Recorder dumps (issue 80: 1,000 ranks x
2,000 entries in at most 10 s), with this tree and, given --rev, another commit's, in the
same run.

Generated dumps (kineto_comm.synth.flight, a GPU stop on one rank) are written once as
pickles to bench/out/hang-RANKSxENTRIES/ (kept for later runs). Each run is a fresh
interpreter importing one tree or the other through PYTHONPATH (the other commit is checked
out once as a worktree, as bench_commits.py does); the trees take turns. Reading (safe
unpickling and the per-rank tables), the job's tables and the analysis are timed apart, in
wall and CPU seconds (the CPU of decoding workers included); medians are printed.

    python3 bench/bench_hang.py [--ranks 1000] [--entries 2000] [--rev HEAD~1] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))

CHILD = """
import inspect, json, resource, sys, time
from kineto_comm.analysis.hang import analyse, tables_of
from kineto_comm.load.flight import read_dumps

def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

folder, jobs = sys.argv[1], int(sys.argv[2])
kw = {"jobs": jobs} if "jobs" in inspect.signature(read_dumps).parameters else {}
marks = [(time.perf_counter(), cpu())]
dumps, errors, _ = read_dumps([folder], **kw)
marks.append((time.perf_counter(), cpu()))
tables = tables_of(dumps)
marks.append((time.perf_counter(), cpu()))
result = analyse(tables)
marks.append((time.perf_counter(), cpu()))
steps = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])]
print(json.dumps({"steps": steps, "roots": result.roots["rank"].to_list(),
                  "entries": tables.entries.height, "errors": len(errors)}))
"""
PHASES = ("read", "tables", "analysis")


def dumps_folder(ranks: int, entries: int) -> tuple[Path, dict]:
    """The generated dumps (written once) and their truth."""
    from kineto_comm.synth.flight import iter_dumps, truth_of

    where = HERE / "bench" / "out" / f"hang-{ranks}x{entries}"
    faulty = ranks // 3
    truth = truth_of(ranks, "gpu", faulty, "2.9")
    if not (where / "truth.json").is_file():
        where.mkdir(parents=True, exist_ok=True)
        for r, d in iter_dumps(ranks, "gpu", faulty, entries_per_rank=entries):
            (where / f"_dump_{r}").write_bytes(pickle.dumps(d))
        (where / "truth.json").write_text(json.dumps(truth))
    return where, truth


def run(tree: Path, folder: Path, jobs: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), str(jobs)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        check=False,
    )
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=1000)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--rev", help="another commit to time in the same run (e.g. HEAD~1)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    folder, truth = dumps_folder(args.ranks, args.entries)
    trees = {"this": HERE}
    if args.rev:
        from bench_commits import tree_of

        trees[args.rev] = tree_of(args.rev)
    got: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, tree in trees.items():
            got[name].append(run(tree, folder, args.jobs))
    print(
        f"{args.ranks} ranks x {args.entries} entries, jobs={args.jobs}, {args.runs} runs;"
        f" truth: roots {truth['roots']}"
    )
    print(f"{'tree':>10} " + " ".join(f"{p + ' wall/cpu s':>22}" for p in PHASES) + "   total")
    for name, runs in got.items():
        cells = []
        for i in range(len(PHASES)):
            wall = median(r["steps"][i][0] for r in runs)
            cpu = median(r["steps"][i][1] for r in runs)
            cells.append(f"{wall:10.2f} / {cpu:9.2f}")
        total = median(sum(s[0] for s in r["steps"]) for r in runs)
        last = runs[-1]
        print(
            f"{name:>10} " + " ".join(f"{c:>22}" for c in cells) + f"   {total:5.2f}"
            f"   roots {last['roots']}, {last['entries']} entries, {last['errors']} errors"
        )


if __name__ == "__main__":
    main()
