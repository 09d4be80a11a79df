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


@pytest.fixture(scope="module")
def frscan():
    """The compiled FR reader (_frscan.c), built here if it is not yet: never skipped."""
    try:
        from kineto_comm.load import _frscan
    except ImportError:
        repo = Path(__file__).resolve().parent.parent
        build = subprocess.run(
            [sys.executable, "setup.py", "build_ext", "--inplace", "-q"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            from kineto_comm.load import _frscan
        except ImportError:
            pytest.fail(f"the compiled FR reader cannot be built: {build.stderr[-2000:]}")
    return _frscan


def _both_ways(path: Path, frscan, monkeypatch) -> tuple[object, object]:
    """read_dump with the compiled reader and without: a FlightDump or the error text."""
    got = []
    for module in (frscan, None):
        monkeypatch.setattr(flight, "_frscan", module)
        try:
            got.append(read_dump(path))
        except TraceError as exc:
            got.append(str(exc))
    return got[0], got[1]


def _same(a, b) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    assert (a.rank, a.rank_source, a.version, a.lib_version) == (
        b.rank,
        b.rank_source,
        b.version,
        b.lib_version,
    )
    assert a.pg_config == b.pg_config and a.pg_status == b.pg_status
    assert a.entries.schema == b.entries.schema
    assert a.entries.equals(b.entries)


def _generated(tmp_path: Path) -> list[Path]:
    """Dumps of every format version and fault, pickled with every protocol pickle has."""
    out = []
    for version in ("2.2", "2.3", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10"):
        for fault in FAULTS:
            for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
                dumps, _ = job_dumps(ranks=4, fault=fault, faulty=1, version=version)
                for r, d in dumps.items():
                    path = tmp_path / f"{version}-{fault}-p{protocol}" / f"_dump_{r}"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(pickle.dumps(d, protocol=protocol))
                    out.append(path)
    return out


def test_the_compiled_reader_gives_the_python_reader_s_tables(frscan, tmp_path, monkeypatch):
    real = [p for run in RUNS for p in sorted(run.glob("_dump_*"))]
    real += sorted(GLOO.glob("*/pickle/_dump_*"))
    assert len(real) >= 8 + (32 if RUNS else 0)
    for path in real + _generated(tmp_path):
        # Every one of these is read by the compiled reader, not handed back to Python.
        assert frscan.scan(path.read_bytes()) is not None, path
        a, b = _both_ways(path, frscan, monkeypatch)
        assert not isinstance(a, str), a
        _same(a, b)


def _odd_entries() -> list[dict]:
    """Entries whose fields take the other shapes a dump may hold."""
    dumps, _ = job_dumps(ranks=4, fault="gpu", faulty=1, version="2.10")
    base = dumps[1]["entries"]
    odd = [
        {"pg_id": "7", "process_group": ["3", "SUB"], "input_sizes": ((2, 3), ())},
        {"process_group": None, "thread_id": 140000, "state": "started"},
        {"process_group": ("9",), "input_dtypes": ("Float", "Half"), "output_dtypes": None},
        {"is_p2p": 0, "retired": None, "profiling_name": "nccl:send 0->3"},
        {"profiling_name": "gloo:recv 1<-0", "time_created_ns": None, "thread_name": None},
        {"input_sizes": [[2**40, 3]], "output_sizes": [], "record_id": -(2**62)},
        {"frames": [], "state": "scheduled", "collective_seq_id": -1, "p2p_seq_id": 2**31},
        {"output_sizes": [[1], [2, 2]], "pg_id": None, "timeout_ms": 0},
    ]
    out = [dict(e) for e in base]
    for i, change in enumerate(odd):
        out[i % len(out)].update(change)
    out[-1].pop("is_p2p")
    out[-1]["profiling_name"] = "nccl:recv 0<-2"
    out[-2].pop("thread_id", None)
    return out


# Field values the compiled reader hands back to the Python reader (kinds it does not write).
HANDED_BACK = [
    ("record_id", 1.5),
    ("record_id", True),
    ("record_id", 2**70),
    ("timeout_ms", "600000"),
    ("input_sizes", [["1024"]]),
    ("input_sizes", [[1.0]]),
    ("input_dtypes", "Float"),
    ("input_dtypes", [1, 2]),
    ("process_group", "0"),
    ("process_group", {"0": 1}),
    ("pg_id", 1.0),
    ("is_p2p", "yes"),
    ("thread_name", 7),
    ("state", ["completed"]),
    ("profiling_name", None),
    ("profiling_name", "nccl:send x->1"),
]


@pytest.mark.parametrize(("key", "value"), HANDED_BACK, ids=lambda v: repr(v)[:20])
def test_odd_fields_give_the_same_table_or_error_either_way(
    frscan, tmp_path, monkeypatch, key, value
):
    entries = _odd_entries()
    path = tmp_path / "_dump_1"
    dumps, _ = job_dumps(ranks=4, fault="gpu", faulty=1, version="2.10")
    path.write_bytes(pickle.dumps({**dumps[1], "entries": entries}))
    assert frscan.scan(path.read_bytes()) is not None, "the shapes it writes"
    _same(*_both_ways(path, frscan, monkeypatch))
    entries[3][key] = value
    path.write_bytes(pickle.dumps({**dumps[1], "entries": entries}))
    _same(*_both_ways(path, frscan, monkeypatch))


def test_damaged_and_refused_pickles_give_the_same_one_line_errors(frscan, tmp_path, monkeypatch):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    dumps, _ = job_dumps(ranks=4, fault="gpu", faulty=1)
    good = pickle.dumps(dumps[2])
    cases = {
        "class": pickle.dumps({"version": "2.9", "entries": [Payload()]}),
        "class-in-entry": pickle.dumps({**dumps[2], "pg_status": Payload()}),
        "truncated": good[: len(good) // 2],
        "garbage": b"\x80\x04garbage that is no pickle",
        "no-stop": good[:-1],
        "frame-too-long": b"\x80\x04\x95\xff\xff\x00\x00\x00\x00\x00\x00}.",
        "not-a-dict": pickle.dumps([1, 2]),
        "entries-tuple": pickle.dumps({**dumps[2], "entries": ()}),
        "not-an-entry": pickle.dumps({**dumps[2], "entries": [{"state": "completed"}]}),
        "bad-version": pickle.dumps({**dumps[2], "version": "1.0"}),
        "bad-utf8": good.replace(b"default_pg", b"default\xff\xfe", 1),
        "stack-underflow": b"\x80\x02Nu.",
    }
    for name, data in cases.items():
        path = tmp_path / name / "_dump_2"
        path.parent.mkdir()
        path.write_bytes(data)
        # Only a well-formed dump of another version is read here (flight.py checks that).
        assert (frscan.scan(data) is None) == (name != "bad-version"), name
        a, b = _both_ways(path, frscan, monkeypatch)
        assert isinstance(a, str) and a == b and "\n" not in a, name
        assert str(path) in a
    assert not marker.exists()
    refused = _both_ways(tmp_path / "class" / "_dump_2", frscan, monkeypatch)[0]
    assert "refused: the pickle names a class" in refused


def test_mutated_dumps_read_the_same_either_way(frscan, tmp_path, monkeypatch):
    """Bytes flipped, dropped or cut anywhere in a dump: both readers agree on every one."""
    import random

    rng = random.Random(80)
    dumps, _ = job_dumps(ranks=4, fault="size", faulty=1, version="2.10")
    for protocol in (2, 4):
        good = pickle.dumps(dumps[1], protocol=protocol)
        for i in range(150):
            at = rng.randrange(len(good))
            kind = i % 3
            if kind == 0:
                data = good[:at] + bytes([rng.randrange(256)]) + good[at + 1 :]
            elif kind == 1:
                data = good[:at] + good[at + 1 :]
            else:
                data = good[:at]
            path = tmp_path / f"p{protocol}-{i}" / "_dump_1"
            path.parent.mkdir()
            path.write_bytes(data)
            _same(*_both_ways(path, frscan, monkeypatch))
