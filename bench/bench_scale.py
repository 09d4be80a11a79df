"""Many-rank jobs: kineto-comm end to end (worker processes) against HTA, side by side.

    python bench/bench_scale.py --ranks 8 --size-mb 10            # with HTA
    python bench/bench_scale.py --ranks 64 --size-mb 50 --no-hta  # the 64 x 50 MB target
    python bench/bench_scale.py --folder bench/out/h100-nccl/ddp-8  # real traces instead
    python bench/bench_scale.py --ranks 8 --size-mb 10 --runs 5   # alternated, with medians

A synthetic data-parallel job is generated under bench/out/ (kept and reused), with as many
CPU ops per kernel as real captures have (--host-ops), unless --folder names a folder of real
trace files (.json) to run on. kineto-comm
runs `analyze()` with one worker per core in a child process; the child's own peak RSS (the
parent of the workers: they are not counted) and the wall time are reported. HTA runs
`TraceAnalysis` load + `get_comm_comp_overlap` + `get_temporal_breakdown` on the same files.
The ratio compares `analyze()` with that; the rules and the text and HTML reports that
`kineto-comm report` adds are timed after it, and the parent's peak RSS is given for both.
Throughput is MB of uncompressed JSON per second of wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_load import run_child  # noqa: E402

# Real captures carry ~7 CPU ops per kernel (record_shapes view and metadata ops): 160-360
# kernels per MB of JSON; without them a generated job has ~700 (bench/README.md, fortieth
# session).
HOST_OPS = 7

KINETO = """
import os, sys, time, resource
from kineto_comm import analyze
from kineto_comm.rules_engine import run_rules
from kineto_comm.render.formats import render
t = time.perf_counter()
r = analyze(sys.argv[1], jobs=int(os.environ['BENCH_JOBS']), ignore=['ALL'])  # rules timed below
dt = time.perf_counter() - t
assert not r.errors, r.errors[:3]
analysed = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024
t = time.perf_counter()
findings = run_rules(r)
render(r, 'text'), render(r, 'html')
rules = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024
print(dt, analysed, rules, rss, r.ranks.height, r.collective_instances.height, len(findings))
"""

HTA = """
import sys, time, logging
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_comm_comp_overlap(visualize=False)
a.get_temporal_breakdown(visualize=False)
print(time.perf_counter() - t)
"""


def job(ranks: int, size_mb: float, host_ops: int = 0) -> Path:
    ops = f"-ops{host_ops}" if host_ops else ""
    out = HERE / "out" / f"scale-dp-{ranks}r-{int(size_mb)}mb{ops}"
    if not (out / "truth.json").exists():
        from kineto_comm.synth import generate

        generate(
            "baseline", out, ranks=ranks, layout="dp", size_mb=size_mb, seed=0, host_ops=host_ops
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--size-mb", type=float, default=10.0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument(
        "--runs", type=int, default=1, help="runs of each tool, alternated; medians are printed"
    )
    ap.add_argument(
        "--host-ops",
        type=int,
        default=HOST_OPS,
        help="CPU ops without kernels per compute kernel in the generated job (0: the denser"
        " job of the earlier measurements)",
    )
    ap.add_argument("--folder", type=Path, help="real traces to run on (no job is generated)")
    args = ap.parse_args()

    folder = args.folder or job(args.ranks, args.size_mb, args.host_ops)
    files = sorted(
        p for p in folder.iterdir() if p.name.endswith(".json") and p.name != "truth.json"
    )
    total = sum(f.stat().st_size for f in files) / 1e6
    print(
        f"{len(files)} ranks x {total / len(files):.0f} MB = {total:,.0f} MB; "
        f"{args.jobs} workers on {os.cpu_count()} cores ({_cpu_model()})"
    )
    ours, theirs = [], []
    for run in range(args.runs):  # alternated, so that both see the same moments of the VM
        if args.runs > 1:
            print(f"run {run + 1} of {args.runs}")
        ours.append(_kineto(folder, total, args.jobs))
        if not args.no_hta:
            theirs.append(_hta(files, total))
            print(f"ratio (HTA / kineto-comm): {theirs[-1] / ours[-1]:.1f}x")
    if args.runs > 1:
        print(f"median of {args.runs}: kineto-comm {median(ours):.2f} s", end="")
        if theirs:
            ratios = sorted(t / o for t, o in zip(theirs, ours, strict=True))
            print(
                f", HTA {median(theirs):.2f} s,"
                f" ratio of the medians {median(theirs) / median(ours):.1f}x"
                f" (per run {ratios[0]:.1f}-{ratios[-1]:.1f}x, median {median(ratios):.1f}x)",
                end="",
            )
        print()


def _cpu_model() -> str:
    """What /proc/cpuinfo says of the CPU (a VM may hide the model's name): the ratio to HTA
    depends on it (bench/README.md, twenty-ninth session: a VM of the same size on another
    CPU ran HTA 1.6x faster and kineto-comm 1.3x)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "CPU unknown"
    info = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines())
    )
    avx512 = "avx512f" in info.get("flags", "").split()
    return (
        f"{info.get('model name', '?')}, model {info.get('model', '?')}, "
        f"{info.get('cache size', '?')} cache, AVX-512 {'yes' if avx512 else 'no'}"
    )


def _kineto(folder: Path, total: float, jobs: int) -> float:
    """One run of kineto-comm in a child process: its `analyze()` seconds, printed with the
    rest of what the child measured."""
    out, _, _ = run_child(KINETO, [str(folder)], {"BENCH_JOBS": str(jobs)})
    inner, analysed, rules, parent_rss, ranks, instances, findings = out.split()
    seconds = float(inner)
    print(
        f"kineto-comm: {seconds:7.2f} s ({total / seconds:6.1f} MB/s), parent peak RSS "
        f"{float(analysed):.2f} GiB, {ranks} ranks, {instances} matched calls"
    )
    print(
        f"  then all rules + text and HTML reports: {float(rules):.2f} s ({findings} findings);"
        f" parent peak RSS over both {float(parent_rss):.2f} GiB"
    )
    return seconds


def _hta(files: list[Path], total: float) -> float:
    """One run of HTA on the same files in a child process: its seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:  # HTA would read truth.json as a trace: give it the traces only
            os.symlink(f.resolve(), Path(tmp) / f.name)
        out, _, hrss = run_child(HTA, [tmp])
    seconds = float(out.split()[0])
    print(f"HTA:         {seconds:7.2f} s ({total / seconds:6.1f} MB/s), peak RSS {hrss:.2f} GiB")
    return seconds


if __name__ == "__main__":
    main()
