"""What the hardware should give (issue 78): the table (kineto_comm/data/hardware.toml), each
rank's GPU from its trace header, each group's expected bus bandwidth and speed of light,
and NET101 / COMM101 measured against them, on generated jobs (whose healthy links are the
table's figures) and on the real captures (one GPU time-sliced: no expectation, no NET101)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from kineto_comm import Report, analyze
from kineto_comm.analysis.hardware import COLLECTIVES, gpu_of, load_table
from kineto_comm.errors import UsageError
from kineto_comm.rules_engine import run_rules
from kineto_comm.synth import generate
from tests.conftest import REPO, kernel, write_trace

DATA = REPO / "tests" / "data"
_CACHE: dict[tuple[str, str, int], tuple[Path, dict[str, Any]]] = {}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory):
    """job(scenario, layout, ranks) -> (folder, truth): a generated job on the generator's
    default model and hardware (an H100 SXM, links at the table's figures), made once."""

    def make(scenario: str, layout: str, ranks: int) -> tuple[Path, dict[str, Any]]:
        key = (scenario, layout, ranks)
        if key not in _CACHE:
            out = tmp_path_factory.mktemp(f"{scenario}-{layout}-{ranks}")
            _CACHE[key] = (out, generate(scenario, out, ranks=ranks, layout=layout, steps=3))
        return _CACHE[key]

    return make


# ------------------------------------------------------------------------------ the table


def test_every_entry_has_its_figures_and_their_sources() -> None:
    table = load_table()
    assert len(table["gpu"]) >= 14
    for key, entry in table["gpu"].items():
        assert entry["match"] and entry["link"], key
        assert set(entry["busbw_gbps"]) == set(COLLECTIVES), key
        assert entry["bf16_tflops"] > 0 and entry["hbm_tbps"] > 0, key
        for figure in ("busbw_gbps", "bf16_tflops", "hbm_tbps"):
            assert len(entry["source"][figure]) > 20, (key, figure)
    assert {"400G-IB", "200G-IB", "200G-RoCE", "100G-RoCE", "800G-IB"} <= set(table["network"])
    for name, net in table["network"].items():
        assert set(net["busbw_gbps"]) == set(COLLECTIVES), name
        assert len(net["source"]) > 20, name
        # Per GPU: never above its NIC's line rate (Gb/s / 8 = GB/s).
        line_rate = int(name.split("G-")[0]) / 8
        assert max(net["busbw_gbps"].values()) < line_rate, name


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),  # the real captures' header
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200"),  # the real H200 captures' header
        ("NVIDIA A100-SXM4-80GB", "a100-sxm"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie"),
        ("Tesla V100-SXM2-32GB", "v100-sxm"),
        ("Tesla V100-PCIE-16GB", "v100-pcie"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA L40S", "l40s"),
        ("AMD Instinct MI250X/MI250", "mi250x"),
        ("AMD Instinct MI300X", "mi300x"),
        ("AMD Instinct MI325X", "mi325x"),
        ("NVIDIA GH200 480GB", None),  # no entry: no guess
        ("NVIDIA GeForce RTX 4090", None),
        (None, None),
    ],
)
def test_device_names_find_their_model(name: str | None, key: str | None) -> None:
    assert gpu_of(name, load_table()) == key


def test_an_override_must_be_a_positive_number() -> None:
    with pytest.raises(ValueError, match="hardware.gpu.h100-sxm.busbw_gbps.all_reduce"):
        load_table({"gpu": {"h100-sxm": {"busbw_gbps": {"all_reduce": 0}}}})
    with pytest.raises(ValueError, match="hardware.gpu.mine.match"):
        load_table({"gpu": {"mine": {"busbw_gbps": {"all_reduce": 10}}}})
    # Names are matched by Polars (Rust regex): no look-behind.
    with pytest.raises(ValueError, match=r"'\(\?<!G\)X' is no pattern"):
        load_table({"gpu": {"mine": {"match": ["(?<!G)X"]}}})


# ---------------------------------------------------- expectations on a generated job


def _totals(report: Report) -> pl.DataFrame:
    return report.collective_totals().filter(pl.col("bytes") > 0)


def test_generated_job_runs_at_its_links_speed(job) -> None:
    folder, truth = job("baseline", "dp", 4)
    report = analyze(folder, jobs=1)
    hw = report.hardware
    assert hw["gpu"].to_list() == ["h100-sxm"] * 4
    assert hw["device_id"].to_list() == [0, 1, 2, 3]  # each rank's own device
    assert hw["sms"].to_list() == [132] * 4 and hw["compute_capability"][0] == "9.0"
    (row,) = report.expected_busbw.filter(pl.col("collective") == "all_reduce").iter_rows(
        named=True
    )
    assert row["scope"] == "intra-node" and row["link"] == "NVLink4/NVSwitch"
    assert row["expected_busbw_gbps"] == truth["process_groups"][0]["busbw_gbps"]
    inst = report.collective_instances.filter(pl.col("bytes") >= 16 << 20)
    sol = inst["busbw_gbps"] / inst["expected_busbw_gbps"]
    assert (inst["speed_of_light"] - sol).abs().max() < 1e-12
    # A healthy link, less its fixed latency per call: near its figure, never above it.
    assert inst["speed_of_light"].min() > 0.6 and inst["speed_of_light"].max() <= 1.0
    totals = _totals(report)
    assert totals["speed_of_light"].to_list() == pytest.approx(
        (totals["busbw_gbps"] / totals["expected_busbw_gbps"]).to_list(), rel=0.05
    )


