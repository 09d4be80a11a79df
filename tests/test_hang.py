"""Flight Recorder dumps of hung jobs: the safe reader, the ranks named as roots (real runs
with their fault_injection.log, generated hangs with their truth), bad input, the CLI."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import polars as pl
import pytest

from kineto_comm import analyze
from kineto_comm.analysis.hang import analyse, tables_of
from kineto_comm.errors import TraceError
from kineto_comm.hang import analyze_hang
from kineto_comm.load import flight
from kineto_comm.load.flight import SafeUnpickler, rank_from_file_name, read_dump, read_dumps
from kineto_comm.synth.flight import FAULTS, job_dumps, write_dumps

from .conftest import SHARED_TRACES

FR = SHARED_TRACES / "flight-recorder"
RUNS = sorted(p for p in FR.glob("*") if (p / "fault_injection.log").is_file())
CLI = [sys.executable, "-m", "kineto_comm.cli"]


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, env=env, timeout=300
    )


def faulted(run_dir: Path) -> set[int]:
    """The faulted ranks, as the run's fault_injection.log records them."""
    text = (run_dir / "fault_injection.log").read_text()
    return {int(m) for m in re.findall(r"Rank (\d+), fault_type", text)}


def roots_of(paths: list[Path]) -> pl.DataFrame:
    dumps, errors, _ = read_dumps(paths)
    assert not errors
    return analyse(tables_of(dumps)).roots


@pytest.mark.skipif(not RUNS, reason="../shared/traces/flight-recorder not present")
@pytest.mark.parametrize("run_dir", RUNS, ids=lambda p: p.name)
def test_every_faulted_rank_is_a_root_and_no_healthy_rank_is(run_dir):
    truth = faulted(run_dir)
    assert truth, "the log names the faulted ranks"
    roots = roots_of([run_dir])
    assert set(roots["rank"].to_list()) == truth
    # The kind follows the fault: a GPU error stops completions, a held GIL stops issuing.
    kinds = set(roots["kind"].to_list())
    log = (run_dir / "fault_injection.log").read_text()
    if "GPU_ERROR" in log:
        assert kinds == {"device"}
    if "LOCK_GIL" in log:
        assert kinds == {"stopped"}


@pytest.mark.skipif(not RUNS, reason="../shared/traces/flight-recorder not present")
@pytest.mark.parametrize("run_dir", RUNS, ids=lambda p: p.name)
def test_pickle_and_json_dumps_of_the_same_buffers_give_the_same_report(run_dir, tmp_path):
    for dump in sorted(run_dir.glob("_dump_*")):
        with open(dump, "rb") as f:
            data = SafeUnpickler(f).load()
        (tmp_path / dump.name).write_text(json.dumps(data))
    a = analyze_hang([run_dir])
    b = analyze_hang([tmp_path])
    assert a.analysed == b.analysed == 16
    for name in ("roots", "frontier", "waits", "lagging", "mismatches"):
        assert getattr(a.analysis, name).equals(getattr(b.analysis, name)), name
    assert [f.to_dict() for f in a.findings] == [f.to_dict() for f in b.findings]


@pytest.mark.parametrize("version", ["2.2", "2.4", "2.7", "2.9", "2.10"])
@pytest.mark.parametrize("fault", FAULTS)
def test_generated_hangs_name_their_faulty_rank(tmp_path, fault, version):
    truth = write_dumps(tmp_path, ranks=8, fault=fault, faulty=5, version=version)
    roots = roots_of([tmp_path])
    assert roots.select("rank", "kind").rows() == [(r, truth["kind"]) for r in truth["roots"]]


@pytest.mark.parametrize("fault", ["size", "dtype", "type"])
def test_a_diverged_call_is_categorised_as_fr_trace_does(tmp_path, fault):
    write_dumps(tmp_path, ranks=4, fault=fault, faulty=2)
    odd = analyse(tables_of(read_dumps([tmp_path])[0])).mismatches
    expected = {
        "size": "SIZE_OR_SYNTAX_MISMATCH",
        "dtype": "COLLECTIVE_DTYPE_MISMATCH",
        "type": "COLLECTIVE_TYPE_MISMATCH",
    }[fault]
    assert set(odd["kind"]) == {expected}
    assert set(odd["rank"]) == {2}


