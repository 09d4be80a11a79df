"""Capture the `solo/`, `shared-gpu/` and `shared-gpu-hog/` traces of this folder (README.md).

A CPU-bound process ("victim": each iteration spins the CPU, then launches a GEMM and
an elementwise kernel) is profiled alone, then again while a second process ("hog")
keeps the same GPU busy with large GEMMs. With no MPS the two contexts time-slice the
GPU: the victim's kernels wait in the queue while the hog runs. The hog is profiled too,
on the same host clock, so its kernels tell independently how long the GPU ran someone
else's work inside each of the victim's steps: the ground truth for the analyser's
`launch` and `queued` blame and for SYNC105.

    python capture_contention.py OUT_DIR        # needs torch with CUDA; ~1 minute

Only torch is needed (the device image has no kineto-comm install).
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
import time
from pathlib import Path

ITERATIONS = 40  # launches per step
SPIN_S = 100e-6  # CPU time before each launch: the device idles, waiting for the CPU
STEPS = 3  # recorded steps (after one skipped and one warm-up step)


def _export(prof, path: Path) -> None:
    raw = path.with_suffix("")
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


def victim(out: Path, started: Path | None = None) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    if started is not None:
        started.touch()  # the hog starts its profiler
        time.sleep(0.2)
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=1, warmup=1, active=STEPS, repeat=1),
        record_shapes=True,
    ) as prof:
        for _ in range(STEPS + 2):
            for _ in range(ITERATIONS):
                until = time.perf_counter() + SPIN_S
                while time.perf_counter() < until:
                    pass
                c = a @ b
                c.relu_()
            torch.cuda.synchronize()
            prof.step()
    out.mkdir(parents=True, exist_ok=True)
    _export(prof, out / "rank-0.pt.trace.json.gz")


def hog(out: Path, ready: Path, started: Path, stop: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    deadline = time.time() + 120
    prof = profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU])
    profiling = False
    ready.touch()
    while not stop.exists() and time.time() < deadline:
        if not profiling and started.exists():
            prof.start()  # only while the victim runs: a small trace
            profiling = True
        for _ in range(4):
            x @ y
        torch.cuda.synchronize()  # a short queue: the victim's wait stays a few GEMMs
    if not profiling:
        raise SystemExit("the victim never started")
    prof.stop()
    out.mkdir(parents=True, exist_ok=True)
    _export(prof, out / "rank-0.pt.trace.json.gz")


def main(root: Path) -> None:
    me = str(Path(__file__).resolve())
    subprocess.run([sys.executable, me, "victim", str(root / "solo")], check=True)
    ready, started, stop = (root / f".hog-{s}" for s in ("ready", "started", "stop"))
    for f in (ready, started, stop):
        f.unlink(missing_ok=True)
    hog_proc = subprocess.Popen(
        [
            sys.executable,
            me,
            "hog",
            str(root / "shared-gpu-hog"),
            str(ready),
            str(started),
            str(stop),
        ]
    )
    while not ready.exists():
        if hog_proc.poll() is not None:
            raise SystemExit("the hog process died")
        time.sleep(0.1)
    try:
        subprocess.run(
            [sys.executable, me, "victim", str(root / "shared-gpu"), str(started)], check=True
        )
        time.sleep(0.2)
    finally:
        stop.touch()
        hog_proc.wait()
    for f in (ready, started, stop):
        f.unlink(missing_ok=True)
    if hog_proc.returncode:
        raise SystemExit(f"the hog process failed ({hog_proc.returncode})")


if __name__ == "__main__":
    if sys.argv[1] == "victim":
        victim(Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
    elif sys.argv[1] == "hog":
        hog(*(Path(a) for a in sys.argv[2:6]))
    else:
        main(Path(sys.argv[1]))
