"""Our compute/communication overlap against HTA's get_comm_comp_overlap on real traces.

HTA keeps kernels whose launching CPU op starts before the last ProfilerStep starts (or,
with include_last_profiler_step=True, before it ends); the same window is applied to our
kernels table, and the overlap shares must agree within 1 percentage point.
"""

from __future__ import annotations

import logging
import shutil

import polars as pl
import pytest

from kineto_comm import analyze
from kineto_comm.analysis.overlap import breakdown

from .conftest import shared

TRACES = [
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "hta/trace_diff/test/test.json.gz",
    "hta/negative_queue_length_values_check/rank0.json.gz",
    "hta/trace_filter/sampled_rank-0.json.gz",
    "hta/trace_filter/sampled_rank-1.json.gz",
]


def _hta_overlap(path, tmp_path, include_last: bool) -> float:
    hta = pytest.importorskip("hta.trace_analysis", reason="HTA is a test dependency")
    logging.disable(logging.CRITICAL)
    try:
        shutil.copy(path, tmp_path / path.name)
        analysis = hta.TraceAnalysis(
            trace_dir=str(tmp_path), include_last_profiler_step=include_last
        )
        return float(analysis.get_comm_comp_overlap(visualize=False)["comp_comm_overlap_pctg"][0])
    finally:
        logging.disable(logging.NOTSET)


def _our_overlap(report, include_last: bool) -> float:
    steps = report.steps
    cutoff = steps["cpu_end_ns"].max() if include_last else steps["cpu_start_ns"].max()
    inside = (pl.col("launch_ns") <= cutoff) if include_last else (pl.col("launch_ns") < cutoff)
    kernels = report.kernels.filter(inside)
    window = pl.DataFrame(
        {
            "rank": [0],
            "window": [0],
            "start_ns": [kernels["start_ns"].min()],
            "end_ns": [kernels["end_ns"].max()],
        }
    )
    row = breakdown(kernels.with_columns(rank=pl.lit(0, dtype=pl.Int64)), window).row(0, named=True)
    return 100.0 * row["overlap_ns"] / row["comm_ns"] if row["comm_ns"] else 0.0


@pytest.mark.parametrize("rel", TRACES, ids=lambda r: r.split("/")[1])
@pytest.mark.parametrize("include_last", [False, True], ids=["hta-default", "with-last-step"])
def test_overlap_share_agrees_with_hta(rel, include_last, tmp_path):
    path = shared(rel)
    report = analyze(path, jobs=1)
    ours = _our_overlap(report, include_last)
    theirs = _hta_overlap(path, tmp_path, include_last)
    assert ours == pytest.approx(theirs, abs=1.0), f"ours {ours:.2f}% vs HTA {theirs:.2f}%"
