"""Hosts measured, not assumed (issue 78, part 4): host names from Kineto's default file
names, and, where the traces name no host and every rank is on device 0, a clock per rank
measured from the collectives (kineto_comm/analysis/align.py, `fit_offsets`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from kineto_comm import analyze
from kineto_comm.analysis.align import fit_offsets, hosts
from kineto_comm.analysis.match import match_keys
from kineto_comm.render.text import hosts_line
from kineto_comm.synth import generate

from .conftest import REPO

DATA = REPO / "tests" / "data"
# Every real capture of several ranks whose ranks all share one GPU (device 0 everywhere:
# tests/data/h100-nccl/README.md, tests/data/h200-nccl/README.md).
SHARED_GPU = sorted(
    folder
    for folder in [*(DATA / "h100-nccl").iterdir(), *(DATA / "h200-nccl").iterdir()]
    if folder.is_dir() and len(list(folder.glob("*.pt.trace.json.gz"))) > 1
)
QUICK = {"tp-2", "fsdp-2"}


@pytest.fixture(scope="module")
def single_gpu_hosts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """Jobs of single-GPU hosts (every rank on device 0, no host names) whose clocks are
    0.5-1.5 ms apart: layout -> (folder, truth)."""
    root = tmp_path_factory.mktemp("single-gpu-hosts")
    return {
        layout: (
            root / layout,
            generate(
                "clock-skew", root / layout, ranks=8, layout=layout, seed=2, single_gpu_hosts=True
            ),
        )
        for layout in ("dp", "tp-dp")
    }


@pytest.mark.parametrize("layout", ["dp", "tp-dp"])
def test_single_gpu_hosts_get_their_offsets_within_10_us(single_gpu_hosts, layout) -> None:
    folder, truth = single_gpu_hosts[layout]
    want = {int(r): v for r, v in truth["clock_offsets_ns"].items()}
    assert len(set(want.values())) == 8 and max(abs(v) for v in want.values()) >= 500_000
    report = analyze(folder, jobs=1)
    assert report.ranks["device"].n_unique() == 1 and report.ranks["host_name"].null_count() == 8
    offsets = report.offsets
    assert set(offsets["host_source"]) == {"measured"}
    assert offsets["host"].n_unique() == 8
    got = dict(offsets.select("rank", "offset_ns").iter_rows())
    for rank, offset in want.items():
        assert abs(got[rank] - (offset - want[0])) <= 10_000, (rank, got[rank], offset)
    # The evidence: one clock has calls ending before they start; the fitted clocks none.
    (evidence,) = offsets["host_evidence"].unique().to_list()
    assert evidence.startswith("other clocks") and ", 0 on a clock per rank" in evidence
    line = hosts_line(report)
    assert line and "8 host(s)" in line and "measured" in line and evidence in line


def test_without_measuring_the_single_gpu_hosts_share_one_clock(single_gpu_hosts) -> None:
    """What the measurement replaces: told nothing (alignment off), the same job reads as
    one shared GPU, and its arrival skews carry the clock offsets."""
    folder, truth = single_gpu_hosts["dp"]
    off = analyze(folder, jobs=1, align=False)
    assert set(off.offsets["host_source"]) == {"shared_device"}
    assert (off.offsets["offset_ns"] == 0).all()
    on = analyze(folder, jobs=1)
    skew = max(abs(v) for v in truth["clock_offsets_ns"].values())
    assert off.collective_instances["arrival_skew_ns"].median() > skew / 2
    assert on.collective_instances["arrival_skew_ns"].median() < skew / 10


@pytest.mark.parametrize(
    "folder",
    [
        pytest.param(
            f, id=f"{f.parent.name}/{f.name}", marks=[] if f.name in QUICK else [pytest.mark.slow]
        )
        for f in SHARED_GPU
    ],
)
def test_every_shared_gpu_capture_keeps_one_clock(folder: Path) -> None:
    report = analyze(folder, jobs=1)
    assert report.ranks["device"].n_unique() == 1  # one GPU
    offsets = report.offsets
    assert set(offsets["host_source"]) == {"shared_device"}
    assert offsets["host"].n_unique() == 1
    assert (offsets["offset_ns"] == 0).all()
    (evidence,) = offsets["host_evidence"].unique().to_list()
    assert "0 end on a rank before another starts them on one clock" in evidence or (
        "no collective" in evidence
    )


def test_the_shared_gpu_captures_are_the_ones_expected() -> None:
    """The parametrisation above covers every multi-rank one-GPU capture in tests/data."""
    names = {f"{f.parent.name}/{f.name}" for f in SHARED_GPU}
    assert {"h100-nccl/tp-2", "h100-nccl/tp-dp-8", "h200-nccl/pp-dp-8"} <= names
    assert len(names) >= 11


def test_a_clock_per_rank_on_one_gpu_is_contradicted() -> None:
    """Why the tp-2 capture keeps one clock although its two ranks' ends differ by a steady
    2.24 ms (time slices of the shared GPU): shifted by that gap, rank 1 would end calls
    before rank 0 started them. Told the hosts are unknown, the calls say one clock."""
    report = analyze(DATA / "h100-nccl" / "tp-2", jobs=1)
    keyed = match_keys(report.collectives)
    grouping = pl.DataFrame(
        {"rank": [0, 1], "host": ["rank 0", "rank 1"], "host_source": ["unknown"] * 2}
    )
    out = fit_offsets(keyed, [0, 1], grouping)
    assert set(out["host_source"]) == {"measured_one_clock"}
    assert out["host"].n_unique() == 1 and (out["offset_ns"] == 0).all()
    assert out["host_evidence"][0].startswith("one clock: of 24 collectives, 0 end")


def _renamed(src: Path, dst: Path, names: list[str]) -> Path:
    """Copies of src's rank files under dst, rank r's as names[r]."""
    dst.mkdir()
    for rank, name in enumerate(names):
        shutil.copy(src / f"rank-{rank}.pt.trace.json.gz", dst / name)
    return dst


def test_hosts_from_kinetos_default_file_names(tmp_path: Path) -> None:
    """The real 4-rank DDP capture renamed as Kineto names files ({hostname}_{pid}.
    {timestamp}.pt.trace.json.gz), two ranks on each of two hosts: the hosts are the file
    names', before the device ids (device 0 everywhere) are looked at."""
    names = [
        "node-a.cluster_4101.1732860000123.pt.trace.json.gz",
        "node-a.cluster_4102.1732860000125.pt.trace.json.gz",
        "node_b_977.1732860000124.pt.trace.json.gz",
        "node_b_978.1732860000126.pt.trace.json.gz",
    ]
    folder = _renamed(DATA / "h100-nccl" / "ddp-4", tmp_path / "job", names)
    report = analyze(folder, jobs=1)
    offsets = report.offsets
    assert set(offsets["host_source"]) == {"file_name"}
    assert offsets["host"].to_list() == ["node-a.cluster"] * 2 + ["node_b"] * 2
    assert offsets["host_evidence"].null_count() == 4
    line = hosts_line(report)
    assert line and line.startswith("Clocks: 2 host(s)") and "file names" in line


