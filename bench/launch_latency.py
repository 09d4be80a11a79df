"""How long after its launch call returns a kernel starts on an idle device, on real traces:
the measurement behind kineto_comm.analysis.steptime.LAUNCH_LATENCY_NS (a launch gap is the
CPU's until the call returned plus that; the rest of the wait is `queued`). By hand, not in
the tests.

    python3 bench/launch_latency.py TRACE_OR_FOLDER [...]

Per job: how many kernels start after the device went idle with their launch call ending
after it, the time from the call's end to the kernel's start (median, 90th and 99th
percentile, most) and the longest launch call among them.
"""

from __future__ import annotations

import sys

import polars as pl

import kineto_comm


def main(paths: list[str]) -> None:
    for path in paths:
        report = kineto_comm.analyze([path], jobs=1, ignore=["ALL"])
        k = report.kernels.sort("rank", "start_ns").with_columns(
            _prev=pl.col("end_ns").cum_max().shift(1).over("rank")
        )
        gaps = k.filter(
            pl.col("_prev").is_not_null(),
            pl.col("start_ns") > pl.col("_prev"),
            pl.col("launch_end_ns") > pl.col("_prev"),
        ).with_columns(
            after=pl.col("start_ns") - pl.col("launch_end_ns"),
            call=pl.col("launch_end_ns") - pl.col("launch_ns"),
        )
        us = [
            round((v or 0) / 1e3, 1)
            for v in (
                gaps["after"].median(),
                gaps["after"].quantile(0.9),
                gaps["after"].quantile(0.99),
                gaps["after"].max(),
            )
        ]
        print(
            f"{path}: {gaps.height} kernels after an idle device; start - call end (us) "
            f"p50 {us[0]}, p90 {us[1]}, p99 {us[2]}, max {us[3]}; longest call "
            f"{(gaps['call'].max() or 0) / 1e3:.1f} us"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
