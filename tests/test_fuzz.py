"""Damaged and hostile input (issue 55): the fuzz campaign of tests/fuzz.py, and one test
per root cause it found, each on a real trace."""

from __future__ import annotations

import collections
import gzip
import json
import os
from pathlib import Path

import polars as pl
import pytest

from kineto_comm import analyze
from kineto_comm.load import decode
from kineto_comm.load import scan as scanner
from tests import fuzz
from tests.conftest import H100_TRACES, SAMPLES, shared

# Cases per family (x 12 families) in the default run, with `pytest -m slow` (CI) and under
# `pytest -m fuzz`.
QUICK_PER_FAMILY = 3
DEFAULT_PER_FAMILY = 25
CAMPAIGN_PER_FAMILY = 840  # 12 x 840 = 10,080 cases
# How long the cases take is measured by bench/bench_fuzz.py, not asserted here.


def _summary(results: list[tuple[str, int, float, list[str]]]) -> str:
    per = collections.Counter(family for family, *_ in results)
    bad = collections.Counter(family for family, _, _, problems in results if problems)
    slow = max((sec for _, _, sec, _ in results), default=0.0)
    return f"cases per family {dict(per)}; failing {dict(bad)}; slowest {slow:.1f} s"


def _check(results: list[tuple[str, int, float, list[str]]]) -> None:
    failures = [f"{f}:{s}: {p[0]}" for f, s, _, p in results if p]
    assert not failures, _summary(results) + "\n" + "\n".join(failures[:20])


@pytest.mark.parametrize("family", fuzz.ALL_FAMILIES)
@pytest.mark.parametrize(
    "seeds",
    [
        pytest.param(range(QUICK_PER_FAMILY), id="quick"),
        pytest.param(
            range(QUICK_PER_FAMILY, DEFAULT_PER_FAMILY), id="more", marks=pytest.mark.slow
        ),
    ],
)
def test_fuzz_cases_keep_the_contract(family, seeds, tmp_path):
    """Seeded cases of every family: a few in the default run, a few hundred in all with
    the slow ones (CI)."""
    _check(fuzz.run_cases([(family, seed) for seed in seeds], tmp_path))


@pytest.mark.fuzz
def test_fuzz_campaign(tmp_path):
    """>= 10,000 cases over two processes (`pytest -m fuzz`); prints counts per family."""
    results = fuzz.campaign(CAMPAIGN_PER_FAMILY, tmp_path, processes=os.cpu_count() or 2)
    assert len(results) >= 10_000
    print(_summary(results))
    _check(results)


def test_the_fuzz_checks_can_fail(tmp_path):
    """The harness sees what it must: a negative size, a markup crash's traceback line, an
    ESC byte, and two read paths that disagree."""
    assert fuzz.negatives({"ranks": [{"totals": {"wall_ns": -1, "start_ns": -5}}]}) == [
        ".ranks[0].totals.wall_ns=-1"
    ]
    assert fuzz._lines_ok("Traceback (most recent call last):\n", 1)
    assert fuzz._lines_ok("error: x: internal error while analysing (KeyError: 1)", 2)
    frame = pl.DataFrame({"a": [1]})
    ok = ("ok", {"gpu": frame}, (0,))
    assert fuzz._disagreements({"a": ok, "b": ("ok", {"gpu": frame.with_columns(a=2)}, (0,))})
    assert fuzz._disagreements({"a": ok, "b": ("error", "bad")})


# ------------------------------------------------------------------ one test per cause


def _json_report(path: Path | str, *extra: str) -> tuple[int, dict, str]:
    code, out, err = fuzz.run_cli(["report", str(path), "--format", "json", "-j", "1", *extra])
    return code, (json.loads(out) if code in (0, 1) else {}), err


def test_a_real_trace_decompressed_reports_like_its_gzip(tmp_path):
    # A plain .json of 16-64 MiB that the scanner hands back (the 2021 schema's text thread
    # ids) was read whole into a memory map, and pieces of it called .index on it.
    gz = shared("kineto-tb-plugin/worker0.1623143089861.pt.trace.json.gz")
    plain = tmp_path / gz.name.removesuffix(".gz")
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    assert 16 << 20 < plain.stat().st_size < 64 << 20
    code_gz, doc_gz, err_gz = _json_report(gz)
    code, doc, err = _json_report(plain)
    assert (code, err) == (code_gz, err_gz.replace(str(gz), str(plain)))
    assert doc["ranks"][0]["totals"] == doc_gz["ranks"][0]["totals"]
    assert doc["ranks"][0]["totals"]["wall_ns"] > 0


