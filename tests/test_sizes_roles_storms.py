"""Message sizes, process-group roles and small-message storms on synthetic and real traces.

Synthetic jobs come with truth.json (kineto_comm.synth): group roles, per-rank expected calls and
bytes per step, the injected small-message problem and its impact. Real traces: the gloo
captures in sample_traces/ and HTA's control trace (all_to_all + all_reduce, no group names).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import kineto_comm
from kineto_comm import lazy
from kineto_comm.analysis.roles import PROCESS_GROUP_SCHEMA, process_groups
from kineto_comm.analysis.sizes import (
    MESSAGE_SIZES_SCHEMA,
    SUMMARY_SCHEMA,
    message_size_summary,
    message_sizes,
)
from kineto_comm.analysis.storms import STORM_SCHEMA, storms
from kineto_comm.rank_store import TIME_COLUMNS
from kineto_comm.report import Report
from kineto_comm.rules_engine import run_rules
from kineto_comm.synth import generate
from kineto_comm.synth.config import Hardware

from .conftest import SAMPLES, shared

CPU_ONLY = "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"

LAYOUTS = ("dp", "fsdp", "tp-dp", "pp-dp")
# Generator role -> ours. The generator calls the single group of the fsdp layout "dp" (it is
# the data-parallel group, sharded): its role in our vocabulary is fsdp.
ROLE_MAP = {"dp": "data_parallel", "tp": "tensor_parallel", "pp": "pipeline", "ep": "expert"}


def expected_role(truth: dict[str, Any], role: str) -> str:
    """Our role name for a generator group role."""
    if truth["layout"] == "fsdp" and role == "dp":
        return "fsdp"
    return ROLE_MAP[role]


Job = tuple[Report, dict[str, Any]]


# Links pinned at one figure, as these tests were calibrated (the default synth's links are
# the hardware table's, per collective and host layout: docs/hardware.md).
HW = Hardware(busbw_gbps=100.0)


def _job(out: Path, scenario: str, **kw: Any) -> Job:
    truth = generate(scenario, out, **{"hardware": HW, **kw})
    return kineto_comm.analyze(out, jobs=1), truth


@pytest.fixture(scope="module")
def baselines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    root = tmp_path_factory.mktemp("baseline")
    return {lay: _job(root / lay, "baseline", ranks=8, layout=lay, steps=2) for lay in LAYOUTS}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Job:
    return _job(tmp_path_factory.mktemp("small"), "small-messages", ranks=4, layout="dp", steps=2)


@pytest.fixture(scope="module")
def samples() -> dict[str, Report]:
    names = ("ddp-4", "pp-4", "tp-2", "fsdp-2")
    return {n: kineto_comm.analyze(SAMPLES / n, jobs=1) for n in names}


def _roles(rep: Report) -> pl.DataFrame:
    return process_groups(rep.collectives, rep.steps, rep.ranks)


# ---------------------------------------------------------------- message sizes


def test_histogram_buckets_hold_every_call_in_its_power_of_two_range(
    baselines: dict[str, Job],
) -> None:
    coll = pl.concat([baselines[lay][0].collectives for lay in LAYOUTS])
    hist = message_sizes(coll)
    assert hist.schema == pl.Schema(MESSAGE_SIZES_SCHEMA)
    assert hist["calls"].sum() == coll.height
    assert hist["bytes"].sum() == coll["bytes"].sum()
    assert hist["time_ns"].sum() == coll["duration_ns"].sum()
    for row in hist.iter_rows(named=True):
        lo = row["bucket_min_bytes"]
        assert lo == 2 ** row["log2_bucket"]
        inside = coll.filter(
            pl.col("process_group") == row["process_group"],
            pl.col("collective") == row["collective"],
            pl.col("bytes") >= lo,
            pl.col("bytes") < 2 * lo,
        )
        assert inside.height == row["calls"]
        assert inside["duration_ns"].sum() == row["time_ns"]
        assert row["p2p"] == (row["collective"] in ("send", "recv", "send_recv"))
    assert hist.filter(pl.col("p2p"))["collective"].unique().sort().to_list() == ["recv", "send"]


def test_histogram_unknown_sizes_zero_bytes_and_unnamed_groups(baselines: dict[str, Job]) -> None:
    coll = baselines["dp"][0].collectives
    odd = coll.with_columns(
        bytes=pl.when(pl.col("call_index") % 3 == 0)
        .then(None)
        .when(pl.col("call_index") % 3 == 1)
        .then(0)
        .otherwise(pl.col("bytes")),
        process_group=pl.lit(None, dtype=pl.String),
    )
    hist = message_sizes(odd)
    assert hist["process_group"].unique().to_list() == ["?"]
    assert hist["calls"].sum() == coll.height
    assert hist["time_ns"].sum() == coll["duration_ns"].sum()
    unknown = hist.filter(pl.col("log2_bucket").is_null())
    zero = hist.filter(pl.col("log2_bucket") == -1)
    assert unknown["calls"].to_list() == [(coll["call_index"] % 3 == 0).sum()]
    assert unknown["bucket_min_bytes"].to_list() == [None]
    assert zero["calls"].to_list() == [(coll["call_index"] % 3 == 1).sum()]
    assert zero["bucket_min_bytes"].to_list() == [0]
    summary = message_size_summary(odd)
    # Calls of unknown size count in the denominators only; zero-byte calls are small.
    assert summary["calls_lt_64k_share"][0] == pytest.approx(
        (coll["call_index"] % 3 == 1).sum() / coll.height
    )


def test_summary_shares_follow_the_generated_message_sizes(
    baselines: dict[str, Job], small: Job
) -> None:
    rep, truth = small
    cap = truth["problems"][0]["max_message_bytes"]
    assert cap < 64 * 1024
    s = message_size_summary(rep.collectives)
    assert s.schema == pl.Schema(SUMMARY_SCHEMA)
    assert s.select("process_group", "collective").rows() == [("0", "all_reduce")]
    assert s["calls_lt_64k_share"][0] == 1.0 and s["time_lt_64k_share"][0] == 1.0
    base = message_size_summary(baselines["dp"][0].collectives)
    bucket = baselines["dp"][1]["expected"]["dp_grad"]["bucket_bytes"]
    assert bucket > 1024 * 1024
    assert base["calls_lt_1m_share"][0] == 0.0
    # Both jobs' calls in one group: the small share is the small job's share of the calls.
    both = pl.concat([rep.collectives, baselines["dp"][0].collectives])
    mixed = message_size_summary(both)
    n_small, n_base = rep.collectives.height, baselines["dp"][0].collectives.height
    assert mixed["calls"][0] == n_small + n_base
    assert mixed["calls_lt_64k_share"][0] == pytest.approx(n_small / (n_small + n_base))
    t_small = rep.collectives["duration_ns"].sum()
    assert mixed["time_lt_1m_share"][0] == pytest.approx(
        t_small / (t_small + baselines["dp"][0].collectives["duration_ns"].sum())
    )
    pp = message_size_summary(baselines["pp-dp"][0].collectives)
    assert dict(zip(pp["collective"], pp["p2p"], strict=True)) == {
        "all_reduce": False,
        "recv": True,
        "send": True,
    }


# ---------------------------------------------------------------- process-group roles


@pytest.mark.parametrize("layout", LAYOUTS)
def test_roles_match_synthetic_truth(baselines: dict[str, Job], layout: str) -> None:
    rep, truth = baselines[layout]
    pgs = _roles(rep)
    assert pgs.schema == pl.Schema(PROCESS_GROUP_SCHEMA)
    # The world group of tp-dp / pp-dp carries no collective: only groups that communicate.
    active = {g["pg_name"]: g for g in truth["process_groups"] if g["role"] != "world"}
    assert set(pgs["process_group"]) == set(active)
    for row in pgs.iter_rows(named=True):
        g = active[row["process_group"]]
        assert row["role"] == expected_role(truth, g["role"]), row["evidence"]
        assert row["ranks"] == g["ranks"]
        assert row["size"] == g["pg_size"]
        assert row["pg_desc"] == g["pg_desc"]
        # calls and bytes per step: truth's per-rank expectation, averaged over the group.
        per_rank = [
            [e for e in truth["expected_per_rank"][str(r)] if e["pg_name"] == g["pg_name"]]
            for r in g["ranks"]
        ]
        calls = sum(e["calls_per_step"] for es in per_rank for e in es) / len(g["ranks"])
        size = sum(e["bytes_per_step"] for es in per_rank for e in es) / len(g["ranks"])
        assert row["calls_per_step"] == pytest.approx(calls)
        assert row["bytes_per_step"] == pytest.approx(size)
        assert "per step" in row["evidence"]


@pytest.mark.parametrize("source", [*LAYOUTS, "gloo fsdp-2"])
def test_roles_on_the_streaming_engine_equal_the_in_memory_ones(
    baselines: dict[str, Job], samples: dict[str, Report], source: str, monkeypatch: Any
) -> None:
    # Big jobs run the features' passes on the streaming engine (lazy.STREAMING_ROWS): the
    # same groups, roles, evidence and per-step means, to the last digit.
    rep = samples["fsdp-2"] if source == "gloo fsdp-2" else baselines[source][0]
    expected = _roles(rep)
    assert expected.height > 0
    monkeypatch.setattr(lazy, "STREAMING_ROWS", 0)
    assert _roles(rep).equals(expected)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_roles_read_each_rank_on_its_own_clock(baselines: dict[str, Job], layout: str) -> None:
    """The report's roles come from the tables before clock alignment (they compare no times
    across ranks): the calls and steps of each rank moved by its own offset (tens of ms),
    give the same table to the last digit."""
    rep, _ = baselines[layout]
    expected = _roles(rep)
    ranks = rep.ranks["rank"].to_list()
    moved = {r: (-1) ** r * 1_000_003 * r * r for r in ranks}
    later = pl.col("rank").replace_strict(moved, return_dtype=pl.Int64)
    calls = rep.collectives.with_columns(
        pl.col(c) + later for c in TIME_COLUMNS if c in rep.collectives.columns
    )
    steps = rep.steps.with_columns(
        pl.col(c) + later for c in TIME_COLUMNS if c in rep.steps.columns
    )
    assert not calls["start_ns"].equals(rep.collectives["start_ns"])
    assert process_groups(calls, steps, rep.ranks).equals(expected)


def test_role_evidence_gives_the_numbers(baselines: dict[str, Job]) -> None:
    pgs = _roles(baselines["tp-dp"][0])
    tp = pgs.filter(pl.col("process_group") == "1").row(0, named=True)
    dp = pgs.filter(pl.col("process_group") == "5").row(0, named=True)
    assert tp["evidence"].startswith("32 all_reduce per step, mean 8.4 MB")
    assert "2 contiguous ranks" in tp["evidence"]
    assert "4 ranks strided by 2" in dp["evidence"]
    assert tp["collectives"] == ["all_reduce"]


def test_roles_on_real_gloo_captures(samples: dict[str, Report]) -> None:
    expected = {"ddp-4": "data_parallel", "pp-4": "pipeline", "tp-2": "tensor_parallel"}
    for name, rep in samples.items():
        pgs = _roles(rep)
        # gloo's annotations name no group; each trace's distributedInfo.pg_config has one,
        # the default group of every rank: its calls are on it.
        assert pgs["process_group"].to_list() == ["0"], name
        assert pgs["pg_desc"].to_list() == ["default_pg"], name
        assert rep.collectives["process_group"].null_count() == 0, name
        row = pgs.row(0, named=True)
        assert row["ranks"] == sorted(rep.ranks["rank"].to_list())
        assert "no process-group names" not in row["evidence"]
        assert row["calls_per_step"] > 0
        if name == "fsdp-2":
            # gloo runs FSDP's reduce-scatter as all_reduce: fsdp, and the evidence says so.
            assert row["role"] in ("fsdp", "data_parallel")
            assert set(row["collectives"]) == {"all_gather", "all_reduce"}
            assert "gloo runs reduce-scatter as all_reduce" in row["evidence"]
        else:
            assert row["role"] == expected[name], row["evidence"]


def test_an_all_to_all_of_unknown_purpose_is_not_called_expert() -> None:
    """The real uneven all-to-all capture (sample_traces/ep-4) has no annotation naming
    experts or embeddings: its group is an all-to-all of unknown purpose, and the advice
    stays generic (no token packing, no MoE flags)."""
    rep = kineto_comm.analyze(SAMPLES / "ep-4", jobs=1)
    row = _roles(rep).row(0, named=True)
    assert row["role"] == "unknown" and "all_to_all of unknown purpose" in row["evidence"]
    for finding in rep.findings:
        text = " ".join(finding.advice)
        assert "tokens" not in text and "DeepEP" not in text, (finding.code, text)


def test_calls_stay_unnamed_where_the_config_lists_several_groups() -> None:
    """The real 300-rank gloo trace lists eleven groups of 300 ranks in its pg_config and its
    calls give no size: which one a call is on cannot be told, so none is named."""
    rep = kineto_comm.analyze(shared(CPU_ONLY), jobs=1)
    assert rep.collectives.height > 0
    assert rep.collectives["process_group"].null_count() == rep.collectives.height
    assert _roles(rep)["process_group"].to_list() == ["?"]
    # Every group it could be on spans the 300 ranks: the size, and so the bus bandwidth
    # (nccl-tests: all_reduce moves 2(n-1)/n of its bytes per rank), is known all the same.
    assert rep.collectives["group_size"].to_list() == [300] * rep.collectives.height
    inst = rep.collective_instances
    assert inst.height and (inst["busbw_gbps"] > 0).all()
    assert inst["busbw_gbps"].to_list() == pytest.approx(
        (inst["algbw_gbps"] * 2 * 299 / 300).to_list(), rel=1e-12
    )


def test_a_step_without_compute_places_no_call() -> None:
    """The real 300-rank gloo trace holds its collectives and no CPU work: its step has no
    compute to tell forward from backward by, so the calls' place in the step is no
    evidence (it read the first call, 18 ms into a step that communication fills, as a
    tensor-parallel all-reduce inside the first layer). The same rank's fuller capture in
    HTA's history, with the CPU work, reads as data-parallel from its compute."""
    for path in (shared(CPU_ONLY), shared("hta/_history/cpu_only")):
        rep = kineto_comm.analyze(path, jobs=1)
        (group,) = _roles(rep).iter_rows(named=True)
        assert group["role"] == "data_parallel", group["evidence"]
        compute = rep.kernels.filter(pl.col("kind") == "compute", pl.col("step") >= 0)
        placed = rep.collectives["compute_before"].is_not_null().any()
        assert placed == (compute.height > 0)
        assert ("no step with compute" in group["evidence"]) == (not placed)


