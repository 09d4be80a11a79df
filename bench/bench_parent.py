"""The parent's memory as the rank count grows, past the jobs this disk can hold.

    python bench/bench_parent.py bench/out/scale-dp-64r-250mb --ranks 64 256 1024 [--rules]

The parent of a big job keeps the tables with a row per kernel, call or step in files, one per
rank (kineto_comm.rank_store), merges the small per-rank table (totals) and runs the
cross-rank analysis over them. To measure its memory at rank counts whose traces would not
fit on this disk, the per-rank tables of a real job (made by bench_scale.py) are built once by
`workers.work`, kernels, calls and steps in files, and kept under bench/out/<job>-tables/. Each
measurement then runs, in a fresh process, `analyze()` as on a big job (budget.SPILL_ABOVE
passed) with its per-rank work replaced by copies of those tables: rank r of copy k becomes
rank 64k + r of a world of R ranks, its small tables read back from the workers' Arrow IPC
bytes and its kernels, calls and steps from the copied rank's files. The copies keep their
process groups, so each data-parallel call is matched over all R ranks.

Printed per rank count: collective rows, wall time of `analyze()`, the parent's peak RSS
(ru_maxrss), its growth over the start per collective row, and a lower bound on what the
returned Report's tables hold (8 bytes per number, 16 per text value: the view, not the text
its rows share; tables kept in files count nothing): the part of the peak no transient can
explain. With --rules, the child then applies the built-in rules and renders every format,
as `kineto-comm report` does (each written to a file), and prints their time and the peak
after them.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_load import run_child  # noqa: E402

CHILD = """
import pickle, resource, sys, time
from dataclasses import replace
from pathlib import Path
import kineto_comm
from kineto_comm.per_rank import from_wire
A = sys.modules["kineto_comm.analyze"]
source, ranks, placeholders = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
wires = sorted(source.glob("wire-*.pickle"), key=lambda p: int(p.stem.removeprefix("wire-")))
files = sorted(placeholders.iterdir(), key=lambda p: int(p.stem.removeprefix("rank")))

def run(names, plan, settings, dask_scheduler, progress=None):
    out = [None] * ranks
    for copy in range((ranks + len(wires) - 1) // len(wires)):
        for path in wires:
            for t in from_wire(pickle.loads(path.read_bytes())):
                rank = copy * len(wires) + t.rank
                if rank < ranks:
                    t = replace(t.with_rank(rank), file=str(files[rank]), world_size=ranks)
                    out[rank] = ("ok", t)
    return out

A._run = run
A.budget.SPILL_ABOVE = -1  # a big job: what workers put in files stays there
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
r = kineto_comm.analyze(placeholders, jobs=1, ignore=["ALL"])  # the rules are timed below
wall = time.perf_counter() - t
assert not r.errors, r.errors[:3]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
import polars as pl
# Bytes per value, at least (a text value is its view; other types count nothing).
WIDTH = {pl.Boolean: 1 / 8, pl.String: 16, pl.Categorical: 4, pl.Int32: 4, pl.UInt32: 4,
         pl.Float32: 4, pl.Int64: 8, pl.UInt64: 8, pl.Float64: 8}
held = sum(
    v.height * sum(WIDTH.get(d.base_type(), 0) for d in v.dtypes)
    for v in vars(r).values() if isinstance(v, pl.DataFrame)
)
calls = r.rank_collectives.height  # not r.collectives: that reads every rank's calls
rules_wall, rules_peak = 0.0, peak
if sys.argv[4:] == ["rules"]:  # what `kineto-comm report` adds: rules, then every format
    from kineto_comm.render.formats import FORMATS, write
    from dataclasses import replace
    from kineto_comm.rules_engine import run_rules
    t = time.perf_counter()
    r = replace(r, findings=run_rules(r))
    for fmt in FORMATS:  # written to a file, as `kineto-comm report -o` does
        write(r, fmt, placeholders / f"report.{fmt}")
    rules_wall = time.perf_counter() - t
    rules_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(r.ranks.height, calls, r.collective_instances.height, wall, base, peak, held,
      rules_wall, rules_peak)
"""


# Marks a complete tables folder; renamed when what workers put in files changes (steps
# since the twenty-third session; since the twenty-fourth, the rank their rows hold and
# their layouts), so that older folders are built again.
DONE = "done-layouts"


def tables(job: Path) -> Path:
    """The job's per-rank tables (kernels, calls and steps in files), built once."""
    out = job.parent / f"{job.name}-tables"
    if (out / DONE).exists():
        return out
    from kineto_comm.per_rank import to_wire
    from kineto_comm.workers import Settings, work

    (out / "kernels").mkdir(parents=True, exist_ok=True)
    files = sorted(str(p) for p in job.glob("*.json") if p.name != "truth.json")
    settings = Settings(spill_dir=str(out / "kernels"))
    for i, f in enumerate(files):
        [(status, payload)] = work([f], settings)
        assert status == "ok", payload
        (out / f"wire-{i}.pickle").write_bytes(pickle.dumps(to_wire([payload])))
        print(f"  tables of {Path(f).name}", flush=True)
    (out / DONE).write_text("")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("job", type=Path, help="a job's trace folder (bench_scale.py makes them)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument(
        "--rules", action="store_true", help="then run the rules and render every format"
    )
    args = ap.parse_args()
    source = tables(args.job)
    for ranks in args.ranks:
        with tempfile.TemporaryDirectory(prefix="kineto-comm-parent-") as tmp:
            for r in range(ranks):
                (Path(tmp) / f"rank{r}.json").write_text("{}")
            argv = [str(source), str(ranks), tmp] + (["rules"] if args.rules else [])
            out, _, _ = run_child(CHILD, argv)
        n, rows, calls, wall, base, peak, held, rules_wall, rules_peak = out.split()[-9:]
        grown = (int(peak) - int(base)) * 1024
        print(
            f"{int(n):5d} ranks: {int(rows):>9,} collective rows ({int(calls):,} calls),"
            f" analyze {float(wall):5.1f} s, parent peak RSS {int(peak) / 2**20:5.2f} GiB"
            f" ({grown / max(int(rows), 1):.0f} B per row over the start);"
            f" the report's tables hold at least {float(held) / 2**30:.2f} GiB"
            + (
                f"; rules and every format {float(rules_wall):5.1f} s, peak RSS after them"
                f" {int(rules_peak) / 2**20:5.2f} GiB"
                if args.rules
                else ""
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