def test_config_override_changes_the_expectation(job, tmp_path: Path) -> None:
    folder, _ = job("baseline", "dp", 4)
    base = _totals(analyze(folder, jobs=1)).row(0, named=True)
    config = tmp_path / "kineto-comm.toml"
    config.write_text("[hardware.gpu.h100-sxm.busbw_gbps]\nall_reduce = 240.0\n")
    over = _totals(analyze(folder, jobs=1, config=config)).row(0, named=True)
    assert over["expected_busbw_gbps"] == 240.0 != base["expected_busbw_gbps"]
    assert over["speed_of_light"] == pytest.approx(2 * base["speed_of_light"], rel=0.05)
    config.write_text('[hardware]\ngpu_model = "a100-sxm"\n')
    a100 = analyze(folder, jobs=1, config=config)
    assert set(a100.hardware["gpu"]) == {"a100-sxm"}
    assert set(a100.expected_busbw["expected_busbw_gbps"]) <= {235.0, 200.0}


def test_across_hosts_only_a_named_network_has_a_figure(job) -> None:
    folder, _ = job("baseline", "dp", 4)
    # Two hosts of two ranks: the default group spans them.
    alone = analyze(folder, jobs=1, ranks_per_host=2)
    assert alone.expected_busbw.height == 0
    assert _totals(alone)["speed_of_light"].null_count() == _totals(alone).height
    ib = analyze(folder, jobs=1, ranks_per_host=2, network="400G-IB")
    row = ib.expected_busbw.filter(pl.col("collective") == "all_reduce").row(0, named=True)
    net = load_table()["network"]["400G-IB"]["busbw_gbps"]["all_reduce"]
    # Each rank drives its own NIC: two on each host.
    assert row["scope"] == "inter-node" and row["expected_busbw_gbps"] == 2 * net
    assert row["network"] == "400G-IB"


# ------------------------------------------------------------------ NET101 and COMM101

LAYOUTS = ["dp", "fsdp", "tp-dp", "pp-dp"]


def _net101_first_within_10_percent(folder: Path, truth: dict[str, Any]) -> None:
    findings = analyze(folder, jobs=1).findings
    top = findings[0]
    assert top.code == "NET101", [(f.code, f.impact_ns_per_step) for f in findings]
    expected = truth["problems"][0]["impact_ns_per_step"]
    assert abs(top.impact_ns_per_step - expected) <= 0.1 * expected, (top, expected)
    assert top.process_group == truth["problems"][0]["pg_name"]
    if truth["layout"] != "pp-dp":  # a pipeline's sends: against the other pipeline
        assert top.evidence["reference"] == "hardware"
        assert "an H100 SXM NVLink4/NVSwitch" in top.message and "(nccl-tests)" in top.message
        assert 0.1 < top.evidence["speed_of_light"] < 0.4  # a link at a fifth of its speed


# pp-dp at 4 ranks (2 stages) on this model holds a larger standing cause, its pipeline's
# exposed sends (PIPE101, in the healthy job too): its slow link is checked at 8 (4 stages).
@pytest.mark.parametrize(("layout", "ranks"), [("dp", 4), ("fsdp", 4), ("tp-dp", 4), ("pp-dp", 8)])
def test_slow_link_found_against_the_hardware_with_no_options(job, layout: str, ranks: int) -> None:
    _net101_first_within_10_percent(*job("slow-link", layout, ranks))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["dp", "fsdp", "tp-dp"])
def test_slow_link_found_on_the_generators_default_job(job, layout: str) -> None:
    """The generator's default job (8 ranks), as the issue's acceptance reads."""
    _net101_first_within_10_percent(*job("slow-link", layout, 8))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_healthy_links_have_no_net101(job, layout: str) -> None:
    folder, _ = job("baseline", layout, 4)
    assert [f for f in analyze(folder, jobs=1).findings if f.code == "NET101"] == []


def test_comm101_states_what_the_link_would_save(job) -> None:
    """COMM101's 'make it cheaper' line: the step with the calls at the link's figure."""

    def comm101(scenario: str) -> tuple[Any, dict[str, Any]]:
        folder, truth = job(scenario, "dp", 4)
        report = analyze(folder, jobs=1)
        # Info from any share: the slow link's all-reduce is mostly hidden (NET101's job).
        (f,) = run_rules(report, select=["COMM101"], options={"COMM101": {"info_share": 0.0}})
        return f, truth

    slow, truth = comm101("slow-link")
    line = slow.advice[-1]
    assert "480 GB/s, what an H100 SXM NVLink4/NVSwitch all_reduce reaches" in line
    assert f"{slow.evidence['at_hardware_saving_ns'] / 1e6:.2f} ms" in line
    assert slow.evidence["expected_busbw_gbps"] == 480.0
    # The link at a fifth of its speed: at its figure, the step gains what fixing it gains.
    fixed = truth["problems"][0]["impact_ns_per_step"]
    assert abs(slow.evidence["at_hardware_saving_ns"] - fixed) <= 0.1 * fixed
    healthy, _ = comm101("baseline")
    assert healthy.evidence["at_hardware_saving_ns"] < 0.05 * fixed


