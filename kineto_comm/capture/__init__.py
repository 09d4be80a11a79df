"""Capture real multi-rank PyTorch Profiler (Kineto) traces of tiny training loops.

This package is the only part of kineto-comm that needs torch. It is imported
lazily: ``import kineto_comm.capture`` works without torch installed, and torch
is imported only when :func:`capture` (or a worker) actually runs.
"""

from __future__ import annotations

from kineto_comm.capture.runner import LAYOUTS, CaptureError, capture

__all__ = ["LAYOUTS", "CaptureError", "capture"]
