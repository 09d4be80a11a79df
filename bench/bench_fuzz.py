"""How long the fuzz cases of tests/fuzz.py take (issue 55: a damaged file is decoded, or
refused, about as fast as a whole one): per family, the median and the slowest case, and
the cases over `--limit` seconds, which make the script exit 1. Run by hand; the tests
check what the cases produce, not how long they take.

    python3 bench/bench_fuzz.py [--per-family 25] [--processes 2] [--limit 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import fuzz  # noqa: E402 - the repository's test helpers, after the path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-family", type=int, default=25)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--limit", type=float, default=30.0, help="seconds a case may take")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = fuzz.campaign(args.per_family, Path(tmp), processes=args.processes)
    by_family: dict[str, list[tuple[float, int]]] = {}
    for family, seed, seconds, _ in results:
        by_family.setdefault(family, []).append((seconds, seed))
    print(f"{'family':<24} {'cases':>6} {'median s':>9} {'slowest s':>10}  seed")
    for family, times in sorted(by_family.items()):
        slowest, seed = max(times)
        median = statistics.median(t for t, _ in times)
        print(f"{family:<24} {len(times):>6} {median:>9.2f} {slowest:>10.2f}  {seed}")
    over = [(f, s, sec) for f, s, sec, _ in results if sec > args.limit]
    for family, seed, seconds in over:
        print(f"over {args.limit:.0f} s: {family}:{seed} took {seconds:.1f} s")
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
