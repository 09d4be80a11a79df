"""Shared test fixtures: the real traces in ../shared/traces and a tiny trace writer."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
SAMPLES = REPO / "sample_traces"
# Real CUDA captures made for this project (tests/data/h100-nccl/README.md).
H100_TRACES = sorted((REPO / "tests" / "data" / "h100-nccl").rglob("*.pt.trace.json.gz"))
# Real NCCL captures of the pp-dp layout on one H200 (tests/data/h200-nccl/README.md).
H200_TRACES = sorted((REPO / "tests" / "data" / "h200-nccl").rglob("*.pt.trace.json.gz"))
# Real gloo captures of layouts the shipped samples lack (tests/data/gloo/README.md).
GLOO_TRACES = sorted((REPO / "tests" / "data" / "gloo").rglob("*.pt.trace.json.gz"))


@pytest.fixture(autouse=True)
def _output_width_as_a_user_pipes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-xdist's workers run with COLUMNS=80 and `-n 0` without it: the text report
    follows COLUMNS, so each test starts as a user's piped output does (no COLUMNS: 120
    columns); a test of another width sets its own."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(autouse=True)
def _batches_must_not_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """decode_files decodes every file of a batch again, one by one, when building the
    batch raises (a bug must cost no file). That would hide the bug from every test that
    compares tables: here it fails the test. A test of that fallback patches over this."""
    from kineto_comm.load import decode

    real = decode._scanned_batch

    def strict(pending: Any) -> Any:
        try:
            return real(pending)
        except Exception as exc:
            pytest.fail(f"building a batch of rank files raised {exc!r}")

    monkeypatch.setattr(decode, "_scanned_batch", strict)


def shared(rel: str) -> Path:
    """Path of a real trace under ../shared/traces; fails (never skips) when it is missing."""
    path = SHARED_TRACES / rel
    if not path.exists():
        pytest.fail(f"real trace missing: {path} (../shared/traces must be present)")
    return path


def all_shared_traces() -> list[Path]:
    """Every trace file under ../shared/traces (fails when the folder is missing)."""
    if not SHARED_TRACES.is_dir():
        pytest.fail(f"{SHARED_TRACES} is missing: the real traces are required")
    files = sorted(p for p in SHARED_TRACES.rglob("*") if p.name.endswith((".json", ".json.gz")))
    assert len(files) >= 30, f"expected the shared trace set, found {len(files)} files"
    return files


def all_real_traces() -> list[Path]:
    """The shared real traces and this project's own GPU and gloo captures."""
    assert len(H100_TRACES) == 47, H100_TRACES
    assert len(H200_TRACES) == 12, H200_TRACES
    assert len(GLOO_TRACES) == 10, GLOO_TRACES
    return all_shared_traces() + H100_TRACES + H200_TRACES + GLOO_TRACES


# The real traces the default run reads in its every-trace tests: one of each kind (schema,
# vendor, hardware, layout, file form). The `slow` marker runs every one of them (CI does,
# .ci/run); the default run stays a few minutes on two cores.
QUICK_TRACES = (
    "_history/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",  # 2021 schema, CPU
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",  # ROCm, MI250
    "hta/nccl_parser_config/nccl_data.json.gz",  # NCCL on A100
    "kineto-tb-plugin/worker0.1623143089861.pt.trace.json.gz",  # 2021 schema, V100
    "hta/mtia_inference_trace/mtia_inference_rank_0.json.gz",  # MTIA
    "hta/call_stack/backward_thread.json",  # plain .json
    "hta/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",  # stream waits
    "hta/rank_unavailable/rank_not_found.json.gz",  # no rank in the file
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",  # ns timestamps
    "h100-nccl/pp-4/rank-0.pt.trace.json.gz",  # NCCL on H100, pipeline
    "h200-nccl/pp-dp-4/rank-2.pt.trace.json.gz",  # NCCL on H200, pipeline x data parallel
    "gloo/tp-dp-4/rank-0.pt.trace.json.gz",  # gloo on a CPU
    # Job folders, for the tests that read a whole job.
    "sample_traces/ddp-4",  # gloo, 4 ranks
    "h100-nccl/pp-4",  # NCCL pipeline
    "h100-nccl/tp-dp-8",  # NCCL tensor x data parallel
)


def is_quick(path: Path) -> bool:
    """Whether the default run reads `path` (a file or a job folder) in its every-trace
    tests (QUICK_TRACES)."""
    return any(path.as_posix().endswith("/" + q) for q in QUICK_TRACES)


def trace_params(paths: list[Path], ids: Any = None) -> list[Any]:
    """`paths` as test parameters, all but QUICK_TRACES marked `slow`; fails when none of
    QUICK_TRACES is among them (moved files must not leave the default run none)."""
    quick = [p for p in paths if is_quick(p)]
    assert quick, f"none of QUICK_TRACES among {len(paths)} traces"
    name = ids or (lambda p: f"{p.parent.name}/{p.name}")
    return [
        pytest.param(p, id=name(p), marks=() if is_quick(p) else pytest.mark.slow) for p in paths
    ]


def kernel(
    name: str,
    ts: float,
    dur: float,
    stream: int = 7,
    corr: int | None = None,
    cat: str = "kernel",
    **args: Any,
) -> dict[str, Any]:
    """A GPU activity event (device 0) in Kineto's layout."""
    a = {"device": 0, "stream": stream, **args}
    if corr is not None:
        a["correlation"] = corr
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": a,
    }


def launch(ts: float, corr: int, tid: int = 100, dur: float = 2.0) -> dict[str, Any]:
    """A cudaLaunchKernel runtime event on host thread `tid`."""
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr, "External id": corr},
    }


def host_wait(
    ts: float, dur: float, corr: int, name: str = "cudaStreamSynchronize", tid: int = 100
) -> dict[str, Any]:
    """A runtime call in which host thread `tid` waits for the device (a synchronisation or
    a poll), as Kineto records it."""
    return {**launch(ts, corr, tid, dur), "name": name}


def cpu(
    name: str, ts: float, dur: float, tid: int = 100, cat: str = "cpu_op", **args: Any
) -> dict[str, Any]:
    """A CPU op or annotation on host thread `tid`."""
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def write_trace(
    path: Path,
    events: list[dict[str, Any]],
    rank: int | None = 0,
    world_size: int | None = 2,
    indent: int | None = 1,
    **top: Any,
) -> Path:
    """Write a Kineto-style trace (gzip when the name ends in .gz)."""
    doc: dict[str, Any] = {"schemaVersion": 1}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
    if "deviceProperties" in top:  # before the events, where Kineto writes it
        doc["deviceProperties"] = top.pop("deviceProperties")
    doc["traceEvents"] = events
    doc.update(top)
    text = json.dumps(doc, indent=indent).encode()
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text))
    else:
        path.write_bytes(text)
    return path
