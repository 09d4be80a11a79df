"""Launch the distributed workers, profile them, and write one Kineto trace per rank.

Why this exists: the analyser needs *real* Kineto traces of communication to be
tested against, not only synthetic ones. This module runs a tiny transformer
training loop under ``torch.distributed`` (one process per rank, on loopback) inside
``torch.profiler`` and exports ``rank-{r}.pt.trace.json.gz`` for every rank.

torch is imported lazily (inside functions) so that importing this module, and the
rest of kineto-comm, never needs torch.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from kineto_comm.capture.config import CaptureConfig, CaptureError

LAYOUTS: tuple[str, ...] = ("ddp", "fsdp", "pp", "pp-1f1b", "pp-dp", "tp", "tp-dp", "ep")
"""Parallelism layouts :func:`capture` knows how to run."""

TRACE_NAME = "rank-{rank}.pt.trace.json.gz"
"""File name of one rank's trace inside the output directory."""

# Recorded steps by default: the last of a trace is cut at its last kernel and left out of
# the step time (steptime.step_times), so 3 leave 2 complete steps to average (the report
# warns under 2).
STEPS = 3
# Profiler schedule: one skipped step, one warm-up step, then ``steps`` recorded steps.
_WAIT = 1
_WARMUP = 1


def trace_path(out_dir: str | Path, rank: int) -> Path:
    """Path of rank ``rank``'s trace in ``out_dir``."""
    return Path(out_dir) / TRACE_NAME.format(rank=rank)


def _import_torch() -> Any:
    """Import torch or raise a :class:`CaptureError` that says how to get it."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise CaptureError(
            "capturing traces needs torch: pip install 'kineto-comm[capture]' "
            "(or python -m pip install torch==2.13.0)"
        ) from exc
    return torch


def default_backend(world_size: int) -> str:
    """nccl when CUDA is available with at least one GPU per rank, else gloo."""
    torch = _import_torch()
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def _free_port() -> int:
    """Ask the OS for a free TCP port on loopback for the rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _validate(
    layout: str,
    ranks: int,
    steps: int,
    micro_batches: int,
    bucket_cap_mb: float,
    backend: str | None,
) -> None:
    """Reject arguments the layouts cannot run with, before any process is started."""
    if layout not in LAYOUTS:
        raise CaptureError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    if ranks < 1:
        raise CaptureError(f"ranks must be >= 1, got {ranks}")
    if steps < 1:
        raise CaptureError(f"steps must be >= 1, got {steps}")
    if micro_batches < 1:
        raise CaptureError(f"micro_batches must be >= 1, got {micro_batches}")
    if bucket_cap_mb <= 0:
        raise CaptureError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")
    if backend is not None and backend not in ("gloo", "nccl"):
        raise CaptureError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    from kineto_comm.capture.workloads import check_layout_ranks

    problem = check_layout_ranks(layout, ranks)
    if problem:
        raise CaptureError(problem)