def test_one_rank_of_a_group_of_unknown_size_gives_no_bus_bandwidth(tmp_path: Path) -> None:
    """The same real trace without its distributedInfo: the group's size is nowhere, and the
    one rank traced is no measure of it, so the bus bandwidth is unknown (null), never the
    zero a group of one would move."""
    raw = json.loads(gzip.decompress(shared(CPU_ONLY).read_bytes()))
    del raw["distributedInfo"]
    path = tmp_path / "rank-34.json"
    path.write_text(json.dumps(raw))
    report = kineto_comm.analyze(path, jobs=1)
    inst = report.collective_instances
    assert inst.height and inst["group_size"].null_count() == inst.height
    assert inst["busbw_gbps"].null_count() == inst.height
    assert inst["algbw_gbps"].null_count() == 0
    # NET101 reads the same: against a 100 GB/s link it found "0.0 GB/s" here.
    found = run_rules(report, options={"NET101": {"link_busbw_gbps": 100.0}})
    assert "NET101" not in {f.code for f in found}


def test_a_group_with_no_call_sizes_has_unknown_volumes_not_zero() -> None:
    """The real V100 trace's 2020 all-reduces carry no size (no record_param_comms args, no
    Input Dims): every table that sums or shares bytes says unknown (null, "-"), never the
    0 B and 0% a sum over nothing gives; the time is still counted."""
    rep = kineto_comm.analyze(shared("hta/df_index_resolver"), jobs=1)
    assert rep.collectives.height == 2020 and rep.collectives["bytes"].null_count() == 2020
    totals = rep.collective_totals()
    assert totals["bytes"].to_list() == [None] and totals["time_ns"].item() > 0
    per_rank = rep.collective_summary()
    assert per_rank.select("bytes", "in_bytes", "out_bytes").row(0) == (None, None, None)
    assert per_rank["count"].item() == 2020
    summary = rep.message_size_summary
    shares = [c for c in summary.columns if c.endswith("_share")]
    assert summary.select("bytes", *shares).null_count().row(0) == (1,) * (1 + len(shares))
    assert summary["time_ns"].item() == rep.collectives["duration_ns"].sum()
    groups = _roles(rep)
    assert groups["bytes_per_step"].to_list() == [None]
    assert "sizes unknown" in groups["evidence"].item() and " 0 B" not in groups["evidence"].item()


