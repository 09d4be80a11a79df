"""`report --model`, `kineto-comm model` and the MODEL101 rule on synthetic jobs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kineto_comm.cli import app
from kineto_comm.synth import generate

MODEL = """
[model]
layers = {layers}
hidden = {hidden}
seq = {seq}
micro_batch = {micro_batch}
micro_batches = {micro_batches}
vocab = {vocab}
dtype = "bfloat16"
grad_dtype = "{grad}"
bucket_mb = {bucket_mb}
dp = {dp}
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    truth = generate("baseline", folder / "traces", ranks=4, layout="dp", steps=2)
    return folder, truth


def _config(folder, truth, grad: str):
    m = truth["model"]
    path = folder / f"model-{grad}.toml"
    path.write_text(
        MODEL.format(
            grad=grad,
            dp=truth["parallelism"]["dp"],
            **{
                k: m[k]
                for k in (
                    "layers",
                    "hidden",
                    "seq",
                    "micro_batch",
                    "micro_batches",
                    "vocab",
                    "bucket_mb",
                )
            },
        )
    )
    return path


def _report(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(app, ["report", *map(str, args), "-f", "json", "--exit-zero"])
    assert result.exit_code == 0, result.output
    return result.exit_code, json.loads(result.stdout)


def test_matching_model_gives_no_deviation(job):
    folder, truth = job
    _, doc = _report(folder / "traces", "--model", _config(folder, truth, "bfloat16"))
    rows = doc["model_comparison"]
    assert rows and all(abs(r["bytes_dev_pct"]) < 1 for r in rows)
    assert not [f for f in doc["findings"] if f["code"] == "MODEL101"]


def test_fp32_gradient_config_is_flagged_with_its_cause(job):
    folder, truth = job
    _, doc = _report(folder / "traces", "--model", _config(folder, truth, "float32"))
    found = [f for f in doc["findings"] if f["code"] == "MODEL101"]
    assert len(found) == 1
    assert found[0]["evidence"]["bytes_dev_pct"] == pytest.approx(-50.0, abs=1)
    assert found[0]["advice"]  # the likely causes


def test_no_model_file_the_inferred_configuration(job):
    """Without --model the comparison is of the configuration inferred from the trace, and
    agrees with it (a plain data-parallel job: no MODEL101 finding)."""
    folder, truth = job
    _, doc = _report(folder / "traces")
    assert doc["model_comparison"]
    assert {r["model_source"] for r in doc["model_comparison"]} == {"inferred"}
    assert doc["summary"]["configuration"]["dp"] == truth["parallelism"]["dp"]
    assert not [f for f in doc["findings"] if f["code"] == "MODEL101"]


def test_model_command_and_bad_config(job, tmp_path):
    folder, truth = job
    out = CliRunner().invoke(app, ["model", str(_config(folder, truth, "bfloat16"))])
    assert out.exit_code == 0 and "data_parallel" in out.stdout and "What-if" in out.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nlayers = 'many'\n")
    result = CliRunner().invoke(app, ["model", str(bad)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {bad}:") and result.stderr.count("\n") == 1
