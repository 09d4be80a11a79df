"""Tests for kineto_comm.capture and the shipped real captures in sample_traces/.

The sample-trace tests use only json/gzip so they run without torch: they pin the
facts the analyser relies on (one file per rank, distinct distributedInfo.rank,
ProfilerStep markers, gloo communication spans). The end-to-end capture tests need
torch and are marked ``capture``.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import shared

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"

# Shipped capture dir -> (ranks, communication span names every rank must hold).
EXPECTED_SAMPLES: dict[str, tuple[int, set[str]]] = {
    "ddp-4": (4, {"gloo:all_reduce", "c10d::allreduce_"}),
    "pp-4": (4, {"gloo:send", "gloo:recv", "c10d::send", "c10d::recv_"}),
    "tp-2": (2, {"gloo:all_reduce", "c10d::allreduce_"}),
    "fsdp-2": (2, {"gloo:all_gather", "c10d::_allgather_base_", "c10d::_reduce_scatter_base_"}),
    "ep-4": (4, {"gloo:all_to_all", "c10d::alltoall_base_"}),
}

COMM_PREFIXES = ("gloo:", "nccl:", "c10d::")


def load_trace(path: Path) -> dict[str, Any]:
    """Read one gzip-compressed Kineto JSON trace."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def complete_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The duration ('X') events of a trace."""
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def profiler_steps(trace: dict[str, Any]) -> list[str]:
    """Names of the ProfilerStep#N markers, in file order."""
    return [e["name"] for e in complete_events(trace) if e["name"].startswith("ProfilerStep#")]


def comm_names(trace: dict[str, Any]) -> Counter[str]:
    """Count communication spans: gloo:*/nccl:* spans, c10d:: ops, record_param_comms."""
    return Counter(
        e["name"]
        for e in complete_events(trace)
        if e["name"].startswith(COMM_PREFIXES) or e["name"] == "record_param_comms"
    )


def check_capture_dir(directory: Path, ranks: int, required: set[str]) -> list[dict[str, Any]]:
    """Assert a capture directory holds one valid trace per rank; return the traces."""
    files = sorted(directory.glob("rank-*.pt.trace.json.gz"))
    assert [f.name for f in files] == [f"rank-{r}.pt.trace.json.gz" for r in range(ranks)]
    traces = [load_trace(f) for f in files]
    seen_ranks = []
    for r, trace in enumerate(traces):
        info = trace["distributedInfo"]
        assert info["rank"] == r
        assert info["world_size"] == ranks
        assert info["pg_config"] and info["pg_config"][0]["pg_size"] == ranks
        seen_ranks.append(info["rank"])
        steps = profiler_steps(trace)
        assert len(steps) >= 2 and len(set(steps)) == len(steps), steps
        names = comm_names(trace)
        assert required <= set(names), f"rank {r} lacks {required - set(names)}"
    assert sorted(seen_ranks) == list(range(ranks))
    return traces


# --------------------------------------------------------------------------- shipped samples


@pytest.mark.parametrize("name", sorted(EXPECTED_SAMPLES))
def test_shipped_sample(name: str) -> None:
    ranks, required = EXPECTED_SAMPLES[name]
    traces = check_capture_dir(SAMPLES / name, ranks, required)
    for trace in traces:
        assert trace["distributedInfo"]["backend"] == "gloo"
        assert len(profiler_steps(trace)) == 3
        # Every c10d op is carried out by exactly one gloo:* span (the issued work).
        names = comm_names(trace)
        c10d = sum(n for k, n in names.items() if k.startswith("c10d::"))
        gloo = sum(n for k, n in names.items() if k.startswith("gloo:"))
        assert c10d == gloo > 0


# c10d dispatcher op -> the gloo span that carries it out (reduce-scatter is an all-reduce).
C10D_TO_GLOO = {
    "c10d::allreduce_": "gloo:all_reduce",
    "c10d::_allgather_base_": "gloo:all_gather",
    "c10d::_reduce_scatter_base_": "gloo:all_reduce",
    "c10d::send": "gloo:send",
    "c10d::recv_": "gloo:recv",
    "c10d::alltoall_base_": "gloo:all_to_all",
}


