"""Pipeline bubbles: stages, micro-batches and idle split, against closed forms and truth."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

import kineto_comm
from kineto_comm.analysis.pipeline import PIPELINE_SCHEMA, pipeline
from kineto_comm.synth import generate

from .conftest import REPO, SAMPLES

F, B = 1_000, 2_000  # forward / backward time of one micro-batch on one stage (ns)
LAT = 10  # duration of a send


def gpipe(
    order: list[int],
    m: int,
    steps: int = 2,
    peers: bool = True,
    pair_groups: bool = False,
    offsets: dict[int, int] | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """kernels, collectives, steps of an ideal GPipe over stages held by `order` (ranks).

    Stage s runs forward j in [(s+j)F, (s+j+1)F) and backward j, after the last forward
    ends at P = (p-1+m)F, in [P + (p-1-s+j)B, ... + B). Every step window is the whole
    pipeline span T = (m+p-1)(F+B). Each recv waits from the end of the rank's previous
    compute (or the window start) until the data arrives; sends take LAT.
    """
    p = len(order)
    period = (m + p - 1) * (F + B)
    fwd_end = (p - 1 + m) * F
    kern: list[dict] = []
    coll: list[dict] = []
    win: list[dict] = []
    for k in range(steps):
        t0 = k * period
        for s, r in enumerate(order):
            off = (offsets or {}).get(r, 0)
            win.append({"rank": r, "step": k, "start_ns": t0 + off, "end_ns": t0 + period + off})
            prev_end = t0
            spans = [(t0 + (s + j) * F, F, "f", j) for j in range(m)]
            spans += [(t0 + fwd_end + (p - 1 - s + j) * B, B, "b", j) for j in range(m)]
            for start, dur, kind, _j in spans:
                src = order[s - 1] if kind == "f" and s > 0 else None
                src = order[s + 1] if kind == "b" and s < p - 1 else src
                dst = order[s + 1] if kind == "f" and s < p - 1 else None
                dst = order[s - 1] if kind == "b" and s > 0 else dst
                if src is not None:
                    coll.append(_call(r, k, "recv", prev_end, start, src, peers, pair_groups, off))
                kern.append(
                    {
                        "rank": r,
                        "kind": "compute",
                        "start_ns": start + off,
                        "end_ns": start + dur + off,
                    }
                )
                if dst is not None:
                    end = start + dur
                    coll.append(_call(r, k, "send", end, end + LAT, dst, peers, pair_groups, off))
                prev_end = start + dur
    kernels = pl.DataFrame(kern, schema={"rank": pl.Int64, "kind": pl.String} | _TIMES)
    steps_t = pl.DataFrame(win, schema={"rank": pl.Int64, "step": pl.Int64} | _TIMES)
    return kernels, pl.DataFrame(coll, schema=_COLL), steps_t


_TIMES = {"start_ns": pl.Int64, "end_ns": pl.Int64}
_COLL = {
    "rank": pl.Int64,
    "step": pl.Int64,
    "collective": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "process_group": pl.String,
    "pg_ranks": pl.String,
    "peer": pl.Int64,
}


def _call(
    rank: int, step: int, what: str, a: int, b: int, other: int, peers: bool, pairs: bool, off: int
) -> dict:
    lo, hi = sorted((rank, other))
    return {
        "rank": rank,
        "step": step,
        "collective": what,
        "start_ns": a + off,
        "end_ns": b + off,
        "process_group": f"pair{lo}-{hi}" if pairs else "0",
        "pg_ranks": f"[{lo}, {hi}]" if pairs else None,
        "peer": other if peers else None,
    }


def stage_of(table: pl.DataFrame) -> dict[int, int]:
    """rank -> stage (one value per rank, checked)."""
    per = table.group_by("rank").agg(pl.col("stage").unique())
    assert per["stage"].list.len().max() == 1
    return {r: s[0] for r, s in per.iter_rows()}


ORDER = [5, 2, 7, 0]  # stage s is held by ORDER[s]: neither sorted nor reversed


@pytest.mark.parametrize(
    "how",
    [{"peers": True}, {"peers": False, "pair_groups": True}, {"peers": False}],
    ids=["peer-column", "2-rank-groups", "timing-only"],
)
def test_gpipe_closed_form(how: dict) -> None:
    m, p = 4, len(ORDER)
    out = pipeline(*gpipe(ORDER, m, **how))
    assert out.schema == pl.Schema(PIPELINE_SCHEMA)
    assert out.height == p * 2
    assert stage_of(out) == {r: s for s, r in enumerate(ORDER)}
    assert out["stages"].unique().to_list() == [p]
    assert out["micro_batches"].unique().to_list() == [m]
    stage = pl.col("stage")
    expect = out.select(
        "idle_ns",
        "warmup_idle_ns",
        "steady_idle_ns",
        "cooldown_idle_ns",
        "busy_ns",
        idle=pl.lit((p - 1) * (F + B)),
        warm=stage * F,
        steady=(p - 1 - stage) * (F + B),
        cool=stage * B,
        busy=pl.lit(m * (F + B)),
    )
    assert expect["idle_ns"].to_list() == expect["idle"].to_list()
    assert expect["warmup_idle_ns"].to_list() == expect["warm"].to_list()
    assert expect["steady_idle_ns"].to_list() == expect["steady"].to_list()
    assert expect["cooldown_idle_ns"].to_list() == expect["cool"].to_list()
    assert expect["busy_ns"].to_list() == expect["busy"].to_list()
    theory = (p - 1) / (m + p - 1)
    assert out["bubble_fraction"].to_list() == pytest.approx([theory] * out.height)
    assert out["theory_fraction"].to_list() == pytest.approx([theory] * out.height)


def test_timing_order_ignores_clock_offsets() -> None:
    """Without peers the order comes from each rank's own clock: host offsets do not matter."""
    offsets = {5: 7_000_000_000, 2: -3_000_000, 7: 0, 0: 123_456_789}
    out = pipeline(*gpipe(ORDER, 3, peers=False, offsets=offsets))
    assert stage_of(out) == {r: s for s, r in enumerate(ORDER)}
    assert out["micro_batches"].unique().to_list() == [3]