def _real(
    tmp_path: Path, name: str = "rank-0.json", source: Path = SAMPLES / "tp-2"
) -> tuple[Path, dict]:
    """A real capture (rank 0 of `source`: the gloo tp-2 sample) as a document to damage."""
    text = gzip.decompress((source / "rank-0.pt.trace.json.gz").read_bytes())
    return tmp_path / name, json.loads(text)


def test_times_near_int64_are_dropped_with_a_warning_not_wrapped(tmp_path):
    path, doc = _real(tmp_path)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    kernels[0]["ts"], kernels[1]["dur"], kernels[2]["ts"] = 9.2e15, 9.3e15, 1e18
    path.write_text(json.dumps(doc))
    code, report, err = _json_report(path)
    assert code in (0, 1), err
    assert not fuzz.negatives(report)
    wall = report["ranks"][0]["totals"]["wall_ns"]
    assert 0 < wall < 10**9  # the capture's own wall (~0.1 s), not decades
    warned = [w for w in report["warnings"] if "out of range; dropped" in w]
    assert warned and all(str(path) in w and "\n" not in w for w in warned)


def test_huge_collective_sizes_become_unknown_never_negative(tmp_path):
    path, doc = _real(tmp_path, source=H100_TRACES[0].parent)
    calls = [e for e in doc["traceEvents"] if e.get("name") == "record_param_comms"]
    assert calls
    for i, e in enumerate(calls[:4]):
        e["args"]["In msg nelems"] = (2**63 - 1, -(2**63), 2**64 + 5, -5)[i]
    path.write_text(json.dumps(doc))
    code, report, err = _json_report(path)
    assert code in (0, 1), err
    assert not fuzz.negatives(report)
    assert all(c["bytes"] is None or c["bytes"] >= 0 for c in report["collectives"])
    assert [w for w in report["warnings"] if "`In msg nelems` out of range" in w]


def test_one_file_with_an_impossible_world_size_loses_only_itself(tmp_path):
    # The ranks table was built outside the per-file isolation: world_size >= 2^63 in one
    # file ended the whole report.
    for p in (SAMPLES / "ddp-4").glob("*.json.gz"):
        doc = json.loads(gzip.decompress(p.read_bytes()))
        if p.name.startswith("rank-2"):
            doc["distributedInfo"]["world_size"] = 2**63
            doc["distributedInfo"]["pg_config"][0]["ranks"] = [0, 1, 2, 99999999999999999999]
        (tmp_path / p.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    code, report, err = _json_report(tmp_path, "--exit-zero")
    assert code == 0, err
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1, 2, 3]
    assert [w for w in report["warnings"] if "world_size" in w and "out of range" in w]


def test_a_huge_step_number_or_negative_rank_is_ignored_with_a_warning(tmp_path):
    path, doc = _real(tmp_path, "rank-1.pt.trace.json")
    step = next(e for e in doc["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#"))
    step["name"] = "ProfilerStep#" + "9" * 25
    doc["distributedInfo"]["rank"] = -1
    path.write_text(json.dumps(doc))
    code, report, err = _json_report(path, "--exit-zero")
    assert code == 0, err
    [rank] = report["ranks"]
    assert (rank["rank"], rank["rank_source"]) == (1, "file name")
    assert [w for w in report["warnings"] if "distributedInfo.rank -1 is out of range" in w]
    assert all(s["step"] < 2**63 for s in rank["steps"])


@pytest.mark.parametrize("name", ["[/]", "\x1b[31mred\x1b]0;title\x07", "[bold]x"])
def test_trace_strings_are_printed_as_text(tmp_path, name, monkeypatch):
    # Wide enough that the text keeps the device and dtype columns (at 80 it drops them).
    monkeypatch.setenv("COLUMNS", "250")  # (conftest's default, 120, would do too)
    path, doc = _real(tmp_path)
    doc["deviceProperties"] = [{"id": 0, "name": name}]
    for e in doc["traceEvents"]:
        if e.get("name") == "record_param_comms":
            e["args"]["dtype"] = name
    path.write_text(json.dumps(doc))
    code, out, err = fuzz.run_cli(["report", str(path), "--exit-zero", "-j", "1"])
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert ("[/]" in out) if name == "[/]" else True
    assert "\\x1b" in out if "\x1b" in name else "[bold]" in out if "bold" in name else True