# ----------------------------------------------------------------------- real captures

REAL = ["h100-nccl/ddp-4", "h100-nccl/tp-dp-8", "h100-nccl/ep-4", "h200-nccl/pp-dp-8"]


def _no_net101_on_a_shared_gpu(folder: Path) -> None:
    report = analyze(folder, jobs=1)
    model = "h200" if "h200" in folder.parent.name else "h100-sxm"
    assert set(report.hardware["gpu"]) == {model}
    assert report.expected_busbw.height == 0  # ranks on one device: no expectation
    codes = [f.code for f in report.findings]
    assert "NET101" not in codes
    if report.ranks.height > 1 and report.collective_instances.height:
        assert "CAPT101" in codes  # the verdict NET101 stands down on


def test_a_capture_told_its_ranks_are_apart_reads_a_sliver_of_the_network() -> None:
    """Told each rank is a host of its own, across 400G-IB, the shared-GPU capture's
    groups get the network's figure and reach under 1% of it; CAPT101 then cannot see the
    shared GPU, and NET101 still reports nothing: no call is as large as the figures are
    measured at (hardware_min_bytes)."""
    report = analyze(DATA / "h100-nccl" / "ddp-4", jobs=1, ranks_per_host=1, network="400G-IB")
    assert set(report.expected_busbw["scope"]) == {"inter-node"}
    assert report.collective_totals()["speed_of_light"].max() < 0.01
    assert report.collective_instances["bytes"].max() < 16 << 20
    assert "NET101" not in [f.code for f in report.findings]


@pytest.mark.parametrize("rel", REAL)
def test_real_shared_gpu_captures_have_no_net101(rel: str) -> None:
    _no_net101_on_a_shared_gpu(DATA / rel)


@pytest.mark.slow
@pytest.mark.parametrize(
    "folder",
    sorted(p for d in ("h100-nccl", "h200-nccl") for p in (DATA / d).iterdir() if p.is_dir()),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_every_real_capture_has_no_net101(folder: Path) -> None:
    _no_net101_on_a_shared_gpu(folder)


@pytest.mark.parametrize("rel", ["gloo/tp-dp-4", "gloo/pp-1f1b-4"])
def test_gloo_captures_have_no_device_and_no_expectation(rel: str) -> None:
    report = analyze(DATA / rel, jobs=1, network="400G-IB")
    assert report.hardware["gpu"].null_count() == report.hardware.height
    assert report.expected_busbw.height == 0
    assert "NET101" not in [f.code for f in report.findings]


# ---------------------------------------------------------------------------- bad input


def test_bad_network_or_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    folder = str(DATA / "gloo" / "ddp-stack-2")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "kineto_comm", "report", folder, *args]
        # This checkout's package, whatever is installed; no config found upward.
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return subprocess.run(
            cmd, capture_output=True, text=True, check=False, cwd=tmp_path, env=env
        )

    out = run("--network", "300G-IB")
    assert out.returncode == 2 and "network '300G-IB'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    config = tmp_path / "kineto-comm.toml"
    config.write_text("[hardware]\nnetwrk = '400G-IB'\n")
    out = run("--config", str(config))
    assert out.returncode == 2 and str(config) in out.stderr and "netwrk" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    config.write_text("[hardware.gpu.h100-sxm.busbw_gbps]\nall_reduce = 'fast'\n")
    with pytest.raises(UsageError, match="all_reduce must be a number"):
        analyze(folder, config=config)


def test_damaged_device_properties_lose_a_field_not_the_file(tmp_path: Path) -> None:
    """A header's deviceProperties with values of the wrong kind: those values are unknown,
    the file and its other fields are read; the rank's device is the entry of its id."""
    from kineto_comm.load.decode import decode_file

    devices = [
        {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "numSms": 108},
        {"id": "1", "name": "NVIDIA H100 80GB HBM3", "numSms": "lots", "computeMajor": 9},
    ]
    path = write_trace(
        tmp_path / "rank-0.pt.trace.json",
        [kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 10.0, 5.0, device=1)],
        deviceProperties=devices,
    )
    raw = decode_file(path)
    assert raw.devices[1] == {
        "id": 1,
        "name": "NVIDIA H100 80GB HBM3",
        "sms": None,
        "memory_bytes": None,
        "compute_capability": "9.0",
    }
    report = analyze(path, jobs=1)
    (row,) = report.hardware.iter_rows(named=True)
    assert row["device_id"] == 1 and row["gpu"] == "h100-sxm" and row["sms"] is None
