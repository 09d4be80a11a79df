"""Every human format carries the same report (issue 53, points 4 and 5): the sections the
JSON document has content for are in text, Markdown and HTML, under one title and one set
of column names; bandwidths keep three significant digits; the unknown group is written one
way; the pipeline table names its ranks and is absent for p = 1."""

from __future__ import annotations

import dataclasses
import html
import json
from pathlib import Path

import polars as pl
import pytest

import kineto_comm
from kineto_comm.render.formats import render
from kineto_comm.render.markdown import md_escape
from kineto_comm.render.sections import UNKNOWN_GROUP, fmt_bw, pipeline, sections
from kineto_comm.report import Report
from kineto_comm.synth import generate

from .conftest import SAMPLES, shared

MODEL = """
[model]
layers = {layers}
hidden = {hidden}
seq = {seq}
micro_batch = {micro_batch}
micro_batches = {micro_batches}
vocab = {vocab}
dtype = "bfloat16"
grad_dtype = "float32"
bucket_mb = {bucket_mb}
dp = {dp}
"""


@pytest.fixture(scope="module")
def with_model(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """A synthetic DP job compared with a model that expects fp32 gradients (MODEL101)."""
    root = tmp_path_factory.mktemp("model")
    truth = generate("baseline", root / "traces", ranks=4, layout="dp", steps=2)
    keys = ("layers", "hidden", "seq", "micro_batch", "micro_batches", "vocab", "bucket_mb")
    config = root / "model.toml"
    config.write_text(
        MODEL.format(dp=truth["parallelism"]["dp"], **{k: truth["model"][k] for k in keys})
    )
    return kineto_comm.analyze(root / "traces", jobs=1, model=config)


def _has_content(doc: dict, key: str) -> bool:
    rows = doc.get(key) or []
    if key == "pipeline":  # a pipeline of one stage is no pipeline
        return any((r.get("stages") or 0) > 1 for r in rows)
    return bool(rows)


def _reports(with_model: Report) -> list[Report]:
    return [
        with_model,
        kineto_comm.analyze(SAMPLES / "pp-4", jobs=1),
        kineto_comm.analyze(SAMPLES / "ddp-4", jobs=1),
    ]


def test_every_format_shows_the_sections_json_has(with_model: Report) -> None:
    for report in _reports(with_model):
        doc = json.loads(render(report, "json"))
        shown = sections(report)
        keys = {s.key for s in shown}
        expected = {
            key
            for key in (
                "collective_totals",
                "skew",
                "inferred_config",
                "process_groups",
                "pipeline",
                "message_size_summary",
                "storms",
                "offsets",
                "stragglers",
                "model_comparison",
                "step_blame",
                "attribution",
            )
            if _has_content(doc, key)
        }
        assert keys == expected
        text, markdown, page = (render(report, f) for f in ("text", "markdown", "html"))
        for section in shown:
            # Titles and column names: the same words in every format.
            assert section.title.split(":")[0] in text, section.title
            assert f"### {md_escape(section.title)}" in markdown
            assert f"<h2>{html.escape(section.title)}</h2>" in page
            header = "| " + " | ".join(md_escape(h) for h in section.header) + " |"
            assert header in markdown
            ths = "".join(html.escape(h) for h in section.header)
            assert ths in page.replace("<th>", "").replace("</th>", "").replace("<th class=l>", "")
            for name in section.header:  # a narrow terminal column may wrap a name
                assert all(word in text for word in name.split()), (section.key, name)
    # --model: the comparison is in every format, not only JSON.
    text = render(with_model, "text")
    assert "Analytical model vs measured (per step)" in text
    # No advice cut: MODEL101's first advice is printed whole in the text's top list.
    model101 = next(f for f in with_model.findings if f.code == "MODEL101")
    assert model101.advice[0] in " ".join(text.split())


def test_bandwidth_group_and_pipeline_are_readable(with_model: Report) -> None:
    assert fmt_bw(97.67) == "97.7 GB/s"
    assert fmt_bw(0.008229) == "8.23 MB/s"
    assert fmt_bw(0.000705) == "705 KB/s"
    assert fmt_bw(1234.0) == "1.23 TB/s"
    assert fmt_bw(0.99999) == "1.00 GB/s"
    assert fmt_bw(None) == "-"
    # A gloo capture: its slow bandwidths keep three digits, none prints as 0.0 / 0.00.
    ddp = kineto_comm.analyze(SAMPLES / "ddp-4", jobs=1)
    coll = next(s for s in sections(ddp) if s.key == "collective_totals")
    algbw, busbw = coll.header.index("algbw"), coll.header.index("busbw")
    for row in coll.rows:
        for cell in (row[algbw], row[busbw]):
            number = float(cell.split()[0])
            assert number >= 1 and cell.split()[1].endswith("B/s"), cell
    # The unknown group: one spelling in every human format, never None/null.
    for fmt in ("text", "markdown", "html"):
        out = render(ddp, fmt)
        assert "None" not in out and "null" not in out, fmt
    # ddp-4's calls name no group; its pg_config has one, so they are that group ("0").
    assert all(row[coll.header.index("group")] == "0" for row in coll.rows)
    # Where the trace cannot say (300 ranks, 11 groups of the calls' size): the one spelling.
    cpu = kineto_comm.analyze(shared("hta/cpu_only"), jobs=1)
    unnamed = next(s for s in sections(cpu) if s.key == "collective_totals")
    assert {row[unnamed.header.index("group")] for row in unnamed.rows} == {UNKNOWN_GROUP}
    # The pipeline table names each stage's ranks, and there is none for p = 1.
    pp = kineto_comm.analyze(SAMPLES / "pp-4", jobs=1)
    table = pipeline(pp)
    assert table is not None and "ranks" in table.header
    stage_ranks = pp.pipeline.group_by("stage").agg(pl.col("rank").unique().sort()).sort("stage")
    assert [row[1] for row in table.rows] == [
        ", ".join(map(str, r)) for r in stage_ranks["rank"].to_list()
    ]
    one_stage = dataclasses.replace(pp, pipeline=pp.pipeline.with_columns(stages=pl.lit(1)))
    assert pipeline(one_stage) is None
    assert "Pipeline:" not in render(one_stage, "text")


def test_sections_need_no_file(tmp_path: Path) -> None:
    """A report with no collectives still renders, saying so in every human format."""
    from .conftest import kernel, write_trace

    write_trace(tmp_path / "rank0.json", [kernel("gemm", 0, 10)], rank=0)
    report = kineto_comm.analyze(tmp_path, jobs=1)
    for fmt in ("text", "markdown", "html"):
        assert "No communication kernels found." in render(report, fmt), fmt


def test_a_wait_for_no_traced_rank_says_so() -> None:
    """Two ranks of a 128-rank job: rank 1 arrived last of the two at every call it waited
    at, so no traced rank held it; the step-time table says so, never "rank ?"."""
    report = kineto_comm.analyze(shared("hta/trace_filter"), jobs=1)
    table = next(s for s in sections(report) if s.key == "step_blame")
    what = [row[table.header.index("what")] for row in table.rows]
    waits = [w for w in what if ", for " in w]
    assert waits and all(w.endswith(", for no traced rank") for w in waits), what
    assert not any("rank ?" in w for w in what)
    # Where a traced rank held the wait, the table names it.
    named = kineto_comm.analyze(SAMPLES / "ddp-4", jobs=1)
    table = next(s for s in sections(named) if s.key == "step_blame")
    what = [row[table.header.index("what")] for row in table.rows]
    assert any(", for rank " in w for w in what) and not any("no traced" in w for w in what)
