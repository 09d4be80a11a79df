"""`analyze()` on trace folders with this tree and with another commit's, in the same run.

    python bench/bench_commits.py 6ff1907 sample_traces/pp-4 tests/data/h100-nccl/tp-dp-8

The other commit is checked out (once) as a git worktree under bench/out/trees/, with this
tree's compiled scanner copied in when its sources are the same (else built there). Each
run is a fresh interpreter (a first call, as the CLI makes) importing one tree or the other
through PYTHONPATH; the trees take turns per folder, so a noisy minute hits both. Prints the
median wall and CPU seconds per folder and tree (imports excluded for --decode), and the
ratio. On a shared machine the CPU seconds are the steadier figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent.parent
CHILD = """
import sys, time, resource
from pathlib import Path
if sys.argv[2] == "decode":  # decoding alone: every trace file of the folder, whole
    from kineto_comm.load.decode import decode_file
    files = sorted(p for p in Path(sys.argv[1]).rglob("*") if p.name.endswith((".json", ".gz")))
    before = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    for f in files:
        decode_file(f)
else:
    before = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    from kineto_comm import analyze
    report = analyze(sys.argv[1], jobs=1, ignore=["ALL"])
    assert not report.errors, report.errors[:2]
wall = time.perf_counter() - t
usage = resource.getrusage(resource.RUSAGE_SELF)
print(wall, usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime)
"""


def tree_of(rev: str) -> Path:
    """A worktree of `rev` with this tree's compiled scanner (same _scan.c), or its own
    compiled extensions (built there once where the sources differ)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=HERE, capture_output=True, text=True, check=True
    ).stdout.strip()
    where = HERE / "bench" / "out" / "trees" / sha
    if not where.exists():
        add = ["git", "worktree", "add", "--detach", str(where), sha]
        subprocess.run(add, cwd=HERE, check=True)
    scan = "kineto_comm/load/_scan.c"
    if (where / scan).read_bytes() != (HERE / scan).read_bytes():
        if not list((where / "kineto_comm" / "load").glob("_scan*.so")):
            build = [sys.executable, "setup.py", "build_ext", "--inplace"]
            subprocess.run(build, cwd=where, check=True, capture_output=True)
        return where
    for so in (HERE / "kineto_comm" / "load").glob("_scan*.so"):
        shutil.copy2(so, where / "kineto_comm" / "load" / so.name)
    return where


def run(tree: Path, folder: str, what: str) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(Path(folder).resolve()), what],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        check=False,
    )
    if out.returncode:
        raise SystemExit(f"{tree}: {folder}: {out.stderr.strip().splitlines()[-1]}")
    wall, cpu = map(float, out.stdout.split())
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("rev", help="the commit to compare with (e.g. HEAD~1)")
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument(
        "--decode", action="store_true", help="time decode_file on each file, not analyze()"
    )
    args = ap.parse_args()
    trees = {"this": HERE, args.rev: tree_of(args.rev)}
    print(f"{'folder':40} {'tree':>10} {'wall s':>8} {'cpu s':>8}")
    for folder in args.folders:
        got: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        for _ in range(args.runs):
            for name, tree in trees.items():
                got[name].append(run(tree, folder, "decode" if args.decode else "analyze"))
        walls = {}
        for name, runs in got.items():
            walls[name] = median(w for w, _ in runs)
            print(f"{folder:40} {name:>10} {walls[name]:8.3f} {median(c for _, c in runs):8.3f}")
        print(f"{folder:40} {'ratio':>10} {walls['this'] / walls[args.rev]:8.3f}")


if __name__ == "__main__":
    main()
