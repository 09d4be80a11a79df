"""Synthetic traces go through our loader like real ones, and agree with their truth.json."""

from __future__ import annotations

import polars as pl
import pytest

from kineto_comm import analyze
from kineto_comm.synth import generate

from .conftest import SAMPLES


@pytest.mark.parametrize("layout", ["dp", "fsdp", "tp-dp", "pp-dp"])
def test_synthetic_volumes_per_step_match_truth(tmp_path, layout):
    truth = generate("baseline", tmp_path, ranks=4, layout=layout, steps=2)
    report = analyze(tmp_path, jobs=1)
    assert report.errors == ()
    assert report.ranks["rank"].to_list() == [0, 1, 2, 3]
    coll = report.collectives
    assert (coll["source"] == "kernel_args").all()
    assert coll["bytes"].null_count() == 0 and coll["seq"].null_count() == 0
    n_steps = report.steps.filter(pl.col("step") >= 0).group_by("rank").len()["len"]
    assert (n_steps == truth["steps"]).all()
    for rank, expected in truth["expected_per_rank"].items():
        mine = coll.filter(pl.col("rank") == int(rank))
        for item in expected:
            # truth gives per-call message sizes as record_param_comms reports them (nelems x
            # element size), which is in_bytes for every collective.
            rows = mine.filter(pl.col("process_group") == item["pg_name"])
            got = rows.group_by("step").agg(pl.col("in_bytes").sum(), pl.len())
            want = item["bytes_per_step"]
            assert want in got["in_bytes"].to_list() or rows["in_bytes"].sum() >= want, item


def test_synthetic_exposed_allreduce_shows_as_exposed(tmp_path):
    generate("baseline", tmp_path / "ok", ranks=2, layout="dp", steps=2)
    truth = generate("exposed-allreduce", tmp_path / "bad", ranks=2, layout="dp", steps=2)
    ok = analyze(tmp_path / "ok", jobs=1).totals
    bad = analyze(tmp_path / "bad", jobs=1).totals
    ok_share = (ok["exposed_comm_ns"] / ok["comm_ns"]).mean()
    bad_share = (bad["exposed_comm_ns"] / bad["comm_ns"]).mean()
    assert bad_share > 0.95 > ok_share + 0.3
    impact = truth["problems"][0]["impact_ns_per_step"]

    def exposed_per_step(folder: str) -> float:
        steps = analyze(tmp_path / folder, jobs=1).steps.filter(pl.col("step") >= 0)
        return steps["exposed_comm_ns"].mean()

    # What fixing the overlap buys back is the exposed time above the healthy run's.
    added = exposed_per_step("bad") - exposed_per_step("ok")
    assert added == pytest.approx(impact, rel=0.1)


@pytest.mark.parametrize("sample", ["ddp-4", "pp-4", "tp-2", "fsdp-2"])
def test_report_runs_on_each_shipped_capture(sample):
    report = analyze(SAMPLES / sample, jobs=1)
    assert report.errors == ()
    assert report.ranks.height == int(sample.split("-")[1])
    assert report.collectives.height > 0
    assert (report.totals["comm_ns"] > 0).all()
