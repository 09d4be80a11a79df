"""Machine formats on real and synthetic reports: JSON schema, SARIF schema, JUnit counts,
GitHub annotation escaping, Markdown escaping, the format registry and the exit-code policy."""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import polars as pl
import pytest

import kineto_comm
from kineto_comm.findings import Finding, Severity
from kineto_comm.rank_store import RankStore
from kineto_comm.render import github, json_doc, junit, markdown, sarif
from kineto_comm.render.formats import (
    FORMATS,
    exit_code,
    parse_also,
    parse_severity,
    render,
    write,
)
from kineto_comm.report import Report

from .conftest import SAMPLES

REPO = Path(__file__).resolve().parents[1]
EVIL = "ncclKernel_<script>alert(1)</script>|x,y:z%\r\nnext"


def make_findings() -> tuple[Finding, ...]:
    """An error, a warning and an info from three rules, with trace-like hostile strings."""
    return (
        Finding(
            code="COMM101",
            severity=Severity.error,
            title="Exposed all-reduce | in group 0",
            message=f"Kernel {EVIL} runs with no compute.",
            impact_ns_per_step=3_000_000,
            step_share=0.2,
            ranks=(0, 1, 2, 3),
            process_group="0",
            advice=("Overlap gradient all-reduce with backward (DDP bucket_cap_mb=25).",),
            rule="exposed-communication",
            evidence={"exposed_ns": 3_000_000, "ratio": 0.5},
        ),
        Finding(
            code="SYNC101",
            severity=Severity.warning,
            title="Straggler rank 3",
            message="Rank 3 arrives last in 90% of all-reduces.",
            impact_ns_per_step=1_000_000,
            ranks=(3,),
            advice=("Check rank 3's data loader.",),
            rule="straggler",
        ),
        Finding(
            code="COMM201",
            severity=Severity.info,
            title="Small messages",
            message="Many small all-reduces.",
            impact_ns_per_step=10_000,
            ranks=(0,),
            rule="small-message-storm",
        ),
    )


@pytest.fixture(scope="module")
def ddp() -> Report:
    """The real 4-rank gloo DDP capture, with three findings added."""
    report = kineto_comm.analyze(REPO / "sample_traces" / "ddp-4", jobs=1)
    return dataclasses.replace(report, findings=make_findings())


@pytest.fixture(scope="module")
def clean_report() -> Report:
    """The same capture with no rule run: no findings."""
    return kineto_comm.analyze(REPO / "sample_traces" / "ddp-4", jobs=1, ignore=["ALL"])


# ------------------------------------------------------------------ JSON


