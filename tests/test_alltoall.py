"""All-to-all pairs and loads (kineto_comm.analysis.alltoall), COMM103 and how the reports
show them, on the ep-4 captures (gloo: sample_traces/ep-4; NCCL: tests/data/h100-nccl/ep-4),
whose routing is known: capture.workloads.ep_tokens, HIDDEN-wide float32 rows. Each step
dispatches (src -> dst: ep_tokens[src][dst]), returns (the transpose), and backward runs both
again in reverse: exchanges 0 and 2 are the dispatch's matrix, 1 and 3 its transpose."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from kineto_comm import Report, analyze
from kineto_comm.analysis import alltoall
from kineto_comm.capture.workloads import HIDDEN, ep_tokens
from kineto_comm.render.html import render_html
from kineto_comm.render.markdown import render_markdown
from kineto_comm.render.sections import all_to_all
from kineto_comm.rules_api import Tables, all_to_all_volume, replay_saving
from kineto_comm.rules_engine import run_rules
from tests.conftest import REPO, shared

JOBS = {
    "gloo": REPO / "sample_traces" / "ep-4",
    "nccl": REPO / "tests" / "data" / "h100-nccl" / "ep-4",
}
ROW_BYTES = HIDDEN * 4  # float32 rows
WORLD = 4


@cache
def report(kind: str) -> Report:
    return analyze(JOBS[kind], jobs=1)


def truth(call: int) -> list[list[int]]:
    """The tokens [src][dst] of the step's exchange `call`: the dispatch, or its transpose."""
    tokens = ep_tokens(WORLD)
    if call % 2 == 0:
        return tokens
    return [[tokens[dst][src] for dst in range(WORLD)] for src in range(WORLD)]


def received(matrix: list[list[int]]) -> list[int]:
    """Each receiver's tokens: the matrix's column sums."""
    return [sum(row[dst] for row in matrix) for dst in range(WORLD)]


@pytest.mark.parametrize("kind", JOBS)
def test_the_pair_matrix_is_the_capture_s_routing(kind: str) -> None:
    pairs = report(kind).all_to_all_pairs
    exchanges = pairs.select("call_index", "call", "step").unique()
    # Every all-to-all the ranks made (12 calls per rank: 3 steps x 4), four a step.
    calls = report(kind).collectives.filter(pl.col("collective") == "all_to_all")
    assert exchanges.height == calls.group_by("rank").len()["len"].max()
    assert sorted(exchanges.group_by("step").len()["len"]) == [4] * exchanges["step"].n_unique()
    for call_index, call, _ in exchanges.sort("call_index").iter_rows():
        rows = pairs.filter(pl.col("call_index") == call_index)
        assert rows.height == WORLD * WORLD
        got = [[0] * WORLD for _ in range(WORLD)]
        for src, dst, n, b in rows.select("src_rank", "dst_rank", "rows", "bytes").iter_rows():
            got[src][dst] = n
            assert b == n * ROW_BYTES
        assert got == truth(call), (kind, call_index, call)


@pytest.mark.parametrize("kind", JOBS)
def test_each_receiver_s_load_and_the_imbalance(kind: str) -> None:
    loads = report(kind).all_to_all_loads
    pairs = report(kind).all_to_all_pairs
    column_sums = pairs.group_by("call_index", pl.col("dst_rank").alias("rank")).agg(
        _sum=pl.col("bytes").sum()
    )
    both = loads.join(column_sums, on=["call_index", "rank"], how="left")
    # What each rank says it received is what the others say they sent it.
    assert (both["received_bytes"] == both["_sum"]).all()
    for call_index, call in loads.select("call_index", "call").unique().iter_rows():
        rows = loads.filter(pl.col("call_index") == call_index).sort("rank")
        want = received(truth(call))
        assert rows["received_bytes"].to_list() == [t * ROW_BYTES for t in want]
        assert rows["sent_bytes"].to_list() == [sum(r) * ROW_BYTES for r in truth(call)]
        assert rows["imbalance"].to_list() == pytest.approx([max(want) / (sum(want) / WORLD)] * 4)
    # The rule API's volumes are a view of the same table.
    tables = Tables(report(kind))
    assert_frame_equal(all_to_all_volume(tables), alltoall.all_to_all_volume(loads))


