"""The command line as users and CI scripts run it: exit codes, one-line errors, JSON."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kineto_comm import analyze
from kineto_comm.cli import app
from kineto_comm.errors import UsageError

from .conftest import SAMPLES, all_real_traces, kernel, shared, trace_params, write_trace

CLI = [sys.executable, "-m", "kineto_comm.cli"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, env=env, timeout=300
    )


def assert_no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout


@pytest.mark.parametrize("path", trace_params(all_real_traces()))
def test_every_real_trace_reports_in_text_and_json(path):
    text = run("report", path)
    assert_no_traceback(text)
    assert text.returncode in (0, 1, 2), text.stderr
    if text.returncode == 2:
        lines = text.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ")
        return
    # The JSON leg runs in-process (the subprocess above already proved no traceback).
    as_json = CliRunner().invoke(app, ["report", str(path), "--format", "json"])
    assert as_json.exit_code in (0, 1), as_json.output
    doc = json.loads(as_json.stdout)
    # Exit 1 means findings at or above the default fail level (error), and only that.
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert (as_json.exit_code == 1) == bool(errors) == (text.returncode == 1)
    assert doc["schema_version"] == 1 and len(doc["ranks"]) == 1
    rank = doc["ranks"][0]
    assert rank["file"] == str(path)
    for key in ("rank", "world_size", "device", "steps", "totals"):
        assert key in rank
    assert doc["errors"] == []


def test_json_document_fields_and_consistency():
    proc = run("report", shared("hta/nccl_parser_config/nccl_data.json.gz"), "-f", "json")
    doc = json.loads(proc.stdout)
    rank = doc["ranks"][0]
    assert (rank["rank"], rank["world_size"]) == (0, 2)
    assert "A100" in rank["device"]
    assert [s["step"] for s in rank["steps"]] == [4, 5, 6]
    for step in rank["steps"]:
        assert set(step) >= {
            "step",
            "start_ns",
            "end_ns",
            "compute_ns",
            "comm_ns",
            "exposed_comm_ns",
            "idle_ns",
        }
        assert step["exposed_comm_ns"] <= step["comm_ns"] <= step["end_ns"] - step["start_ns"]
    totals = rank["totals"]
    assert set(totals) >= {
        "wall_ns",
        "compute_ns",
        "comm_ns",
        "overlap_ns",
        "exposed_comm_ns",
        "idle_ns",
    }
    assert totals["overlap_ns"] + totals["exposed_comm_ns"] == totals["comm_ns"]
    colls = {(c["collective"], c["dtype"]): c for c in doc["collectives"]}
    ar = colls[("all_reduce", "float32")]
    assert ar["count"] == 15 and ar["process_group"] == "0" and ar["bytes"] > 0
    assert set(doc["collectives"][0]) >= {
        "rank",
        "collective",
        "process_group",
        "dtype",
        "bytes",
        "count",
        "total_ns",
    }


def test_text_report_on_a_sample_names_ranks_and_collectives():
    proc = run("report", SAMPLES / "ddp-4", "--exit-zero")
    assert proc.returncode == 0, proc.stderr
    assert "all_reduce" in proc.stdout
    for rank in range(4):
        assert f"│    {rank} │" in proc.stdout


def test_fail_on_and_exit_zero_set_the_exit_code(tmp_path):
    from kineto_comm.synth import Hardware, generate

    # 100 GB/s links: the exposed all-reduce is a warning (at the table's H100 figures, info).
    links = Hardware(busbw_gbps=100.0)
    generate("exposed-allreduce", tmp_path, ranks=4, layout="dp", steps=2, hardware=links)
    strict = run("report", tmp_path, "--fail-on", "warning", "-f", "json")
    assert strict.returncode == 1
    assert any(f["severity"] in ("warning", "error") for f in json.loads(strict.stdout)["findings"])
    assert run("report", tmp_path, "--fail-on", "warning", "--exit-zero").returncode == 0
    bad = run("report", tmp_path, "--fail-on", "loud")
    assert bad.returncode == 2 and bad.stderr.startswith("error: ")


@pytest.mark.skipif(not hasattr(signal, "SIGPIPE"), reason="no SIGPIPE on this platform")
def test_a_reader_that_stops_early_ends_the_report_as_it_ends_cat():
    """`report | head`: the process ends by SIGPIPE (the shell's 141), silently; before,
    click turned the broken pipe into exit 1, which says "findings" to a CI script."""
    proc = subprocess.Popen(
        [*CLI, "report", str(SAMPLES / "ddp-4"), "--exit-zero", "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(1) == b"{"  # the JSON document (300 KB) outgrows the pipe
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == -signal.SIGPIPE
    assert err == b""


def test_missing_path_is_exit_2_with_one_line():
    proc = run("report", "/nonexistent/trace.json")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: /nonexistent/trace.json: no such file or directory"
    assert proc.stdout == ""


def test_one_corrupt_rank_does_not_lose_the_others(tmp_path):
    good = write_trace(tmp_path / "rank0.json", [kernel("gemm", 0, 10)], rank=0)
    bad = tmp_path / "rank1.json"
    bad.write_text('{"traceEvents": [ this is not json')
    empty = tmp_path / "rank2.json.gz"
    empty.write_bytes(b"")
    text = run("report", tmp_path)
    assert text.returncode == 0
    assert_no_traceback(text)
    # Each unusable file is one `error:` line, printed once, on stderr.
    for broken in (bad, empty):
        assert text.stderr.count(f"error: {broken}: ") == 1
    assert "error:" not in text.stdout
    doc = json.loads(run("report", tmp_path, "--format", "json").stdout)
    assert [r["file"] for r in doc["ranks"]] == [str(good)]
    assert {e["file"] for e in doc["errors"]} == {str(bad), str(empty)}
    assert all("\n" not in e["message"] for e in doc["errors"])


def test_only_bad_files_is_exit_2(tmp_path):
    (tmp_path / "a.json").write_text("not json at all")
    proc = run("report", tmp_path / "a.json", "--format", "json")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().startswith(f"error: {tmp_path / 'a.json'}: not a JSON trace")


def test_truncated_rank_is_reported_with_a_warning(tmp_path):
    events = [kernel(f"k{i}", 10.0 * i, 5.0) for i in range(300)]
    full = write_trace(tmp_path / "x.json", events).read_bytes()
    (tmp_path / "x.json").write_bytes(full[: len(full) // 2])
    proc = run("report", tmp_path / "x.json", "-f", "json")
    assert proc.returncode == 0
    doc = json.loads(proc.stdout)
    assert any("cut off" in w for w in doc["warnings"])


def test_output_file_and_exit_codes(tmp_path):
    out = tmp_path / "r.json"
    proc = run("report", SAMPLES / "tp-2", "-f", "json", "-o", out, "--fail-on", "warning")
    doc = json.loads(out.read_text())
    assert len(doc["ranks"]) == 2 and proc.stdout == ""
    # 1 exactly when a finding is at the fail level (the sample's blocked tensor-parallel
    # all-reduces are exposed: a warning), 0 with --exit-zero or below the fail level.
    assert doc["summary"]["failing_findings"] > 0
    assert proc.returncode == 1
    again = run("report", SAMPLES / "tp-2", "-f", "json", "-o", out, "--exit-zero")
    assert again.returncode == 0
    errors = run("report", SAMPLES / "tp-2", "-f", "json", "-o", out, "--fail-on", "error")
    failing = json.loads(out.read_text())["summary"]["failing_findings"]
    assert errors.returncode == (1 if failing else 0)


def test_ranks_from_metadata_name_and_order_with_duplicates(tmp_path):
    write_trace(tmp_path / "a.json", [kernel("k", 0, 1)], rank=5)
    write_trace(tmp_path / "worker_rank-2.json", [kernel("k", 0, 1)], rank=None)
    write_trace(tmp_path / "zzz.json", [kernel("k", 0, 1)], rank=None)
    write_trace(tmp_path / "dup.json", [kernel("k", 0, 1)], rank=5)
    report = analyze(tmp_path, jobs=1)
    got = dict(zip(report.ranks["file"], report.ranks["rank"], strict=True))
    assert got == {
        str(tmp_path / "a.json"): 5,
        str(tmp_path / "worker_rank-2.json"): 2,
        str(tmp_path / "zzz.json"): 0,
    }
    sources = dict(zip(report.ranks["rank"], report.ranks["rank_source"], strict=True))
    assert sources == {5: "distributedInfo", 2: "file name", 0: "file order"}
    assert [(f, "duplicate" in m) for f, m in report.errors] == [(str(tmp_path / "dup.json"), True)]


def test_files_of_different_jobs_are_flagged(tmp_path):
    write_trace(tmp_path / "a.json", [kernel("k", 0, 1)], rank=0, world_size=2)
    write_trace(tmp_path / "b.json", [kernel("k", 0, 1)], rank=1, world_size=8)
    report = analyze(tmp_path, jobs=1)
    # Two jobs (world sizes 2 and 8): the first analysed, the other's file left out.
    assert [w for w in report.warnings if w.startswith("files of 2 jobs (they differ in world")]
    assert report.ranks["rank"].to_list() == [0]
    assert [f for f, _ in report.errors] == [str(tmp_path / "b.json")]


def test_worker_processes_give_the_same_report_as_one_process():
    one = analyze(SAMPLES / "pp-4", jobs=1)
    two = analyze(SAMPLES / "pp-4", jobs=2)
    for name in ("kernels", "collectives", "steps", "totals"):
        assert getattr(one, name).equals(getattr(two, name)), name


@pytest.mark.parametrize("path", trace_params(all_real_traces()))
def test_every_real_trace_renders_in_every_format(path):
    import dataclasses

    from kineto_comm.findings import Severity
    from kineto_comm.render.formats import FORMATS, render
    from kineto_comm.rules_engine import run_rules

    report = analyze(path, jobs=1)
    assert report.ranks.height or report.errors  # an unusable trace is reported
    report = dataclasses.replace(report, findings=tuple(run_rules(report)))
    for fmt in FORMATS:
        text = render(report, fmt, fail_on=Severity.error)
        # GitHub annotations are one line per finding: none without findings.
        assert text or (fmt == "github" and not report.findings), fmt


def test_an_invalid_comm_pattern_is_one_line_and_exit_2():
    # It used to reach every rank file's model and fail each one with a multi-line
    # "internal error" (Polars' regex engine: Rust syntax, no look-around).
    for pattern, why in (("(", "unclosed group"), ("(?<=x)k", "look-around")):
        bad = run("report", str(SAMPLES / "tp-2"), "--comm-pattern", pattern)
        assert bad.returncode == 2 and why in bad.stderr, bad.stderr
        assert bad.stderr.strip().count("\n") == 0
        assert_no_traceback(bad)
    ok = run("report", str(SAMPLES / "tp-2"), "--comm-pattern", "dispatch|combine", "--exit-zero")
    assert ok.returncode == 0
    with pytest.raises(UsageError, match="not a valid regular expression"):
        analyze(SAMPLES / "tp-2", comm_patterns=["("])


def test_an_unreadable_model_file_is_named_once(tmp_path):
    missing = tmp_path / "missing.toml"
    broken = tmp_path / "broken.toml"
    broken.write_text("[model\n")
    for path, why in ((missing, "cannot read"), (broken, "invalid TOML")):
        for args in (("model", str(path)), ("report", str(SAMPLES / "tp-2"), "--model", str(path))):
            out = run(*args)
            assert out.returncode == 2 and why in out.stderr, out.stderr
            assert out.stderr.count(str(path)) == 1, out.stderr
            assert_no_traceback(out)


def test_a_path_it_cannot_write_is_one_line_naming_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for args in (
        ("synth", "baseline", "--out", str(blocker / "job"), "--ranks", "2"),
        ("report", str(SAMPLES / "tp-2"), "--output", str(blocker / "out.txt")),
    ):
        out = run(*args)
        assert out.returncode == 2, out.stderr
        assert str(blocker) in out.stderr and "internal error" not in out.stderr, out.stderr
        assert out.stderr.strip().count("\n") == 0
        assert_no_traceback(out)
    # Issue 75, item 7: an output under a regular file said "File exists" (mkdir's word).
    saved = run("report", SAMPLES / "tp-2", "-f", "json", "-o", tmp_path / "r.json", "--exit-zero")
    assert saved.returncode == 0, saved.stderr
    for target, args in (
        (blocker / "x", ("report", SAMPLES / "tp-2", "-f", "json", "-o")),
        (blocker / "deeper" / "x.json", ("report", SAMPLES / "tp-2", "--also", "json=")),
        (blocker / "x", ("diff", tmp_path / "r.json", tmp_path / "r.json", "-o")),
    ):
        last = f"{args[-1]}{target}" if args[-1].endswith("=") else target
        out = run(*args[:-1], *([args[-1], target] if last == target else [last]))
        assert out.returncode == 2 and "File exists" not in out.stderr, out.stderr
        assert out.stderr.strip() == f"error: {target}: {blocker} is a file, not a directory"


def test_memory_limit_option():
    bad = run("report", str(SAMPLES / "tp-2"), "--memory-limit", "plenty")
    assert bad.returncode == 2 and "not a memory size" in bad.stderr
    assert_no_traceback(bad)
    ok = run("report", str(SAMPLES / "tp-2"), "--memory-limit", "64M", "--exit-zero")
    assert ok.returncode == 0 and "memory limit" in ok.stdout + ok.stderr


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("--jobs", "0", "jobs must be at least 1 (got 0)"),
        ("--jobs", "-2", "jobs must be at least 1 (got -2)"),
        ("--memory-limit", "0", "memory limit must be more than 0 bytes (got '0')"),
    ],
)
def test_a_setting_that_cannot_run_is_a_usage_error(option, value, problem):
    # They ran, with one worker or the default memory limit, without a word.
    out = run("report", str(SAMPLES / "tp-2"), option, value, "--exit-zero")
    assert out.returncode == 2 and out.stderr.strip() == f"error: {problem}", out.stderr
    with pytest.raises(UsageError, match="must be"):
        analyze(SAMPLES / "tp-2", **{option[2:].replace("-", "_"): int(value)})


def test_analyze_returns_what_report_json_prints(tmp_path, monkeypatch):
    """The README's Python entry point gives what the CLI reports: `analyze(...).to_json()`
    is the text of `report --format json`, findings included; rules are selected as on the
    command line, and a bad selection fails before any trace is read."""
    monkeypatch.chdir(tmp_path)  # no config file above
    path = SAMPLES / "ddp-4"
    report = analyze(path, jobs=1)
    assert report.findings, "the gloo DDP sample has findings (46% exposed all-reduce)"
    out = CliRunner().invoke(app, ["report", str(path), "--format", "json", "-j", "1"])
    assert report.to_json() == out.stdout
    assert report.to_dict()["findings"] == json.loads(out.stdout)["findings"] != []
    some = report.findings[0].code
    picked = analyze(path, jobs=1, select=[some])
    assert picked.findings and {f.code for f in picked.findings} == {some}
    assert analyze(path, jobs=1, ignore=["ALL"]).findings == ()
    with pytest.raises(UsageError, match="NOPE9"):
        analyze(tmp_path / "no-such-dir", select=["NOPE9"])


def test_terminal_output_is_clean(tmp_path):
    """Issue 53, point 7: warnings on stderr in text mode (not repeated on stdout); help
    names values in words with a description for every option; `synth` says the layout it
    wrote."""
    events = [kernel(f"k{i}", 10.0 * i, 5.0) for i in range(300)]
    full = write_trace(tmp_path / "x.json", events).read_bytes()
    (tmp_path / "x.json").write_bytes(full[: len(full) // 2])
    proc = run("report", tmp_path / "x.json")
    assert proc.returncode == 0
    cut = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert any("cut off" in line for line in cut)
    assert "warning:" not in proc.stdout
    to_file = tmp_path / "r.txt"
    assert run("report", tmp_path / "x.json", "-o", to_file).returncode == 0
    assert cut[0] in to_file.read_text()  # a file keeps the whole report

    import typer

    runner = CliRunner()
    command = typer.main.get_command(app)
    for name, sub in command.commands.items():
        for param in sub.params:
            assert (param.help or "").strip(), f"{name} {param.name} has no description"
    for args in [[], ["--help"], *([name, "--help"] for name in command.commands)]:
        shown = runner.invoke(app, args, terminal_width=200).output
        assert "Usage:" in shown, args
        for tag in ("<bool>", "<str>", "<int>", "<path>", "<list[", "{"):
            assert tag not in shown, (args, tag)
    for name, sub in command.commands.items():
        # Each paragraph of a command's description on one line where the terminal is wide
        # enough, not broken where its docstring's lines end.
        wide = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"}).output
        for paragraph in (sub.help or "").split("\n\n"):
            assert " ".join(paragraph.split()) in wide, (name, paragraph)
    assert "[model]" in runner.invoke(app, ["model", "--help"], terminal_width=200).output
    assert "TRACES" in runner.invoke(app, ["report", "--help"]).output.replace("PATHS", "TRACES")

    wrote = runner.invoke(app, ["synth", "bubble", "--ranks", "4", "--out", str(tmp_path / "b")])
    truth = json.loads((tmp_path / "b" / "truth.json").read_text())
    assert truth["layout"] != "dp" and f"({truth['layout']}:" in wrote.output


def test_missing_arguments_are_named():
    """Issue 75, item 7: `report`, `explain`, `model` and `diff a` said `Missing argument ''.`"""
    runner = CliRunner()
    for args, name in (
        (["report"], "PATHS..."),
        (["explain"], "CODE"),
        (["model"], "CONFIG"),
        (["diff", "a"], "NEW"),
    ):
        out = runner.invoke(app, args)
        assert out.exit_code == 2 and f"Missing argument '{name}'." in out.output, out.output


def test_choices_and_rule_codes_are_case_insensitive_everywhere(tmp_path):
    """Issue 75, item 7: `-f JSON` was rejected while `--fail-on WARNING` and `--select
    comm101` were accepted; `--fail-on never` worked for diff, not for report; a bad
    `--fail-on-new` printed Python's `'bogus' is not a valid Severity`."""
    runner = CliRunner()
    sample = str(SAMPLES / "tp-2")
    lower = runner.invoke(app, ["report", sample, "-f", "json", "--fail-on", "warning"])
    upper = runner.invoke(app, ["report", sample, "-f", "JSON", "--fail-on", "WARNING"])
    doc = json.loads(lower.stdout)
    assert doc["summary"]["failing_findings"] > 0  # the sample's tensor-parallel warning
    assert lower.exit_code == upper.exit_code == 1
    assert json.loads(upper.stdout)["findings"] == doc["findings"]
    some = doc["findings"][0]["code"]
    for code in (some.lower(), some.upper(), some.title()):
        picked = runner.invoke(
            app, ["report", sample, "-f", "Json", "--select", code, "--exit-zero"]
        )
        assert {f["code"] for f in json.loads(picked.stdout)["findings"]} == {some}
    name = doc["findings"][0]["rule"]
    assert runner.invoke(app, ["explain", name.upper()]).stdout.startswith(some)
    # never: nothing fails the report (as --exit-zero), in report as in diff.
    never = runner.invoke(app, ["report", sample, "-f", "json", "--fail-on", "NEVER"])
    assert never.exit_code == 0 and json.loads(never.stdout)["findings"] == doc["findings"]
    saved = tmp_path / "r.json"
    saved.write_text(lower.stdout)
    for value in ("never", "Never", "ERROR", "info"):
        same = runner.invoke(app, ["diff", str(saved), str(saved), "--fail-on-new", value])
        assert same.exit_code == 0 and same.stdout.startswith("kineto-comm diff"), same.output
    as_json = runner.invoke(app, ["diff", str(saved), str(saved), "-f", "JSON"])
    assert json.loads(as_json.stdout)["failed"] is False
    wrote = runner.invoke(
        app, ["synth", "Baseline", "--layout", "DP", "--ranks", "2", "--out", str(tmp_path / "j")]
    )
    assert wrote.exit_code == 0 and "wrote baseline (dp:" in wrote.output, wrote.output
    assert json.loads((tmp_path / "j" / "truth.json").read_text())["scenario"] == "baseline"
    # One line naming the option, its value and the choices; exit 2.
    for args, option, value in (
        (["diff", str(saved), str(saved), "--fail-on-new", "bogus"], "--fail-on-new", "bogus"),
        (["report", sample, "--fail-on", "loud"], "--fail-on", "loud"),
        (["report", sample, "-f", "xml"], "--format", "xml"),
        (["diff", str(saved), str(saved), "-f", "html"], "--format", "html"),
        (["diff", str(saved), str(saved), "--max-regression", "five"], "--max-regression", "five"),
        (["diff", str(saved), str(saved), "--max-busbw-drop", "-3"], "--max-busbw-drop", "-3"),
    ):
        out = run(*args)
        assert out.returncode == 2 and out.stdout == "", out.stderr
        line = out.stderr.strip()
        assert "\n" not in line and line.startswith(f"error: {option}: "), line
        assert repr(value) in line and "Severity" not in line, line
    # Help names values in words: no Typer range tag (`N [x>=1]`).
    shown = runner.invoke(app, ["report", "--help"], terminal_width=200).output
    assert "x>=" not in shown and "[x" not in shown
    assert "(at least 1)" in shown


@pytest.mark.parametrize("fmt", ["json", "text", "markdown"])
def test_an_output_named_gz_is_gzip(tmp_path, fmt):
    """Issue 75, item 7: `-o r.json.gz` wrote plain text into a .gz name; now gzip (any
    format, --also and diff -o too), holding what the plain file holds."""
    import gzip

    sample = str(SAMPLES / "tp-2")
    plain = tmp_path / ("r.json" if fmt == "json" else "r.out")  # diff reads a .json report
    packed, also = tmp_path / "r.out.gz", tmp_path / "a" / "r.gz"
    args = ["report", sample, "-f", fmt, "--exit-zero"]
    assert run(*args, "-o", plain).returncode == 0
    assert run(*args, "-o", packed, "--also", f"{fmt}={also}").returncode == 0
    for path in (packed, also):
        assert path.read_bytes()[:2] == b"\x1f\x8b"  # the gzip magic
        text = gzip.decompress(path.read_bytes()).decode()
        if fmt == "json":
            assert json.loads(text)["findings"] == json.loads(plain.read_text())["findings"]
        else:
            assert text == plain.read_text()
    if fmt == "json":
        out = tmp_path / "d.json.gz"
        assert run("diff", plain, plain, "-f", "json", "-o", out).returncode == 0
        assert json.loads(gzip.decompress(out.read_bytes()))["failed"] is False