def test_json_validates_against_documented_schema(ddp: Report, tmp_path: Path) -> None:
    schema = json.loads((REPO / "docs" / "json-schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    doc = json.loads(render(ddp, "json", fail_on=Severity.warning))
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert doc["schema_version"] == 1
    assert [f["code"] for f in doc["findings"]] == ["COMM101", "SYNC101", "COMM201"]
    s = doc["summary"]
    assert s["ranks"] == 4 and s["findings"] == {"info": 1, "warning": 1, "error": 1, "total": 3}
    assert s["failed"] is True and s["failing_findings"] == 2
    # the summary's mean step equals the mean over the rank step rows of the complete
    # steps (the job's step time's), which leave out the last step, cut at its last kernel
    complete = {t["step"] for t in doc["step_times"] if t["complete"]}
    assert len(complete) >= 2 and max(complete) < max(t["step"] for t in doc["step_times"])
    walls = [st["wall_ns"] for r in doc["ranks"] for st in r["steps"] if st["step"] in complete]
    assert s["mean_step_ns"] == round(sum(walls) / len(walls)) <= s["step_ns"]
    assert s["steps"] == s["step_windows"] == len(walls)
    total_calls = sum(c["count"] for c in doc["collectives"])
    assert sum(c["calls"] for c in doc["collective_totals"]) == total_calls


def test_json_schema_rejects_a_broken_document(ddp: Report) -> None:
    schema = json.loads((REPO / "docs" / "json-schema.json").read_text())
    doc = json.loads(render(ddp, "json"))
    doc["findings"][0]["severity"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)
    del doc["summary"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)


def test_json_is_strict_without_nan(ddp: Report) -> None:
    nan_finding = dataclasses.replace(make_findings()[0], step_share=float("nan"))
    text = render(dataclasses.replace(ddp, findings=(nan_finding,)), "json")
    assert "NaN" not in text
    assert json.loads(text)["findings"][0]["step_share"] is None


def test_as_finding_round_trips_json() -> None:
    for f in make_findings():
        assert json_doc.as_finding(json.loads(json.dumps(f.to_dict()))) == f


# ------------------------------------------------------------------ SARIF


def test_sarif_validates_against_official_schema(ddp: Report, clean_report: Report) -> None:
    schema = json.loads((REPO / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
    validator = jsonschema.Draft4Validator(
        schema, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER
    )
    for report in (ddp, clean_report):
        log = json.loads(render(report, "sarif"))
        validator.validate(log)
    log = json.loads(render(ddp, "sarif"))
    run = log["runs"][0]
    assert log["version"] == "2.1.0"
    results = run["results"]
    assert [r["ruleId"] for r in results] == ["COMM101", "SYNC101", "COMM201"]
    assert [r["level"] for r in results] == ["error", "warning", "note"]
    rules = run["tool"]["driver"]["rules"]
    for r in results:  # ruleIndex points at the rule with that id
        assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
        assert r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith(".gz")
    for rule in rules:
        assert rule["shortDescription"]["text"] and rule["help"]["text"]
        assert rule["fullDescription"]["text"]
    # a broken log fails the same validator (the test can fail)
    del run["tool"]["driver"]["name"]
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(log)


def test_sarif_rule_metadata_without_registry(ddp: Report, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_doc, "registry_rules", lambda: None)
    rules = json.loads(render(ddp, "sarif"))["runs"][0]["tool"]["driver"]["rules"]
    by_id = {r["id"]: r for r in rules}
    assert set(by_id) == {"COMM101", "SYNC101", "COMM201"}
    assert by_id["COMM101"]["name"] == "exposed-communication"
    assert by_id["COMM101"]["shortDescription"]["text"] == "Exposed all-reduce | in group 0"
    assert "Overlap gradient all-reduce" in by_id["COMM101"]["help"]["text"]


def test_sarif_fingerprint_is_stable_and_distinguishes() -> None:
    a, b, _ = make_findings()
    assert sarif.fingerprint(a) == sarif.fingerprint(dataclasses.replace(a, message="other"))
    assert sarif.fingerprint(a) != sarif.fingerprint(b)
    assert sarif.artifact_uri("traces/rank 0.json") == "traces/rank%200.json"
    assert sarif.artifact_uri("/abs/t.json") == "file:///abs/t.json"


# ------------------------------------------------------------------ JUnit


def _cases(xml_text: str) -> tuple[ET.Element, dict[str, ET.Element]]:
    root = ET.fromstring(xml_text)
    suite = root.find("testsuite")
    assert suite is not None
    return root, {c.get("name", "").split()[0]: c for c in suite.findall("testcase")}


def test_junit_counts_failures_at_fail_level(ddp: Report, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_doc, "registry_rules", lambda: None)
    root, cases = _cases(render(ddp, "junit", fail_on=Severity.error))
    assert set(cases) == {"COMM101", "SYNC101", "COMM201"}
    assert root.get("tests") == "3" and root.get("failures") == "1"
    assert cases["COMM101"].find("failure") is not None
    assert cases["SYNC101"].find("failure") is None
    assert "Straggler" in (cases["SYNC101"].findtext("system-out") or "")
    root, cases = _cases(render(ddp, "junit", fail_on=Severity.info))
    assert root.get("failures") == "3"
    assert all(c.find("failure") is not None for c in cases.values())


def test_junit_passing_case_per_registry_rule(ddp: Report, monkeypatch: pytest.MonkeyPatch) -> None:
    extra = [
        json_doc.RuleInfo("NET101", "low-bus-bandwidth", "Low busbw.", "Help.", True),
        json_doc.RuleInfo("COMM101", "exposed-communication", "Exposed.", "Help.", True),
    ]
    monkeypatch.setattr(json_doc, "registry_rules", lambda: extra)
    root, cases = _cases(render(ddp, "junit", fail_on=Severity.warning))
    assert set(cases) == {"COMM101", "SYNC101", "COMM201", "NET101"}
    assert root.get("tests") == "4" and root.get("failures") == "2"
    assert len(cases["NET101"]) == 0  # passing: no failure, no output
    # the failure text holds the hostile kernel name, escaped into valid XML
    assert "<script>" in (cases["COMM101"].findtext("failure") or "")


def test_junit_strips_xml_illegal_characters(ddp: Report) -> None:
    bad = dataclasses.replace(make_findings()[0], message="nul\x00 bell\x07 ok")
    text = junit.render_junit(dataclasses.replace(ddp, findings=(bad,)), Severity.error)
    root = ET.fromstring(text)
    assert "nul bell ok" in "".join(root.itertext())


# ------------------------------------------------------------------ GitHub annotations


def test_github_one_escaped_line_per_finding(ddp: Report) -> None:
    text = render(ddp, "github")
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("::error title=kineto-comm COMM101%3A Exposed all-reduce | in")
    assert lines[1].startswith("::warning title=") and lines[2].startswith("::notice title=")
    _, _, message = lines[0].partition("::")[2].partition("::")
    assert "%0D%0Anext" in message and "%25" in message and "\r" not in lines[0]
    assert github.escape_property("a:b,c%d\ne") == "a%3Ab%2Cc%25d%0Ae"
    assert github.escape_data("a:b,c%d\r") == "a:b,c%25d%0D"


@pytest.mark.parametrize("job", ["sample_traces/ddp-4", "tests/data/h100-nccl/tp-dp-8"])
def test_github_annotation_gives_each_share_once(job: str) -> None:
    """One saving, one number: a finding's message and its annotation's "Estimated cost"
    round the same share once (ddp-4's COMM101 said 18.3% in one and 18.2% in the other:
    the share was rounded to 4 places and then to one decimal)."""
    report = kineto_comm.analyze(REPO / job, jobs=1)
    assert report.findings
    lines = github.render_github(report).splitlines()
    for f, line in zip(json_doc.findings_of(report), lines, strict=True):
        assert f.step_share is not None
        shown = f"{100 * f.step_share:.1f}%25 of step"
        assert shown in line, (f.code, line)
        # Every one-decimal percentage of the line near the share is that share.
        for pct in re.findall(r"(\d+\.\d)%25", line):
            if abs(float(pct) - 100 * f.step_share) < 0.2:
                assert f"{pct}%25 of step" in shown, (f.code, pct, line)


def test_github_empty_without_findings(clean_report: Report) -> None:
    assert render(clean_report, "github") == ""


# ------------------------------------------------------------------ Markdown


def test_markdown_headline_tables_and_escaping(ddp: Report) -> None:
    text = render(ddp, "markdown", fail_on=Severity.warning)
    assert "**2 finding(s) at or above `warning`**" in text
    top = text.split("### Top recommendations")[1].split("###")[0]
    assert "1. " in top and "saves ~3.00 ms/step (20.0% of step time)" in top
    assert "<script>" not in text and "&lt;script&gt;" in text
    per_rank = text.split("### Per rank")[1].split("###")[0]
    rank_rows = [ln for ln in per_rank.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert len(rank_rows) == 4
    pipes = 0
    for line in text.splitlines():
        if not line.startswith("| "):
            pipes = 0
            continue
        cells = line.replace("\\|", "").count("|")  # unescaped pipes: a table's own
        pipes = pipes or cells  # the header's
        assert cells == pipes, line
    assert "Exposed all-reduce \\| in group 0" in text
    assert markdown.md_escape("a|b\nc<d>") == "a\\|b c&lt;d&gt;"


def test_markdown_says_which_ranks_share_a_clock() -> None:
    """The hosts line the text report prints (which ranks share a host and its clock, and
    how that was inferred) is in the Markdown too, escaped."""
    from kineto_comm import analyze
    from kineto_comm.render.text import hosts_line

    report = analyze(SAMPLES / "tp-2", jobs=1, ranks_per_host=1)
    line = hosts_line(report)
    assert line and line.startswith("Clocks: 2 host(s)")
    assert markdown.md_escape(line) in render(report, "markdown")


def test_markdown_without_findings(clean_report: Report) -> None:
    text = render(clean_report, "markdown")
    assert "No findings at or above `error`." in text
    assert "### Findings" not in text and "all\\_reduce" in text


# ------------------------------------------------------------------ registry and exit codes


def test_every_format_renders_and_unknown_fails(ddp: Report) -> None:
    assert set(FORMATS) == {"text", "json", "markdown", "sarif", "junit", "github", "html"}
    for fmt in FORMATS:
        assert render(ddp, fmt).strip(), fmt
    with pytest.raises(ValueError, match="unknown format"):
        render(ddp, "yaml")


def test_every_format_renders_a_report_whose_every_file_was_unusable(tmp_path: Path) -> None:
    # What a CI script gets from analyze() on a job whose traces are all damaged: each
    # format still says what was wrong with each file (the text one used to raise).
    (tmp_path / "rank-0.json").write_text('{"traceEvents": [], "deviceProperties": "x"}')
    (tmp_path / "rank-1.json").write_text("not json")
    report = kineto_comm.analyze(tmp_path)
    assert report.ranks.height == 0 and len(report.errors) == 2
    for fmt in FORMATS:
        out = render(report, fmt)
        if fmt != "github":  # annotations are for findings only
            assert "rank-1.json" in out, fmt
    text = render(report, "text")
    assert "No rank could be analysed." in text
    assert "error: " + str(tmp_path / "rank-0.json") in text


def test_exit_code_policy(ddp: Report, clean_report: Report) -> None:
    assert exit_code(ddp, Severity.error, exit_zero=False) == 1
    assert exit_code(ddp, Severity.error, exit_zero=True) == 0
    only_info = dataclasses.replace(ddp, findings=(make_findings()[2],))
    assert exit_code(only_info, Severity.error, False) == 0
    assert exit_code(only_info, Severity.warning, False) == 0
    assert exit_code(only_info, Severity.info, False) == 1
    assert exit_code(clean_report, Severity.info, False) == 0
    assert exit_code(ddp, "warning", False) == 1
    assert parse_severity("ERROR") is Severity.error
    with pytest.raises(ValueError, match="choose one of"):
        parse_severity("fatal")


def test_parse_also() -> None:
    assert parse_also("sarif=out/r.sarif") == ("sarif", Path("out/r.sarif"))
    for bad in ("sarif", "yaml=x", "json="):
        with pytest.raises(ValueError):
            parse_also(bad)


def test_json_text_is_the_document_dumped_whatever_the_file_names():
    """render_json writes each rank's steps in place one rank at a time: the text must be
    the document dumped whole, even when a file is named like the placeholder it uses."""
    import polars as pl

    report = kineto_comm.analyze(SAMPLES / "pp-4", jobs=1)
    named = report.ranks.with_columns(
        file=pl.when(pl.col("rank") == 1)
        .then(pl.lit('"steps": "@kineto-comm-steps-1@"'))
        .otherwise(pl.lit("@kineto-comm-steps-0@"))
    )
    for r in (report, dataclasses.replace(report, ranks=named)):
        whole = json.dumps(json_doc.document(r), indent=2, default=str, allow_nan=False) + "\n"
        assert json_doc.render_json(r) == whole
        assert all(rank["steps"] for rank in json.loads(whole)["ranks"])


def test_step_rows_become_the_text_json_dumps_gives_them() -> None:
    """A rank's step rows are written by one query where every column is an integer (nulls
    and negative numbers included), by json.dumps otherwise (floats, NaN as null): the text
    is json.dumps' either way, re-indented to its place in the document."""
    import polars as pl

    frames = [
        pl.DataFrame({"step": [1, None, 3], "start_ns": [-5, 2**62, 0]}),
        pl.DataFrame({"step": [7]}, schema={"step": pl.Int32}),
        pl.DataFrame({"wall_ns": [1.5, float("nan")], "step": [1, 2]}),
        pl.DataFrame(schema={"step": pl.Int64}),
    ]
    for frame in frames:
        for pad in ("", " " * 6):
            listed = json_doc.clean(frame.to_dicts())
            expected = json.dumps(listed, indent=2, allow_nan=False).replace("\n", "\n" + pad)
            assert json_doc._rows_json(frame, pad) == expected


def test_write_gives_the_rendered_text_to_files_and_streams(ddp: Report, tmp_path: Path) -> None:
    """`write` is how the CLI outputs: the JSON document in pieces (a rank's steps each), the
    other formats whole, the same text as `render` either way."""
    import io

    pieces = list(json_doc.json_pieces(ddp))
    assert len(pieces) > ddp.ranks.height  # a rank's steps each, not the document at once
    for fmt in FORMATS:
        stream = io.StringIO()
        write(ddp, fmt, stream, fail_on="warning")
        path = tmp_path / "new" / f"report.{fmt}"
        write(ddp, fmt, path, fail_on="warning")
        text = render(ddp, fmt, fail_on="warning")
        assert stream.getvalue() == text == path.read_bytes().decode("utf-8"), fmt
    with pytest.raises(ValueError, match="unknown format"):
        write(ddp, "yaml", io.StringIO())


def test_summary_counts_distinct_rank_steps_a_window_of_ranks_at_a_time(monkeypatch):
    """`steps` in the summary: distinct (rank, step) pairs of the complete steps (all windows
    when no rank has a numbered one), the same when counted one rank per window."""
    import polars as pl

    from kineto_comm import rank_store

    report = kineto_comm.analyze(SAMPLES / "pp-4", jobs=1)
    steps = report.steps
    cases = {
        "numbered": steps,
        "none numbered": steps.with_columns(step=pl.lit(-1, pl.Int64)),
    }
    complete = report.step_times.filter("complete")["step"]
    for name, table in cases.items():
        numbered = (table["step"] >= 0).any()
        kept = table.filter(pl.col("step").is_in(complete.implode())) if numbered else table
        expect = kept.select("rank", "step").unique().height
        whole = dataclasses.replace(
            report,
            rank_steps=RankStore.from_frame(table),
            step_times=report.step_times if numbered else report.step_times.clear(),
        )
        assert json_doc.document(whole)["summary"]["steps"] == expect > 0, name
    # One window per rank: the counts per window add up to the same.
    monkeypatch.setattr(rank_store, "SLICE_ROWS", 1)
    split = RankStore(
        rank_store.Part(rows=g.height, frame=g, rank=r)
        for (r,), g in steps.group_by("rank", maintain_order=True)
    )
    assert len(split.windows(1)) == report.ranks.height > 1
    report = dataclasses.replace(report, rank_steps=split)
    expect = steps.filter(pl.col("step").is_in(complete.implode())).select("rank", "step")
    assert json_doc.document(report)["summary"]["steps"] == expect.unique().height


def test_rank_means_are_the_means_of_the_documents_steps():
    """The Markdown, HTML and text rank tables: per rank, its windows of the complete steps
    only when it has any (the last step, cut at its last kernel, is left out)."""
    import polars as pl

    report = kineto_comm.analyze(SAMPLES / "tp-2", jobs=1)
    steps = report.steps.with_columns(  # rank 1 keeps only its un-numbered windows
        step=pl.when(pl.col("rank") == 1).then(-1).otherwise(pl.col("step"))
    )
    report = dataclasses.replace(report, rank_steps=RankStore.from_frame(steps))
    means = json_doc.rank_means(report)
    complete = set(report.step_times.filter("complete")["step"])
    assert 0 < len(complete) < report.step_times.height
    for rank, got in zip(json_doc.document(report)["ranks"], means, strict=True):
        rows = [s for s in rank["steps"] if s["step"] in complete] or rank["steps"]
        assert got["rank"] == rank["rank"] and got["steps"] == len(rows) > 0
        for col in json_doc.MEANS:
            assert got[col] == sum(s[col] for s in rows) / len(rows), col


def _table(text: str, title: str) -> list[list[str]]:
    """The rows (cells stripped) of the text report's table under `title`."""
    table = text[text.index(title) :].split("└")[0]
    return [
        [c.strip() for c in line.split("│")[1:-1]]
        for line in table.splitlines()
        if line.startswith("│")
    ]


def test_text_shows_a_big_jobs_extreme_ranks_and_median(tmp_path: Path) -> None:
    """Above MAX_RANK_ROWS ranks the per-rank table holds the ranks with the most and the
    least exposed communication around a median row, and so do the offsets (largest and
    smallest) and stragglers tables (most and least delay); the roles' evidence is one
    phrase while the JSON keeps it whole (32 ranks, 24 of them shifted: three hosts of 8
    off rank 0's)."""
    import io

    from kineto_comm.analysis.roles import evidence_phrase
    from kineto_comm.render.text import EXTREME_RANKS, MAX_RANK_ROWS, render_text
    from kineto_comm.synth import Hardware, ModelConfig, generate

    tiny = ModelConfig(layers=2, hidden=256, seq=256, micro_batch=1, vocab=1024, bucket_mb=2.0)
    generate(
        "clock-skew",
        tmp_path,
        ranks=32,
        layout="dp",
        steps=2,
        model=tiny,
        hardware=Hardware(tflops=10.0),
    )
    report = kineto_comm.analyze(tmp_path, jobs=1)
    assert report.ranks.height == 32 > MAX_RANK_ROWS
    out = io.StringIO()
    render_text(report, out, width=250)
    text = out.getvalue()
    table = text[text.index("Where each rank's device time went") : text.index("overlap = ")]
    cells = [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")]
    assert len(cells) == 2 * EXTREME_RANKS + 1 and cells[EXTREME_RANKS] == "median"
    share = report.totals.select("rank", s=pl.col("exposed_comm_ns") / pl.col("wall_ns")).sort(
        ["s", "rank"], descending=[True, False]
    )
    ranks = [str(r) for r in share["rank"]]
    assert cells[:EXTREME_RANKS] == ranks[:EXTREME_RANKS]
    assert cells[EXTREME_RANKS + 1 :] == ranks[-EXTREME_RANKS:]
    offsets = report.offsets.filter(pl.col("offset_ns") != 0)
    assert offsets.height == 24
    # Offsets: the largest first, the median, the smallest (every rank in the JSON).
    shown = [row[0] for row in _table(text, "Clock offsets:")]
    largest = report.offsets.sort(pl.col("offset_ns").abs(), "rank", descending=[True, False])
    order = [str(r) for r in largest["rank"]]
    assert shown == [*order[:EXTREME_RANKS], "median", *order[-EXTREME_RANKS:]]
    assert "32 ranks: the 5 with the largest offsets" in text
    # Stragglers likewise: the most delaying ranks first.
    shown = [row[0] for row in _table(text, "Stragglers:")]
    delay = report.stragglers.sort(
        ["is_straggler", "delay_ns", "rank"], descending=[True, True, False]
    )
    order = [str(r) for r in delay["rank"]]
    assert shown == [*order[:EXTREME_RANKS], "median", *order[-EXTREME_RANKS:]]
    # Roles: the evidence column holds each group's deciding phrase, the JSON the whole.
    groups = {row[0]: row[-1] for row in _table(text, "Process groups and their inferred")}
    for name, evidence in report.process_groups.select("process_group", "evidence").iter_rows():
        phrase = evidence_phrase(evidence)
        assert groups[name] == phrase and 0 < len(phrase) < len(evidence) / 3
    doc = json.loads(render(report, "json"))
    assert [g["evidence"] for g in doc["process_groups"]] == report.process_groups[
        "evidence"
    ].to_list()


def test_a_32_rank_jobs_text_is_a_screenful_not_a_scroll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tensor x data parallel job of 32 ranks (18 groups): at the default width each
    group's evidence is one line (one phrase, where the whole evidence took ten), and the
    offsets and stragglers tables hold 2 x EXTREME_RANKS + 1 rows, not 25 each."""
    from kineto_comm.render.text import DEFAULT_WIDTH, EXTREME_RANKS
    from kineto_comm.synth import generate

    generate("straggler", tmp_path, ranks=32, layout="tp-dp", steps=3, seed=0)
    report = kineto_comm.analyze(tmp_path, jobs=1)
    monkeypatch.delenv("COLUMNS", raising=False)
    text = render(report, "text")
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= DEFAULT_WIDTH
    roles = text[text.index("Process groups and their inferred") :].split("└")[0]
    body = [line.split("│")[-2].strip() for line in roles.splitlines() if line.startswith("│")]
    evidence = [cell for cell in body if cell]  # the evidence cells' lines: one a group
    assert len(evidence) == report.process_groups.height == 18 and len(body) < 2 * 18
    for title in ("Clock offsets:", "Stragglers:"):
        assert len(_table(text, title)) == 2 * EXTREME_RANKS + 1


def test_text_fits_an_80_column_terminal_without_cutting(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 80 columns (a terminal, or COLUMNS for piped and -o output) no line is wider, no
    cell ends in '…', and every word and number is one printed at 250 columns: names and
    numbers are wrapped at spaces or their column left out (named), never cut; advice
    wraps at words under its arrow."""
    import io
    import re

    from kineto_comm.render.formats import render_text_str
    from kineto_comm.render.text import render_text

    report = kineto_comm.analyze(REPO / "sample_traces" / "ddp-4", jobs=1)
    wide = io.StringIO()
    render_text(report, wide, width=250)

    def words(text: str) -> set[str]:
        return set(re.split(r"[\s│┃┏┓┗┛┡┩┳┻╇━─└┘┴┬┼├┤┌┐]+", text)) - {""}

    monkeypatch.setenv("COLUMNS", "80")
    narrow = io.StringIO()
    render_text(report, narrow, width=80)
    for text in (narrow.getvalue(), render_text_str(report)):
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= 80
        assert "…" not in text
        flat = " ".join(text.split())
        notes = re.findall(r"\(left out at 80 columns: ([^;]*);[^)]*\)", flat)
        assert notes and words(re.sub(r"\(left out at 80 columns: [^)]*\)", "", flat)) <= words(
            wide.getvalue()
        )
        for finding in report.findings[:5]:
            assert "-> " + " ".join(finding.advice[0].split()) in flat
        # A column left out is named, and only one the wide text shows.
        headers = {
            cell.strip()
            for line in wide.getvalue().splitlines()
            if line.startswith("┃")
            for cell in line.split("┃")
        }
        for note in notes:
            assert set(note.split(", ")) <= headers
    # Piped output follows COLUMNS, not a fixed width.
    monkeypatch.setenv("COLUMNS", "200")
    assert max(len(line) for line in render_text_str(report).splitlines()) > 140


def test_point_to_point_rows_show_their_matched_transfers_bus_bandwidth() -> None:
    """The collectives table's busbw is the skew table's for the same calls: a send and a
    recv are matched as one transfer (`send_recv`), so both rows show its bus bandwidth
    (it used to be blank for them while the skew table gave one)."""
    from kineto_comm.render.json_doc import collective_totals

    from .conftest import REPO

    report = kineto_comm.analyze(REPO / "tests" / "data" / "h200-nccl" / "pp-dp-4", jobs=1)
    skew = {
        (r["process_group"], r["collective"]): r["median_busbw_gbps"]
        for r in report.skew_summary().iter_rows(named=True)
    }
    p2p = [t for t in collective_totals(report) if t["collective"] in ("send", "recv")]
    assert {t["process_group"] for t in p2p} == {"1", "2"} and len(p2p) == 4
    for t in p2p:
        assert t["busbw_gbps"] == skew[(t["process_group"], "send_recv")] > 0


@pytest.mark.parametrize(
    "where",
    ["h200-nccl/pp-dp-4", "h100-nccl/tp-dp-8", "samples/ddp-4", "hta/nccl_parser_config"],
)
def test_each_collectives_row_has_nccl_tests_algbw_and_busbw(where: str) -> None:
    """In the collectives table, busbw is algbw times nccl-tests' factor for the row's
    collective and group size, as nccl-tests prints them: both are bytes over the calls'
    transfer time. (algbw was bytes over the kernel time, waiting included, while busbw
    was over the transfer: a recv on h200 pp-dp-4 showed algbw 5.67 MB/s beside busbw
    1.72 GB/s, with a factor of 1.) Each dtype of a group keeps its own calls' bandwidths."""
    from kineto_comm.analysis.bandwidth import busbw_factor

    from .conftest import REPO, shared

    kind, name = where.split("/", 1)
    path = (
        SAMPLES / name
        if kind == "samples"
        else shared(where)
        if kind == "hta"
        else REPO / "tests" / "data" / kind / name
    )
    report = kineto_comm.analyze(path, jobs=1, ignore=["ALL"])
    sizes = report.collectives.group_by("collective", "process_group").agg(
        n=pl.col("group_size").max()
    )
    totals = report.collective_totals().join(
        sizes, on=["collective", "process_group"], how="left", nulls_equal=True
    )
    both = totals.filter(pl.col("busbw_gbps").is_not_null())
    assert both.height > 0
    factor = both.select(busbw_factor(pl.col("collective"), pl.col("n"))).to_series()
    assert (both["busbw_gbps"] / both["algbw_gbps"] - factor).abs().max() < 1e-9
    # The p2p rows of one group show their transfer's bandwidth, sends and recvs alike.
    p2p = totals.filter(pl.col("collective").is_in(["send", "recv"]))
    for _, rows in p2p.group_by("process_group"):
        assert rows["algbw_gbps"].n_unique() == 1
    if name == "nccl_parser_config":  # its float32 and int64 broadcasts: GB/s against MB/s
        cast = totals.filter(pl.col("collective") == "broadcast").sort("dtype")
        assert cast["dtype"].to_list() == ["float32", "int64"]
        assert cast["algbw_gbps"][0] > 10 * cast["algbw_gbps"][1]
