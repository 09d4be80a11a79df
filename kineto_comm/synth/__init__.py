"""Synthetic multi-rank PyTorch Profiler (Kineto) traces with known ground truth.

`generate(scenario, out_dir, ranks=8, layout="dp", ...)` simulates one training job (a
layout: dp, fsdp, tp-dp, pp-dp) with one injected problem (a scenario: baseline,
exposed-allreduce, straggler, bubble, small-messages, slow-link, clock-skew) and writes a
Kineto trace per rank, as current Kineto writes them, plus `truth.json`: what was injected
and the step time that fixing it recovers, simulated without it.

Why: real traces say what happened, never what should have; the tests and the benches
check each finding's place and saving against this truth (bench/scenario_matrix.py). Output
is byte-identical for the same arguments. The layouts, durations, scenarios and truth.json's
fields in full: docs/synth.md.
"""

from .config import Hardware, ModelConfig
from .generate import LAYOUTS, SCENARIOS, generate

__all__ = ["LAYOUTS", "SCENARIOS", "Hardware", "ModelConfig", "generate"]
