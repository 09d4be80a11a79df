"""Analytical communication model: what a training configuration should communicate.

    load_config(path) -> ModelConfig          the [model] table of a TOML file
    ModelConfig(**keys)                        the same from keyword arguments
    expected(config) -> pl.DataFrame           per role and collective, per rank and step
    bubble_fraction(config) -> float           (p-1)/(v*m + p-1)
    compare(expected_table, report, roles=None) -> pl.DataFrame   expected vs measured
    comparison_findings(table) -> list[Finding]   flagged rows as findings (model_deviation)
    render_comparison(table) -> str            the comparison as plain text
    what_if(config, vary, values, hardware=None) -> pl.DataFrame  communication share sweep
    render_model(config, hardware=None) -> str plain-text tables for `kineto-comm model`
    with_model(report, config, hardware=None) -> Report   report + its model_comparison table
Formulas and citations: docs/analytic-model.md.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .compare import compare, comparison_findings, measured
from .config import HardwareModel, ModelConfig, load_config, load_hardware
from .expected import bubble_fraction, expected
from .render import render_comparison, render_model
from .whatif import what_if

if TYPE_CHECKING:
    from kineto_comm.report import Report


def with_model(
    report: Report, config: ModelConfig, hardware: HardwareModel | None = None
) -> Report:
    """The report with `model_comparison` (expected vs measured per role) filled in."""
    table = compare(expected(config), report)
    options = {**report.options, "model": dataclasses.asdict(config)}
    return dataclasses.replace(report, model_comparison=table, options=options)


__all__ = [
    "HardwareModel",
    "ModelConfig",
    "bubble_fraction",
    "compare",
    "comparison_findings",
    "expected",
    "load_config",
    "load_hardware",
    "measured",
    "render_comparison",
    "render_model",
    "what_if",
    "with_model",
]
