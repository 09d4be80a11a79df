"""Mixed and partial jobs (issue #75, item 2): files of two jobs in one folder, a job with
ranks missing, a job with an unreadable file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl

from kineto_comm import analyze
from kineto_comm.analysis.jobs import split_jobs

from .conftest import REPO, SAMPLES

GLOO = SAMPLES / "ddp-4"  # gloo on CPUs, world_size 4
H100 = REPO / "tests" / "data" / "h100-nccl" / "ddp-4"  # NCCL on H100s, world_size 4


def _folder(tmp: Path, picks: dict[int, Path]) -> Path:
    """A folder with rank r's file taken from job folder picks[r] (symlinks)."""
    tmp.mkdir(parents=True, exist_ok=True)
    for rank, src in picks.items():
        name = f"rank-{rank}.pt.trace.json.gz"
        (tmp / name).symlink_to(src / name)
    return tmp


def _ranks_named(report) -> set[int]:
    """Every rank a table, finding or step figure of `report` names as traced, waited
    for or late (process groups list their configs' members, traced or not)."""
    named = set(report.totals["rank"].to_list())
    named |= set(report.step_blame["rank"].to_list())
    named |= set(report.step_blame["late_rank"].drop_nulls().to_list())
    named |= set(report.step_times["critical_rank"].to_list())
    named |= set(report.critical_path["rank"].to_list())
    named |= set(report.critical_path["waited_for"].drop_nulls().to_list())
    named |= set(report.collective_instances["last_rank"].drop_nulls().to_list())
    named |= set(report.stragglers["rank"].to_list())
    named |= set(report.offsets["rank"].to_list())
    return named | {r for f in report.findings for r in f.ranks}


def test_files_of_two_jobs_are_never_compared(tmp_path: Path) -> None:
    """gloo ranks 0-1 and H100 ranks 2-3 of two runs in one folder: before, the warning said
    "no cross-rank analysis", yet the step table charged rank 2 with waits for rank 1 and
    COMM101 covered ranks 0-3. Now one job is analysed (ranks 0-1: the first of two jobs of
    two ranks), exactly as if its files were alone, the other job's files are listed as
    left out, and the warning names what differs."""
    mixed = analyze(_folder(tmp_path / "mixed", {0: GLOO, 1: GLOO, 2: H100, 3: H100}), jobs=1)
    alone = analyze(_folder(tmp_path / "alone", {0: GLOO, 1: GLOO}), jobs=1)
    assert mixed.ranks["rank"].to_list() == [0, 1]
    assert _ranks_named(mixed) == {0, 1}
    # Nothing of the other job reaches the analysed one's figures.
    assert mixed.step_times.equals(alone.step_times)
    assert mixed.step_blame.equals(alone.step_blame)
    # A group's ranks are its config's (4 members, 2 traced): the same as the job's alone.
    assert mixed.process_groups.equals(alone.process_groups)
    assert [(f.code, f.ranks, f.impact_ns_per_step) for f in mixed.findings] == [
        (f.code, f.ranks, f.impact_ns_per_step) for f in alone.findings
    ]
    assert [f for f in mixed.findings if f.code == "COMM101"]
    left = {Path(file).name: problem for file, problem in mixed.errors}
    assert sorted(left) == ["rank-2.pt.trace.json.gz", "rank-3.pt.trace.json.gz"]
    assert all("another job than ranks 0-1" in p for p in left.values())
    (said,) = [w for w in mixed.warnings if w.startswith("files of 2 jobs")]
    assert "differ in backend, device, time range)" in said
    assert "backend gloo" in said and "backend nccl" in said and "H100" in said
    assert "analysed ranks 0-1" in said and "left out ranks 2-3" in said
    # The analysed job is missing its ranks 2-3, as any partial job is.
    assert [w for w in mixed.warnings if w.startswith("2 of 4 ranks present")]


def test_the_job_of_most_ranks_is_the_one_analysed(tmp_path: Path) -> None:
    """H100 ranks 1-3 and a gloo rank 0: the three-rank job is analysed, rank 0 left out."""
    report = analyze(_folder(tmp_path, {0: GLOO, 1: H100, 2: H100, 3: H100}), jobs=1)
    assert report.ranks["rank"].to_list() == [1, 2, 3]
    assert set(report.ranks["backend"]) == {"nccl"}
    assert _ranks_named(report) <= {1, 2, 3}
    assert [Path(f).name for f, _ in report.errors] == ["rank-0.pt.trace.json.gz"]
    (said,) = [w for w in report.warnings if w.startswith("files of 2 jobs")]
    assert "analysed ranks 1-3" in said and "left out ranks 0 " in said


def test_split_jobs_tells_jobs_apart_by_backend_world_size_and_time() -> None:
    """One signature and overlapping times: one job; a backend or a world size of its own,
    or a time range after the others' end: another. A file that names no backend or world
    size is of the job most files name."""
    s = 10**18
    files = pl.DataFrame(
        {
            "rank": [0, 1, 2, 3, 4, 5],
            "backend": ["nccl", "nccl", None, "nccl", "gloo", "nccl"],
            "device": ["H100"] * 6,
            "world_size": [8, 8, 8, None, 8, 16],
            "start_ns": [s, s + 5, s + 9, s + 10**12, s, s],
            "end_ns": [s + 100] * 3 + [s + 10**12 + 100, s + 100, s + 100],
        }
    )
    job = dict(split_jobs(files).select("rank", "job").iter_rows())
    assert job[0] == job[1] == job[2] == 0
    assert len({job[3], job[4], job[5], 0}) == 4


def test_one_rank_of_four_says_which_are_missing(tmp_path: Path) -> None:
    """Only rank 0 of a world_size 4 job: a full report, and one warning that says 1 of 4
    ranks are here, 1-3 are missing, and the cross-rank figures cover rank 0 only. The whole
    job says nothing of the kind."""
    report = analyze(_folder(tmp_path, {0: H100}), jobs=1)
    assert report.ranks["rank"].to_list() == [0] and not report.errors
    assert report.step_times.height > 0 and report.findings
    assert list(report.warnings) == [
        "1 of 4 ranks present (world_size 4): ranks 0; missing ranks 1-3. Cross-rank figures"
        " (waits, skews, stragglers, the step time and its critical rank, the findings'"
        " ranks) cover the present ranks only"
    ]
    assert not [w for w in analyze(H100, jobs=1).warnings if "ranks present" in w]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "kineto_comm.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_an_unreadable_file_exits_0_and_2_under_strict(tmp_path: Path) -> None:
    """3 good ranks and 1 unreadable file: the report of the three, exit 0 (the file is one
    error line); `--strict` (what docs/ci.md's script passes) writes the same report and
    exits 2."""
    job = tmp_path / "job"
    shutil.copytree(GLOO, job)
    (job / "rank-3.pt.trace.json.gz").write_bytes(b"not a gzip file")
    lax = _cli("report", str(job), "--format", "json", "-o", str(tmp_path / "lax.json"))
    strict = _cli(
        "report", str(job), "--format", "json", "-o", str(tmp_path / "strict.json"), "--strict"
    )
    for proc in (lax, strict):
        assert "Traceback" not in proc.stderr + proc.stdout
        (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
        assert "rank-3.pt.trace.json.gz" in line
    assert lax.returncode == 0, lax.stderr
    assert strict.returncode == 2, strict.stderr
    assert (tmp_path / "strict.json").read_text() == (tmp_path / "lax.json").read_text()
    # A whole job passes --strict.
    assert _cli("report", str(GLOO), "--strict", "--exit-zero").returncode == 0
