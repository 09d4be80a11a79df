"""What one query over every rank's files costs the parent, by how the files are scanned.

    python bench/bench_scan.py --ranks 1024 4096 [--steps 950]

A big job keeps each rank's steps (and kernels and calls) in its own Arrow IPC file
(kineto_comm.rank_store). This writes one steps-like file per rank (15 integer columns,
`--steps` rows, the rank in `rank`), then runs the same aggregation (the means of every
column and a rank sum) in a fresh child per way of scanning, on the streaming engine:

- `a scan per file`: `RankStore.lazy()` over parts that do not say which rank their rows
  hold, so each file is its own `scan_ipc` with its rank as a literal, all concatenated
  (what every store did before the twenty-fourth session);
- `a scan per file, windows of 512`: the same, a window of ranks per query (`per_window`);
- `store`: `RankStore.lazy()` over parts whose rows hold their final rank (what workers'
  files now are where the trace's rank claim holds): one `scan_ipc` over the list.

Printed per rank count and way: wall seconds and the child's peak RSS over its start.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_load import run_child  # noqa: E402

CHILD = """
import resource, sys, time
import polars as pl
from kineto_comm.lazy import collect
from kineto_comm.rank_store import Part, RankStore
folder, ranks, steps, way = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
paths = [f"{folder}/r{r}.arrow" for r in range(ranks)]
cols = [c for c in pl.scan_ipc(paths[0]).collect_schema() if c != "rank"]
held = (lambda r: r) if way == "store" else (lambda r: None)
store = RankStore([Part(rows=steps, path=p, rank=r, held=held(r)) for r, p in enumerate(paths)])
agg = [pl.col(cols).mean(), pl.col("rank").sum()]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if way == "windows":
    out = store.per_window(lambda view: view.lazy().select(agg), 512 * steps)
else:
    out = collect(store.lazy().select(agg), store.height)
assert out["rank"].sum() == ranks * (ranks - 1) // 2 * steps
wall = time.perf_counter() - t
print(wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
"""

WAYS = {
    "files": "a scan per file",
    "windows": "a scan per file, windows of 512",
    "store": "store",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--steps", type=int, default=950)
    args = ap.parse_args()
    import polars as pl

    from kineto_comm.per_rank import write_frame

    names = ["step", "cpu_start_ns", "cpu_end_ns", "start_ns", "end_ns", "wall_ns", "busy_ns"]
    names += ["compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns", "memcpy_ns"]
    names += ["memset_ns", "idle_ns"]
    with tempfile.TemporaryDirectory(prefix="kineto-comm-scan-") as tmp:
        row = pl.int_range(0, args.steps, eager=True)
        frame = pl.DataFrame({n: row * (i + 1) for i, n in enumerate(names)})
        written = 0
        for ranks in args.ranks:
            for r in range(written, ranks):
                rows = frame.with_columns(rank=pl.lit(r, pl.Int64)).select("rank", *names)
                write_frame(rows, Path(tmp) / f"r{r}.arrow")
            written = max(written, ranks)
            for way, label in WAYS.items():
                out, _, _ = run_child(CHILD, [tmp, str(ranks), str(args.steps), way])
                wall, grown = out.split()[-2:]
                print(
                    f"{ranks:6d} ranks, {label:32s} {float(wall):5.2f} s,"
                    f" peak RSS +{int(grown) / 2**20:5.2f} GiB",
                    flush=True,
                )


if __name__ == "__main__":
    main()