@pytest.mark.parametrize("name", sorted(EXPECTED_SAMPLES))
def test_shipped_c10d_ops_pair_with_gloo_spans_in_order(name: str) -> None:
    """The n-th c10d op (by ts) is carried out by the n-th gloo span, which starts no earlier.

    This is the pairing sample_traces/README.md documents (there is no id linking them).
    """
    ranks, _ = EXPECTED_SAMPLES[name]
    for r in range(ranks):
        events = complete_events(load_trace(SAMPLES / name / f"rank-{r}.pt.trace.json.gz"))
        c10d = sorted((e for e in events if e["name"].startswith("c10d::")), key=lambda e: e["ts"])
        gloo = sorted((e for e in events if e["name"].startswith("gloo:")), key=lambda e: e["ts"])
        assert len(c10d) == len(gloo) > 0
        for op, span in zip(c10d, gloo, strict=True):
            assert C10D_TO_GLOO[op["name"]] == span["name"]
            assert span["ts"] >= op["ts"]
            if op["name"] in ("c10d::allreduce_", "c10d::send", "c10d::recv_"):
                assert op["args"]["Input Dims"][0] == span["args"]["Input Dims"]


def test_shipped_samples_are_small() -> None:
    for name in EXPECTED_SAMPLES:
        size = sum(f.stat().st_size for f in (SAMPLES / name).glob("*.gz"))
        assert 0 < size < 1_500_000, (name, size)


def test_shipped_pp_sends_match_receives() -> None:
    """Pipeline p2p: rank r's sends to peer p equal p's receives from r (Concrete Inputs)."""
    sends: Counter[tuple[int, int]] = Counter()
    recvs: Counter[tuple[int, int]] = Counter()
    for r in range(4):
        trace = load_trace(SAMPLES / "pp-4" / f"rank-{r}.pt.trace.json.gz")
        for e in complete_events(trace):
            if e["name"] == "c10d::send":
                sends[(r, int(e["args"]["Concrete Inputs"][2]))] += 1
            elif e["name"] == "c10d::recv_":
                recvs[(int(e["args"]["Concrete Inputs"][2]), r)] += 1
    assert sends == recvs
    # 4 micro-batches x 3 steps, activations forward and gradients backward.
    assert set(sends) == {(0, 1), (1, 2), (2, 3), (1, 0), (2, 1), (3, 2)}
    assert set(sends.values()) == {12}


def test_gloo_point_to_point_calls_are_paired_through_their_ops() -> None:
    """gloo's send/recv annotations name no peer: the analyser takes it from the c10d op
    that made each call (the k-th gloo:send of a rank is its k-th c10d::send), so every
    transfer of the shipped pipeline capture has the peer its op's Concrete Inputs name,
    and each send meets its peer's recv in one point-to-point instance."""
    from kineto_comm import analyze

    report = analyze(SAMPLES / "pp-4", jobs=1)
    calls = report.collectives.filter(pl.col("collective").is_in(["send", "recv"]))
    assert calls.height == 144 and calls["peer"].null_count() == 0
    sent = calls.filter(pl.col("collective") == "send").group_by("rank", "peer").len()
    assert set(sent.select("rank", "peer").iter_rows()) == {
        (0, 1),
        (1, 2),
        (2, 3),
        (1, 0),
        (2, 1),
        (3, 2),
    }
    p2p = report.collective_instances.filter(pl.col("collective") == "send_recv")
    assert p2p.height == 72 and (p2p["key_kind"] == "p2p").all()
    assert (p2p["ranks_seen"] == 2).all()


@pytest.mark.parametrize("job", [SAMPLES / "ep-4", REPO / "tests" / "data" / "h100-nccl" / "ep-4"])
def test_uneven_all_to_all_bytes_are_what_each_rank_sent_and_received(job: Path) -> None:
    """ep-4, gloo (sizes from the c10d op) and NCCL (all_to_allv's split sizes in the
    kernels' args): per call, the analyser's input and output sizes are what the capturing
    script routed (ep_tokens x hidden x 4 bytes): the dispatch sends the rank's tokens and
    receives its expert's, the combine the reverse, and backward repeats both. What the rank
    sends differs from what it receives, and `bytes` (the nccl-tests size) is the larger."""
    from kineto_comm import analyze
    from kineto_comm.capture.workloads import HIDDEN, ep_tokens

    report = analyze(job, jobs=1, ignore=["ALL"])
    assert report.errors == ()
    tokens = ep_tokens(4)
    calls = report.collectives.filter(pl.col("step") >= 0).sort("rank", "start_ns")
    assert set(calls["collective"]) == {"all_to_all"}
    summary = report.collective_summary()
    for rank in range(4):
        sent = sum(tokens[rank]) * HIDDEN * 4
        received = sum(tokens[src][rank] for src in range(4)) * HIDDEN * 4
        mine = calls.filter(pl.col("rank") == rank)
        assert mine.height == 12  # 4 exchanges x 3 steps
        pairs = list(zip(mine["in_bytes"], mine["out_bytes"], strict=True))
        assert pairs == [(sent, received), (received, sent)] * 6, (rank, pairs[:4])
        assert (mine["bytes"] == max(sent, received)).all()
        row = summary.filter(pl.col("rank") == rank)
        assert row["in_bytes"].item() == row["out_bytes"].item() == 6 * (sent + received)
    assert {sum(t) for t in tokens} != {sum(t[d] for t in tokens) for d in range(4)}