def test_roles_on_hta_control_trace() -> None:
    rep = kineto_comm.analyze(shared("hta/trace_diff/control/control.json.gz"), jobs=1)
    pgs = _roles(rep)
    # No group named per call: the pool of all-to-alls and all-reduces is split by kind
    # (issue 76): the dense gradient all-reduces, one row per size, apart from the rest.
    assert set(pgs["process_group"]) == {"?"}
    rest = pgs.filter(pl.col("pooled_collective").is_null())
    assert rest.height == 1
    row = rest.row(0, named=True)
    # A DLRM-style job: its all-to-alls sit in torchrec's annotations (`## all2all_data:
    # lengths ##`, `## alltoall_fwd_single ##`): an embedding exchange, not experts.
    assert row["role"] == "embedding", row["evidence"]
    assert "embeddings or sparse features" in row["evidence"]
    assert row["collectives"] == ["all_to_all"]
    reduces = pgs.filter(pl.col("pooled_collective") == "all_reduce")
    sizes = rep.collectives.filter(pl.col("collective") == "all_reduce")["bytes"].unique()
    assert sorted(reduces["pooled_bytes"]) == sorted(sizes)
    # Once a step, after most of the compute: gradients, not embeddings.
    assert set(reduces["role"]) == {"data_parallel"}
    n_steps = rep.steps.filter(pl.col("step") >= 0).height
    in_steps = rep.collectives.filter(pl.col("step") >= 0)
    assert pgs["calls_per_step"].sum() == pytest.approx(in_steps.height / n_steps)
    assert row["ranks"] == rep.ranks["rank"].to_list()