def test_a_pickle_naming_a_class_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    bad = tmp_path / "_dump_0"
    bad.write_bytes(pickle.dumps({"version": "2.9", "entries": [Payload()]}))
    with pytest.raises(TraceError, match=r"refused: the pickle names a class \((posix|os)\.system"):
        read_dump(bad)
    proc = run("hang", bad)
    assert proc.returncode == 2
    assert not marker.exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "refused" in lines[0]


def test_bad_files_are_one_line_each_and_the_rest_is_analysed(tmp_path):
    write_dumps(tmp_path, ranks=4, fault="stopped", faulty=1)
    good = (tmp_path / "_dump_2").read_bytes()
    (tmp_path / "_dump_2").write_bytes(good[: len(good) // 2])  # truncated
    (tmp_path / "_dump_3").write_bytes(b"\x80\x04garbage that is no pickle")
    proc = run("hang", tmp_path)
    assert "Traceback" not in proc.stderr
    errs = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errs) == 2 and all("_dump_2" in e or "_dump_3" in e for e in errs)
    # Two dumps remain: the hang is still analysed, and the damaged ranks are not silent.
    assert proc.returncode == 1
    assert "no dump from ranks 2, 3" in proc.stdout


def test_nothing_analysable_exits_2(tmp_path):
    (tmp_path / "_dump_0").write_bytes(b"\x80\x04\x95")
    proc = run("hang", tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run("hang", empty)
    assert proc.returncode == 2 and "no Flight Recorder dumps" in proc.stderr


def test_ranks_that_never_dumped_are_suspects_not_absent(tmp_path):
    write_dumps(tmp_path, ranks=16, fault="stopped", faulty=6)
    for r in (6, 9, 13):
        (tmp_path / f"_dump_{r}").unlink()
    report = analyze_hang([tmp_path])
    roots = dict(report.analysis.roots.select("rank", "kind").rows())
    # Everyone waits on the three: each is a root without a dump.
    assert roots == {6: "no_dump", 9: "no_dump", 13: "no_dump"}
    assert {r for f in report.findings if f.code == "HANG104" for r in f.ranks} == {6, 9, 13}


def test_a_dump_of_another_job_is_set_aside(tmp_path):
    write_dumps(tmp_path / "a", ranks=8, fault="stopped", faulty=3)
    write_dumps(tmp_path / "b", ranks=4, fault="stopped", faulty=1)
    (tmp_path / "a" / "_dump_9").write_bytes((tmp_path / "b" / "_dump_2").read_bytes())
    dumps, errors, _ = read_dumps([tmp_path / "a"])
    assert [Path(e.file).name for e in errors] == ["_dump_9"]
    assert "another job" in errors[0].problem
    assert len(dumps) == 8


def test_twenty_thousand_entries_per_rank(tmp_path):
    dumps, truth = job_dumps(ranks=4, fault="gpu", faulty=2, entries_per_rank=20_000)
    for r, d in dumps.items():
        (tmp_path / f"_dump_{r}").write_bytes(pickle.dumps(d))
    roots = roots_of([tmp_path])
    assert roots["rank"].to_list() == [2]
    assert read_dumps([tmp_path])[0][0].entries.height >= 20_000


def test_decoding_in_worker_processes_gives_what_one_process_gives(tmp_path, monkeypatch):
    write_dumps(tmp_path, ranks=8, fault="gpu", faulty=5)
    (tmp_path / "_dump_3").write_bytes(b"\x80\x04garbage that is no pickle")
    one = read_dumps([tmp_path], jobs=1)
    monkeypatch.setattr(flight, "PARALLEL_ABOVE", 0)  # a worker even for this small job
    two = read_dumps([tmp_path], jobs=2)
    assert [(e.file, e.problem) for e in one[1]] == [(e.file, e.problem) for e in two[1]]
    assert len(one[0]) == len(two[0]) == 7
    for a, b in zip(one[0], two[0], strict=True):
        assert (a.rank, a.file, a.pg_status) == (b.rank, b.file, b.pg_status)
        assert a.entries.equals(b.entries)


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("_dump_12", 12),
        ("nccl_trace_rank_7", 7),
        ("node-03_rank5.pkl", 5),
        ("host12-rank_3", 3),
        ("fr_dump_host7_rank-11.json", 11),
    ],
)
def test_rank_from_file_names(name, rank):
    assert rank_from_file_name(name) == rank


