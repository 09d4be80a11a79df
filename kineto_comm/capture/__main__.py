"""``python -m kineto_comm.capture``: command-line entry point for :func:`capture`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kineto_comm.capture.runner import LAYOUTS, STEPS, CaptureError, capture


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser (kept separate so the project CLI can mirror it)."""
    p = argparse.ArgumentParser(
        prog="python -m kineto_comm.capture",
        description="Capture one Kineto trace per rank of a tiny distributed transformer "
        "training loop (rank-{r}.pt.trace.json.gz).",
    )
    p.add_argument("--layout", choices=LAYOUTS, required=True, help="parallelism layout")
    p.add_argument("--ranks", type=int, default=2, help="number of processes (world size)")
    p.add_argument("--steps", type=int, default=STEPS, help="profiler steps recorded (active)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size (MB)")
    p.add_argument("--micro-batches", type=int, default=4, help="pipeline micro-batches")
    p.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default=None,
        help="process-group backend (default: nccl with enough GPUs, else gloo)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument(
        "--with-stack",
        action="store_true",
        help="record Python call stacks and modules (python_function), and each call's phase"
        " and module beside the traces (truth-rank-N.json)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run a capture from command-line arguments; print the written paths."""
    args = build_parser().parse_args(argv)
    try:
        paths = capture(
            args.layout,
            args.out,
            ranks=args.ranks,
            steps=args.steps,
            backend=args.backend,
            bucket_cap_mb=args.bucket_cap_mb,
            micro_batches=args.micro_batches,
            seed=args.seed,
            with_stack=args.with_stack,
        )
    except CaptureError as exc:
        print(f"capture failed: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