def capture(
    layout: str,
    out_dir: str | Path,
    *,
    ranks: int = 2,
    steps: int = STEPS,
    backend: str | None = None,
    bucket_cap_mb: float = 25.0,
    micro_batches: int = 4,
    seed: int = 0,
    with_stack: bool = False,
) -> list[Path]:
    """Run a tiny transformer training loop on `ranks` processes under torch.distributed with
    torch.profiler; write one Kineto trace per rank (rank-{r}.pt.trace.json.gz) and return
    their paths.

    Layouts: ``ddp`` (DistributedDataParallel, ``bucket_cap_mb``), ``fsdp`` (FSDP2
    ``fully_shard``), ``pp`` (GPipe pipeline over ``ranks`` stages with ``micro_batches``
    micro-batches, ``dist.isend``/``dist.recv``), ``pp-1f1b`` (the same stages on Megatron-LM's
    1F1B schedule, batched sends and receives), ``pp-dp`` (pipelines of 2 stages, of 4 from 8
    ranks on, across data-parallel replicas, with batched sends and receives; each stage's
    gradients all-reduced after the flush),
    ``tp`` (Megatron column/row-parallel linears with ``all_reduce`` in forward and backward),
    ``tp-dp`` (tensor parallel in pairs, DDP across them) and ``ep`` (uneven all-to-all).
    ``with_stack`` records Python call stacks and modules too (torch.profiler's
    `with_stack` and `with_modules`): the trace then holds a `python_function` event per
    Python call, as many users' traces do, and each rank's `truth-rank-{r}.json` says which
    phase and module issued each collective call (kineto_comm.capture.truth).

    If ``RANK`` and ``WORLD_SIZE`` are set (e.g. under ``torchrun``), this process acts as
    that one rank, ``ranks`` is taken from ``WORLD_SIZE``, and only its own trace path is
    returned. Otherwise ``ranks`` workers are started with ``torch.multiprocessing.spawn``
    on 127.0.0.1 and a free port.
    """
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if torchrun:
        ranks = int(os.environ["WORLD_SIZE"])
    _validate(layout, ranks, steps, micro_batches, bucket_cap_mb, backend)
    torch = _import_torch()
    chosen = backend or default_backend(ranks)
    if chosen == "nccl" and not torch.cuda.is_available():
        raise CaptureError("backend 'nccl' needs CUDA GPUs; none are available (use gloo)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = CaptureConfig(
        layout=layout,
        out_dir=str(out),
        world_size=ranks,
        steps=steps,
        backend=chosen,
        bucket_cap_mb=bucket_cap_mb,
        micro_batches=micro_batches,
        seed=seed,
        with_stack=with_stack,
    )

    if torchrun:
        rank = int(os.environ["RANK"])
        run_worker(rank, cfg, init_method="env://")
        return [trace_path(out, rank)]

    import torch.multiprocessing as mp

    init_method = f"tcp://127.0.0.1:{_free_port()}"
    try:
        mp.spawn(_spawn_entry, args=(cfg, init_method), nprocs=ranks, join=True)
    except mp.ProcessRaisedException as exc:
        text = str(exc)
        raise CaptureError(
            f"{layout} capture failed in a worker: {_worker_reason(text)}\n{text}"
        ) from None
    except mp.ProcessExitedException as exc:
        raise CaptureError(f"{layout} capture: a worker died: {exc}") from None
    paths = [trace_path(out, r) for r in range(ranks)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise CaptureError(f"workers finished but traces are missing: {', '.join(missing)}")
    return paths


def _worker_reason(text: str) -> str:
    """The one line that says why a worker failed, from the traceback the parent receives:
    the "rank N: problem" that _spawn_entry raised, else the traceback's last line (the
    command line prints a capture error's first line only)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        _, sep, reason = line.partition(": ")
        if sep and reason.startswith("rank ") and reason[5:].split(":")[0].isdigit():
            return reason
    return lines[-1] if lines else "no message"


def _spawn_entry(rank: int, cfg: CaptureConfig, init_method: str) -> None:
    """Target of ``torch.multiprocessing.spawn``: one rank's whole life."""
    try:
        run_worker(rank, cfg, init_method=init_method)
    except CaptureError:
        raise
    except Exception as exc:
        # Keep the worker's traceback in the message the parent turns into a CaptureError.
        raise RuntimeError(f"rank {rank}: {exc}\n{traceback.format_exc()}") from exc


def _share_gpu(rank: int) -> None:
    """Let NCCL run several ranks on one GPU (a capture on a one-GPU machine).

    NCCL refuses two ranks of a communicator on the same device of the same host. A host
    id of its own per rank (``NCCL_HOSTID``) makes each rank a host of its own, so NCCL
    accepts them and carries their traffic over loopback sockets (``NCCL_SOCKET_IFNAME=lo``).
    The kernels are real NCCL kernels; their durations include the ranks' time-slicing of
    the one GPU, so such a trace's bandwidths say nothing about the hardware.
    """
    os.environ.setdefault("NCCL_HOSTID", f"kineto-comm-rank-{rank}")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")


def run_worker(rank: int, cfg: CaptureConfig, *, init_method: str) -> Path:
    """Join the process group, run ``wait+warmup+steps`` profiled iterations, export.

    Returns the path of this rank's trace.
    """
    torch = _import_torch()
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    from kineto_comm.capture.truth import TRUTH, truth_path
    from kineto_comm.capture.workloads import build_workload

    # Several ranks share a couple of cores: one intra-op thread each avoids thrashing.
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if cfg.backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
        if torch.cuda.device_count() < cfg.world_size:
            _share_gpu(rank)

    kwargs: dict[str, Any] = {"backend": cfg.backend, "timeout": timedelta(minutes=5)}
    if init_method == "env://":
        kwargs["init_method"] = "env://"
    else:
        kwargs.update(init_method=init_method, rank=rank, world_size=cfg.world_size)
    if cfg.backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    rank = dist.get_rank()
    try:
        if cfg.with_stack:  # the attribution captures: each call's phase and module too
            TRUTH.install()
        step_fn: Callable[[], None] = build_workload(cfg, rank, device)
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        path = trace_path(cfg.out_dir, rank)

        def on_trace_ready(prof: Any) -> None:
            prof.export_chrome_trace(str(path))

        # On a GPU, the CUDA synchronization events too: the trace then records which
        # stream waited for which (cudaStreamWaitEvent), read by the dependency graph.
        experimental = None
        if device.type == "cuda":
            try:  # a private API: a torch without it records the trace without them
                from torch._C._profiler import _ExperimentalConfig

                experimental = _ExperimentalConfig(enable_cuda_sync_events=True)
            except (ImportError, TypeError):
                experimental = None
        with profile(
            activities=activities,
            schedule=schedule(wait=_WAIT, warmup=_WARMUP, active=cfg.steps, repeat=1),
            record_shapes=True,
            with_stack=cfg.with_stack,
            with_modules=cfg.with_stack,
            on_trace_ready=on_trace_ready,
            experimental_config=experimental,
        ) as prof:
            for i in range(_WAIT + _WARMUP + cfg.steps):
                TRUTH.active, TRUTH.step = i >= _WAIT + _WARMUP, i
                step_fn()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                prof.step()
        TRUTH.active = False
        if cfg.with_stack:
            TRUTH.write(truth_path(cfg.out_dir, rank))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return path
