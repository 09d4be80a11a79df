"""The HTML report: structure, the four plots' SVG, escaping of trace strings, no external
resources; and, when a chromium binary is installed, that it loads and renders headless."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest

import kineto_comm
from kineto_comm.findings import Finding, Severity
from kineto_comm.rank_store import RankStore
from kineto_comm.render.html import pipeline_ranks, render_html, size_histograms
from kineto_comm.report import Report
from kineto_comm.synth import generate

EVIL = "<script>alert(1)</script>"


class Collector(HTMLParser):
    """Tags with attributes, in order, and the page's text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def ids(self) -> dict[str, str]:
        return {a["id"] or "": t for t, a in self.tags if a.get("id")}

    def count(self, tag: str, cls: str | None = None) -> int:
        return sum(
            1
            for t, a in self.tags
            if t == tag and (cls is None or cls in (a.get("class") or "").split())
        )


@pytest.fixture(scope="module")
def pipeline_report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """A synthetic pipeline job (bubble) with a hostile kernel name, group and finding."""
    out = tmp_path_factory.mktemp("bubble")
    generate("bubble", out, ranks=4, layout="pp-dp", steps=2)
    report = kineto_comm.analyze(out, jobs=1)
    kernels = report.kernels.with_columns(
        name=pl.when(pl.col("kind") == "communication").then(pl.lit(EVIL)).otherwise(pl.col("name"))
    )
    collectives = report.collectives.with_columns(
        process_group=pl.when(pl.col("process_group") == "1")
        .then(pl.lit(f"pg{EVIL}"))
        .otherwise(pl.col("process_group"))
    )
    finding = Finding(
        code="PIPE101",
        severity=Severity.error,
        title=f"Bubble on {EVIL}",
        message=f"Stage waits on {EVIL} & more",
        impact_ns_per_step=5_000_000,
        step_share=0.1,
        ranks=(0, 1),
        process_group=EVIL,
        evidence={"kernel": EVIL},
        advice=(f"Raise micro-batches {EVIL}",),
        rule="pipeline-bubble",
    )
    return dataclasses.replace(
        report,
        rank_kernels=RankStore.from_frame(kernels),
        rank_collectives=RankStore.from_frame(collectives),
        findings=(finding,),
    )


def test_html_has_four_plots_and_findings(pipeline_report: Report) -> None:
    page = render_html(pipeline_report, Severity.error)
    p = Collector()
    p.feed(page)
    p.close()
    ids = p.ids()
    for plot in ("plot-step-time", "plot-skew", "plot-pipeline"):
        assert ids.get(plot) == "svg", plot
    assert ids.get("plot-sizes") == "div"
    # step-time: 4 ranks, each with compute and exposed-comm segments
    assert p.count("rect", "seg-compute") == 4 and p.count("rect", "seg-exposed") == 4
    # one histogram per (collective, group) in the data
    hist = size_histograms(pipeline_report)
    assert p.count("svg", "hist") == hist.select("collective", "process_group").unique().height
    assert p.count("rect", "bar") == hist.height
    # heatmap: one cell per (rank, matched instance) at this size
    matched = pipeline_report.collective_instances.filter(pl.col("ranks_seen") > 1)
    waits = pipeline_report.collective_waits.join(matched.select("instance"), on="instance")
    assert p.count("rect", "cell") == waits.height
    # pipeline: every send/recv rank has a lane with compute and communication blocks
    assert pipeline_ranks(pipeline_report) == [0, 1, 2, 3]
    assert p.count("rect", "k-compute") >= 4 and p.count("rect", "k-communication") >= 4
    text = "".join(p.text)
    assert "Findings (1)" in text and "Raise micro-batches" in text


