"""The first second (issue 81): `--help`, `--version`, `rules`, `explain` as whole processes.

Each command runs in a fresh process, every tree's and the bare `python -c "import typer,
rich"` alternated in each round, so that the machine's load falls on all alike; the table
gives the medians of wall and CPU (user + system) seconds and each one's ratio to the bare
import (the goal: at most 2x). CPU seconds are the steadier number on a shared machine.

    python3 bench/bench_startup.py --runs 9 --base /tmp/speed_base

`--base TREE`: a checkout (with its built extensions) to compare with, e.g. the commit
before; the package is run with `python -P` and PYTHONPATH=TREE, so the working
directory's copy never wins. Run from the repository root.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = (("--help",), ("--version",), ("report", "--help"), ("rules",), ("explain", "COMM101"))
BARE = ("-c", "import typer, rich")
# What Typer itself loads to print help (rich.markdown, markdown_it, pygments): the floor of
# any `--help` drawn by Typer's rich help.
HELP_FLOOR = ("-c", "import typer, rich, typer.rich_utils")


def _once(args: tuple[str, ...], tree: Path | None) -> tuple[float, float]:
    """Wall and CPU seconds of one process."""
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree else dict(os.environ)
    argv = [sys.executable, "-P", *(args if tree is None else ("-m", "kineto_comm", *args))]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--base", type=Path, help="another tree to compare with (the commit before)")
    args = ap.parse_args()
    trees = {"this": ROOT} | ({"base": args.base.resolve()} if args.base else {})
    cases = [("bare", BARE, None), ("bare", HELP_FLOOR, None)] + [
        (name, cmd, tree) for cmd in COMMANDS for name, tree in trees.items()
    ]
    times: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(cases))}
    for _ in range(args.runs):
        for i, (_name, cmd, tree) in enumerate(cases):
            times[i].append(_once(cmd, tree))
    med = {i: tuple(statistics.median(x[k] for x in t) for k in (0, 1)) for i, t in times.items()}
    bare_wall, bare_cpu = med[0]
    print(f"medians of {args.runs} alternated runs; ratio = to `python -c 'import typer, rich'`")
    print(f"{'command':<36} {'tree':<5} {'wall s':>7} {'ratio':>6} {'cpu s':>7} {'ratio':>6}")
    for i, (name, cmd, _tree) in enumerate(cases):
        wall, cpu = med[i]
        label = cmd[1].removeprefix("import ") if name == "bare" else " ".join(cmd)
        print(
            f"{label:<36} {name:<5} {wall:7.3f} {wall / bare_wall:6.2f} {cpu:7.3f}"
            f" {cpu / bare_cpu:6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
