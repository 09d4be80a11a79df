"""Synthetic traces go through our loader like real ones, and agree with their truth.json."""

from __future__ import annotations

import json
from collections import Counter

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


def test_host_ops_add_real_cpu_op_mix_without_changing_results(tmp_path):
    """The CPU ops that real traces carry around every launch (`host_ops`: what makes the
    generated bench jobs as dense in kernels as real captures) are in the file, nested in
    their launching op, and change no table the analysis builds (only the ids the kernels
    point at: each op has its own)."""
    generate("baseline", tmp_path / "plain", ranks=4, layout="tp-dp", steps=2)
    truth = generate("baseline", tmp_path / "ops", ranks=4, layout="tp-dp", steps=2, host_ops=7)
    hidden = truth["model"]["hidden"]
    events = {
        name: json.loads((tmp_path / name / "rank-0.pt.trace.json").read_text())["traceEvents"]
        for name in ("plain", "ops")
    }
    count = {name: Counter(e.get("cat") for e in found) for name, found in events.items()}
    kernels = count["plain"]["kernel"]
    assert count["ops"]["kernel"] == kernels
    compute = kernels - sum(
        "ncclDevKernel" in e["name"] for e in events["plain"] if e.get("cat") == "kernel"
    )
    assert count["ops"]["cpu_op"] - count["plain"]["cpu_op"] == 7 * compute
    # Each view op lies inside the op that launches the next kernel, before the launch.
    ops = [e for e in events["ops"] if e.get("cat") in ("cpu_op", "cuda_runtime")]
    views = {"aten::view", "aten::t", "aten::transpose", "aten::as_strided", "aten::empty"}
    views |= {"aten::reshape", "aten::_unsafe_view"}
    for i, e in enumerate(ops):
        if e["name"] == "aten::t":
            parent = next(p for p in reversed(ops[:i]) if p["name"] not in views)
            launch = next(p for p in ops[i:] if p.get("cat") == "cuda_runtime")
            assert parent["ts"] <= e["ts"] and e["ts"] + e["dur"] <= launch["ts"]
            assert launch["ts"] + launch["dur"] <= parent["ts"] + parent["dur"]
            assert e["args"]["Input Dims"] == [[hidden, hidden]]
    plain, ops_report = (analyze(tmp_path / name, jobs=1) for name in ("plain", "ops"))
    for table in ("kernels", "collectives", "steps", "totals", "collective_instances"):
        a, b = getattr(plain, table), getattr(ops_report, table)
        drop = [c for c in ("external_id",) if c in a.columns]
        assert a.drop(drop).equals(b.drop(drop)), table
