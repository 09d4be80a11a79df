"""The perfetto export (kineto_comm.render.perfetto): a Chrome trace event file that
Perfetto UI and chrome://tracing open, every time on the reference clock.

The file is checked against the Chrome trace event format by `validate` below (phases,
required fields, flow pairs, nesting and monotone times per track), read back by
kineto-comm's own loader (the kernels' times survive exactly) and by HTA's parser, and on
a synthetic straggler job every arrow must start at the injected straggler."""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from kineto_comm import analyze, budget, rank_store
from kineto_comm.analysis.stragglers import NOISE_NS
from kineto_comm.render.perfetto import (
    _quoted,
    parse_numbers,
    select,
    timeline_pieces,
    write_timeline,
)
from kineto_comm.synth import generate

from .conftest import REPO, SAMPLES, trace_params

TP_DP = REPO / "tests" / "data" / "h100-nccl" / "tp-dp-8"
PHASES = {"X", "i", "s", "f", "M"}
META = {"process_name", "process_sort_index", "process_labels", "thread_name", "thread_sort_index"}


def _ns(us: Any) -> int:
    """A `ts`/`dur` in microseconds as integer nanoseconds (exactly, from its decimal text)."""
    return int(Decimal(str(us)) * 1000)


def validate(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Check `doc` against the Chrome trace event format (JSON object form) and return its
    events; AssertionError naming the first problem.

    Every event has a known phase and its required fields; complete slices (X) have a
    duration >= 0 and, on each track (pid, tid), appear in start order and nest (a slice
    starting inside another ends inside it: no partial overlap, which viewers draw wrong);
    instants and flow events are in time order on their track too; each flow start (s) has
    exactly one end (f) with the same id, name and category, and both lie inside a slice of
    their track (the slice they bind to)."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    events = doc["traceEvents"]
    slices: dict[tuple[int, int], list[tuple[int, int]]] = {}
    last_ts: dict[tuple[int, int], int] = {}
    open_stack: dict[tuple[int, int], list[int]] = {}
    flows: dict[Any, dict[str, tuple]] = {}
    for e in events:
        ph = e.get("ph")
        assert ph in PHASES, e
        assert isinstance(e.get("pid"), int) and isinstance(e.get("name"), str), e
        if ph == "M":
            assert e["name"] in META and isinstance(e.get("args"), dict), e
            if e["name"].startswith("thread"):
                assert isinstance(e.get("tid"), int), e
            continue
        assert isinstance(e.get("tid"), int) and isinstance(e.get("cat"), str), e
        assert isinstance(e.get("ts"), (int, float)), e
        track, ts = (e["pid"], e["tid"]), _ns(e["ts"])
        assert ts >= last_ts.get(track, ts), f"ts goes back on track {track}: {e}"
        last_ts[track] = ts
        if ph == "X":
            dur = _ns(e["dur"])
            assert dur >= 0, e
            stack = open_stack.setdefault(track, [])
            while stack and stack[-1] <= ts:
                stack.pop()
            assert not stack or ts + dur <= stack[-1], f"slice overlaps its parent: {e}"
            stack.append(ts + dur)
            slices.setdefault(track, []).append((ts, ts + dur))
        elif ph in ("s", "f"):
            assert "id" in e, e
            side = flows.setdefault(e["id"], {})
            assert ph not in side, f"flow id {e['id']} has two {ph} events"
            side[ph] = (e["name"], e["cat"], track, ts)
            if ph == "f":
                assert e.get("bp") == "e", e
        elif ph == "i":
            assert e.get("s") in ("t", "p", "g"), e
    for fid, side in flows.items():
        assert set(side) == {"s", "f"}, f"flow {fid} is not a pair: {side}"
        assert side["s"][:2] == side["f"][:2], f"flow {fid}: name or category differ"
        for _, _, track, ts in side.values():
            assert any(a <= ts <= b for a, b in slices.get(track, [])), (
                f"flow {fid} binds to no slice on {track} at {ts}"
            )
    return events


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def tp_dp():
    return analyze(TP_DP)


@pytest.fixture(scope="module")
def straggler_job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("straggler")
    truth = generate("straggler", folder, ranks=8, seed=3, steps=3)
    return folder, truth


def test_real_capture_exports_a_valid_trace_on_the_reference_clock(tp_dp, tmp_path):
    out = tmp_path / "job.json.gz"
    chosen = write_timeline(tp_dp, out, select(tp_dp, ranks=range(8)))
    with out.open("rb") as fh:
        assert fh.read(2) == b"\x1f\x8b"  # gzip by name
    doc = load(out)
    events = validate(doc)
    base = doc["baseTimeNanoseconds"]
    # One process per rank, named with its rank, host and group roles.
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names) == chosen.ranks == list(range(8))
    for rank, name in names.items():
        assert name.startswith(f"rank {rank} ")
        roles = tp_dp.process_groups.filter(pl.col("ranks").list.contains(rank))["role"]
        assert roles.len() > 0 and all(role in name for role in roles)
    # Every kernel of every rank, at its start and end on the report's clock.
    kernels = [e for e in events if e["ph"] == "X" and e["cat"] == "kernel"]
    got = sorted(
        (e["pid"], base + _ns(e["ts"]), base + _ns(e["ts"]) + _ns(e["dur"])) for e in kernels
    )
    want = sorted(tp_dp.kernels.select("rank", "start_ns", "end_ns").iter_rows())
    assert got == want
    # Each waiting communication kernel holds a wait and a transfer; waits end where the
    # last rank arrived (its kernel's start), which the arrow joins.
    waits = [e for e in events if e.get("cat") == "comm_wait"]
    assert waits and all(e["name"] == f"wait for rank {e['args']['last_rank']}" for e in waits)
    arrivals = {
        e["args"]["instance"]: base + _ns(e["ts"])
        for e in events
        if e.get("cat") == "comm_transfer" and e["pid"] == e["args"]["last_rank"]
    }
    for e in waits:
        assert base + _ns(e["ts"]) + _ns(e["dur"]) == arrivals[e["args"]["instance"]]
    flows = Counter(e["ph"] for e in events if e.get("cat") == "wait_flow")
    assert flows["s"] == flows["f"] == len(waits)
    # A finding track per rank the finding names, a steps track.
    findings = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert any(n.startswith("finding 1: ") for n in findings)
    assert "steps (device window)" in findings