def test_the_answer_does_not_depend_on_the_memory_limit(tmp_path):
    # A damaged rank was rejected at the default but kept with null totals at 24M (read
    # in pieces, the pieces before the damage were kept); a corrupt gzip likewise.
    for p in (SAMPLES / "tp-2").glob("*.json.gz"):
        data = gzip.decompress(p.read_bytes())
        if p.name.startswith("rank-1"):
            at = len(data) * 3 // 4
            data = data[:at] + b"@" + data[at + 1 :]
        (tmp_path / p.name).write_bytes(gzip.compress(data))
    answers = []
    for limit in (None, "16M", "24M", "100M"):
        extra = [] if limit is None else ["--memory-limit", limit]
        code, report, err = _json_report(tmp_path, "--exit-zero", *extra)
        # The errors (a limit below the need adds a warning of its own; that is all).
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        answers.append((code, [r["rank"] for r in report["ranks"]], errors))
    assert all(a == answers[0] for a in answers), answers
    [error] = answers[0][2]
    assert answers[0][1] == [0] and "rank-1" in error and "invalid JSON" in error


def test_trace_events_twice_reads_the_last_in_every_path(tmp_path, monkeypatch):
    _, doc = _real(tmp_path)
    events = doc.pop("traceEvents")
    body = json.dumps({"traceEvents": events[:50], **doc, "traceEvents_": events}, indent=1)
    path = tmp_path / "twice.json"
    path.write_text(body.replace('"traceEvents_"', '"traceEvents"'))
    whole = decode.decode_file(Path(path))
    assert [w for w in whole.warnings if "traceEvents appears more than once" in w]
    reference = decode.decode_file(_write(tmp_path / "once.json", {**doc, "traceEvents": events}))
    for scan in (True, False):
        with monkeypatch.context() as m:
            if not scan:
                m.setattr(scanner, "_scanner", None)
            for piece in (None, 32 * 1024):
                got = decode.decode_file(path, piece)
                for table in ("gpu", "ops", "host", "threads"):
                    assert getattr(got, table).equals(getattr(reference, table)), (scan, piece)
                assert got.rank == reference.rank == 0


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc, indent=1))
    return path


def test_symlinked_folders_are_followed_once(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "node0").symlink_to(SAMPLES / "tp-2", target_is_directory=True)
    (job / "node0-again").symlink_to(job, target_is_directory=True)  # a loop
    report = analyze(job, jobs=1)
    assert sorted(report.ranks["rank"].to_list()) == [0, 1]
    assert not report.errors


def test_deep_nesting_is_an_input_error(tmp_path):
    path, doc = _real(tmp_path)
    doc["deep"] = "DEEP"
    path.write_text(json.dumps(doc).replace('"DEEP"', "[" * 5000 + "]" * 5000))
    code, _, err = _json_report(path)
    assert code == 2
    [line] = err.splitlines()
    assert line.startswith(f"error: {path}: invalid JSON trace") and "internal" not in line


def test_a_cut_off_file_without_its_rank_says_so(tmp_path):
    _, doc = _real(tmp_path)
    info = doc.pop("distributedInfo")
    text = json.dumps({**doc, "distributedInfo": info}, indent=1)  # after the events
    path = tmp_path / "rank-1.json"
    path.write_text(text[: len(text) // 2])
    raw = decode.decode_file(path)
    assert raw.rank is None
    assert [w for w in raw.warnings if "no distributedInfo before the cut" in w]


def test_what_a_piece_reads_does_not_depend_on_where_the_file_is_cut(tmp_path):
    """Campaign cases collargs:549/627/733. On HTA's trace_filter trace, a record_param_comms
    named a collective but without a size still leaves its annotation's Input Dims to be
    read; on the MI250 trace, a kernel whose stream is out of range keeps its host thread,
    and only it. Both were decided per piece, so whole and pieces gave different tables."""
    text = gzip.decompress(shared("hta/trace_filter/sampled_rank-0.json.gz").read_bytes())
    doc = json.loads(text)
    comms = [e for e in doc["traceEvents"] if e.get("name") == "record_param_comms"]
    comms[-1].setdefault("args", {})["Collective name"] = "allreduce"
    filtered = _write(tmp_path / "filter.json", doc)
    text = gzip.decompress(
        shared("hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz").read_bytes()
    )
    doc = json.loads(text)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[len(kernels) // 2]["args"]["stream"] = 2**64 + 5
    mi250 = _write(tmp_path / "mi250.json", doc)
    for path in (filtered, mi250):
        got = fuzz._decode_all(path)
        assert all(v[0] == "ok" for v in got.values()), got
        assert not fuzz._disagreements(got), (path.name, fuzz._disagreements(got))
    ops = decode.decode_file(filtered, fuzz.PIECE).ops
    sized = ops.filter(pl.col("name").str.starts_with("nccl:"))
    assert sized.height and sized.get_column("input_dims").null_count() == 0
    gpu = decode.decode_file(mi250).gpu
    assert gpu.filter(pl.col("tid").is_not_null()).height == 1
    assert gpu.filter(pl.col("stream").is_null()).height == 1