def test_tiny_broadcast_group_is_unknown_and_unnamed_group_still_classified(
    baselines: dict[str, Job],
) -> None:
    rep = baselines["dp"][0]
    coll = rep.collectives
    # A handful of 8-byte broadcasts per step in another group, on the same ranks and times.
    extra = (
        coll.filter(pl.col("call_index") < 2)
        .with_columns(
            process_group=pl.lit("9"),
            collective=pl.lit("broadcast"),
            bytes=pl.lit(8, dtype=pl.Int64),
            pg_desc=pl.lit("custom"),
        )
        .with_columns(pl.col("call_index").cast(pl.Int64))
    )
    pgs = process_groups(pl.concat([coll, extra]), rep.steps, rep.ranks)
    roles = dict(zip(pgs["process_group"], pgs["role"], strict=True))
    assert roles == {"0": "data_parallel", "9": "unknown"}
    unnamed = process_groups(
        coll.with_columns(process_group=pl.lit(None, dtype=pl.String)), rep.steps, rep.ranks
    )
    assert unnamed.select("process_group", "role").rows() == [("?", "data_parallel")]


def test_roles_without_steps_count_the_whole_trace(baselines: dict[str, Job]) -> None:
    rep, truth = baselines["pp-dp"]
    # A trace without ProfilerStep markers: no step windows, no call in a step.
    unplaced = rep.collectives.with_columns(
        step=pl.lit(-1, dtype=pl.Int64), compute_before=pl.lit(None, dtype=pl.Float64)
    )
    pgs = process_groups(unplaced, rep.steps.clear(), rep.ranks)
    pipe = pgs.filter(pl.col("role") == "pipeline")
    assert set(pipe["process_group"]) == {"5", "6"}
    assert "no step with compute to place the calls by" in pipe["evidence"][0]
    # Every call counts once per rank: all of the group's calls over its ranks.
    n = rep.collectives.filter(pl.col("process_group") == "5").height
    assert pipe["calls_per_step"][0] == pytest.approx(n / 4)