def test_export_reads_back_through_kineto_comm_and_hta(tp_dp, tmp_path):
    folder = tmp_path / "export"
    folder.mkdir()
    out = folder / "job.json"
    write_timeline(tp_dp, out, select(tp_dp, ranks=[0, 1, 2]))
    back = analyze(out)
    assert back.errors == () and back.ranks.height == 1
    # Our loader finds the same kernels at the same (aligned) times.
    want = tp_dp.kernels.filter(pl.col("rank") <= 2)
    assert sorted(back.kernels.select("start_ns", "end_ns").iter_rows()) == sorted(
        want.select("start_ns", "end_ns").iter_rows()
    )
    hta = pytest.importorskip("hta.trace_analysis", reason="HTA is a test dependency")
    logging.disable(logging.CRITICAL)
    try:
        trace = hta.TraceAnalysis(trace_dir=str(folder)).t.get_trace(0)
    finally:
        logging.disable(logging.NOTSET)
    assert len(trace) >= want.height


def test_arrows_of_every_call_start_at_the_injected_straggler(straggler_job, tmp_path):
    folder, truth = straggler_job
    (problem,) = truth["problems"]
    (late,) = problem["ranks"]
    report = analyze(folder)
    chosen = select(report)
    assert late in chosen.ranks and "straggler" in chosen.why[late]
    write_timeline(report, tmp_path / "a.json", select(report, ranks=range(8)))
    doc = load(tmp_path / "a.json")
    events = validate(doc)
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    assert starts and {e["pid"] for e in starts} == {late}
    assert all(e["pid"] != late for e in ends)
    # Every call whose ranks arrived apart has its arrows: one to each rank that waited.
    late_calls = report.collective_instances.filter(pl.col("arrival_skew_ns") >= NOISE_NS)
    assert late_calls.height > 0 and (late_calls["last_rank"] == late).all()
    width = doc["otherData"]["flow_id_width"]  # flow id = instance x width + waiting rank
    drawn = Counter(e["id"] // width for e in ends)
    waited = report.collective_waits.filter(pl.col("wait_ns") > 0).group_by("instance").len()
    assert drawn == dict(waited.iter_rows())
    assert set(drawn) == set(late_calls["instance"])


def test_default_selection_and_what_is_left_out(straggler_job, tmp_path):
    folder, truth = straggler_job
    report = analyze(folder)
    # Every rank fits the size budget: every rank is shown, the chosen ones labelled.
    (problem,) = truth["problems"]
    (late,) = problem["ranks"]
    whole = select(report)
    assert whole.ranks == list(range(8)) and whole.steps is None
    assert "straggler" in whole.why[late]
    # Beyond the budget the ranks are sampled (then the steps), and the file says so.
    chosen = select(report, max_bytes=1)
    assert 1 < len(chosen.ranks) < 8 and late in chosen.ranks
    assert any("ranks would be about" in n for n in chosen.notes)
    write_timeline(report, tmp_path / "d.json", chosen)
    doc = load(tmp_path / "d.json")
    validate(doc)
    meta = doc["otherData"]
    assert sorted(meta["ranks_included"] + meta["ranks_left_out"]) == list(range(8))
    assert {e["pid"] for e in doc["traceEvents"]} == set(meta["ranks_included"])
    # Arrows to ranks that are not in the file are left out, and counted.
    assert meta["flows_left_out"] == 0  # the straggler, their start, is always in
    # Steps asked for: only their kernels; the rest named as left out.
    one = select(report, steps=[1])
    write_timeline(report, tmp_path / "s.json", one)
    doc = load(tmp_path / "s.json")
    validate(doc)
    assert doc["otherData"]["steps_included"] == [1]
    assert doc["otherData"]["steps_left_out"] == [0, 2]
    kernel_steps = {e["args"]["step"] for e in doc["traceEvents"] if e.get("cat") == "kernel"}
    assert kernel_steps == {1}
    # A ceiling below the whole job keeps the middle steps and says so.
    small = select(report, ranks=range(8), max_bytes=1)
    assert small.steps == [1] and "middle step" in small.notes[0]
    # 'all' is every rank and every step, whatever the size.
    every = select(report, ranks="all", steps="all", max_bytes=1)
    assert every.ranks == list(range(8)) and every.steps is None


def test_the_default_shows_every_rank_of_a_job_that_fits(tp_dp):
    """An 8-rank real capture is far under the size budget: all 8 ranks, every step."""
    chosen = select(tp_dp)
    assert chosen.ranks == sorted(tp_dp.ranks["rank"].to_list()) and len(chosen.ranks) == 8
    assert chosen.steps is None and chosen.metadata()["ranks_left_out"] == []


def test_ranks_or_steps_the_job_lacks_are_errors_naming_those_it_has(tp_dp):
    ranks = sorted(tp_dp.ranks["rank"].to_list())
    steps = select(tp_dp).all_steps
    assert ranks == list(range(8)) and steps
    with pytest.raises(ValueError, match=r"--ranks: rank 9 not in the job, which has ranks 0-7"):
        select(tp_dp, ranks=[9])
    with pytest.raises(ValueError, match=r"ranks 8-9 not in the job"):
        select(tp_dp, ranks=[1, 8, 9])
    last = max(steps)
    with pytest.raises(ValueError, match=rf"--steps: step {last + 90} not in .* steps {steps[0]}"):
        select(tp_dp, steps=[last, last + 90])


def test_cli_refuses_ranks_and_steps_the_job_lacks(tmp_path):
    """`--ranks 9` on a 4-rank job, `--steps 99`: exit 2 with one line naming what exists,
    and no file; without them every rank of the job is in the file."""
    job = SAMPLES / "ddp-4"
    out = tmp_path / "t.json"
    base = [sys.executable, "-m", "kineto_comm.cli", "report", str(job), "-f", "perfetto"]
    for extra, named in (
        (["--ranks", "9"], "which has ranks 0-3"),
        (["--steps", "99"], "which has steps"),
    ):
        run = subprocess.run(
            [*base, "-o", str(out), *extra], capture_output=True, text=True, cwd=REPO
        )
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        assert run.returncode == 2, run.stderr
        assert len(errors) == 1 and extra[0] in errors[0] and named in errors[0], run.stderr
        assert "Traceback" not in run.stderr and not out.exists()
    run = subprocess.run(
        [*base, "-o", str(out), "--exit-zero"], capture_output=True, text=True, cwd=REPO
    )
    assert run.returncode == 0, run.stderr
    assert load(out)["otherData"]["ranks_included"] == [0, 1, 2, 3]


def test_ranks_are_chosen_by_the_per_rank_tables_mean_step():
    """The median, slowest and fastest ranks are chosen by each rank's mean step as the
    report's per-rank table gives it (its windows of the complete steps), not by a mean
    that takes in the last, cut step too."""
    from kineto_comm.render.json_doc import rank_means
    from kineto_comm.render.perfetto import rank_scores

    report = analyze(REPO / "tests" / "data" / "h100-nccl" / "pp-4", jobs=1)
    assert not report.step_times["complete"].all()
    table = {r["rank"]: r["wall_ns"] for r in rank_means(report)}
    assert rank_scores(report) == pytest.approx(table)


def test_kept_in_files_the_export_is_the_same(monkeypatch, tmp_path):
    """Big jobs keep every rank's rows in files (the spill path): the export reads them a
    rank at a time and writes the same bytes."""
    folder = SAMPLES / "ddp-4"
    memory = "".join(timeline_pieces(analyze(folder), None))
    monkeypatch.setattr(budget, "SPILL_ABOVE", 0)
    monkeypatch.setattr(rank_store, "BATCH_ROWS", 1)
    files = analyze(folder)
    assert files.rank_kernels.spilled and files.rank_waits.spilled
    whole = rank_store.RankStore.frame

    def some_ranks(self, ranks=None, columns=None):
        assert ranks is not None, "every rank's rows assembled"
        return whole(self, ranks, columns)

    monkeypatch.setattr(rank_store.RankStore, "frame", some_ranks)
    assert "".join(timeline_pieces(files, None)) == memory
    validate(json.loads(memory))


def test_trace_strings_are_escaped_json():
    nasty = ['a"b', "back\\slash", "tab\tnew\nline", "bell\x07", "ünï €", "</script>"]
    quoted = pl.DataFrame({"s": nasty}).select(q=_quoted(pl.col("s")))["q"].to_list()
    assert [json.loads(q) for q in quoted] == nasty


@pytest.mark.parametrize(
    ("spec", "numbers"),
    [("0,3,8-11", [0, 3, 8, 9, 10, 11]), ("all", "all"), (None, None), ("5", [5])],
)
def test_rank_and_step_lists_parse(spec, numbers):
    assert parse_numbers(spec) == numbers


@pytest.mark.parametrize("bad", ["a", "3-1", "1-x"])
def test_bad_rank_lists_are_errors(bad):
    with pytest.raises(ValueError):
        parse_numbers(bad)


def test_cli_writes_the_timeline_and_the_report(tmp_path):
    out = tmp_path / "job.json.gz"
    also = tmp_path / "r.html"
    run = subprocess.run(
        [sys.executable, "-m", "kineto_comm.cli", "report", str(TP_DP), "--format", "perfetto"]
        + ["-o", str(out), "--ranks", "0-3", "--steps", "3", "--also", f"html={also}"]
        + ["--exit-zero"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr
    doc = load(out)
    validate(doc)
    assert doc["otherData"]["ranks_included"] == [0, 1, 2, 3]
    assert doc["otherData"]["steps_included"] == [3]
    assert also.read_text().startswith("<!DOCTYPE html>")
    bad = subprocess.run(
        [sys.executable, "-m", "kineto_comm.cli", "report", str(TP_DP), "-f", "perfetto"]
        + ["--ranks", "x"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert bad.returncode == 2 and "expected numbers" in bad.stderr
    alone = subprocess.run(
        [sys.executable, "-m", "kineto_comm.cli", "report", str(TP_DP), "--ranks", "0"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert alone.returncode == 2 and "no perfetto output" in alone.stderr


FOLDERS = sorted(
    [p for p in SAMPLES.iterdir() if p.is_dir()]
    + [p for p in (REPO / "tests" / "data" / "h100-nccl").iterdir() if p.is_dir()]
)


@pytest.mark.parametrize("folder", trace_params(FOLDERS))
def test_every_real_capture_exports_a_valid_trace(folder, tmp_path):
    """Every layout (gloo host spans, NCCL kernels, pipelines, one rank): a valid file with
    every kernel of every rank, each arrow from a call's last arriver."""
    report = analyze(folder)
    out = tmp_path / "t.json"
    write_timeline(report, out, select(report, ranks="all", steps="all"))
    events = validate(load(out))
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert len(kernels) == report.rank_kernels.height
    last = dict(report.collective_instances.select("instance", "last_rank").iter_rows())
    waits = {e["args"]["instance"]: e for e in events if e.get("cat") == "comm_wait"}
    for e in waits.values():
        assert e["args"]["last_rank"] == last[e["args"]["instance"]]
    starts = [e for e in events if e["ph"] == "s"]
    assert len(starts) == len([e for e in events if e.get("cat") == "comm_wait"])
    # One step of two ranks: every arrow still has both ends (a call near a step's edge
    # may be in another step on another rank), and the kernels are that step's.
    steps = sorted(report.steps.filter(pl.col("step") >= 0)["step"].unique())
    if steps:
        step = steps[len(steps) // 2]
        write_timeline(
            report, out, select(report, ranks=[0, report.ranks.height - 1], steps=[step])
        )
        doc = load(out)
        events = validate(doc)
        assert {e["args"]["step"] for e in events if e.get("cat") == "kernel"} <= {step}


def test_the_critical_path_becomes_its_own_track(tp_dp, tmp_path):
    """The report's `critical_path` (issue #51's model: each step's chain of ranks as time
    segments) is drawn on each rank's `critical path` track, segment for segment, on the
    reference clock; a report without one says so in the file."""
    path = tp_dp.critical_path.filter(pl.col("step") == 3)
    assert path.height >= 2  # tp-dp-8's step 3: the critical rank and the rank it waited for
    ranks = sorted(set(path["rank"].to_list()))
    out = tmp_path / "path.json"
    write_timeline(tp_dp, out, select(tp_dp, ranks=ranks, steps=[3]))
    doc = load(out)
    events = validate(doc)
    assert doc["otherData"]["critical_path"] == "included"
    crit = [e for e in events if e.get("cat") == "critical_path"]
    base = doc["baseTimeNanoseconds"]
    got = sorted((e["pid"], base + _ns(e["ts"]), e["name"]) for e in crit)
    assert got == sorted(path.select("rank", "start_ns", "name").iter_rows())
    bare = dataclasses.replace(tp_dp, critical_path=pl.DataFrame())
    write_timeline(bare, out, select(bare, ranks=[0, 1]))
    assert load(out)["otherData"]["critical_path"] == "none in this report"