@pytest.mark.skipif(not RUNS, reason="../shared/traces/flight-recorder not present")
def test_rank_from_process_groups_when_the_name_has_none(tmp_path):
    for rank in (3, 14):
        path = tmp_path / f"dump-of-host-{chr(97 + rank)}"
        path.write_bytes((RUNS[0] / f"_dump_{rank}").read_bytes())
        d = read_dump(path)
        assert (d.rank, d.rank_source) == (rank, "process groups")
    # Groups that leave two ranks possible: an error naming the file, not a guess.
    dumps, _ = job_dumps(ranks=4, fault="stopped", faulty=1)
    path = tmp_path / "dump-of-some-host"
    path.write_bytes(pickle.dumps(dumps[3]))
    with pytest.raises(TraceError, match="no rank in the file name"):
        read_dump(path)


@pytest.mark.skipif(not RUNS, reason="../shared/traces/flight-recorder not present")
def test_report_on_a_folder_of_dumps_is_the_hang_report_in_every_format(tmp_path):
    run_dir = RUNS[0]
    hang = run("hang", run_dir)
    report = run("report", run_dir)
    assert report.returncode == hang.returncode == 1
    assert report.stdout == hang.stdout
    doc = json.loads(run("report", run_dir, "-f", "json").stdout)
    assert sorted(r["rank"] for r in doc["roots"]) == sorted(faulted(run_dir))
    for fmt in ("markdown", "github"):
        proc = run("hang", run_dir, "-f", fmt)
        assert proc.returncode == 1 and proc.stdout.strip()
    # SARIF: one result per root, each pointing at that rank's dump.
    sarif = json.loads(run("hang", run_dir, "-f", "sarif").stdout)["runs"][0]
    found = {r for res in sarif["results"] for r in res["properties"]["ranks"]}
    assert found == faulted(run_dir)
    for res in sarif["results"]:
        uri = res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        assert uri.endswith(f"_dump_{res['properties']['ranks'][0]}")
    assert {r["id"] for r in sarif["tool"]["driver"]["rules"]} >= {"HANG101", "HANG102"}
    # JUnit: a case per HANG rule, failing where a root was named.
    suite = ET.fromstring(run("hang", run_dir, "-f", "junit").stdout).find("testsuite")
    failed = {c.get("name").split()[0] for c in suite if c.find("failure") is not None}
    assert failed == {res["ruleId"] for res in sarif["results"]}
    assert int(suite.get("tests")) == len(sarif["tool"]["driver"]["rules"])
    # HTML: the roots' table names every root rank.
    page = run("hang", run_dir, "-f", "html")
    assert page.returncode == 1 and page.stdout.startswith("<!DOCTYPE html>")
    roots_html = page.stdout.split("<h2>Root ranks</h2>")[1].split("</table>")[0]
    cells = set(re.findall(r"<tr><td class=\"l\">(\d+)</td>", roots_html))
    assert {int(c) for c in cells} == faulted(run_dir)
    assert run("hang", run_dir, "--exit-zero").returncode == 0
    bad = run("hang", run_dir, "-f", "nope")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_hang_rules_find_nothing_on_kineto_reports():
    from kineto_comm.rules_engine import run_rules

    assert run_rules({}, select=("HANG",)) == ()


