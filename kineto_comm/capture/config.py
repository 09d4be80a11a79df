"""What a capture run is told (CaptureConfig) and how it fails (CaptureError): below the
runner, which launches the workers, and the workloads they run, which both read them.
"""

from __future__ import annotations

from dataclasses import dataclass


class CaptureError(RuntimeError):
    """A capture could not run (bad arguments, torch missing, or a layout unsupported)."""


@dataclass(frozen=True)
class CaptureConfig:
    """Everything a worker needs to know; picklable so it crosses ``spawn``."""

    layout: str
    out_dir: str
    world_size: int
    steps: int
    backend: str
    bucket_cap_mb: float
    micro_batches: int
    seed: int
    with_stack: bool = False
