"""Issue #76 section 4: advice that fits the framework in the trace.

Each test reads a real trace, checks what the `framework` table says the job uses (against
what the trace's annotations and calls show), and that the findings' advice never names a
setting already in use nor one the framework rejects in the schedule seen.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import polars as pl
import pytest

import kineto_comm
from kineto_comm.report import Report

from .conftest import REPO, SAMPLES, shared

H100 = REPO / "tests" / "data" / "h100-nccl"
GLOO = REPO / "tests" / "data" / "gloo"


@cache
def report(path: Path) -> Report:
    """The job's report, analysed once per test run."""
    return kineto_comm.analyze(path)


def used(r: Report, kind: str) -> pl.DataFrame:
    """The framework table's rows of one kind."""
    return r.framework.filter(pl.col("kind") == kind)


def finding(r: Report, code: str, contains: str = "") -> object:
    """The first finding of `code` whose title holds `contains`; fails when none."""
    hits = [f for f in r.findings if f.code == code and contains in f.title]
    assert hits, f"no {code} finding ({contains!r}) among {[f.code for f in r.findings]}"
    return hits[0]


def advice_of(r: Report) -> list[str]:
    """Every advice line of every finding."""
    return [line for f in r.findings for line in f.advice]


# Advice that recommends a setting, by what the framework table shows makes it wrong.
BATCH_P2P = re.compile(r"torch\.distributed\.batch_isend_irecv|use batch_isend_irecv", re.I)
FSDP1_FLAGS = ("BackwardPrefetch", "forward_prefetch=True", "limit_all_gathers")


def misfits(r: Report) -> list[str]:
    """The advice lines that name a setting the trace shows in use, or one its framework
    rejects in the schedule seen (the acceptance check of issue #76 section 4)."""
    frameworks = set(used(r, "framework")["name"].to_list())
    schedules = set(used(r, "schedule")["name"].to_list())
    together = used(r, "p2p").height > 0
    bad = []
    for line in advice_of(r):
        if together and BATCH_P2P.search(line):
            bad.append(line)
        if "fsdp2" in frameworks and any(flag in line for flag in FSDP1_FLAGS):
            bad.append(line)
        pipelined = "torchrec_pipeline" in frameworks and "TrainPipelineSparseDist" in line
        if pipelined and "already" not in line:
            bad.append(line)
        if "torchrec" in frameworks and "CUDA graph" in line and "no CUDA graph" not in line:
            bad.append(line)
        if schedules and "interleaved" not in schedules and "--overlap-p2p-communication" in line:
            bad.append(line)
    return bad


def test_the_1f1b_capture_is_seen_as_1f1b_with_its_p2p_issued_together() -> None:
    # The capture runs Megatron's 1F1B schedule and exchanges with each neighbour by one
    # batch_isend_irecv (tests/data/gloo/README.md): every stage shows both.
    r = report(GLOO / "pp-1f1b-4")
    assert used(r, "schedule")["name"].unique().to_list() == ["1f1b"]
    assert sorted(used(r, "schedule")["rank"].to_list()) == [0, 1, 2, 3]
    assert sorted(used(r, "p2p").filter(pl.col("name") == "overlapped")["rank"]) == [0, 1, 2, 3]


def test_pipe101_on_1f1b_rests_on_nothing_in_use_or_rejected() -> None:
    r = report(GLOO / "pp-1f1b-4")
    f = finding(r, "PIPE101")
    assert r.findings[0].code == "PIPE101"
    assert "1F1B theory" in f.message
    assert f.evidence["schedule"] == "1f1b" and f.evidence["p2p_issued_together"]
    text = " ".join(f.advice)
    # Megatron's p2p overlap needs the interleaved schedule and replaces batched p2p.
    assert "--overlap-p2p-communication" not in text
    assert not BATCH_P2P.search(text)
    # The transfers' saving is still there, with the route that can buy it.
    hide = [line for line in f.advice if "point-to-point transfers" in line]
    assert hide and "already go out together" in hide[0]
    assert "--num-layers-per-virtual-pipeline-stage" in hide[0]
    assert f.evidence["hidden_transfers_saving_ns"] > 0
    assert misfits(r) == []


def test_gpipe_is_named_gpipe_not_1f1b() -> None:
    # The H100 pipeline runs GPipe (tests/data/gloo/README.md: the only 1F1B capture is the
    # gloo one): its last stage receives every micro-batch before it sends a gradient.
    r = report(H100 / "pp-4")
    assert used(r, "schedule")["name"].unique().to_list() == ["gpipe"]
    f = finding(r, "PIPE101")
    assert "GPipe theory" in f.message and "1F1B theory" not in f.message
    assert f.evidence["schedule"] == "gpipe"
    assert any("1F1B has the same bubble" in line for line in f.advice)
    assert not any("--overlap-p2p-communication" in line for line in f.advice)
    assert misfits(r) == []


