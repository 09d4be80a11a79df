"""What the perfetto export adds to `kineto-comm report` (issue #54: at most 30%).

    python bench/bench_timeline.py --ranks 64 --size-mb 50          # the generated 64 x 50 MB job
    python bench/bench_timeline.py --folder tests/data/h100-nccl/tp-dp-8 --ranks-shown all
    python bench/bench_timeline.py --ranks 16 --size-mb 10 --spill   # tables kept in files

The job is bench_scale.py's (generated under bench/out/ and reused). Each run is a fresh
child process that times what `report` does (`analyze()` with the rules, then the text
report) and then the export of the selected ranks (`select` + `write_timeline` to a
.json.gz, as `--format perfetto -o job.json.gz`; and to plain .json once, for its size). The
child's peak RSS is printed after each phase. --spill keeps every rank's tables in Arrow
files (budget.SPILL_ABOVE = 0), the path big jobs take.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scale import HOST_OPS, job  # noqa: E402

CHILD = """
import io, json, os, resource, sys, time
from pathlib import Path
from kineto_comm import analyze, budget
from kineto_comm.render.formats import render
from kineto_comm.render.perfetto import parse_numbers, select, write_timeline
if os.environ.get("BENCH_SPILL"):
    budget.SPILL_ABOVE = 0
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024
t = time.perf_counter()
r = analyze(sys.argv[1], jobs=int(os.environ["BENCH_JOBS"]))
render(r, "text")
report = time.perf_counter() - t
after_report = rss()
t = time.perf_counter()
chosen = select(r, parse_numbers(os.environ["BENCH_RANKS"]))
out = Path(sys.argv[2])
write_timeline(r, out, chosen)
export = time.perf_counter() - t
plain = None
if os.environ.get("BENCH_PLAIN"):
    write_timeline(r, out.with_suffix(""), chosen)
    plain = out.with_suffix("").stat().st_size
print(json.dumps({"report_s": report, "export_s": export, "gz_bytes": out.stat().st_size,
                  "json_bytes": plain, "ranks": chosen.ranks, "steps": chosen.steps,
                  "spilled": r.rank_kernels.spilled, "rss_report_gib": after_report,
                  "rss_export_gib": rss(), "world": r.ranks.height}))
"""


def run(folder: Path, jobs: int, ranks: str, spill: bool, plain: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, BENCH_JOBS=str(jobs), BENCH_RANKS=ranks)
        if spill:
            env["BENCH_SPILL"] = "1"
        if plain:
            env["BENCH_PLAIN"] = "1"
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(folder), str(Path(tmp) / "job.json.gz")],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--size-mb", type=float, default=50.0)
    ap.add_argument("--host-ops", type=int, default=HOST_OPS)
    ap.add_argument("--folder", type=Path, help="real traces instead of a generated job")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ranks-shown", default="", help="--ranks of the export (default: chosen)")
    ap.add_argument("--spill", action="store_true", help="keep every rank's tables in files")
    args = ap.parse_args()
    folder = args.folder or job(args.ranks, args.size_mb, args.host_ops)
    size = sum(p.stat().st_size for p in folder.iterdir() if p.name != "truth.json") / 1e6
    print(f"{folder}: {size:,.0f} MB; {args.jobs} jobs on {os.cpu_count()} cores")
    shares = []
    for i in range(args.runs):
        res = run(folder, args.jobs, args.ranks_shown, args.spill, plain=i == 0)
        shares.append(res["export_s"] / res["report_s"])
        print(
            f"run {i + 1}: report {res['report_s']:.2f} s, export {res['export_s']:.2f} s"
            f" (+{100 * shares[-1]:.1f}%); {len(res['ranks'])} of {res['world']} ranks"
            f" {res['ranks']}, steps {res['steps'] or 'all'}; .json.gz"
            f" {res['gz_bytes'] / 1e6:.1f} MB"
            + (f", .json {res['json_bytes'] / 1e6:.1f} MB" if res["json_bytes"] else "")
            + f"; spilled {res['spilled']}; peak RSS {res['rss_report_gib']:.2f} ->"
            f" {res['rss_export_gib']:.2f} GiB"
        )
    print(f"median added: +{100 * median(shares):.1f}% of report's time")


if __name__ == "__main__":
    main()
