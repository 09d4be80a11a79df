"""The command line's first second (issue 81): help and the version load no data library.

`python -X importtime` lists every module a process imports; the heavy ones (Polars, numpy,
pandas, msgspec, pyarrow) must not be among them for `--help`, `--version` and any command's
`--help`. `rules` and `explain` still load them: the built-in rules and their API import
Polars at module level (bench/README.md, issue 81).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

HEAVY = {"polars", "numpy", "pandas", "msgspec", "pyarrow"}
COMMANDS = ("report", "diff", "model", "synth", "capture", "rules", "explain", "hang")


def _imported(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """The process of `python -m kineto_comm ARGS` and the top-level packages it imported."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "kineto_comm", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    names = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    return proc, names


@pytest.mark.parametrize(
    "args", [("--help",), ("--version",), *[(c, "--help") for c in COMMANDS]], ids=" ".join
)
def test_help_and_version_import_no_data_library(args: tuple[str, ...]) -> None:
    proc, names = _imported(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "kineto_comm" in names and "typer" in names  # the parse saw the imports
    assert proc.stdout.strip()
    assert not names & HEAVY, sorted(names & HEAVY)


def test_a_report_still_imports_polars() -> None:
    """The check above can fail: the same parse sees Polars where a command loads it."""
    proc, names = _imported("explain", "COMM101")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "polars" in names


def test_package_attribute_analyze_is_the_function() -> None:
    """Loaded on first use, `kineto_comm.analyze` is the function, as it was when the package
    imported it, even after the submodule of the same name is imported."""
    code = (
        "import kineto_comm, sys\n"
        "assert 'polars' not in sys.modules\n"
        "import kineto_comm.analyze\n"
        "from kineto_comm import analyze, Report\n"
        "assert callable(kineto_comm.analyze) and kineto_comm.analyze is analyze\n"
        "assert Report is sys.modules['kineto_comm.analyze'].Report\n"
        "assert {'analyze', 'Report'} <= set(dir(kineto_comm))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
