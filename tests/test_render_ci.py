"""docs/ci/kineto-comm-ci.sh, run through `python -m kineto_comm.cli` as CI would run it:
every output file is written and valid, a synthetic regression fails the job (exit 1), an
identical baseline passes (exit 0), and unusable input exits 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema

from kineto_comm.synth import generate

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "docs" / "ci" / "kineto-comm-ci.sh"


def run_script(*args: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the CI script with KINETO_COMM pointing at this checkout's CLI."""
    full_env = {
        **os.environ,
        "KINETO_COMM": os.environ.get(
            "KINETO_COMM_TEST_CLI", f"{sys.executable} -m kineto_comm.cli"
        ),
        "PYTHONPATH": str(REPO),
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=REPO,
        timeout=300,
    )


def test_script_is_valid_bash_and_documents_usage() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    r = run_script()
    assert r.returncode == 2 and "usage:" in r.stderr


def test_script_on_sample_traces_writes_every_format(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = run_script(REPO / "sample_traces" / "ddp-4", out)
    assert first.returncode in (0, 1), first.stderr
    for name in ("report.json", "report.sarif", "report.html", "report.md", "report.xml"):
        assert (out / name).stat().st_size > 0, name
    doc = json.loads((out / "report.json").read_text())
    schema = json.loads((REPO / "docs" / "json-schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    sarif_schema = json.loads((REPO / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(sarif_schema).validate(
        json.loads((out / "report.sarif").read_text())
    )
    ET.fromstring((out / "report.xml").read_text())
    # stdout holds only annotations (one per finding), nothing else
    lines = [ln for ln in first.stdout.splitlines() if ln.strip()]
    assert all(ln.startswith(("::error ", "::warning ", "::notice ")) for ln in lines)
    assert len(lines) == len(doc["findings"])
    # the run's own report as baseline: the same traces pass the diff
    again = run_script(REPO / "sample_traces" / "ddp-4", tmp_path / "again", out / "report.json")
    assert again.returncode == first.returncode, again.stderr
    assert json.loads((tmp_path / "again" / "diff.json").read_text())["failed"] is False
    assert "PASSED" in again.stdout


def test_script_fails_on_injected_regression(tmp_path: Path) -> None:
    generate("baseline", tmp_path / "base", ranks=4, layout="dp", steps=2, seed=0)
    generate("exposed-allreduce", tmp_path / "new", ranks=4, layout="dp", steps=2, seed=0)
    base = run_script(tmp_path / "base", tmp_path / "base-out", FAIL_ON="error")
    assert base.returncode in (0, 1), base.stderr
    r = run_script(tmp_path / "new", tmp_path / "new-out", tmp_path / "base-out" / "report.json")
    assert r.returncode == 1, r.stderr
    d = json.loads((tmp_path / "new-out" / "diff.json").read_text())
    assert d["failed"] is True and d["changes"][0]["regressed"] is True
    assert "FAILED" in r.stdout


def test_script_exits_2_on_unusable_input(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rank-0.json").write_text("{not json")
    r = run_script(tmp_path / "traces", tmp_path / "out")
    assert r.returncode == 2
    assert "rank-0.json" in r.stderr and "error:" in r.stderr


def test_script_exits_2_on_one_unreadable_rank_and_still_writes_the_reports(
    tmp_path: Path,
) -> None:
    """Three good gloo ranks and one unreadable file: `report` alone exits 0 or 1 (the
    three are reported), the script's `report --strict` exits 2 after writing every
    format, so CI does not pass a job whose rank went missing."""
    import shutil

    traces = tmp_path / "traces"
    shutil.copytree(REPO / "sample_traces" / "ddp-4", traces)
    (traces / "rank-3.pt.trace.json.gz").write_bytes(b"\x1f\x8b not gzip")
    r = run_script(traces, tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert "rank-3.pt.trace.json.gz" in r.stderr and "error:" in r.stderr
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [rank["rank"] for rank in doc["ranks"]] == [0, 1, 2]
    assert [e["file"] for e in doc["errors"]] == [str(traces / "rank-3.pt.trace.json.gz")]