def test_fsdp2_gets_fully_shard_knobs_not_fsdp1_flags() -> None:
    r = report(SAMPLES / "fsdp-2")
    frameworks = used(r, "framework")
    assert sorted(frameworks.filter(pl.col("name") == "fsdp2")["rank"]) == [0, 1]
    assert "fsdp1" not in frameworks["name"].to_list()
    gather = finding(r, "COMM102", "all_gather")
    assert gather.advice[0].startswith("FSDP2")
    assert "reshard_after_forward" in gather.advice[0]
    assert "set_modules_to_forward_prefetch" in gather.advice[0]
    assert not any(flag in line for line in gather.advice for flag in FSDP1_FLAGS)
    assert misfits(r) == []


def test_torchrec_pipeline_is_not_advised_where_it_runs() -> None:
    r = report(shared("hta/negative_queue_length_values_check"))
    assert "torchrec_pipeline" in used(r, "framework")["name"].to_list()
    lines = [line for line in advice_of(r) if "TrainPipelineSparseDist" in line]
    assert lines and all("already" in line for line in lines)
    assert misfits(r) == []


def test_the_blocking_copy_in_sparse_data_dist_is_named() -> None:
    # Each step's `## sparse_data_dist ##` holds a cudaMemcpyAsync to pageable memory
    # (aten::to) that keeps the CPU 139-147 ms: the CPU's time goes there.
    r = report(shared("hta/negative_queue_length_values_check"))
    copies = used(r, "blocking_copy").filter(pl.col("within") == "## sparse_data_dist ##")
    assert copies.height == 1
    per_step = copies["ns_per_step"].item()
    step_ns = int(r.step_times["step_ns"].median())
    assert 100e6 < per_step < step_ns
    phase = used(r, "phase").filter(pl.col("name") == "## sparse_data_dist ##")
    assert per_step <= phase["ns_per_step"].item()
    named = [line for line in advice_of(r) if "`## sparse_data_dist ##`" in line]
    assert named and "blocks the CPU" in named[0]
    assert f"{per_step / 1e6:.2f} ms per step" in named[0]


def test_host_bound_torchrec_step_names_the_shampoo_step_not_cuda_graphs() -> None:
    r = report(shared("hta/trace_filter"))
    shampoo = used(r, "optimizer").filter(pl.col("name") == "Shampoo")
    assert shampoo["rank"].sort().to_list() == [0, 1]
    f = finding(r, "SYNC106")
    step_ns = f.evidence["step_ns"]
    share = shampoo["ns_per_step"].mean() / step_ns
    assert 0.25 < share < 0.40
    assert "Shampoo.step" in f.advice[0] and f"({share:.0%} of the step)" in f.advice[0]
    assert not any(line.startswith("Launch the step as a CUDA graph") for line in f.advice)
    assert any("no CUDA graph" in line for line in f.advice)
    assert misfits(r) == []


@pytest.mark.parametrize("job", ["h100-nccl/tp-2", "sample_traces/tp-2"])
def test_tensor_parallel_groups_are_not_told_to_pack_sequences(job: str) -> None:
    # Both ranks of a tensor-parallel group see one batch: packing cannot even them.
    path = SAMPLES / "tp-2" if job.startswith("sample") else H100 / "tp-2"
    # The H100 capture read as one GPU per rank (--ranks-per-host 1): as captured its ranks
    # share one GPU and CAPT101's advice replaces any balancing (test_diagnosis_capture.py).
    r = kineto_comm.analyze(path, ranks_per_host=1) if path.parent == H100 else report(path)
    assert set(r.process_groups["role"].to_list()) == {"tensor_parallel"}
    imbalance = [f for f in r.findings if f.code in ("SYNC101", "SYNC104")]
    assert imbalance, [f.code for f in r.findings]
    for f in imbalance:
        assert not any(re.search(r"(?i)pack(ing)? sequences|packing per rank", x) for x in f.advice)
        assert any("tensor-parallel" in line for line in f.advice)
    # The tensor-parallel overlap advice stays (by hand on gloo, Megatron-LM's on NCCL).
    tp = finding(r, "COMM101", "tensor-parallel")
    overlap = ("--sequence-parallel", "async_op=True")
    assert any(w in line for line in tp.advice for w in overlap) or "too little" in tp.title


def test_data_parallel_imbalance_still_advises_packing() -> None:
    # Data-parallel ranks each read their own batch: there packing evens the work. Read as
    # one GPU per rank (--ranks-per-host 1): as captured the 8 ranks share one GPU with the
    # same work and no balancing is advised (test_diagnosis_capture.py).
    r = kineto_comm.analyze(H100 / "tp-dp-8", ranks_per_host=1)
    f = finding(r, "SYNC104")
    assert any("pack sequences" in line for line in f.advice)


