"""docs/papers.md: its code blocks, run in order on real captures, give what the page says."""

from __future__ import annotations

import re

import pytest

from .conftest import REPO

DOC = REPO / "docs" / "papers.md"


def _run_the_page(traces: str) -> dict:
    """Every ```python block of the page, in order, in one namespace, on `traces`."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 5
    setup = blocks[0].replace('TRACES = "traces/"', f"TRACES = {traces!r}")
    assert setup != blocks[0], "the first block sets TRACES"
    names: dict = {}
    for block in [setup, *blocks[1:]]:
        exec(compile(block, str(DOC), "exec"), names)  # noqa: S102 - the page's own code
    return names


@pytest.mark.parametrize(
    ("job", "schemes"),
    [
        ("tests/data/h200-nccl/pp-dp-8", {"pipeline", "data_parallel"}),
        ("tests/data/h100-nccl/tp-dp-8", {"tensor_parallel", "data_parallel"}),
    ],
    ids=["h200-pp-dp-8", "h100-tp-dp-8"],
)
def test_the_papers_page_runs_on_real_captures(job: str, schemes: set) -> None:
    """Anthony et al.'s counts per scheme, Lu et al.'s waits by block size and the bubble,
    Pati et al.'s shares and sweep: each table holds the job's schemes, and its numbers
    are the report's."""
    page = _run_the_page(str(REPO / job))
    report = page["report"]
    per_scheme, sizes = page["per_scheme"], page["sizes"]
    assert set(per_scheme["role"]) == schemes == set(sizes["role"])
    # Every call of every rank is in one size bucket.
    assert sizes["calls"].sum() == report.collectives.height
    # Waits and data movement split each matched call's time, never below zero.
    waiting = page["waiting"]
    assert set(waiting["role"]) == schemes
    assert (waiting["wait_ms"] >= 0).all() and (waiting["moving_ms"] > 0).all()
    assert waiting["calls"].sum() == report.collective_waits.height
    bubble = page["bubble"]
    assert (bubble.height > 0) == ("pipeline" in schemes)
    if bubble.height:
        assert ((bubble["bubble_fraction"] > 0) & (bubble["bubble_fraction"] <= 1)).all()
    shares = page["shares"]
    assert shares["rank"].to_list() == report.ranks["rank"].sort().to_list()
    for column in ("comm_share", "hidden_share", "exposed_share"):
        assert shares[column].is_between(0, 1).all(), column
    # Strong scaling: the communication share grows with the data-parallel degree.
    sweep = page["sweep"]
    assert sweep["value"].to_list() == [8, 16, 32, 64]
    assert sweep["comm_share"].is_sorted() and sweep["comm_share"].n_unique() == 4
