"""docs/custom-rule-example.py works as documented: loaded with --rules it fires on a storm of
small all-reduces and stays quiet on the healthy baseline; its options are honoured."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kineto_comm import analyze
from kineto_comm.cli import app
from kineto_comm.rules_engine import explain, registry, run_rules
from kineto_comm.synth import Hardware, ModelConfig, generate

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "custom-rule-example.py"
TINY = ModelConfig(layers=4, hidden=512, seq=512, micro_batch=2, vocab=2048, bucket_mb=2.0)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for scenario in ("baseline", "small-messages"):
        d = tmp_path_factory.mktemp(scenario)
        generate(scenario, d, ranks=2, steps=2, model=TINY, hardware=Hardware(tflops=10.0))
        out[scenario] = d
    return out


def test_example_rule_fires_on_storm_only(jobs: dict[str, Path]) -> None:
    report = analyze(jobs["small-messages"], jobs=1)
    storm = run_rules(report, select=["XMPL101"], extra_rules=[EXAMPLE])
    assert [f.code for f in storm] == ["XMPL101"]
    assert storm[0].evidence["calls_per_step"] > 200 and storm[0].ranks == (0, 1)
    # Its cost is its own estimate (no edit to replay): said so, and never over the step.
    own = (storm[0].evidence["calls_per_step"] - 200) * 15_000
    assert storm[0].claimed and storm[0].evidence["saving_method"] == "claimed by the rule"
    assert storm[0].impact_ns_per_step == min(own, report.savings["step_ns"])
    quiet = run_rules(analyze(jobs["baseline"], jobs=1), select=["XMPL101"], extra_rules=[EXAMPLE])
    assert quiet == ()
    # a higher limit silences it
    assert (
        run_rules(
            analyze(jobs["small-messages"], jobs=1),
            select=["XMPL101"],
            extra_rules=[EXAMPLE],
            options={"XMPL101": {"limit": 10_000}},
        )
        == ()
    )


def test_example_rule_through_cli_and_explain(jobs: dict[str, Path]) -> None:
    r = registry([EXAMPLE]).get("too-many-collectives")
    assert r.source == "file" and "How to fix" in explain(r)
    out = CliRunner().invoke(
        app, ["report", str(jobs["small-messages"]), "--rules", str(EXAMPLE), "-f", "json"]
    )
    assert out.exit_code in (0, 1), out.output  # 1: findings at or above --fail-on
    assert '"code": "XMPL101"' in out.output and "error:" not in out.output