def test_no_rows_without_a_whole_group_s_all_to_alls() -> None:
    ddp = analyze(REPO / "sample_traces" / "ddp-4", jobs=1, ignore=["ALL"])
    assert ddp.all_to_all_pairs.height == 0 and ddp.all_to_all_loads.height == 0
    assert all_to_all(ddp) is None and "plot-a2a" not in render_html(ddp)
    # Two ranks of a 128-rank job: all-to-alls, but not the whole group's.
    sampled = analyze(shared("hta/trace_filter"), jobs=1, ignore=["ALL"])
    assert sampled.collectives.filter(pl.col("collective") == "all_to_all").height
    assert sampled.all_to_all_pairs.height == 0 and sampled.all_to_all_loads.height == 0


@pytest.mark.parametrize("kind", JOBS)
def test_comm103_states_the_loads_and_replays_the_balancing(kind: str) -> None:
    r = report(kind)
    (f,) = [f for f in r.findings if f.code == "COMM103"]
    per_step = [sum(received(truth(c))[rank] for c in range(4)) * ROW_BYTES for rank in range(4)]
    assert f.evidence["received_bytes_per_step"] == {str(i): b for i, b in enumerate(per_step)}
    mean = sum(per_step) / WORLD
    assert f.evidence["load_max_over_mean"] == pytest.approx(max(per_step) / mean, abs=1e-3)
    by_call = [max(received(truth(c))) / (sum(received(truth(c))) / WORLD) for c in range(4)]
    assert f.evidence["imbalance_by_call"] == pytest.approx(
        {str(c): x for c, x in enumerate(by_call)}
    )
    assert f.evidence["call_imbalance"] == pytest.approx(sum(by_call) / 4, abs=1e-3)
    assert f.ranks == tuple(i for i, b in enumerate(per_step) if b == max(per_step))
    assert f.impact_ns_per_step == replay_saving(Tables(r), f.edit)
    step = r.savings["step_ns"]
    assert 0 < f.impact_ns_per_step < step
    # Balancing everything the group moves saves more than balancing its uneven part.
    everything = replace(f.edit, fraction=1.0)
    assert f.impact_ns_per_step < replay_saving(Tables(r), everything)
    assert f"{sum(by_call) / 4:.2f}x the mean" in f.title
    # A threshold above the mean exchange's imbalance: no finding.
    quiet = run_rules(r, select=["COMM103"], options={"COMM103": {"min_imbalance": 1.15}})
    assert not list(quiet)


@pytest.mark.parametrize("kind", JOBS)
def test_the_reports_show_the_matrix_and_the_imbalance(kind: str) -> None:
    r = report(kind)
    by_call = [max(received(truth(c))) / (sum(received(truth(c))) / WORLD) for c in range(4)]
    (row,) = all_to_all(r).rows  # one line per group
    assert row[0] == "0" and row[6] == f"{sum(by_call) / 4:.2f}x"
    page = render_html(r)
    assert 'id="plot-a2a"' in page
    assert page.count('class="pair"') == 4 * WORLD * WORLD
    for c in range(4):
        assert f"group 0 · exchange {c} · imbalance {by_call[c]:.2f}x" in page
    src, dst = 1, 3
    tip = f"rank {src} → rank {dst}: {truth(0)[src][dst] * ROW_BYTES / 1e3:,.1f} KB per step"
    assert tip in page
    md = render_markdown(r)
    for c in range(4):
        assert f"All-to-all pairs: group 0, exchange {c} of each step" in md


def test_group_names_are_escaped_in_the_heat_map() -> None:
    r = report("gloo")
    name = '<b onmouseover="x">'
    odd = replace(
        r,
        all_to_all_pairs=r.all_to_all_pairs.with_columns(process_group=pl.lit(name)),
        all_to_all_loads=r.all_to_all_loads.with_columns(process_group=pl.lit(name)),
    )
    page = render_html(odd)
    assert name not in page and "group &lt;b onmouseover=&quot;x&quot;&gt; · exchange 0" in page