def test_an_older_trace_reads_received_sizes_from_the_c10d_op() -> None:
    """HTA's 16-rank NCCL trace records no sizes in record_param_comms: the annotation has
    only the input, the c10d op [output, input]. An uneven all-to-all's received size and
    an all-gather's full output come from the op (nccl-tests counts the output)."""
    from kineto_comm import analyze

    report = analyze(shared("hta/negative_queue_length_values_check"), ignore=["ALL"])
    calls = report.collectives
    a2a = calls.filter(pl.col("collective") == "all_to_all")
    assert a2a.height and a2a["out_nelems"].null_count() == 0
    assert (a2a["in_nelems"] != a2a["out_nelems"]).any()  # uneven: sends != receives
    pairs = set(zip(a2a["out_nelems"], a2a["in_nelems"], strict=True))
    assert (2883584, 3145728) in pairs  # the first alltoall_fwd_single's op: [[2883584], [3145728]]
    gather = calls.filter(pl.col("collective") == "all_gather")
    assert gather.height and (gather["out_nelems"] > gather["in_nelems"]).all()
    assert (gather["bytes"] == gather["out_bytes"]).all()


def test_shipped_ddp_allreduce_sizes_agree_across_ranks() -> None:
    """Every DDP rank all-reduces the same bucket sizes (several buckets: bucket_cap_mb=0.1)."""
    per_rank = []
    for r in range(4):
        trace = load_trace(SAMPLES / "ddp-4" / f"rank-{r}.pt.trace.json.gz")
        dims = sorted(
            e["args"]["Input Dims"][0][0]
            for e in complete_events(trace)
            if e["name"] == "gloo:all_reduce"
        )
        per_rank.append(dims)
    assert all(d == per_rank[0] for d in per_rank)
    assert len(set(per_rank[0])) > 1  # more than one bucket size


# --------------------------------------------------------------------------- without torch


