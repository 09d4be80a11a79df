"""Which queries over every call of every rank Polars' streaming engine runs in bounded memory.

    python bench/bench_streaming.py bench/out/scale-dp-64r-250mb --ranks 256 1024

The parent's memory on a big job is the per-call tables it merges (collectives: one row per
call and rank) and what the cross-rank steps build over them. This measures, on the
collectives of a real job (the per-rank tables bench_parent.py keeps under
bench/out/<job>-tables/, copied to R ranks as bench_parent does), each kind of query those
steps use, run two ways in a fresh process each:

- `memory`: every rank's rows read into one DataFrame, then the query on the in-memory
  engine (what the cross-rank steps did until the fifteenth session);
- `stream`: the query on the streaming engine over `scan_ipc` of one Arrow IPC file per
  rank (what a parent that keeps the per-call tables in files, as it keeps kernels, would do).

Printed per query: the peak RSS growth over the process's start (for `memory`, above the
loaded table too) and the wall time. A query the streaming engine cannot run in pieces falls
back to holding its input whole: its growth then follows the rows like the `memory` one's.
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
from bench_parent import tables  # noqa: E402

KEY = ["process_group", "collective", "seq", "call_index"]

# name -> query over `lf` (a LazyFrame of every rank's collectives); `pl` is polars.
QUERIES = {
    "group_by few groups: min/max/len/first": """lf.group_by(KEY).agg(
        pl.col("start_ns").min(), pl.col("end_ns").max(), pl.len(),
        pl.col("pg_desc").first(), pl.col("rank").sort_by("start_ns").last())""",
    "group_by few groups: n_unique": 'lf.group_by(KEY).agg(pl.col("rank").n_unique())',
    "group_by few groups: median": 'lf.group_by(KEY).agg(pl.col("bytes").median())',
    "group_by few groups: when(first) in agg": """lf.group_by(KEY).agg(
        pl.when(pl.col("collective").first() == "send").then(1).otherwise(2))""",
    "group_by (group, value) counts": 'lf.group_by("process_group", "bytes").agg(pl.len())',
    "group_by a group per row": 'lf.group_by(*KEY, "rank").agg(pl.col("end_ns").max())',
    "join with a small table": """lf.select(*KEY, "rank", "start_ns").join(
        lf.group_by(KEY).agg(last=pl.col("start_ns").max()).collect(engine=ENGINE).lazy(),
        on=KEY, how="left").select(pl.col("last").sub(pl.col("start_ns")).sum())""",
    "window over rank": """lf.select(
        o=pl.int_range(pl.len()).over("rank", "process_group")).select(pl.col("o").sum())""",
    "sort": 'lf.select("rank", "start_ns").sort("start_ns").select(pl.col("rank").last())',
}

CHILD = """
import resource, sys, time
from pathlib import Path
import polars as pl
mode, folder, text = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
KEY = ["process_group", "collective", "seq", "call_index"]
files = sorted(folder.glob("*.arrow"))
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
start = rss()
if mode == "memory":
    ENGINE = "in-memory"
    lf = pl.concat([pl.read_ipc(f) for f in files], rechunk=True).lazy()
else:
    ENGINE = "streaming"
    lf = pl.scan_ipc(files)
loaded = rss()
t = time.perf_counter()
eval(text).collect(engine=ENGINE)
print(loaded - start, rss() - loaded, time.perf_counter() - t)
"""


def rank_files(source: Path, ranks: int, out: Path) -> None:
    """Every rank's collectives in its own Arrow IPC file: rank r of copy k is 64k + r."""
    import polars as pl

    from kineto_comm.per_rank import from_wire

    wires = sorted(source.glob("wire-*.pickle"), key=lambda p: int(p.stem.removeprefix("wire-")))
    base = [t for w in wires for t in from_wire(pickle.loads(w.read_bytes()))]
    for rank in range(ranks):
        t = base[rank % len(base)]
        rows = t.collectives.with_columns(rank=pl.lit(rank, dtype=pl.Int64))
        rows.write_ipc(out / f"rank{rank:05d}.arrow")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("job", type=Path, help="a job's trace folder (bench_scale.py makes them)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[256, 1024])
    args = ap.parse_args()
    source = tables(args.job)
    for ranks in args.ranks:
        with tempfile.TemporaryDirectory(prefix="kineto-comm-stream-") as tmp:
            rank_files(source, ranks, Path(tmp))
            print(f"{ranks} ranks:")
            for name, text in QUERIES.items():
                cells = []
                for mode in ("memory", "stream"):
                    out, _, _ = run_child(CHILD, [mode, tmp, text])
                    loaded, grown, wall = (float(x) for x in out.split()[-3:])
                    held = f" over {loaded:.2f} loaded" if mode == "memory" else ""
                    cells.append(f"{mode} +{grown:.2f} GiB{held}, {wall:.1f} s")
                print(f"  {name:42s} {' | '.join(cells)}", flush=True)


if __name__ == "__main__":
    main()