def test_empty_inputs_give_empty_tables_with_schema(baselines: dict[str, Job]) -> None:
    rep = baselines["dp"][0]
    empty = rep.collectives.clear()
    assert message_sizes(empty).schema == pl.Schema(MESSAGE_SIZES_SCHEMA)
    assert message_size_summary(empty).schema == pl.Schema(SUMMARY_SCHEMA)
    assert storms(empty).schema == pl.Schema(STORM_SCHEMA)
    assert process_groups(empty, rep.steps, rep.ranks).schema == pl.Schema(PROCESS_GROUP_SCHEMA)
    assert message_sizes(empty).height == 0


# ---------------------------------------------------------------- storms


def test_storms_found_where_truth_puts_them_and_cost_the_impact(small: Job) -> None:
    rep, truth = small
    problem = truth["problems"][0]
    assert problem["kind"] == "small_messages"
    found = storms(rep.collectives)
    assert found.schema == pl.Schema(STORM_SCHEMA)
    per_step = found.group_by("rank", "step").agg(
        pl.col("time_ns").sum(), pl.col("calls").sum(), pl.col("bytes").sum()
    )
    expected_keys = {(r, s) for r in problem["ranks"] for s in problem["steps"]}
    assert set(per_step.select("rank", "step").rows()) == expected_keys
    # The step pays the storms' wall time; truth's impact is the step time saved without them.
    impact = problem["impact_ns_per_step"]
    for row in per_step.iter_rows(named=True):
        assert abs(row["time_ns"] - impact) <= 0.2 * impact, row
    # Nearly every small call of the step belongs to a storm.
    calls = rep.collectives.filter(pl.col("step") >= 0).group_by("rank", "step").len()
    joined = per_step.join(calls, on=["rank", "step"])
    assert (joined["calls"] >= 0.9 * joined["len"]).all()
    assert (found["bytes"] / found["calls"] <= problem["max_message_bytes"]).all()
    assert (found["calls"] >= 32).all()
    assert (found["collective"] == "all_reduce").all()
    # Only small messages in that group: no reference bandwidth to compare with.
    assert found["reference_busbw_gbps"].null_count() == found.height
    assert found["latency_bound_share"].null_count() == found.height
    # A run is at least as long as its calls' kernels on the rank's stream.
    assert (found["busbw_gbps"] < truth["hardware"]["busbw_gbps"] / 10).all()
    assert storms(rep.collectives, min_calls=100_000).height == 0


