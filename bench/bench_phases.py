"""Where the time of one `analyze()` call goes: a timeline of its phases, per thread.

    python bench/bench_phases.py bench/out/scale-dp-8r-10mb            # 5 fresh processes
    python bench/bench_phases.py bench/out/scale-dp-8r-10mb --runs 9 --jobs 1

Each run is a fresh process (a first call pays for fresh memory, as a user's does) that
wraps the main steps of the per-rank work and of the cross-rank analysis with timers, calls
`analyze()` once, and reports each step's start and end per thread. Printed: per step the
median over the runs of its summed time and of its first start / last end relative to the
call, the call's wall and CPU time, and its page faults. The wrappers cost ~1 us per call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

CHILD = r"""
import json, os, resource, sys, threading, time
import importlib

STEPS = [
    ("kineto_comm.load.decode", "_read_blocks", "read"),
    ("kineto_comm.load.decode", "_scan_piece", "scan"),
    ("kineto_comm.load.decode", "_settle", "settle"),
    ("kineto_comm.load.decode", "_scanned_batch", "batch"),
    ("kineto_comm.load.decode", "_assemble", "assemble"),
    ("kineto_comm.load.decode", "_join_launches", "assemble.join_launches"),
    ("kineto_comm.per_rank", "tabulate", "model"),
    ("kineto_comm.per_rank", "stack", "model.stack"),
    ("kineto_comm.per_rank", "_process_groups", "model.groups"),
    ("kineto_comm.per_rank", "cpu_steps", "model.cpu_steps"),
    ("kineto_comm.per_rank", "build_kernels", "model.kernels"),
    ("kineto_comm.per_rank", "assign_steps", "model.assign_steps"),
    ("kineto_comm.per_rank", "build_collectives", "model.collectives"),
    ("kineto_comm.per_rank", "device_windows", "model.windows"),
    ("kineto_comm.per_rank", "breakdowns", "model.breakdowns"),
    ("kineto_comm.lazy", "collect_all", "collect_all (any)"),
    ("kineto_comm.lazy", "split", "split (any)"),
    ("kineto_comm.per_rank", "_rank_tables", "model.rank_tables"),
    ("kineto_comm.analyze", "cross_rank", "cross_rank"),
    ("kineto_comm.analysis.crossrank", "keyed_calls", "x.keyed"),
    ("kineto_comm.analysis.crossrank", "fit_offsets", "x.offsets"),
    ("kineto_comm.analysis.crossrank", "instances", "x.instances"),
    ("kineto_comm.analysis.crossrank", "waits", "x.waits"),
    ("kineto_comm.analysis.crossrank", "stragglers", "x.stragglers"),
    ("kineto_comm.analysis.crossrank", "process_groups", "x.roles"),
    ("kineto_comm.analysis.crossrank", "pipeline", "x.pipeline"),
    ("kineto_comm.analysis.crossrank", "storms", "x.storms"),
]
events = []

def wrap(fn, label):
    if hasattr(fn, "__wrapped_step__"):
        return fn
    def timed(*a, **k):
        t = time.perf_counter_ns()
        try:
            return fn(*a, **k)
        finally:
            events.append((label, threading.get_ident(), t, time.perf_counter_ns()))
    timed.__wrapped_step__ = True
    return timed

import kineto_comm
from kineto_comm import analyze
for module, name, label in STEPS:
    m = importlib.import_module(module)
    if hasattr(m, name):
        original = getattr(m, name)
        timed = wrap(original, label)
        # Every module that imported the function by name calls it through its own name.
        for other in [v for k, v in sys.modules.items() if k.startswith("kineto_comm")]:
            for attr, value in list(vars(other).items()):
                if value is original:
                    setattr(other, attr, timed)
jobs = int(sys.argv[2]) if sys.argv[2] != "0" else None
r0 = resource.getrusage(resource.RUSAGE_SELF)
c0 = time.process_time()
t0 = time.perf_counter_ns()
report = analyze(sys.argv[1], jobs=jobs)
t1 = time.perf_counter_ns()
c1 = time.process_time()
r1 = resource.getrusage(resource.RUSAGE_SELF)
assert not report.errors, report.errors[:3]
main = threading.get_ident()
out = {"wall": (t1 - t0) / 1e6, "cpu": (c1 - c0) * 1e3, "sys": (r1.ru_stime - r0.ru_stime) * 1e3,
       "faults": r1.ru_minflt - r0.ru_minflt, "steps": {}}
threads = {}
for label, tid, s, e in events:
    threads.setdefault(tid, len(threads))
    step = out["steps"].setdefault(label, {"sum": 0.0, "first": 1e18, "last": 0.0, "n": 0})
    step["sum"] += (e - s) / 1e6
    step["first"] = min(step["first"], (s - t0) / 1e6)
    step["last"] = max(step["last"], (e - t0) / 1e6)
    step["n"] += 1
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=0, help="analyze(jobs=...); 0: its default")
    args = ap.parse_args()
    runs = []
    for _ in range(args.runs):
        got = subprocess.run(
            [sys.executable, "-c", CHILD, str(Path(args.folder).resolve()), str(args.jobs)],
            capture_output=True,
            text=True,
            cwd="/tmp",
            env=dict(os.environ),
            check=True,
        )
        runs.append(json.loads(got.stdout.strip().splitlines()[-1]))
    for key in ("wall", "cpu", "sys", "faults"):
        values = [r[key] for r in runs]
        print(f"{key:>8}: median {median(values):8.1f}  ({min(values):.1f}-{max(values):.1f})")
    labels = list(dict.fromkeys(label for r in runs for label in r["steps"]))
    print(f"{'step':<22}{'calls':>6}{'sum ms':>9}{'first':>8}{'last':>8}")
    for label in labels:
        got = [r["steps"][label] for r in runs if label in r["steps"]]
        print(
            f"{label:<22}{median(s['n'] for s in got):>6.0f}"
            f"{median(s['sum'] for s in got):>9.1f}"
            f"{median(s['first'] for s in got):>8.1f}{median(s['last'] for s in got):>8.1f}"
        )


if __name__ == "__main__":
    main()