@pytest.mark.parametrize(
    ("names", "why"),
    [
        (["a_11.1732860000123.pt.trace.json", "rank-1.pt.trace.json"], "not every name"),
        (["rank0_11.1732860000123.pt.trace.json", "rank1_12.1732860000124.pt.trace.json"], "rank"),
        (["a_11.1732860000123.pt.trace.json", "a_11.1732860000124.pt.trace.json"], "one process"),
        (["w_0.1732860000123.pt.trace.json", "w_1.1732860000124.pt.trace.json"], "pid = rank"),
        (["a_11.2861.pt.trace.json", "b_12.2862.pt.trace.json"], "no timestamp"),
    ],
)
def test_file_names_that_read_more_than_one_way_name_no_host(names, why) -> None:
    ranks = pl.DataFrame(
        {"rank": [0, 1], "host_name": [None, None], "file": [f"/x/{n}" for n in names]},
        schema={"rank": pl.Int64, "host_name": pl.String, "file": pl.String},
    )
    devices = pl.DataFrame({"rank": [0, 1], "device": [0, 0]})
    assert hosts(ranks, devices)["host_source"].to_list() == ["shared_device"] * 2, why
    good = ranks.with_columns(
        file=pl.Series(
            ["/x/a_11.1732860000123.pt.trace.json", "/x/b_12.1732860000124.pt.trace.json"]
        )
    )
    assert hosts(good, devices)["host"].to_list() == ["a", "b"]