def _jobs() -> list[object]:
    """Every real job folder of the expert review, the slow mark on those the tests above
    do not read already."""
    read = {GLOO / "pp-1f1b-4", H100 / "pp-4", SAMPLES / "fsdp-2", H100 / "tp-2"}
    folders = sorted(
        {
            p.parent
            for base in (H100, REPO / "tests" / "data" / "h200-nccl", GLOO, SAMPLES)
            for p in base.rglob("*.pt.trace.json.gz")
        }
    )
    folders += [
        shared(f"hta/{name}")
        for name in ("trace_filter", "negative_queue_length_values_check", "df_index_resolver")
    ]
    return [
        pytest.param(p, id=p.name, marks=() if p in read else pytest.mark.slow) for p in folders
    ]


@pytest.mark.parametrize("job", _jobs())
def test_no_advice_names_a_setting_in_use_or_rejected(job: Path) -> None:
    assert misfits(report(job)) == []


@pytest.mark.parametrize(
    "path",
    [H100 / "ddp", shared("hta/nccl_parser_config")],
    ids=["h100-ddp", "hta-nccl_parser_config"],
)
def test_foreach_in_use_is_not_advised_again(path: Path) -> None:
    """h100 ddp (AdamW) and hta nccl_parser_config (SGD) run torch.optim's foreach path
    (multi_tensor_apply kernels, expert review): the framework table says so, and SYNC106's
    advice says it is in use instead of advising foreach=True; a trace without such kernels
    (h100 launch-eager) still gets it."""
    r = report(path)
    assert set(used(r, "in_use")["name"]) == {"foreach"}
    lines = [a for f in r.findings if f.code == "SYNC106" for a in f.advice]
    assert lines and not any("foreach=True" in a for a in lines)
    assert any("foreach kernels already" in a or "foreach is in use" in a for a in lines)
    eager = report(H100 / "launch-eager")
    assert used(eager, "in_use").height == 0
    assert any("foreach=True" in a for f in eager.findings if f.code == "SYNC106" for a in f.advice)


def test_tensor_parallel_advice_fits_the_backend() -> None:
    """Megatron-LM's --tp-comm-overlap needs NCCL and GPUs: on the gloo tp-dp-4 capture the
    tensor-parallel finding recommends the overlap by hand instead (expert review), while
    an NCCL job's keeps the Megatron-LM line."""
    tp = finding(report(GLOO / "tp-dp-4"), "COMM101", "tensor-parallel")
    assert not any(line.startswith("Megatron-LM") for line in tp.advice), tp.advice
    assert any("async_op=True" in line for line in tp.advice), tp.advice
    from kineto_comm.rules_api import Platform
    from kineto_comm_builtin_rules.exposed_comm import ADVICE, advice_for

    lines = ADVICE[("tensor_parallel", "all_reduce")]
    assert advice_for(Platform("nccl", False), lines)[0].startswith("Megatron-LM")
    assert not advice_for(Platform("gloo", False), lines)[0].startswith("Megatron-LM")


def test_launch_bound_advice_names_the_largest_cpu_phase_first() -> None:
    """hta nccl_parser_config: the forward and backward hold the CPU ~103 ms a step each, the
    optimizer 15 ms; SYNC106's first line names the passes before the optimizer (expert
    review: it named only the optimizer's 7%)."""
    r = report(shared("hta/nccl_parser_config"))
    phases = used(r, "phase")
    passes = phases.filter(pl.col("name").str.contains("## (forward|backward) ##"))
    optimizer = used(r, "optimizer")["ns_per_step"].max()
    assert passes["ns_per_step"].min() > optimizer  # the trace's own ordering
    line = finding(r, "SYNC106").advice[0]
    assert line.index("## backward ##") < line.index("optimizer step"), line
    assert line.index("## forward ##") < line.index("optimizer step"), line


def test_torch_compile_seen_from_its_cpu_ops() -> None:
    """hta df_index_resolver runs a torch.compile'd graph (CompiledFunction and
    CompiledFunctionBackward CPU ops) whose kernels are not Triton's: the framework table
    shows torch_compile in use from the ops, and SYNC106 no longer advises
    torch.compile(mode="reduce-overhead") as if it were not there (expert review)."""
    r = report(shared("hta/df_index_resolver"))
    assert "torch_compile" in used(r, "in_use")["name"].to_list()
    assert "inductor" not in used(r, "in_use")["name"].to_list()
    advice = " ".join(finding(r, "SYNC106").advice)
    assert "torch.compile is in use" in advice
    assert 'torch.compile(mode="reduce-overhead")' not in advice
    # A trace without a compiled graph shows none.
    plain = report(shared("hta/nccl_parser_config"))
    assert "torch_compile" not in used(plain, "in_use")["name"].to_list()