def _beside(folder: Path, traces: list[Path], faulty: int) -> Path:
    """A folder holding these Kineto traces (linked) and generated dumps of the same 4
    ranks whose hang starts at `faulty`."""
    folder.mkdir()
    for trace in traces:
        (folder / trace.name).symlink_to(trace.resolve())
    write_dumps(folder, ranks=4, fault="stopped", faulty=faulty)
    return folder


@pytest.mark.parametrize("faulty", [1, 3])  # ddp-4: the most late rank, and one never late
def test_kineto_traces_beside_the_dumps_say_whether_the_root_was_late_before(tmp_path, faulty):
    ddp = Path(__file__).parent.parent / "sample_traces" / "ddp-4"
    late = analyze(ddp, ignore=["ALL"]).stragglers
    folder = _beside(tmp_path / "mix", sorted(ddp.glob("*.json.gz")), faulty)
    mixed = analyze_hang([folder])
    alone = analyze_hang(list(folder.glob("_dump_*")))
    # The traces change nothing in the hang analysis; they add each root's history.
    assert mixed.analysis.roots.equals(alone.analysis.roots)
    assert mixed.kineto_traces == 4 and alone.kineto_traces == 0 and alone.history.height == 0
    assert not mixed.errors
    (h,) = mixed.history.to_dicts()
    mine = late.filter(pl.col("rank") == faulty).to_dicts()[0]
    assert h["rank"] == faulty and h["traced"]
    for key in ("times_last", "instances", "late_share", "is_straggler"):
        assert h[key] == mine[key]
    assert h["most_late"] == (mine["late_share"] == late["late_share"].max() > 0)
    (finding,) = mixed.findings
    said = "most late rank" if h["most_late"] else "not a straggler"
    assert said in finding.message and "before_the_hang" in finding.evidence
    assert "before the hang (Kineto traces)" in run("report", folder).stdout


def test_a_root_that_was_a_straggler_before_the_hang_is_said_to_be(tmp_path):
    from kineto_comm.synth.generate import generate

    truth = generate("straggler", tmp_path / "job", ranks=4, steps=3)
    (straggler,) = truth["problems"][0]["ranks"]
    traces = sorted((tmp_path / "job").glob("rank-*.json"))
    for faulty in (straggler, (straggler + 1) % 4):
        report = analyze_hang([_beside(tmp_path / f"hang-{faulty}", traces, faulty)])
        (h,) = report.history.to_dicts()
        assert (h["rank"], h["is_straggler"]) == (faulty, faulty == straggler)
        verdict = "already a straggler" if faulty == straggler else "not a straggler"
        assert verdict in report.findings[0].message


GLOO = Path(__file__).parent / "data" / "flight-recorder-gloo"


@pytest.mark.parametrize("fault", ["skip", "size"])
def test_real_gloo_dumps_name_the_rank_that_hangs_pickle_and_json_alike(fault):
    truth = json.loads((GLOO / fault / "truth.json").read_text())
    a = analyze_hang([GLOO / fault / "pickle"])
    b = analyze_hang([GLOO / fault / "json"])
    assert not a.errors and not b.errors and a.analysed == b.analysed == 4
    # Both stop issuing: the others wait in the next all_reduce for the faulty rank.
    assert a.analysis.roots.select("rank", "kind").rows() == [
        (r, "stopped") for r in truth["roots"]
    ]
    for name in ("roots", "frontier", "waits", "mismatches"):
        assert getattr(a.analysis, name).equals(getattr(b.analysis, name)), name
    assert [f.to_dict() for f in a.findings] == [f.to_dict() for f in b.findings]
    # The odd size passed gloo's all_reduce; the call before the hung one shows it.
    odd = a.analysis.mismatches.select("kind", "rank").rows()
    assert odd == ([("SIZE_OR_SYNTAX_MISMATCH", *truth["roots"])] if fault == "size" else [])