def test_each_colour_means_one_thing_in_every_chart(pipeline_report: Report) -> None:
    """Red meant exposed communication in the step-time bars and waiting in the timelines.
    Now, over the whole page: every legend label has one colour, a category drawn in several
    charts (compute, exposed communication, idle) has the same colour in each, and the
    waiting colour (the heat map's hottest) is used for nothing else."""
    page = render_html(pipeline_report, Severity.error)
    p = Collector()
    p.feed(page)
    p.close()
    fills: dict[str, set[str]] = {}
    for tag, attrs in p.tags:
        if tag == "rect" and attrs.get("fill") and attrs.get("class"):
            for cls in (attrs["class"] or "").split():
                fills.setdefault(cls, set()).add(attrs["fill"] or "")
    # The same category, chart by chart (step-time bars, pipeline chart, timelines).
    for a, b in [
        ("seg-compute", "k-compute"),
        ("seg-compute", "tl-compute"),
        ("seg-exposed", "tl-exposed"),
        ("seg-idle", "tl-idle"),
    ]:
        assert a in fills and b in fills, (a, b, sorted(fills))
        assert len(fills[a]) == 1 and fills[a] == fills[b], (a, fills[a], b, fills[b])
    (wait,) = fills["tl-wait"]
    others = {c for cls, cs in fills.items() if cls not in ("tl-wait", "cell") for c in cs}
    assert wait not in others
    # The heat map's scale runs to the same red.
    stops = re.findall(r'stop-color="(#[0-9a-f]{6})"', page)
    assert stops and stops[-1] == wait
    # Legends: a label has one colour, a colour one label, but for the names of one
    # category (exposed comm, exposed communication; communication, its orange).
    legend = re.findall(r'<i style="background:(#[0-9a-f]{6})"></i>([^<]+)</span>', page)
    same = {"exposed communication": "exposed comm", "communication": "exposed comm"}
    by_label: dict[str, set[str]] = {}
    by_colour: dict[str, set[str]] = {}
    for colour, label in legend:
        by_label.setdefault(label, set()).add(colour)
        by_colour.setdefault(colour, set()).add(same.get(label, label))
    assert all(len(c) == 1 for c in by_label.values()), by_label
    assert all(len(n) == 1 for n in by_colour.values()), by_colour
    assert by_label["waiting for the last rank"] == {wait}


def test_html_escapes_every_trace_string(pipeline_report: Report) -> None:
    page = render_html(pipeline_report, Severity.error)
    assert EVIL not in page
    assert "<script" not in page.lower()
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 5
    p = Collector()
    p.feed(page)
    assert not [t for t, _ in p.tags if t == "script"]
    # the decoded text shows the name as text (in the kernel tooltip and the finding)
    assert EVIL in "".join(p.text)


def test_html_is_self_contained(pipeline_report: Report) -> None:
    page = render_html(pipeline_report, Severity.error)
    p = Collector()
    p.feed(page)
    for tag, attrs in p.tags:
        for key in ("src", "href"):
            value = attrs.get(key)
            assert value is None or value.startswith(("data:", "#")), (tag, key, value)
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page
    assert "default-src 'none'" in page


def test_html_without_pipeline_or_matches(tmp_path: Path) -> None:
    report = kineto_comm.analyze(
        Path(__file__).resolve().parents[1] / "sample_traces" / "ddp-4", jobs=1
    )
    page = render_html(report, Severity.error)
    assert "No pipeline ranks" in page and 'id="plot-pipeline"' in page
    assert 'class="cell"' in page  # ddp all-reduces are matched across ranks
    empty = dataclasses.replace(report, rank_waits=RankStore())
    assert "No collective calls matched across ranks." in render_html(empty, Severity.error)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.skipif(_chromium() is None, reason="no chromium binary installed")
def test_html_renders_in_headless_chromium(pipeline_report: Report, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_html(pipeline_report, Severity.error), encoding="utf-8")
    shot = tmp_path / "shot.png"
    base = [
        _chromium() or "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    # the laid-out DOM: the SVG plots exist with their shapes after the page loaded
    dom = subprocess.run(
        [*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=90
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    for plot in ("plot-step-time", "plot-sizes", "plot-skew", "plot-pipeline"):
        assert f'id="{plot}"' in dom.stdout
    assert "<script" not in dom.stdout.lower()
    run = subprocess.run(
        [*base, "--enable-logging=stderr", "--v=0", f"--screenshot={shot}"]
        + ["--window-size=1300,2400", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    console = [ln for ln in run.stderr.splitlines() if "CONSOLE" in ln]
    assert not console, console
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
