"""What a new user meets first: the version, `python -m kineto_comm`, and declared dependencies.

The fresh-venv install-and-run of the README's first command is in `.ci/run` (it needs the
package index and a minute); here are the checks that can run in the test environment.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points, version
from pathlib import Path

import kineto_comm
from tests.conftest import REPO, SAMPLES


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kineto_comm", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_version_has_one_home() -> None:
    """`--version`, the package's __version__ and the installed metadata say the same."""
    out = _run("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"kineto-comm {kineto_comm.__version__}"
    assert version("kineto-comm") == kineto_comm.__version__


def test_python_dash_m_runs_the_same_command_line() -> None:
    """`python -m kineto_comm report` gives what the console script gives, exit codes too."""
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "kineto-comm"]
    assert script.value == "kineto_comm.cli:main"
    ok = _run("report", str(SAMPLES / "ddp-4"), "--exit-zero", "--format", "json")
    assert ok.returncode == 0, ok.stderr
    assert '"findings"' in ok.stdout
    missing = _run("report", str(REPO / "no-such-folder"))
    assert missing.returncode == 2
    assert "no-such-folder" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_promised_python_is_the_declared_one() -> None:
    """The README promises the Pythons pyproject.toml declares, and this one is among them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = re.fullmatch(r">=\s*3\.(\d+)", project["requires-python"])
    assert declared, project["requires-python"]
    promised = re.search(r"Python >= 3\.(\d+)", (REPO / "README.md").read_text())
    assert promised and promised.group(1) == declared.group(1)
    assert sys.version_info >= (3, int(declared.group(1)))


def _deptry(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deptry", "--no-ansi", "."],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
    )


def test_every_import_is_declared(tmp_path: Path) -> None:
    """deptry passes on the tree, and fails naming numpy once numpy's declaration is removed
    (as it was when a fresh install could not run the first command)."""
    clean = _deptry(REPO)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    copy = tmp_path / "tree"
    for part in ("kineto_comm", "rules"):
        shutil.copytree(
            REPO / part, copy / part, ignore=shutil.ignore_patterns("*.so", "__pycache__")
        )
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"numpy>=' in pyproject
    (copy / "pyproject.toml").write_text(re.sub(r'\s*"numpy>=[^"]*",', "", pyproject))
    broken = _deptry(copy)
    assert broken.returncode != 0
    assert "'numpy'" in broken.stdout + broken.stderr


def test_usage_errors_are_one_line_naming_the_command() -> None:
    """A missing argument or a bad option value is one `error:` line (no boxed panel, no
    traceback), naming the command and the argument, exit 2; no arguments prints the help."""
    for args, words in (
        (["report"], ["report", "PATHS"]),
        (["diff", "a"], ["diff", "NEW"]),
        (["report", "x", "--ranks-per-host", "0"], ["report", "--ranks-per-host"]),
        (["--bogus"], ["--bogus"]),
    ):
        out = _run(*args)
        assert out.returncode == 2, (args, out.stderr)
        lines = out.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, out.stderr)
        assert all(w in lines[0] for w in words), (args, lines[0])
    bare = _run()
    assert "Usage:" in bare.stdout and "report" in bare.stdout