def test_the_header_host_name_goes_before_the_file_name(tmp_path: Path) -> None:
    ranks = pl.DataFrame(
        {
            "rank": [0, 1],
            "host_name": ["h0", "h0"],
            "file": ["/x/a_11.1732860000123.pt.trace.json", "/x/b_12.1732860000124.pt.trace.json"],
        }
    )
    out = hosts(ranks, pl.DataFrame({"rank": [0, 1], "device": [0, 0]}))
    assert out["host_source"].to_list() == ["host_name"] * 2 and out["host"].n_unique() == 1


def test_the_truth_of_a_single_gpu_hosts_job_says_so(single_gpu_hosts) -> None:
    folder, truth = single_gpu_hosts["dp"]
    assert truth["ranks_per_host"] == 1
    header = json.loads((folder / "rank-3.pt.trace.json").read_text())
    assert len(header["deviceProperties"]) == 1 and "host_name" not in header


def test_measured_hosts_in_the_json_document(single_gpu_hosts) -> None:
    """The JSON document of a measured job carries the new host_source and its evidence and
    validates against the documented schema."""
    import jsonschema

    from kineto_comm.render.formats import render
    from kineto_comm.rules_api import Severity

    schema = json.loads((REPO / "docs" / "json-schema.json").read_text())
    report = analyze(single_gpu_hosts["dp"][0], jobs=1)
    doc = json.loads(render(report, "json", fail_on=Severity.error))
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert {o["host_source"] for o in doc["offsets"]} == {"measured"}
    assert all(o["host_evidence"].startswith("other clocks") for o in doc["offsets"])


def test_synth_cli_writes_single_gpu_hosts(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kineto_comm.cli import app

    out = tmp_path / "job"
    args = ["synth", "clock-skew", "--ranks", "2", "--single-gpu-hosts", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    truth = json.loads((out / "truth.json").read_text())
    assert truth["ranks_per_host"] == 1
    assert 500_000 <= abs(truth["clock_offsets_ns"]["1"]) <= 1_500_000


def test_unknown_hosts_are_measured_too(single_gpu_hosts) -> None:
    """Told nothing of the hosts (`unknown`), the single-GPU hosts' job is measured the same
    way: a host per rank, the same offsets as the whole analysis found."""
    folder, _ = single_gpu_hosts["dp"]
    report = analyze(folder, jobs=1)
    keyed = match_keys(
        report.collectives.with_columns(
            pl.col("start_ns", "end_ns")
            + pl.col("rank").replace_strict(report.offsets["rank"], report.offsets["offset_ns"])
        )
    )  # back on each rank's own clock
    ranks = report.ranks["rank"].to_list()
    grouping = pl.DataFrame(
        {"rank": ranks, "host": [f"rank {r}" for r in ranks], "host_source": ["unknown"] * 8}
    )
    out = fit_offsets(keyed, ranks, grouping)
    assert set(out["host_source"]) == {"measured"}
    assert out["offset_ns"].to_list() == report.offsets["offset_ns"].to_list()


def test_inconsistent_end_differences_keep_one_clock() -> None:
    """Two ranks on one device whose ends differ call by call by up to +-2 ms around 0 (no
    steady gap): one clock has calls end before they start, but a clock per rank explains
    them no better (its gap is insignificant, nothing applied), so the shared device's one
    clock stands and the evidence says why."""
    import random

    rng = random.Random(5)
    rows = []
    for call in range(40):
        t = 1_000_000_000 + call * 10_000_000
        late = rng.choice([-2_000_000, -1_000_000, 0, 1_000_000, 2_000_000])
        rows += [(call, 0, t, t + 50_000), (call, 1, t + late, t + late + 50_000)]
    keyed = pl.DataFrame(
        rows, schema=["instance", "rank", "start_ns", "end_ns"], orient="row"
    ).with_columns(device=pl.lit(0), collective=pl.lit("all_reduce"))
    grouping = pl.DataFrame(
        {"rank": [0, 1], "host": ["host 0"] * 2, "host_source": ["shared_device"] * 2}
    )
    out = fit_offsets(keyed, [0, 1], grouping)
    assert set(out["host_source"]) == {"shared_device"}
    assert (out["offset_ns"] == 0).all()
    evidence = out["host_evidence"][0]
    assert evidence.startswith("kept, the calls favour neither reading"), evidence
    assert out["estimate_ns"].null_count() == 2  # one host: nothing fitted across it
