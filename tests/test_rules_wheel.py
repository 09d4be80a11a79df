"""The built-in rules ship inside the wheel: build it, install it into a fresh virtual
environment and run `kineto-comm rules` / `kineto-comm explain` from there (offline)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_NO_INDEX"] = "1"  # offline: the wheel has everything we need
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def _see_these_packages(py: Path, cwd: Path) -> None:
    """Let the new environment import the dependencies the tests run with (polars, typer,
    ...), after its own packages, so its installed kineto_comm is the one imported.

    `venv --system-site-packages` would link the *base* interpreter's packages: inside a
    virtual environment (the README's `pip install -e '.[test,capture]'` in a venv) those
    are not the ones installed, and the wheel's commands failed on `import polars`. A .pth
    file naming this interpreter's site directories works in a venv and without one. It is
    written after pip ran, so pip never sees (nor uninstalls) the outer kineto-comm."""
    found = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd)
    assert found.returncode == 0, found.stderr
    outer = [
        p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()
    ]
    (Path(found.stdout.strip()) / "outer-site.pth").write_text("\n".join(outer) + "\n")


@pytest.mark.slow
def test_installed_wheel_lists_and_explains_builtin_rules(tmp_path: Path) -> None:
    src = tmp_path / "src"  # build from a copy: no build/ or egg-info in the shared checkout
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")  # the wheel compiles its own
    for name in ("kineto_comm", "rules"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    build = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        tmp_path,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("kineto_comm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "kineto_comm_builtin_rules/__init__.py" in names
    assert "kineto_comm_builtin_rules/exposed_comm.py" in names
    # the compiled scanner is built into the wheel (gcc and the Python headers are here)
    assert any(
        n.startswith("kineto_comm/load/_scan.") and n.endswith((".so", ".pyd")) for n in names
    )
    # the hardware table is package data (pyproject's package-data)
    assert "kineto_comm/data/hardware.toml" in names
    # the explicit package list in pyproject.toml misses no subpackage of kineto_comm
    for init in (REPO / "kineto_comm").rglob("__init__.py"):
        rel = init.relative_to(REPO).as_posix()
        assert rel in names, f"{rel} missing from the wheel: add it to pyproject packages"

    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    inst = _run(
        [str(py), "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel)], tmp_path
    )
    assert inst.returncode == 0, inst.stderr[-2000:]
    _see_these_packages(py, tmp_path)
    where = _run(
        [
            str(py),
            "-c",
            "import kineto_comm, kineto_comm_builtin_rules as b; "
            "from kineto_comm.analysis.hardware import load_table; "
            "assert load_table()['gpu']['h100-sxm']['busbw_gbps']['all_reduce'] > 0; "
            "print(kineto_comm.__file__); print(b.__file__)",
        ],
        tmp_path,
    )
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert str(venv) in line, where.stdout  # the installed copy, not the checkout

    exe = venv / "bin" / "kineto-comm"
    listed = _run([str(exe), "rules"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    for code in ("COMM101", "COMM201", "NET101", "NET102", "PIPE101", "SYNC101", "SYNC103"):
        assert code in listed.stdout
    assert "built-in" in listed.stdout
    shown = _run([str(exe), "explain", "COMM101"], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "Why is this bad?" in shown.stdout and "kineto_comm_builtin_rules" not in shown.stderr
    assert "warn_share" in shown.stdout