def test_two_pipelines_in_one_group_without_peers() -> None:
    """d parallel pipelines sharing the p2p group: p = ranks / d, stage-mates share a stage."""
    k1, c1, s1 = gpipe([0, 2, 4, 6], 2, peers=False)
    k2, c2, s2 = gpipe([1, 3, 5, 7], 2, peers=False)
    out = pipeline(pl.concat([k1, k2]), pl.concat([c1, c2]), pl.concat([s1, s2]))
    assert stage_of(out) == {r: r // 2 for r in range(8)}
    assert out["stages"].unique().to_list() == [4]
    assert out["micro_batches"].unique().to_list() == [2]


def test_missing_first_stage_trace() -> None:
    """Stage 0's file is lost: peers still place the others, m comes from the last stage."""
    kernels, coll, steps = gpipe(ORDER, 5)
    gone = pl.col("rank") != ORDER[0]
    out = pipeline(kernels.filter(gone), coll.filter(gone), steps.filter(gone))
    assert stage_of(out) == {r: s for s, r in enumerate(ORDER) if s > 0}
    assert out["stages"].unique().to_list() == [4]
    assert out["micro_batches"].unique().to_list() == [5]


def test_collective_only_rank_has_no_rows() -> None:
    kernels, coll, steps = gpipe([0, 1], 2)
    extra = pl.DataFrame(
        {"rank": [9], "step": [0], "collective": ["all_reduce"], "start_ns": [0], "end_ns": [5]},
        schema={k: v for k, v in _COLL.items() if k in ("rank", "step", "collective")} | _TIMES,
    )
    steps = pl.concat(
        [steps, pl.DataFrame({"rank": [9], "step": [0], "start_ns": [0], "end_ns": [9]})]
    )
    out = pipeline(kernels, pl.concat([coll, extra], how="diagonal_relaxed"), steps)
    assert sorted(out["rank"].unique().to_list()) == [0, 1]


def test_idle_split_with_gaps_and_window_edges() -> None:
    """Compute straddling the window edges is clipped; comm-only time is idle."""
    steps = pl.DataFrame(
        {
            "rank": [0, 0, 1],
            "step": [0, 1, 0],
            "start_ns": [100, 200, 100],
            "end_ns": [200, 300, 200],
        }
    )
    kernels = pl.DataFrame(
        {
            "rank": [0, 0, 0, 0, 0, 1],
            "kind": ["compute", "compute", "communication", "compute", "compute", "compute"],
            "start_ns": [90, 140, 150, 190, 260, 100],
            "end_ns": [110, 150, 180, 230, 270, 200],
        }
    )
    coll = pl.DataFrame(
        {
            "rank": [0, 1],
            "step": [0, 0],
            "collective": ["send", "recv"],
            "start_ns": [110, 100],
            "end_ns": [120, 110],
            "peer": [1, 0],
        }
    )
    out = pipeline(kernels, coll, steps).sort("rank", "step")
    rows = out.select(
        "rank",
        "step",
        "busy_ns",
        "warmup_idle_ns",
        "steady_idle_ns",
        "cooldown_idle_ns",
        "idle_ns",
        "wall_ns",
    ).rows()
    # rank 0 step 0: compute [100,110) [140,150) [190,200): busy 30, no warm-up, steady 70.
    # rank 0 step 1: compute [200,230) [260,270): busy 40, steady 30, cool-down 30.
    # rank 1: computes the whole window.
    assert rows == [
        (0, 0, 30, 0, 70, 0, 70, 100),
        (0, 1, 40, 0, 30, 30, 60, 100),
        (1, 0, 100, 0, 0, 0, 0, 100),
    ]
    assert stage_of(out) == {0: 0, 1: 1}


def test_window_without_compute_is_all_warmup() -> None:
    steps = pl.DataFrame({"rank": [0, 1], "step": [3, 3], "start_ns": [0, 0], "end_ns": [50, 50]})
    kernels = pl.DataFrame({"rank": [1], "kind": ["compute"], "start_ns": [10], "end_ns": [20]})
    coll = pl.DataFrame(
        {
            "rank": [0, 1],
            "step": [3, 3],
            "collective": ["send", "recv"],
            "start_ns": [0, 0],
            "end_ns": [5, 10],
            "peer": [1, 0],
        }
    )
    out = pipeline(kernels, coll, steps).sort("rank")
    assert out.select("warmup_idle_ns", "steady_idle_ns", "cooldown_idle_ns").rows() == [
        (50, 0, 0),
        (10, 0, 30),
    ]
    assert out["bubble_fraction"].to_list() == pytest.approx([1.0, 0.8])


def test_empty_inputs() -> None:
    empty = pipeline(pl.DataFrame(), pl.DataFrame(), pl.DataFrame())
    assert empty.height == 0 and empty.schema == pl.Schema(PIPELINE_SCHEMA)
    kernels, coll, steps = gpipe([0, 1], 2)
    none = pipeline(kernels, coll.clear(), steps)
    assert none.height == 0 and none.schema == pl.Schema(PIPELINE_SCHEMA)


# ----------------------------------------------------------------- synthetic and real traces


@pytest.fixture(scope="module")
def bubble_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[pl.DataFrame, dict]:
    out = tmp_path_factory.mktemp("bubble")
    generate("bubble", out, ranks=8, seed=0, steps=2)
    r = kineto_comm.analyze(out, jobs=1)
    return pipeline(r.kernels, r.collectives, r.steps), json.loads((out / "truth.json").read_text())


@pytest.fixture(scope="module")
def baseline_pp(tmp_path_factory: pytest.TempPathFactory) -> tuple[pl.DataFrame, dict]:
    out = tmp_path_factory.mktemp("baseline-pp")
    generate("baseline", out, ranks=8, layout="pp-dp", steps=2)
    r = kineto_comm.analyze(out, jobs=1)
    return pipeline(r.kernels, r.collectives, r.steps), json.loads((out / "truth.json").read_text())


def _pp_stages(truth: dict) -> dict[int, int]:
    """rank -> stage from the truth's pipeline process groups (their ranks in stage order)."""
    groups = [g for g in truth["process_groups"] if g["role"] == "pp"]
    return {r: s for g in groups for s, r in enumerate(g["ranks"])}


def steady_bubble(table: pl.DataFrame) -> float:
    """Mean over stages of bubble_fraction in the steady-state steps (module doc)."""
    first = table["step"].min()
    return table.filter(pl.col("step") > first)["bubble_fraction"].mean()  # type: ignore[return-value]


def test_synth_bubble_matches_truth(bubble_job: tuple[pl.DataFrame, dict]) -> None:
    table, truth = bubble_job
    problem = truth["problems"][0]
    p, m = problem["stages"], problem["micro_batches"]
    assert (p, m) == (truth["parallelism"]["pp"], 2)
    assert table.height == truth["world_size"] * truth["steps"]
    assert stage_of(table) == _pp_stages(truth)
    assert table["stages"].unique().to_list() == [p]
    assert table["micro_batches"].unique().to_list() == [m]
    assert table["theory_fraction"].to_list() == pytest.approx([(p - 1) / (m + p - 1)] * 16)
    want = problem["bubble_fraction"]
    assert steady_bubble(table) == pytest.approx(want, abs=0.02)
    stage0 = table.filter(pl.col("stage") == 0)["bubble_fraction"].mean()
    assert stage0 == pytest.approx(want, abs=0.02)
    # The bubble is warm-up on later stages: stage s waits for s forwards.
    steady = (
        table.filter(pl.col("step") == 1).group_by("stage").agg(pl.col("warmup_idle_ns").mean())
    )
    warm = steady.sort("stage")["warmup_idle_ns"].to_list()
    assert warm == sorted(warm) and warm[0] < warm[-1]


def test_synth_baseline_pipeline(
    baseline_pp: tuple[pl.DataFrame, dict], bubble_job: tuple[pl.DataFrame, dict]
) -> None:
    table, truth = baseline_pp
    p, m = truth["parallelism"]["pp"], truth["model"]["micro_batches"]
    assert stage_of(table) == _pp_stages(truth)
    assert table["stages"].unique().to_list() == [p]
    assert table["micro_batches"].unique().to_list() == [m]
    assert steady_bubble(table) == pytest.approx(truth["measured_bubble_fraction"], abs=0.02)
    assert steady_bubble(table) < steady_bubble(bubble_job[0]) - 0.2


def test_dp_only_job_has_no_pipeline(tmp_path: Path) -> None:
    generate("baseline", tmp_path, ranks=4, layout="dp", steps=2)
    r = kineto_comm.analyze(tmp_path, jobs=1)
    assert r.collectives.height > 0
    out = pipeline(r.kernels, r.collectives, r.steps)
    assert out.height == 0 and out.schema == pl.Schema(PIPELINE_SCHEMA)


def test_real_gloo_gpipe_capture() -> None:
    """4-stage GPipe over gloo, 4 micro-batches, no peers recorded: stage of rank r is r."""
    r = kineto_comm.analyze(SAMPLES / "pp-4", jobs=1)
    assert r.errors == ()
    out = pipeline(r.kernels, r.collectives, r.steps)
    steps = r.steps.select("rank", "step").sort("rank", "step")
    assert out.select("rank", "step").sort("rank", "step").equals(steps)
    assert stage_of(out) == {0: 0, 1: 1, 2: 2, 3: 3}
    assert out["stages"].unique().to_list() == [4]
    assert out["micro_batches"].unique().to_list() == [4]
    assert out["theory_fraction"].to_list() == pytest.approx([3 / 7] * out.height)
    split = out["warmup_idle_ns"] + out["steady_idle_ns"] + out["cooldown_idle_ns"]
    assert split.equals(out["idle_ns"], check_names=False)
    assert ((out["bubble_fraction"] > 0) & (out["bubble_fraction"] < 1)).all()


@pytest.mark.parametrize("capture", [SAMPLES / "pp-4", REPO / "tests/data/h100-nccl/pp-4"])
def test_measured_step_edges_give_the_kernels_table(capture: Path) -> None:
    """Real pipeline captures (gloo on the host, NCCL on an H100): the table built from the
    steps' own compute time and edges (the per-rank sweep's) equals the one found again
    from every kernel, as for steps without them (a cache written before they existed)."""
    r = kineto_comm.analyze(capture, jobs=1)
    measured = pipeline(r.kernels, r.collectives, r.steps)
    assert measured.height > 0 and measured["busy_ns"].sum() > 0
    bare = r.steps.drop("compute_ns", "compute_start_ns", "compute_end_ns")
    assert pipeline(r.kernels, r.collectives, bare).equals(measured)


def test_compute_edges_match_their_definition_on_random_kernels() -> None:
    """busy, first and last compute of each window against their definitions, computed
    kernel by kernel: busy the length of the union of compute inside the window; first the
    earliest moment of the window some compute runs (from the earliest overlapping kernel's
    start, clipped to the window; a kernel of no length runs none); last the latest. Windows
    with and without the steps' own compute_ns give the same table, and so does the per-rank
    sweep's measure of the same windows (overlap.breakdown: the steps' compute_ns,
    compute_start_ns and compute_end_ns)."""
    import random

    from kineto_comm.analysis.overlap import breakdown
    from kineto_comm.analysis.pipeline import _compute_edges

    rng = random.Random(7)
    for _ in range(40):
        rows = [
            (rank, rng.choice(["compute", "compute", "communication"]), s, s + rng.randint(0, 120))
            for rank in range(3)
            for s in (rng.randint(0, 1000) for _ in range(rng.randint(1, 25)))
        ]
        kernels = pl.DataFrame(rows, schema=["rank", "kind", "start_ns", "end_ns"], orient="row")
        wins = []
        for rank in range(3):
            t, step = 0, 0
            while t < 1100:
                wins.append((rank, step, t, t + rng.randint(1, 300)))
                t, step = wins[-1][3], step + 1
        windows = pl.DataFrame(wins, schema=["rank", "step", "start_ns", "end_ns"], orient="row")
        got = _compute_edges(kernels, windows).sort("rank", "step")
        expected = []
        for rank, step, w0, w1 in wins:
            spans = [
                (max(s, w0), min(e, w1))
                for r, kind, s, e in rows
                if r == rank and kind == "compute" and s < w1 and e > w0 and e > s
            ]
            covered = {t for a, b in spans for t in range(a, b)}
            expected.append(
                (
                    rank,
                    step,
                    len(covered),
                    min((a for a, _ in spans), default=None),
                    max((b for _, b in spans), default=None),
                )
            )
        want = pl.DataFrame(
            expected, schema=["rank", "step", "busy_ns", "first_ns", "last_ns"], orient="row"
        )
        assert got.equals(want), (got, want)
        measured = windows.join(
            got.select("rank", "step", compute_ns="busy_ns"), on=["rank", "step"]
        )
        assert _compute_edges(kernels, measured).sort("rank", "step").equals(got)
        swept = breakdown(kernels, windows.rename({"step": "window"})).select(
            "rank",
            step="window",
            busy_ns="compute_ns",
            first_ns="compute_start_ns",
            last_ns="compute_end_ns",
        )
        assert swept.sort("rank", "step").equals(got)