def test_import_and_validation_without_torch() -> None:
    """kineto_comm.capture imports with torch unimportable, and capture() says why it fails."""
    code = """
import sys
sys.modules["torch"] = None  # acts as not installed: import fails, find_spec gives None
import kineto_comm.capture as cap
assert sys.modules["torch"] is None
assert not [m for m in sys.modules if m.startswith("torch.")]
try:
    cap.capture("nope", "/tmp/x")
except cap.CaptureError as exc:
    assert "unknown layout" in str(exc), exc
else:
    raise SystemExit("unknown layout accepted")
try:
    cap.capture("ddp", "/tmp/x")
except cap.CaptureError as exc:
    assert "needs torch" in str(exc), exc
else:
    raise SystemExit("capture ran without torch")
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


@pytest.mark.parametrize(
    ("layout", "ranks", "message"),
    [
        ("pp", 1, "pp needs"),
        ("pp-1f1b", 9, "pp-1f1b needs"),
        ("tp", 3, "tp needs"),
        ("tp-dp", 6 - 4, "tp-dp needs"),
        ("tp-dp", 5, "tp-dp needs"),
        ("pp-dp", 2, "pp-dp needs"),
        ("pp-dp", 6 - 1, "pp-dp needs"),
        ("ddp", 0, "ranks must"),
    ],
)
def test_bad_arguments_rejected(layout: str, ranks: int, message: str, tmp_path: Path) -> None:
    from kineto_comm.capture import CaptureError, capture

    with pytest.raises(CaptureError, match=message):
        capture(layout, tmp_path, ranks=ranks)
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- real capture


@pytest.mark.capture
@pytest.mark.parametrize(
    ("layout", "required"),
    [
        ("ddp", {"gloo:all_reduce", "c10d::allreduce_"}),
        ("pp", {"gloo:send", "gloo:recv"}),
        ("pp-1f1b", {"gloo:send", "gloo:recv"}),
    ],
)
@pytest.mark.slow
def test_capture_end_to_end(layout: str, required: set[str], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from kineto_comm.capture import capture

    out = tmp_path / layout
    paths = capture(
        layout, out, ranks=2, steps=2, backend="gloo", bucket_cap_mb=0.1, micro_batches=2
    )
    assert paths == [out / "rank-0.pt.trace.json.gz", out / "rank-1.pt.trace.json.gz"]
    for p in paths:
        with p.open("rb") as fh:
            assert fh.read(2) == b"\x1f\x8b"  # gzip magic
    traces = check_capture_dir(out, 2, required)
    for trace in traces:
        assert len(profiler_steps(trace)) == 2
    # ... and the fresh capture goes through the analyser end to end.
    from kineto_comm import analyze

    report = analyze(out, jobs=1)
    assert report.errors == ()
    assert report.ranks["rank"].to_list() == [0, 1]
    assert set(report.ranks["timeline"]) == {"host"}
    assert report.collectives.height > 0
    assert (report.steps.filter(report.steps["step"] >= 0).group_by("rank").len()["len"] == 2).all()
    if layout.startswith("pp"):
        # The last stage's schedule: GPipe receives both micro-batches, then sends both
        # gradients; 1F1B sends each gradient before the next receive.
        calls = report.collectives.filter((pl.col("rank") == 1) & (pl.col("step") >= 0))
        for _, rows in calls.sort("start_ns").group_by("step", maintain_order=True):
            kinds = rows["collective"].to_list()
            want = ["recv", "send"] * 2 if layout == "pp-1f1b" else ["recv"] * 2 + ["send"] * 2
            assert kinds == want, (layout, kinds)


@pytest.mark.slow
@pytest.mark.capture
def test_pipeline_and_data_parallel_capture_on_gloo(tmp_path: Path) -> None:
    """pp-dp on 4 gloo ranks: stage 0 is ranks 0-1, stage 1 ranks 2-3 (pipelines 0-2 and
    1-3), and the analyser finds those stages; each rank all-reduces its stage's gradients
    once a step, after its sends and receives."""
    pytest.importorskip("torch")
    from kineto_comm import analyze
    from kineto_comm.capture import capture

    out = tmp_path / "pp-dp"
    capture("pp-dp", out, ranks=4, steps=2, backend="gloo", micro_batches=2)
    check_capture_dir(out, 4, {"gloo:send", "gloo:recv", "gloo:all_reduce"})
    report = analyze(out, jobs=1)
    assert report.errors == ()
    found = report.pipeline.group_by("stage").agg(pl.col("rank").unique().sort()).sort("stage")
    assert found["rank"].to_list() == [[0, 1], [2, 3]]
    calls = report.collectives.filter(pl.col("step") >= 0).sort("rank", "start_ns")
    last = calls.group_by("rank", "step", maintain_order=True).agg(pl.col("collective").last())
    assert set(last["collective"]) == {"all_reduce"}
    assert (
        calls.group_by("rank", "step").agg((pl.col("collective") == "all_reduce").sum())[
            "collective"
        ]
        == 1
    ).all()


def test_every_capture_entry_point_records_two_complete_steps_by_default() -> None:
    """The last profiled step is cut at its last kernel and left out of the step time, so
    the default must record 3 for 2 complete steps: the library, `python -m
    kineto_comm.capture` and `kineto-comm capture` agree on it (no torch needed)."""
    import inspect

    import typer.main

    from kineto_comm.capture.__main__ import build_parser
    from kineto_comm.capture.runner import STEPS, capture
    from kineto_comm.cli import app

    assert STEPS >= 3
    assert inspect.signature(capture).parameters["steps"].default == STEPS
    assert build_parser().parse_args(["--layout", "ddp", "--out", "x"]).steps == STEPS
    command = typer.main.get_command(app).commands["capture"]  # type: ignore[attr-defined]
    (option,) = [p for p in command.params if p.name == "steps"]
    assert option.default == STEPS


@pytest.mark.slow
@pytest.mark.capture
def test_a_default_capture_has_two_complete_steps_and_no_step_warning(tmp_path: Path) -> None:
    """A gloo DDP capture with the default steps: the report finds two complete steps and
    says nothing about resting on one."""
    pytest.importorskip("torch")
    from kineto_comm import analyze
    from kineto_comm.capture import capture

    out = tmp_path / "ddp"
    capture("ddp", out, ranks=2, backend="gloo", bucket_cap_mb=0.1)
    report = analyze(out, jobs=1)
    complete = report.step_times.filter(pl.col("complete") & (pl.col("step") >= 0))
    assert complete.height >= 2
    assert not [w for w in report.warnings if "profiled step" in w]


@pytest.mark.slow
@pytest.mark.capture
def test_capture_cli(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "tp"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kineto_comm.capture",
            "--layout",
            "tp",
            "--ranks",
            "2",
            "--steps",
            "2",
            "--out",
            str(out),
            "--backend",
            "gloo",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(out / f"rank-{r}.pt.trace.json.gz") for r in range(2)]
    check_capture_dir(out, 2, {"gloo:all_reduce", "c10d::allreduce_"})


# ------------------------------------------------------------------ real H100 captures


@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
def test_h100_world_size_one_capture(layout: str) -> None:
    """A real NCCL capture on one GPU: device time is all there, nothing is communication,
    and the report says why rather than showing an empty table without a reason."""
    import polars as pl

    from kineto_comm import analyze

    path = REPO / "tests" / "data" / "h100-nccl" / layout
    trace = load_trace(path / "rank-0.pt.trace.json.gz")
    device_events = [
        e for e in complete_events(trace) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    report = analyze(path, jobs=1)
    assert report.errors == ()
    assert report.ranks.row(0, named=True)["device"] == "NVIDIA H100 80GB HBM3"
    assert report.ranks["world_size"].to_list() == [1]
    assert report.kernels.height == len(device_events)
    assert report.collectives.height == 0
    assert report.totals["comm_ns"].to_list() == [0]
    # DDP still calls all_reduce on one rank; FSDP2 calls no collective at all.
    calls = sum(1 for e in complete_events(trace) if e["name"].startswith("nccl:"))
    assert (calls > 0) == (layout == "ddp")
    said = [w for w in report.warnings if "world size 1" in w]
    expected = f"world size 1: its {calls} collective calls moved no data between ranks"
    assert [expected in w for w in said] == ([True] if calls else [])
    # Sub-microsecond memsets keep their exact length (HTA reads them as -1 us).
    memsets = sorted(
        round(e["dur"] * 1000) for e in complete_events(trace) if e.get("cat") == "gpu_memset"
    )
    ours = report.kernels.filter(pl.col("kind") == "memset")
    assert sorted((ours["end_ns"] - ours["start_ns"]).to_list()) == memsets


# The kernels' own "Collective name" -> our canonical collective.
_NCCL_NAMES = {
    "allreduce": "all_reduce",
    "_allgather_base": "all_gather",
    "_reduce_scatter_base": "reduce_scatter",
    "send": "send",
    "recv": "recv",
    "all_to_allv": "all_to_all",
}


@pytest.mark.parametrize(
    ("folder", "role"),
    [
        ("ddp-4", "data_parallel"),
        ("ddp-8", "data_parallel"),
        ("tp-2", "tensor_parallel"),
        ("fsdp-2", "fsdp"),
        ("fsdp-4", "fsdp"),
        ("pp-4", "pipeline"),
        ("ep-4", "unknown"),  # no annotation names the all-to-all's purpose
    ],
)
def test_h100_multi_rank_nccl_capture(folder: str, role: str) -> None:
    """Real NCCL kernels of several ranks (on one GPU, tests/data/h100-nccl/README.md): every
    communication kernel in the files is a call, with the collective and size its own args
    name, matched across all ranks of its group, and the one process group gets the role of
    the layout that made it.

    DDP's gradient all-reduces start early on the wall clock here (communication takes ~90 %
    of the step), yet after ~40 % of the step's compute: the role must follow the compute."""
    import polars as pl

    from kineto_comm import analyze

    path = REPO / "tests" / "data" / "h100-nccl" / folder
    files = sorted(path.glob("rank-*.pt.trace.json.gz"))
    report = analyze(path, jobs=1)
    assert report.errors == ()
    assert report.ranks["rank"].to_list() == list(range(len(files)))
    assert set(report.ranks["backend"].to_list()) == {"nccl"}
    for rank, file in enumerate(files):
        events = complete_events(load_trace(file))
        kernels = [
            e["args"]
            for e in sorted(events, key=lambda e: e["ts"])
            if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_")
        ]
        ours = report.collectives.filter(pl.col("rank") == rank).sort("start_ns")
        assert ours.height == len(kernels) > 0
        assert ours["in_nelems"].to_list() == [a["In msg nelems"] for a in kernels]
        named = [_NCCL_NAMES[a["Collective name"]] for a in kernels]
        assert ours["collective"].to_list() == named
    instances = report.collective_instances
    point_to_point = instances["collective"] == "send_recv"
    assert (instances.filter(~point_to_point)["ranks_seen"] == len(files)).all()
    assert (instances.filter(point_to_point)["ranks_seen"] == 2).all()
    groups = report.process_groups
    assert groups["process_group"].to_list() == ["0"]
    assert groups["role"].to_list() == [role], groups["evidence"][0]