def test_storm_reference_busbw_from_large_messages_of_the_same_group(
    small: Job, baselines: dict[str, Job]
) -> None:
    rep, truth = small
    base = baselines["dp"][0]
    # The same group "0" all_reduce with large buckets, in other (later-numbered) steps.
    large = base.collectives.with_columns(pl.col("step") + 100)
    found = storms(pl.concat([rep.collectives, large]))
    assert found.height == storms(rep.collectives).height
    hw = truth["hardware"]["busbw_gbps"]
    ref = found["reference_busbw_gbps"]
    assert ref.null_count() == 0 and ref.n_unique() == 1
    assert 0.8 * hw < ref[0] <= hw * 1.001
    # 48 KiB all-reduces cost ~12 us of latency for < 1 us of transfer at ~100 GB/s.
    assert (found["latency_bound_share"] > 0.9).all()
    assert (found["latency_bound_share"] <= 1.0).all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_storm_on_baseline(baselines: dict[str, Job], layout: str) -> None:
    assert storms(baselines[layout][0].collectives).height == 0


def test_storms_on_real_traces_run_and_respect_the_size_limit(samples: dict[str, Report]) -> None:
    for name, rep in samples.items():
        found = storms(rep.collectives, min_calls=2)
        assert found.schema == pl.Schema(STORM_SCHEMA), name
        assert (found["bytes"] < 64 * 1024 * found["calls"]).all()


@pytest.mark.parametrize("scenario", ["ddp-4", "pp-4"])
def test_first_call_positions_are_medians_over_a_sample_of_steps_on_big_jobs(scenario, monkeypatch):
    """Where a group's first call falls in a step is the median over every (rank, step);
    above lazy.SAMPLE_ROWS steps of all ranks, over every k-th step only (the same steps on
    every rank), so that the parent holds a bounded number of positions."""
    from kineto_comm.analysis import roles

    report = kineto_comm.analyze(SAMPLES / scenario, jobs=1)
    calls, steps = report.rank_collectives, report.rank_steps
    pos = pl.col("_pos")
    per_step = (
        roles._calls(calls, steps)
        .filter(pos.is_not_null())
        .group_by("process_group", "rank", "step")
        .agg(_f=pos.min(), _fa=pos.filter(pl.col("collective") == "all_reduce").min())
        .collect()
    )

    def medians(rows: pl.DataFrame) -> pl.DataFrame:
        return rows.group_by("process_group").agg(
            _first=pl.col("_f").median(), _ar_first=pl.col("_fa").median()
        )

    full = roles._first_positions(calls, steps)
    assert full.height > 0
    assert full.sort("process_group").equals(medians(per_step).sort("process_group"))
    monkeypatch.setattr(lazy, "SAMPLE_ROWS", steps.height // 3)
    every = -(-steps.height // lazy.SAMPLE_ROWS)
    picked = per_step.filter(pl.col("step") % every == 0)
    assert 0 < picked.height < per_step.height
    sampled = roles._first_positions(calls, steps).sort("process_group")
    assert sampled.equals(medians(picked).sort("process_group"))
    assert not sampled.equals(full.sort("process_group"))
