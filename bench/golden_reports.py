"""Golden reports: `report DIR --format json` on every real trace folder, written or compared.

Refactors that must not change what a user sees (issue 77) run this on the commit before the
change (`write`) and after each step (`compare`): every report must be byte-identical. Each
folder runs in its own child process, one at a time (the machine is shared), as a user would run
it; the exit code and stderr are kept beside the JSON, so a folder that fails (exit 2 with a
one-line error) must keep failing the same way.

    python3 bench/golden_reports.py write /tmp/golden_house
    python3 bench/golden_reports.py compare /tmp/golden_house

Run from the repository root (report JSON names files by the path given, so both runs must use
the same relative paths). `--code TREE` runs another checkout's package (say an export of the
base commit, with its built extensions) on this tree's folders, so a golden run need not hold
the working tree still. Nothing in the JSON is normalised: no field was found to vary between
runs of the same tree.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path("../shared/traces")


def _holds_files(d: Path) -> bool:
    """True when `d` directly holds a file other than docs (a trace, a dump)."""
    return any(p.is_file() and p.suffix not in {".md", ".txt", ".py", ".sh"} for p in d.iterdir())


def trace_folders() -> list[Path]:
    """Every real trace folder, as paths relative to the repository root, in a fixed order."""
    found: list[Path] = []
    for pattern in ("sample_traces/*", "tests/data/*/*"):
        found += [p for p in sorted(Path().glob(pattern)) if p.is_dir() and _holds_files(p)]
    if SHARED.is_dir():
        found += [
            Path(dirpath)
            for dirpath, _dirs, _files in sorted(os.walk(SHARED))
            if Path(dirpath) != SHARED and _holds_files(Path(dirpath))
        ]
    return found


def _name(folder: Path) -> str:
    """A flat file name for a folder's outputs."""
    return str(folder).replace("../", "").replace("/", "__")


def run_one(folder: Path, code: Path) -> tuple[bytes, bytes]:
    """The JSON report of `folder` by the package at `code`, and its exit code and stderr.
    `-P`: the working directory (this tree) must not come before PYTHONPATH (`code`)."""
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "kineto_comm", "report", str(folder), "--format", "json"]
        + ["--exit-zero"],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(code)},
    )
    return proc.stdout, f"rc={proc.returncode}\n".encode() + proc.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["write", "compare", "list"])
    ap.add_argument("out", type=Path, nargs="?", default=Path("/tmp/golden_house"))
    ap.add_argument(
        "--code", type=Path, default=ROOT, help="tree whose package runs (default: this one)"
    )
    ap.add_argument("--only", default="", help="substring: run only folders whose path holds it")
    args = ap.parse_args()
    os.chdir(ROOT)
    folders = [f for f in trace_folders() if args.only in str(f)]
    if args.mode == "list":
        print("\n".join(map(str, folders)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    differ = 0
    for folder in folders:
        json_doc, status = run_one(folder, args.code.resolve())
        base = args.out / _name(folder)
        if args.mode == "write":
            base.with_suffix(".json").write_bytes(json_doc)
            base.with_suffix(".status").write_bytes(status)
            print(f"wrote {folder} ({len(json_doc)} bytes, {status.splitlines()[0].decode()})")
            continue
        same_json = base.with_suffix(".json").read_bytes() == json_doc
        same_status = base.with_suffix(".status").read_bytes() == status
        if not (same_json and same_status):
            differ += 1
            base.with_suffix(".new.json").write_bytes(json_doc)
            base.with_suffix(".new.status").write_bytes(status)
        what = "same" if same_json and same_status else "DIFFERS" + " (json)" * (not same_json)
        print(f"{what}: {folder}")
    if args.mode == "compare":
        print(f"{len(folders) - differ}/{len(folders)} identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
