"""The HTML report's per-rank timelines (kineto_comm.render.html_timeline) and the wait heat
map's groups and last arrivers, on a synthetic straggler job and the real tp-dp-8 capture."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest

from kineto_comm import analyze
from kineto_comm.findings import Severity
from kineto_comm.render.html import render_html
from kineto_comm.render.html_timeline import _merged, _minus, _within, chosen_steps, lanes
from kineto_comm.synth import generate

from .conftest import REPO

TP_DP = REPO / "tests" / "data" / "h100-nccl" / "tp-dp-8"


class Shapes(HTMLParser):
    """Every tag's attributes, and the text inside each <svg id=...>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.svg: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "svg":
            self.svg = a.get("id")
        a["_svg"] = self.svg
        self.tags.append((tag, a))

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self.svg = None

    def rects(self, svg: str, cls: str) -> list[dict[str, str | None]]:
        return [
            a for t, a in self.tags if t == "rect" and a["_svg"] == svg and a.get("class") == cls
        ]


def parse(page: str) -> Shapes:
    p = Shapes()
    p.feed(page)
    p.close()
    return p


@pytest.fixture(scope="module")
def straggler(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("straggler")
    truth = generate("straggler", folder, ranks=4, seed=3, steps=3)
    return analyze(folder), truth["problems"][0]["ranks"][0]


def test_median_and_worst_step_are_drawn_for_every_rank(straggler) -> None:
    report, late = straggler
    steps = chosen_steps(report)
    # The one step time (step_times: the longest rank's window), as every table uses.
    times = report.step_times.filter(pl.col("step") >= 0)
    assert [w for w, _, _ in steps][0] == "median"
    assert max(times["step_ns"]) == steps[-1][2]
    page = render_html(report, Severity.error)
    shapes = parse(page)
    for which, step, _ in steps:
        svg = f"timeline-{which}"
        # A lane (its idle background) per rank, and compute drawn on every lane.
        assert len(shapes.rects(svg, "tl-idle")) == report.ranks.height
        assert shapes.rects(svg, "tl-compute")
        # The ranks that waited for the straggler show waits; the straggler itself none.
        waits = shapes.rects(svg, "tl-wait")
        assert waits
        start = page.index(f'id="{svg}"')
        drawing = page[start : page.index("</svg>", start)]
        label_y = {
            int(m.group(2)): float(m.group(1))
            for m in re.finditer(
                r'<text x="[\d.]+" y="([\d.]+)" text-anchor="end"[^>]*>rank (\d+)', drawing
            )
        }
        assert sorted(label_y) == sorted(report.ranks["rank"].to_list())
        assert f"step {step} ({which}" in drawing
        ys = {float(a["y"] or 0) for a in waits}
        lane_top = {r: y - 18 / 2 - 4 for r, y in label_y.items()}
        assert round(lane_top[late], 1) not in {round(y, 1) for y in ys}
        # The step's critical path: a bar under each lane it crosses, its first hop on the
        # critical rank.
        path = report.critical_path.filter(pl.col("step") == step)
        bars = shapes.rects(svg, "tl-critical")
        assert len(bars) == path.height > 0
        first = path.sort("hop").row(0, named=True)["rank"]
        on = {round(float(b["y"] or 0) - 18 + 4, 1) for b in bars}
        assert round(lane_top[first], 1) in on


def test_finding_windows_link_to_their_cards(straggler) -> None:
    report, _ = straggler
    page = render_html(report, Severity.error)
    links = set(re.findall(r'<a href="#(finding-\d+)">', page))
    assert links, "no finding drawn on a timeline"
    ids = set(re.findall(r'id="(finding-\d+)"', page))
    assert links <= ids
    assert len(ids) == len(report.findings)


def test_heat_map_marks_the_straggler_as_last_arriver(straggler) -> None:
    report, late = straggler
    page = render_html(report, Severity.error)
    lasts = re.findall(r'class="last"[^>]*><title>last to arrive: rank (\d+)', page)
    assert lasts and {int(r) for r in lasts} == {late}


def test_heat_map_separates_groups_on_tp_dp() -> None:
    report = analyze(TP_DP)
    page = render_html(report, Severity.error)
    groups = report.collective_instances.filter(pl.col("ranks_seen") > 1)["process_group"]
    names = re.findall(r">group ([^<]+)</text>", page)
    assert sorted(names) == sorted(groups.unique().to_list())
    assert page.count('class="group-sep"') == len(names) - 1
    # every matched call's last rank is outlined (one call per column at this size)
    assert (
        page.count('class="last"')
        == report.collective_instances.filter(
            (pl.col("ranks_seen") > 1) & (pl.col("arrival_skew_ns") >= 5_000)
        ).height
    )


def test_big_jobs_draw_the_chosen_ranks(tmp_path: Path) -> None:
    generate("straggler", tmp_path, ranks=32, seed=1, steps=2)
    report = analyze(tmp_path)
    ranks, why = lanes(report)
    assert 1 < len(ranks) < 32 and all(why[r] for r in ranks)
    assert any("straggler" in why[r] for r in ranks)


def test_interval_arithmetic() -> None:
    assert _merged([(5, 6), (0, 2), (1.8, 3)], 0.5) == [(0, 3), (5, 6)]
    assert _minus([(0, 10)], [(2, 3), (5, 12)]) == [(0, 2), (3, 5)]
    assert _within([(0, 10), (20, 30)], [(5, 25)]) == [(5, 10), (20, 25)]


def test_html_carries_what_the_text_report_has() -> None:
    """Roles, skew and bandwidth, offsets, stragglers (the shared sections) and the clock
    lines the text report prints, in the HTML too."""
    import html as htmllib

    from kineto_comm.render.formats import render
    from kineto_comm.render.sections import sections
    from kineto_comm.render.text import clock_sets_line, hosts_line

    report = analyze(TP_DP)
    page = htmllib.unescape(render_html(report, Severity.error))
    text = render(report, "text")
    keys = {s.key for s in sections(report)}
    assert {"process_groups", "skew", "offsets", "stragglers"} <= keys
    for section in sections(report):
        assert section.title in page and section.title in text
    lines = [line for line in (hosts_line(report), clock_sets_line(report)) if line]
    assert lines
    for line in lines:
        assert line in page and line in " ".join(text.split())