def test_h100_tensor_and_data_parallel_capture() -> None:
    """Real NCCL capture of tensor parallel in pairs and data parallel across them (tp-dp-8,
    tests/data/h100-nccl/README.md): each call is matched across its whole group, the pairs
    are tensor-parallel and the groups across them data-parallel, with the layout's ranks.
    Every rank is on the one GPU, so on one host and one clock: no offset is applied. Only
    a clock per rank (ranks_per_host=1) takes each pair's steady end gap (2.24 ms) for an
    offset and puts the pair's all-reduce ends within 10 us of each other."""
    import polars as pl

    from kineto_comm import analyze

    report = analyze(REPO / "tests" / "data" / "h100-nccl" / "tp-dp-8", jobs=1)
    assert report.errors == ()
    assert report.ranks["rank"].to_list() == list(range(8))
    groups = {r["process_group"]: r for r in report.process_groups.iter_rows(named=True)}
    pairs = [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert sorted(g["ranks"] for g in groups.values()) == sorted(
        [*pairs, [0, 2, 4, 6], [1, 3, 5, 7]]
    )
    for g in groups.values():
        want = "tensor_parallel" if g["ranks"] in pairs else "data_parallel"
        assert g["role"] == want, g["evidence"]
    instances = report.collective_instances
    sizes = {name: len(g["ranks"]) for name, g in groups.items()}
    assert all(
        r["ranks_seen"] == sizes[r["process_group"]] for r in instances.iter_rows(named=True)
    )
    assert (report.offsets["offset_ns"] == 0).all()
    per_rank = analyze(REPO / "tests" / "data" / "h100-nccl" / "tp-dp-8", jobs=1, ranks_per_host=1)
    in_pairs = per_rank.collective_instances.filter(pl.col("group_size") == 2)
    spread = in_pairs.group_by("process_group").agg(
        (pl.col("last_end_ns") - pl.col("first_end_ns")).median()
    )
    assert (spread["last_end_ns"] < 10_000).all(), spread


def _stage_params(stage: int, stages: int) -> int:
    """Parameters a pp-dp stage holds (the capture's tiny transformer split in `stages`):
    the ground truth of its gradient all-reduce's size, from the model's shapes alone."""
    from kineto_comm.capture import workloads as w

    h, f = w.HIDDEN, w.FFN
    block = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    embed = w.VOCAB * h + w.SEQ * h
    head = 2 * h + h * w.VOCAB + w.VOCAB
    blocks = max(w.LAYERS, stages) // stages
    return blocks * block + (embed if stage == 0 else 0) + (head if stage == stages - 1 else 0)


@pytest.mark.parametrize("world", [4, 8])
def test_h200_pipeline_and_data_parallel_capture(world: int) -> None:
    """Real NCCL capture of pipelines across data-parallel replicas (pp-dp: 2 stages of 2
    ranks from 4, 4 stages of 2 from 8; batched sends and receives; tests/data/h200-nccl),
    in Megatron's rank order: the pipelines' groups are strided and pipeline, the stages'
    groups contiguous and data parallel; the pipeline table finds the stages with the
    layout's ranks; every activation and gradient is 16,384 bytes and each stage
    all-reduces, once a step, exactly the parameters it holds."""
    from kineto_comm import analyze
    from kineto_comm.capture.workloads import pp_depth

    report = analyze(REPO / "tests" / "data" / "h200-nccl" / f"pp-dp-{world}", jobs=1)
    assert report.errors == ()
    depth = pp_depth(world)
    dp = world // depth
    stages = [list(range(s * dp, (s + 1) * dp)) for s in range(depth)]
    pipes = [list(range(d, world, dp)) for d in range(dp)]
    roles = {tuple(g["ranks"]): g["role"] for g in report.process_groups.iter_rows(named=True)}
    assert roles == {
        **{tuple(s): "data_parallel" for s in stages},
        **{tuple(p): "pipeline" for p in pipes},
    }
    found = report.pipeline.group_by("stage").agg(pl.col("rank").unique().sort()).sort("stage")
    assert found["rank"].to_list() == stages, found
    calls = report.collectives.filter(pl.col("step") >= 0)
    p2p = calls.filter(pl.col("collective").is_in(["send", "recv"]))
    assert set(p2p["bytes"].to_list()) == {16_384}
    reduce = calls.filter(pl.col("collective") == "all_reduce")
    per = reduce.group_by("rank", "step").agg(pl.len(), pl.col("in_nelems").first())
    assert (per["len"] == 1).all()
    want = {r: _stage_params(r // dp, depth) for r in range(world)}
    assert {r: n for r, n in per.select("rank", "in_nelems").unique().iter_rows()} == want


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """A stage's sends and receives in one step of Megatron-LM's 1F1B schedule, in order
    (collective, peer stage), written from the schedule's definition: warm-up forwards
    (receive, then send on), one receive more, then per steady micro-batch the forward's
    send with the backward's receive, then the backward's send with the next forward's
    receive, then the cool-down's receives and sends."""
    prev = [] if stage == 0 else [stage - 1]
    nxt = [] if stage == stages - 1 else [stage + 1]
    warmup = min(stages - stage - 1, micro_batches)
    ops: list[tuple[str, int]] = []
    for _ in range(warmup):
        ops += [("recv", r) for r in prev] + [("send", r) for r in nxt]
    if warmup < micro_batches:
        ops += [("recv", r) for r in prev]
    for j in range(micro_batches - warmup):
        ops += [("send", r) for r in nxt] + [("recv", r) for r in nxt]
        ops += [("send", r) for r in prev]
        if warmup + j + 1 < micro_batches:
            ops += [("recv", r) for r in prev]
    for _ in range(warmup):
        ops += [("recv", r) for r in nxt] + [("send", r) for r in prev]
    return ops


def test_the_1f1b_capture_runs_megatrons_schedule() -> None:
    """Real gloo capture of Megatron-LM's 1F1B schedule (pp-1f1b, 4 stages, 4 micro-batches;
    tests/data/gloo): each stage's sends and receives in every step are the schedule's, in
    its order; the analyser pairs every one of them and finds the stages and micro-batches."""
    from kineto_comm import analyze

    report = analyze(REPO / "tests" / "data" / "gloo" / "pp-1f1b-4", jobs=1)
    assert report.errors == ()
    calls = report.collectives.filter(pl.col("step") >= 0).sort("rank", "start_ns")
    steps = calls["step"].unique().sort().to_list()
    assert len(steps) == 3
    for (rank, step), rows in calls.group_by("rank", "step", maintain_order=True):
        got = list(rows.select("collective", "peer").iter_rows())
        assert got == one_f_one_b(int(rank), 4, 4), (rank, step)
    inst = report.collective_instances
    assert inst.height == 3 * 3 * 8 and (inst["ranks_seen"] == 2).all()
    pipe = report.pipeline.filter(pl.col("step") >= 0)
    assert (pipe["stage"] == pipe["rank"]).all()
    assert set(pipe["stages"]) == {4} and set(pipe["micro_batches"]) == {4}


def test_batched_point_to_point_kernels_take_their_batchs_ops() -> None:
    """NCCL's batch_isend_irecv launches one ncclDevKernel_SendRecv per batch, inside a
    `nccl:coalesced` span, and neither names the group, the peer nor the size; the batch's
    send and recv ops recorded them before (pytorch/pytorch#194693). In pp-dp-4 each batch
    holds one op: every kernel is that op, in the order the trace's record_param_comms
    give, and every transfer is matched with its peer's. In pp-dp-8 the middle stages'
    batches send to one stage and receive from another in one kernel: those keep their
    pipeline group, and no peer or size is made up for them."""
    from kineto_comm import analyze

    h200 = REPO / "tests" / "data" / "h200-nccl"
    report = analyze(h200 / "pp-dp-4", jobs=1)
    for rank in range(4):
        events = complete_events(load_trace(h200 / "pp-dp-4" / f"rank-{rank}.pt.trace.json.gz"))
        ops = [
            e["args"]
            for e in sorted(events, key=lambda e: e["ts"])
            if e["name"] == "record_param_comms"
            and e["args"].get("Collective name") in ("send", "recv")
        ]
        calls = report.collectives.filter(
            (pl.col("rank") == rank) & pl.col("name").str.contains("SendRecv")
        ).sort("launch_ns")
        assert calls.height == len(ops) == 24
        assert calls["collective"].to_list() == [a["Collective name"] for a in ops]
        assert calls["process_group"].to_list() == [a["Process Group Name"] for a in ops]
        peers = [a.get("Dst Rank", a.get("Src Rank")) for a in ops]
        assert calls["peer"].to_list() == peers
        assert set(calls["bytes"]) == {16_384}
    p2p = report.collective_instances.filter(pl.col("collective") == "send_recv")
    assert p2p.height == 48 and (p2p["ranks_seen"] == 2).all()

    report = analyze(h200 / "pp-dp-8", jobs=1)
    calls = report.collectives.filter(pl.col("name").str.contains("SendRecv"))
    middle = pl.col("rank").is_in([2, 3, 4, 5])
    both = calls.filter(pl.col("collective") == "send_recv")
    assert both.height > 0 and both.filter(~middle).height == 0
    assert both["peer"].null_count() == both.height
    assert set(both["in_bytes"]) == set(both["out_bytes"]) == {16_384}
    pipes = {0: "1", 1: "2"}  # pipelines 0-2-4-6 and 1-3-5-7
    assert all(g == pipes[r % 2] for r, g in both.select("rank", "process_group").iter_rows())
    ends = calls.filter(~middle)
    assert set(ends["collective"]) == {"send", "recv"} and set(ends["bytes"]) == {16_384}


@pytest.mark.parametrize("world", [4, 8])
def test_the_analytical_model_predicts_the_pp_dp_captures(world: int) -> None:
    """Anthony et al.'s check on a real job: the analytical model of the capture's own
    configuration (its parameter count from the model's shapes, 2 or 4 stages, 2 replicas,
    4 micro-batches of 2 x 32 tokens, fp32) against the NCCL traces, per rank and step: the
    data-parallel all-reduce and the pipeline sends and receives agree in calls and bytes,
    the middle stages' batched kernels (one send and one receive each) included."""
    from kineto_comm import analyze
    from kineto_comm.analytic import ModelConfig, compare, expected
    from kineto_comm.capture import workloads as w

    depth = w.pp_depth(world)
    config = ModelConfig(
        params=sum(_stage_params(s, depth) for s in range(depth)),
        layers=max(w.LAYERS, depth),
        hidden=w.HIDDEN,
        vocab=w.VOCAB,
        seq=w.SEQ,
        micro_batch=2,  # the capture's 2 x micro_batches sequences, in micro_batches chunks
        micro_batches=4,
        dtype="fp32",
        dp=world // depth,
        pp=depth,
        tied_embeddings=False,
        bucket_mb=1000,
    )
    report = analyze(REPO / "tests" / "data" / "h200-nccl" / f"pp-dp-{world}", jobs=1)
    table = compare(expected(config), report)
    rows = {(r["role"], r["collective"]): r for r in table.iter_rows(named=True)}
    assert set(rows) == {
        ("data_parallel", "all_reduce"),
        ("pipeline", "send"),
        ("pipeline", "recv"),
    }
    for row in rows.values():
        assert not row["flagged"], row
        assert abs(row["calls_dev_pct"]) < 0.5 and abs(row["bytes_dev_pct"]) < 0.5, row


def test_a_failed_worker_is_named_on_the_errors_first_line() -> None:
    """The command line prints a capture error's first line only: it must hold the failing
    rank and its problem, taken from the traceback torch.multiprocessing hands the parent
    (this one as a worker of an early pp-dp layout wrote it)."""
    from kineto_comm.capture.runner import _worker_reason

    text = (
        "\n\n-- Process 2 terminated with the following error:\nTraceback (most recent call "
        'last):\n  File "spawn.py", line 87, in _wrap\n    fn(i, *args)\nRuntimeError: rank 2: '
        "cannot unpack non-iterable NoneType object\nTraceback (most recent call last):\n  File "
        '"workloads.py", line 430, in exchange\nTypeError: cannot unpack non-iterable NoneType '
        "object\n"
    )
    assert _worker_reason(text) == "rank 2: cannot unpack non-iterable NoneType object"
    assert _worker_reason("Traceback:\n  x\nValueError: bad\n") == "ValueError: bad"


def test_ranks_sharing_a_gpu_get_a_nccl_host_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL refuses two ranks on one device of one host: each rank sharing a GPU gets a host
    id of its own (what made tests/data/h100-nccl/*-N); a user's own NCCL settings stay."""
    import os

    from kineto_comm.capture.runner import _share_gpu

    monkeypatch.delenv("NCCL_HOSTID", raising=False)
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    _share_gpu(3)
    assert os.environ["NCCL_HOSTID"] == "kineto-comm-rank-3"
    assert os.environ["NCCL_SOCKET_IFNAME"] == "lo"
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("NCCL_HOSTID", "mine")
    _share_gpu(1)
    assert (os.environ["NCCL_HOSTID"], os.environ["NCCL_SOCKET_IFNAME"]) == ("mine", "eth0")
