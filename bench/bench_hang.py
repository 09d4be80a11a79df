"""Time the hang analysis of a big job's Flight Recorder dumps (issue 80: 1,000 ranks x
2,000 entries in at most 10 s). Generated dumps (kineto_comm.synth.flight, a GPU stop on one
rank) are written as pickles to a temporary folder, then `analyze_hang` reads and analyses
them; reading (safe unpickling, tables) and analysing are timed apart.

    python3 bench/bench_hang.py [--ranks 1000] [--entries 2000]
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
import time
from pathlib import Path

from kineto_comm.analysis.hang import analyse, tables_of
from kineto_comm.hang import analyze_hang
from kineto_comm.load.flight import read_dumps
from kineto_comm.synth.flight import job_dumps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=1000)
    parser.add_argument("--entries", type=int, default=2000)
    args = parser.parse_args()
    dumps, truth = job_dumps(
        ranks=args.ranks, fault="gpu", faulty=args.ranks // 3, entries_per_rank=args.entries
    )
    with tempfile.TemporaryDirectory() as tmp:
        for r, d in dumps.items():
            (Path(tmp) / f"_dump_{r}").write_bytes(pickle.dumps(d))
        del dumps
        t0 = time.perf_counter()
        decoded, errors, _ = read_dumps([tmp])
        t1 = time.perf_counter()
        tables = tables_of(decoded)
        t2 = time.perf_counter()
        result = analyse(tables)
        t3 = time.perf_counter()
        report = analyze_hang([tmp])
        t4 = time.perf_counter()
    roots = result.roots["rank"].to_list()
    print(
        f"{args.ranks} ranks x {tables.entries.height // max(1, args.ranks)} entries:"
        f" read {t1 - t0:.2f} s, tables {t2 - t1:.2f} s, analysis {t3 - t2:.2f} s;"
        f" analyze_hang end to end {t4 - t3:.2f} s; roots {roots} (truth {truth['roots']});"
        f" {len(report.findings)} findings, {len(errors)} errors"
    )


if __name__ == "__main__":
    main()
