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
    with_model(report, config, hardware=None, source="file") -> Report   + model_comparison
    config_from_inferred(table) -> (ModelConfig | None, why)   the model a trace tells
    load_model(path) -> (ModelConfig, HardwareModel)  both from one TOML file
Formulas and citations: docs/analytic-model.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from .compare import compare, comparison_findings, measured
from .config import HardwareModel, ModelConfig, load_config, load_hardware
from .expected import bubble_fraction, expected
from .from_trace import config_from_inferred
from .render import render_comparison, render_model
from .whatif import what_if

if TYPE_CHECKING:
    from kineto_comm.report import Report


def with_model(
    report: Report,
    config: ModelConfig,
    hardware: HardwareModel | None = None,
    source: str = "file",
) -> Report:
    """The report with `model_comparison` (expected vs measured per role) filled in;
    `source` ("file": `--model`, "inferred": config_from_inferred) in its `model_source`
    column and the options, so MODEL101 can tell a stated configuration from one read back
    from the same trace."""
    table = compare(expected(config), report).with_columns(model_source=pl.lit(source))
    options = {**report.options, "model": dataclasses.asdict(config), "model_source": source}
    return dataclasses.replace(report, model_comparison=table, options=options)


def load_model(path: str | Path) -> tuple[ModelConfig, HardwareModel]:
    """(ModelConfig, HardwareModel) from one TOML file: what `--model` and `kineto-comm
    model` read. ValueError as one line naming the file (and the key, where one is wrong)."""
    path = Path(path)
    try:
        return load_config(path), load_hardware(path)
    except ValueError as exc:
        text = str(exc)  # reading and TOML errors name the file already
        raise ValueError(text if text.startswith(f"{path}:") else f"{path}: {text}") from None


__all__ = [
    "HardwareModel",
    "ModelConfig",
    "bubble_fraction",
    "compare",
    "comparison_findings",
    "config_from_inferred",
    "expected",
    "load_config",
    "load_hardware",
    "load_model",
    "measured",
    "render_comparison",
    "render_model",
    "what_if",
    "with_model",
]
