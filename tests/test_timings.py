"""`KINETO_COMM_TIMINGS=1` (issue 81): where a run's time went, on stderr, report unchanged."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO, SAMPLES

STAGES = ("imports", "rules setup", "per-rank", "decode", "model", "merge", "cross-rank")
STAGES += ("rules", "model of time", "render")


def _report(timings: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KINETO_COMM_TIMINGS"}
    if timings is not None:
        env["KINETO_COMM_TIMINGS"] = timings
    return subprocess.run(
        [sys.executable, "-m", "kineto_comm", "report", str(SAMPLES / "ddp-4")]
        + ["--format", "json", "--exit-zero"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )


def test_timings_name_every_stage_and_change_nothing_else() -> None:
    plain, timed, off = _report(None), _report("1"), _report("0")
    assert plain.returncode == timed.returncode == off.returncode == 0, timed.stderr[-2000:]
    assert timed.stdout == plain.stdout == off.stdout  # the report itself is the same
    assert "timings" not in plain.stderr and "timings" not in off.stderr
    rows = dict(re.findall(r"^ +(\S(?:.*?\S)?) +(\d+\.\d+) s", timed.stderr, flags=re.MULTILINE))
    assert set(STAGES) <= set(rows), sorted(rows)
    # Each rule that ran has its own line, and the rules' lines add up to the rules stage.
    codes = [name for name in rows if re.fullmatch(r"[A-Z]+\d{3}", name)]
    assert "COMM101" in codes and len(codes) >= 5, codes
    assert sum(float(rows[c]) for c in codes) <= float(rows["rules"]) + 1e-3 * len(codes)
    wall = float(re.search(r"(\d+\.\d+) s since", timed.stderr).group(1))  # type: ignore[union-attr]
    top = ("imports", "rules setup", "per-rank", "merge", "cross-rank", "rules", "render")
    assert sum(float(rows[s]) for s in top) <= wall
