"""Built-in rules on generated traces: a positive and a negative case per rule, and the
acceptance scenarios (test_scenario_*): on each synthetic pathology the matching rule is the
top-ranked finding with impact within 20% of truth.json, and the baseline has no warning."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from kineto_comm import Report, analyze
from kineto_comm.findings import Finding, Severity
from kineto_comm.rules_api import Tables, replay_timeline
from kineto_comm.rules_engine import builtin_rules, run_rules
from kineto_comm.synth import Hardware, ModelConfig, generate
from tests.conftest import REPO, cpu, host_wait, kernel, launch, shared, trace_params, write_trace

TINY = ModelConfig(layers=4, hidden=512, seq=512, micro_batch=2, vocab=2048, bucket_mb=2.0)
HW = Hardware(tflops=10.0, busbw_gbps=100.0)  # links as the tests were calibrated on
_CACHE: dict[tuple[str, str, int, bool], tuple[Report, dict[str, Any]]] = {}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory):
    """job(scenario, layout, ranks, full) -> (Report, truth), generated once per module: the
    tests' tiny model on a slow GPU, or with `full` the generator's default model (8 layers
    of 1024, 4k tokens per micro-batch) on its default GPU, where communication overlaps
    much more compute."""

    def make(
        scenario: str, layout: str = "dp", ranks: int = 4, full: bool = False
    ) -> tuple[Report, dict]:
        key = (scenario, layout, ranks, full)
        if key not in _CACHE:
            out = tmp_path_factory.mktemp(f"{scenario}-{layout}-{ranks}")
            kw: dict[str, Any] = {} if full else {"model": TINY, "hardware": HW}
            truth = generate(scenario, out, ranks=ranks, layout=layout, steps=3, **kw)
            _CACHE[key] = (analyze(out, jobs=1), truth)
        return _CACHE[key]

    return make


def codes(findings: tuple[Finding, ...], at_least: Severity = Severity.info) -> list[str]:
    """Codes of the findings at or above a severity, in rank order."""
    return [f.code for f in findings if f.severity.level >= at_least.level]


def only(report: Report, code: str, **options: Any) -> list[Finding]:
    """Findings of one rule."""
    return list(run_rules(report, select=[code], options={code: options} if options else None))


# ---------------------------------------------------------------- acceptance scenarios


SCENARIOS = [
    ("exposed-allreduce", "dp", 4, "COMM101", {}),
    ("straggler", "dp", 8, "SYNC101", {}),
    ("bubble", "pp-dp", 4, "PIPE101", {}),
    ("small-messages", "dp", 4, "COMM201", {}),
    ("slow-link", "dp", 4, "NET101", {"NET101": {"link_busbw_gbps": 100.0}}),
    ("slow-link", "dp", 8, "NET101", {"NET101": {"link_busbw_gbps": 100.0}}),
]


@pytest.mark.parametrize(("scenario", "layout", "ranks", "code", "options"), SCENARIOS)
def test_scenario_top_finding_and_impact(
    job, scenario: str, layout: str, ranks: int, code: str, options: dict
) -> None:
    report, truth = job(scenario, layout, ranks)
    findings = run_rules(report, options=options)
    assert findings, f"{scenario}: no finding"
    top = findings[0]
    assert top.code == code, [(f.code, f.impact_ns_per_step) for f in findings]
    expected = truth["problems"][0]["impact_ns_per_step"]
    assert abs(top.impact_ns_per_step - expected) <= 0.2 * expected, (top, expected)
    assert set(top.ranks) >= set(truth["problems"][0]["ranks"]) or code == "SYNC101"
    assert top.step_share is not None and 0 < top.step_share < 1
    assert top.advice


def test_scenario_straggler_names_the_rank(job) -> None:
    report, truth = job("straggler", "dp", 8)
    top = run_rules(report)[0]
    assert top.ranks == tuple(truth["problems"][0]["ranks"])


def test_scenario_slow_link_against_peer_groups(job) -> None:
    """Without a link speed, the slow DP group is found against the other DP group."""
    report, truth = job("slow-link", "tp-dp", 8)
    found = only(report, "NET101")
    assert [f.process_group for f in found] == [truth["problems"][0]["pg_name"]]
    assert found[0].severity.level >= Severity.warning.level


@pytest.mark.parametrize(("layout", "ranks"), [("dp", 4), ("tp-dp", 8), ("fsdp", 4), ("pp-dp", 4)])
def test_scenario_baseline_has_no_warning(job, layout: str, ranks: int) -> None:
    report, _ = job("baseline", layout, ranks)
    findings = run_rules(report)
    assert codes(findings, Severity.warning) == [], findings


def test_scenario_clock_skew_has_no_warning(job) -> None:
    report, _ = job("clock-skew", "dp", 4)
    assert codes(run_rules(report), Severity.warning) == []


# ---------------------------------------------------------------- per rule


def test_exposed_communication_positive_and_negative(job) -> None:
    bad, _ = job("exposed-allreduce")
    good, _ = job("baseline")
    (f,) = only(bad, "COMM101")
    assert f.evidence["collective"] == "all_reduce" and f.evidence["role"] == "data_parallel"
    assert f.ranks == (0, 1, 2, 3)
    assert any("bucket_cap_mb" in a for a in f.advice)
    assert only(good, "COMM101") == []
    # warn/error thresholds are options: a 4% threshold makes the same cause a warning
    (w,) = only(bad, "COMM101", warn_share=0.04)
    assert w.severity is Severity.warning


def _mean_step(report: Report) -> float:
    from kineto_comm.rules_api import step_times

    return step_times(Tables(report)).filter(pl.col("complete"))["step_ns"].mean()


def test_one_gradient_all_reduce_after_the_backward_is_exposed(tmp_path: Path) -> None:
    """DDP with one bucket (bucket_cap_mb above the model's gradients): its one all-reduce
    a step starts after the whole backward, the step's last call. It is not hideable as it
    stands, yet splitting it into buckets hides all but the last: COMM101 reports it, and
    its replayed saving bounds, from above, what the default buckets bought back (the same
    job with 2 MB buckets, ground truth by generation), and is at most the call's own
    exposed time."""
    from dataclasses import replace

    times = {}
    for name, mb in (("split", TINY.bucket_mb), ("one", 1e5)):
        generate(
            "baseline",
            tmp_path / name,
            ranks=4,
            steps=3,
            model=replace(TINY, bucket_mb=mb),
            hardware=HW,
        )
        times[name] = analyze(tmp_path / name, jobs=1)
    one = times["one"]
    per_step = one.collectives.filter(pl.col("step") >= 0).group_by("rank", "step").len()
    assert (per_step["len"] == 1).all()
    (f,) = only(one, "COMM101")
    assert f.evidence["single_call_steps"] and not f.evidence["compute_bound_saving"]
    assert any("bucket_cap_mb" in a for a in f.advice)
    truth = _mean_step(one) - _mean_step(times["split"])
    assert truth > 0
    assert truth <= f.impact_ns_per_step <= f.evidence["exposed_ns_per_step"]


def test_a_cause_of_no_inferred_role_is_named_by_its_group_and_ranks() -> None:
    """sample_traces/ep-4 (gloo): its all-to-all group is known (pg_config's group 0), its
    role is not (no annotation names experts). COMM101 names the group and its ranks and
    says the role is unknown, not "unknown groups"."""
    report = analyze(REPO / "sample_traces" / "ep-4", jobs=1)
    (f,) = [f for f in report.findings if f.code == "COMM101"]
    assert f.evidence["role"] == "unknown"
    (pg,) = f.evidence["process_groups"]
    ranks = report.process_groups.filter(pl.col("process_group") == pg)["ranks"][0].to_list()
    assert ranks == list(range(min(ranks), max(ranks) + 1))  # written as one range
    assert f"all_to_all on group {pg} (ranks {min(ranks)}-{max(ranks)}, role unknown)" in f.title
    assert "unknown groups" not in f.title
    # The step table names its rows the same way.
    from kineto_comm.render.sections import step_blame

    section = step_blame(report)
    assert section is not None
    calls = [r[1] for r in section.rows if r[0] in ("transfer", "wait")]
    assert calls and all(c.startswith(f"all_to_all on {pg} (role unknown)") for c in calls)


@pytest.mark.parametrize("job", ["sample_traces/ddp-4", "tests/data/h100-nccl/tp-dp-8"])
def test_ties_for_the_late_rank_are_listed_in_the_skew_table_and_sync104(job: str) -> None:
    """One tie-break everywhere: every rank tied for most often last is in the skew table
    (sample_traces/ddp-4: ranks 0 and 1 were each last at 4 of its 12 all-reduces, and the
    table said 0 while SYNC104 named 1, the most late), and every rank tied for the most
    lateness in SYNC104."""
    from kineto_comm.analysis.stragglers import NOISE_NS
    from kineto_comm.render.sections import skew

    report = analyze(REPO / job, jobs=1)
    counted = report.collective_instances.filter(
        (pl.col("ranks_seen") > 1) & (pl.col("arrival_skew_ns") >= NOISE_NS)
    )
    section = skew(report)
    assert section is not None
    shown = {(r[0], r[1]): r[-1] for r in section.rows}
    for row in report.skew_summary().iter_rows(named=True):
        n = (
            counted.filter(
                (pl.col("process_group") == row["process_group"])
                & (pl.col("collective") == row["collective"])
            )
            .group_by("last_rank")
            .len()
        )
        tied = sorted(n.filter(pl.col("len") == n["len"].max())["last_rank"].to_list())
        assert row["most_often_last_ranks"] == tied
        assert row["most_often_last"] == (tied[0] if tied else None)
        assert shown[(row["process_group"], row["collective"])] == (
            ", ".join(map(str, tied)) or "-"
        )
    late = report.stragglers
    for f in (f for f in report.findings if f.code == "SYNC104"):
        top = late.filter(pl.col("late_share") == late["late_share"].max())["rank"].sort()
        assert f.evidence["most_late_ranks"] == top.to_list()
        assert f.evidence["most_late_rank"] == top[0]


def test_a_pipelines_gradient_all_reduce_after_the_flush_is_reported() -> None:
    """The real pp-dp NCCL capture (tests/data/h200-nccl): each stage all-reduces its
    gradients once a step after the pipeline flush, exposed (the step-time table's transfer
    rows), with too little compute in the step to hide it behind: COMM101 names it as such,
    with its share of the critical ranks' steps, and a saving within the step."""
    from kineto_comm.rules_api import step_times

    report = analyze(REPO / "tests" / "data" / "h200-nccl" / "pp-dp-4", jobs=1)
    (f,) = [f for f in report.findings if f.code == "COMM101"]
    assert f.evidence["collective"] == "all_reduce"
    assert f.evidence["role"] == "data_parallel"
    assert f.evidence["single_call_steps"] and f.evidence["compute_bound_saving"]
    tables = Tables(report)
    times = step_times(tables).filter(pl.col("complete"))
    # The critical ranks' rows: the report's step-time table.
    blame = report.step_blame.join(times.select("step"), on="step")
    exposed = blame.filter(
        (pl.col("category") == "transfer") & (pl.col("collective") == "all_reduce")
    )["ns"].sum()
    share = exposed / times["step_ns"].sum()
    assert share > 0.1
    # The exposed share is evidence in the text; the title and severity are what hiding buys.
    assert f"({share:.0%} of the step" in f.message and "too little compute" in f.title
    assert f.evidence["exposed_share"] == pytest.approx(share, abs=1e-4)
    assert 0 < f.impact_ns_per_step < f.evidence["step_ns"]
    assert f.severity is Severity.info and f.step_share < 0.1


def test_an_fsdp_groups_all_reduce_is_its_gradient_reduction() -> None:
    """The real gloo FSDP capture: gloo runs FSDP's reduce-scatter as an all_reduce, which
    the group's role says (fsdp, "the all_reduce is taken as FSDP's gradient reduction").
    Its exposure is COMM102's, with the advice for the reduce-scatter, not COMM101's generic
    "launch it earlier" beside COMM102's gathers."""
    from .conftest import SAMPLES

    report = analyze(SAMPLES / "fsdp-2", jobs=1)
    (group,) = report.process_groups.iter_rows(named=True)
    assert group["role"] == "fsdp" and "gradient reduction" in group["evidence"]
    findings = run_rules(report)
    assert [f for f in findings if f.code == "COMM101"] == []
    (reduce,) = [f for f in findings if f.code == "COMM102" and "all_reduce" in f.title]
    assert reduce.evidence["role"] == "fsdp" and reduce.evidence["collective"] == "all_reduce"
    assert any("reduce-scattered while" in a for a in reduce.advice)


def test_sharded_collective_exposed_positive_and_negative(job) -> None:
    # The tiny model's fix saves 1.8% of its step, under the default 2% floor of a finding.
    bad, _ = job("exposed-allreduce", "fsdp")
    found = only(bad, "COMM102", info_share=0.01)
    assert found[0].evidence["collective"] == "reduce_scatter"
    assert any("overlap_comm" in a for a in found[0].advice)
    # The role is PyTorch FSDP's: its own API is the advice shown first (text and markdown
    # print only the first line), for the gathers and the scatters alike.
    assert found and all(f.advice[0].startswith("FSDP:") for f in found)
    good, _ = job("exposed-allreduce", "dp")
    assert only(good, "COMM102") == []


def test_small_message_storm_positive_and_negative(job) -> None:
    bad, _ = job("small-messages")
    (f,) = only(bad, "COMM201")
    assert f.evidence["median_bytes"] <= 48 * 1024 and f.severity is Severity.error
    assert only(job("baseline")[0], "COMM201") == []
    # the exposure rule leaves the storm to COMM201 (one finding per cause)
    assert "COMM101" not in codes(run_rules(bad), Severity.warning)


def test_straggler_positive_and_negative(job) -> None:
    bad, truth = job("straggler", "dp", 8)
    (f,) = only(bad, "SYNC101")
    assert f.ranks == tuple(truth["problems"][0]["ranks"])
    assert f.severity is Severity.error
    assert only(job("baseline")[0], "SYNC101") == []


def test_low_bus_bandwidth_positive_and_negative(job) -> None:
    bad, _ = job("slow-link")
    assert only(bad, "NET101") == []  # one group, no link speed: nothing to compare with
    (f,) = only(bad, "NET101", link_busbw_gbps=100.0)
    assert f.evidence["median_busbw_gbps"] < 25
    assert only(job("baseline")[0], "NET101", link_busbw_gbps=100.0) == []


def test_tensor_parallel_across_hosts_positive_and_negative(job) -> None:
    report, _ = job("baseline", "tp-dp", 8)
    assert only(report, "NET102") == []  # TP pairs inside one 8-GPU host
    (f,) = only(report, "NET102", ranks_per_host=1)
    assert f.ranks == tuple(range(8)) and len(f.evidence["process_groups"]) == 4
    assert f.impact_ns_per_step > 0


def test_tensor_parallel_hosts_are_the_reports_hosts(job, tmp_path) -> None:
    """NET102 counts hosts as the clock alignment does (the offsets table): one rank per
    host by --ranks-per-host puts each TP pair on two hosts; pairs of ranks per host keep
    them together; the rule's own option still overrides."""
    out = tmp_path / "tp-dp"
    generate("baseline", out, ranks=8, layout="tp-dp", steps=3, model=TINY, hardware=HW)
    apart = analyze(out, jobs=1, ranks_per_host=1)
    assert set(apart.offsets["host_source"]) == {"ranks_per_host"}
    (f,) = only(apart, "NET102")
    assert f.evidence["hosts_from"] == "hosts from ranks per host"
    assert f.ranks == tuple(range(8))
    together = analyze(out, jobs=1, ranks_per_host=2)
    assert only(together, "NET102") == []
    (g,) = only(together, "NET102", ranks_per_host=1)
    assert g.evidence["hosts_from"] == "1 ranks per host"


def test_pipeline_bubble_positive_and_negative(job) -> None:
    bad, truth = job("bubble", "pp-dp")
    (f,) = only(bad, "PIPE101")
    assert f.evidence["micro_batches"] == truth["problems"][0]["micro_batches"]
    assert f.evidence["stages"] == truth["problems"][0]["stages"]
    assert abs(f.evidence["theory_bubble_fraction"] - 1 / 3) < 1e-3
    assert f.advice[0].startswith("Raise micro-batches")  # the bubble is the schedule's
    good = only(job("baseline", "pp-dp")[0], "PIPE101")
    assert all(g.severity is Severity.info for g in good)
    assert only(job("baseline")[0], "PIPE101") == []  # no pipeline at all


def _host_trace(tmp: Path, late_launch: bool, sync_after: bool | str) -> Report:
    """One rank: 10 steps of a 1 ms GEMM then a 200 us all-reduce then a 500 us GEMM.

    late_launch: the all-reduce is launched 300 us after the first GEMM ended (CPU late).
    sync_after: the second GEMM is launched 100 us after the all-reduce ended; "waited":
    after a cudaStreamSynchronize that returned when the all-reduce ended (CPU blocked),
    True: without one (the CPU was busy elsewhere).
    """
    events = []
    corr = 1
    for s in range(10):
        t0 = 10_000.0 + s * 3_000.0
        events.append(cpu(f"ProfilerStep#{s}", t0, 2_900.0))
        events += [launch(t0 + 1, corr), kernel("sm90_gemm", t0 + 10, 1000.0, corr=corr)]
        corr += 1
        ar_launch = t0 + 1010 + (300 if late_launch else -900)
        ar_start = max(t0 + 1010, ar_launch + 5)
        events += [
            launch(ar_launch, corr),
            kernel(
                "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", ar_start, 200.0, stream=20, corr=corr
            ),
        ]
        corr += 1
        ar_end = ar_start + 200
        g_launch = ar_end + 100 if sync_after else ar_start - 50
        g_start = max(ar_end + 1, g_launch + 5)
        if sync_after == "waited":  # the CPU waits for the all-reduce, then launches
            events.append(host_wait(ar_start - 20, 20 + 200 + 3, corr + 1000))
        events += [launch(g_launch, corr), kernel("sm90_gemm", g_start, 500.0, corr=corr)]
        corr += 1
    write_trace(tmp / "rank-0.json", events, rank=0, world_size=1)
    return analyze(tmp, jobs=1)


def test_host_bound_communication_positive_and_negative(tmp_path: Path) -> None:
    (tmp_path / "late").mkdir()
    (tmp_path / "early").mkdir()
    late = _host_trace(tmp_path / "late", late_launch=True, sync_after=False)
    (f,) = only(late, "SYNC102")
    assert 250_000 <= f.impact_ns_per_step <= 320_000, f
    assert f.severity is Severity.warning  # ~300 us of a 3 ms step: 10%, error from 15%
    early = _host_trace(tmp_path / "early", late_launch=False, sync_after=False)
    assert only(early, "SYNC102") == []


def test_blocking_synchronisation_positive_and_negative(tmp_path: Path) -> None:
    """SYNC103 where the trace shows the CPU waiting for the collective (a host wait that
    returned when it ended) before its late launch; not where the CPU launched late without
    waiting (busy elsewhere: SYNC106's), nor where it launched ahead."""
    for name in ("sync", "busy", "async"):
        (tmp_path / name).mkdir()
    sync = _host_trace(tmp_path / "sync", late_launch=False, sync_after="waited")
    (f,) = only(sync, "SYNC103")
    assert 90_000 <= f.impact_ns_per_step <= 120_000, f
    assert only(sync, "SYNC102") == []  # the gap is after the collective, not before
    busy = _host_trace(tmp_path / "busy", late_launch=False, sync_after=True)
    assert only(busy, "SYNC103") == []
    free = _host_trace(tmp_path / "async", late_launch=False, sync_after=False)
    assert only(free, "SYNC103") == []


def test_every_rule_returns_nothing_on_empty_tables(job) -> None:
    """No crash and no finding on empty tables, or on per-rank tables without cross-rank ones."""
    report, _ = job("exposed-allreduce")
    per_rank_only = {n: report.table(n) for n in ("ranks", "kernels", "collectives", "steps")}
    for r in builtin_rules():
        assert r(Tables({}), None) == [], r.code
        result = r(Tables(per_rank_only), None)
        assert isinstance(result, list), r.code


def test_findings_are_json_ready(job) -> None:
    report, _ = job("small-messages")
    findings = run_rules(report)
    doc = json.loads(json.dumps([f.to_dict() for f in findings]))
    assert doc[0]["code"] == "COMM201" and doc[0]["rule"] == "small-message-storm"
    assert isinstance(doc[0]["impact_ns_per_step"], int)


def test_unnamed_groups_keep_their_role_on_a_real_capture() -> None:
    """gloo traces name no process group: the rules must still see the group's role."""
    from kineto_comm import analyze

    from .conftest import SAMPLES

    findings = run_rules(analyze(SAMPLES / "ddp-4", jobs=1))
    exposed = [f for f in findings if f.code == "COMM101"]
    assert exposed and "data-parallel" in exposed[0].title
    assert any("bucket_cap_mb" in a for a in exposed[0].advice)


def _turns_trace(tmp: Path, late: list[int], delay_us: float = 600.0) -> Report:
    """Four ranks, one step per entry of `late`: a 1 ms GEMM, then an all-reduce that ends
    200 us after the last rank reaches it; in step s rank late[s] computes `delay_us`
    longer, so the three others wait that long in the all-reduce with nothing to hide it."""
    for rank in range(4):
        events, corr = [], 1
        for s, slow in enumerate(late):
            t0 = 10_000.0 + s * 3_000.0
            gemm = 1_000.0 + (delay_us if rank == slow else 0.0)
            events.append(cpu(f"ProfilerStep#{s}", t0, 2_900.0))
            events += [launch(t0 + 1, corr), kernel("sm90_gemm", t0 + 10, gemm, corr=corr)]
            corr += 1
            start, end = t0 + 10 + gemm, t0 + 10 + 1_000.0 + delay_us + 200.0
            events += [
                launch(t0 + 5, corr),
                kernel(
                    "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                    start,
                    end - start,
                    stream=20,
                    corr=corr,
                    **{
                        "Collective name": "allreduce",
                        "In msg nelems": 1 << 20,
                        "Out msg nelems": 1 << 20,
                        "Group size": 4,
                        "dtype": "Float",
                        "Process Group Name": "0",
                        "Process Group Ranks": "[0, 1, 2, 3]",
                        "Seq": s,
                    },
                ),
            ]
            corr += 1
        write_trace(tmp / f"rank-{rank}.json", events, rank=rank, world_size=4)
    return analyze(tmp, jobs=1)


def test_arrival_imbalance_positive_and_negative(tmp_path: Path) -> None:
    """Ranks late in turn: each step three ranks wait 600 us, so a rank waits 450 us per step
    on average, and no one rank is to blame (SYNC104, not SYNC101). One rank late every step
    is SYNC101's straggler, and nothing is left for SYNC104."""
    (tmp_path / "turns").mkdir()
    (tmp_path / "one").mkdir()
    turns = _turns_trace(tmp_path / "turns", late=[0, 1, 2, 3, 0, 1, 2, 3])
    (f,) = only(turns, "SYNC104")
    assert abs(f.impact_ns_per_step - 450_000) <= 0.1 * 450_000, f
    assert f.severity.level >= Severity.warning.level
    assert f.evidence["ranks_ever_last"] == 4 and f.evidence["most_late_share"] < 0.5
    assert only(turns, "SYNC101") == []
    one = _turns_trace(tmp_path / "one", late=[2] * 8)
    (s,) = only(one, "SYNC101")
    assert s.ranks == (2,)
    assert only(one, "SYNC104") == []


def test_pipeline_bubble_above_theory_on_a_real_capture() -> None:
    """Real 4-stage NCCL pipeline (four processes on one H100, transfers over sockets):
    stages idle ~98% of the step against 43% in GPipe theory. The excess is reported, but
    hiding the transfers is replayed as their own time where the data arrives, behind the
    compute the stages have (~0.7 ms a step each): it once claimed the whole excess (23.3
    ms of a 37.9 ms step), waits for stages held up by a shared device included. The
    advice says what the rest is."""
    import polars as pl

    from .conftest import REPO

    report = analyze(REPO / "tests" / "data" / "h100-nccl" / "pp-4", jobs=1)
    (f,) = only(report, "PIPE101")
    ev = f.evidence
    assert ev["stages"] == 4 and ev["micro_batches"] == 4
    excess = ev["measured_bubble_fraction"] - ev["theory_bubble_fraction"]
    assert ev["bubble_above_theory"] == pytest.approx(excess, abs=1e-3)
    assert excess > ev["theory_bubble_fraction"]
    steps = report.steps.filter(pl.col("step").is_in(list(f.steps)))
    free = steps.group_by("rank").agg((pl.col("compute_ns") - pl.col("overlap_ns")).mean())
    assert 0 < ev["hidden_transfers_saving_ns"] <= free["compute_ns"].sum()
    assert f.impact_ns_per_step < 0.1 * ev["step_ns"]
    # It runs GPipe without batched p2p: Megatron's p2p overlap is not named (only the
    # interleaved schedule honours it).
    (p2p,) = [a for a in f.advice if "point-to-point transfers" in a]
    assert "above GPipe theory" in p2p and "waiting for neighbours held up" in p2p
    assert "overlap-p2p-communication" not in p2p
    assert any(a.startswith("Raise micro-batches") for a in f.advice)


def _pipe101(report: Report) -> Finding:
    """PIPE101's finding at any saving (its severity thresholds at 0)."""
    (f,) = only(report, "PIPE101", warn_share=0.0, error_share=0.0)
    return f


def test_pipeline_transfers_hidden_against_free_transfers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ground truth by generation: the same pp-dp job with its pipeline transfers made
    free (1 us) is faster by what the transfers cost. PIPE101's replay of hiding them
    counts each transfer once, where its data arrives (counted at both ends, it doubled
    the truth: 1.49 ms for 0.69), and stays within 25% of it."""
    import kineto_comm.synth.program as program

    real = program.comm_ns
    steps = {}
    for free in (False, True):
        if free:
            monkeypatch.setattr(
                program,
                "comm_ns",
                lambda hw, c, b, n, bw: 1000 if c in ("send", "recv") else real(hw, c, b, n, bw),
            )
        out = tmp_path / str(free)
        generate("baseline", out, ranks=8, layout="pp-dp", steps=3, model=TINY, hardware=HW)
        report = analyze(out, jobs=1)
        steps[free] = _mean_step(report)
        if not free:
            hidden = _pipe101(report).evidence["hidden_transfers_saving_ns"]
    truth = steps[False] - steps[True]
    assert truth > 0
    assert abs(hidden - truth) <= 0.25 * truth, (hidden, truth)


def test_hidden_gathers_save_no_more_than_free_gathers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ground truth by generation: the healthy FSDP job (default model, 4 ranks) with its
    all-gathers made free (1 us) is faster by 0.74 ms, the most hiding them can buy. The
    compute after them then waits for its launches (the CPU issued it during the
    gathers), which COMM102's replay keeps (launch_floor): without it COMM102 claimed
    0.89 ms. Within 5% of the free job. Links at 100 GB/s (at the hardware table's H100
    figures the gathers hide)."""
    import kineto_comm.synth.program as program

    links = Hardware(busbw_gbps=100.0)
    generate("baseline", tmp_path / "base", ranks=4, layout="fsdp", steps=3, hardware=links)
    base = analyze(tmp_path / "base", jobs=1)
    (f,) = [f for f in only(base, "COMM102") if f.evidence["collective"] == "all_gather"]
    real = program.comm_ns
    monkeypatch.setattr(
        program,
        "comm_ns",
        lambda hw, c, b, n, bw: 1000 if c == "_allgather_base" else real(hw, c, b, n, bw),
    )
    generate("baseline", tmp_path / "free", ranks=4, layout="fsdp", steps=3, hardware=links)
    truth = _mean_step(base) - _mean_step(analyze(tmp_path / "free", jobs=1))
    assert truth > 0
    assert abs(f.impact_ns_per_step - truth) <= 0.05 * truth, (f.impact_ns_per_step, truth)


def test_a_late_stage_is_not_the_pipeline_bubbles_saving(job) -> None:
    """A straggler in a pipeline (the default model, 4 stages of 2 ranks) makes its
    neighbours wait, which shows as bubble above 1F1B theory. PIPE101 once claimed that
    wait as hideable transfers (4.78 ms, 8% of the step, against the straggler's 2 ms,
    ranked above SYNC101; nothing in the healthy job); its saving is now the same with or
    without the late rank, and SYNC101 claims the delay."""
    base = _pipe101(job("baseline", "pp-dp", 8, True)[0])
    report, truth = job("straggler", "pp-dp", 8, True)
    late = _pipe101(report)
    delay = truth["problems"][0]["delay_ns"]
    assert abs(late.impact_ns_per_step - base.impact_ns_per_step) < 0.05 * delay
    (s,) = only(report, "SYNC101")
    assert s.ranks == tuple(truth["problems"][0]["ranks"])
    expected = truth["problems"][0]["impact_ns_per_step"]
    assert abs(s.impact_ns_per_step - expected) <= 0.1 * expected


def _real_jobs() -> list[Path]:
    from .conftest import REPO, SAMPLES, shared

    h100 = REPO / "tests" / "data" / "h100-nccl"
    found = sorted(p for p in SAMPLES.iterdir() if p.is_dir())
    found += sorted(p for p in h100.iterdir() if p.is_dir())
    return [*found, shared("hta/trace_filter")]


@pytest.mark.parametrize("path", trace_params(_real_jobs()))
def test_a_straggler_is_the_same_rank_everywhere(path: Path) -> None:
    """On every real multi-rank capture, SYNC101 names exactly the ranks the stragglers
    table marks `is_straggler`, each with that table's delay, and such a rank is the one
    most often last in the groups it was last in. SYNC104 leaves that delay out."""
    import polars as pl

    report = analyze(path, jobs=1)
    table = report.stragglers
    named = table.filter(pl.col("is_straggler")) if table.height else table
    findings = run_rules(report)
    sync101 = [f for f in findings if f.code == "SYNC101"]
    assert sorted(r for f in sync101 for r in f.ranks) == sorted(named["rank"].to_list())
    delay = dict(named.select("rank", "delay_ns").iter_rows()) if named.height else {}
    for f in sync101:
        assert f.impact_ns_per_step == delay[f.ranks[0]]
        assert f.evidence["delay_ns"] == delay[f.ranks[0]]
    if named.height:
        last = report.skew_summary()["most_often_last"].drop_nulls().unique().to_list()
        assert last == named["rank"].to_list()
        for f in (f for f in findings if f.code == "SYNC104"):
            assert f.evidence["straggler_lateness_ns_per_step"] == sum(delay.values())


def _gap(case: tuple[str, str, int, str], reason: str) -> Any:
    """A known gap of the replay: a strict xfail, so that it fails once it passes."""
    return pytest.param(*case, {}, marks=pytest.mark.xfail(strict=True, reason=reason))


# Issue 51: the replayed saving of the matching finding is within 10% of truth.json's impact,
# at several rank counts and layouts. Known gaps are strict xfails: they fail the test when
# they start passing, so that the list stays honest.
REPLAY_SCENARIOS = [
    ("exposed-allreduce", "dp", 4, "COMM101", {}),
    ("exposed-allreduce", "dp", 8, "COMM101", {}),
    ("straggler", "dp", 4, "SYNC101", {}),
    ("straggler", "dp", 8, "SYNC101", {}),
    ("straggler", "tp-dp", 8, "SYNC101", {}),
    ("straggler", "tp-dp", 4, "SYNC101", {}),
    ("straggler", "fsdp", 4, "SYNC101", {}),
    ("straggler", "fsdp", 8, "SYNC101", {}),
    ("straggler", "pp-dp", 4, "SYNC101", {}),
    ("straggler", "pp-dp", 8, "SYNC101", {}),
    ("small-messages", "dp", 4, "COMM201", {}),
    ("small-messages", "dp", 8, "COMM201", {}),
    ("small-messages", "tp-dp", 4, "COMM201", {}),
    ("small-messages", "tp-dp", 8, "COMM201", {}),
    ("small-messages", "pp-dp", 4, "COMM201", {}),
    ("small-messages", "pp-dp", 8, "COMM201", {}),
    ("slow-link", "dp", 4, "NET101", {"NET101": {"link_busbw_gbps": 100.0}}),
    ("slow-link", "dp", 8, "NET101", {"NET101": {"link_busbw_gbps": 100.0}}),
    # FSDP's gathers and scatters at link speed: the device then waits for the CPU's
    # launches (steptime.launch_floor), which the replay keeps.
    ("slow-link", "fsdp", 4, "NET101", {"NET101": {"link_busbw_gbps": 100.0}}),
    ("slow-link", "fsdp", 8, "NET101", {"NET101": {"link_busbw_gbps": 100.0}}),
    # A pipeline group's point-to-point transfers: against the other pipeline's (the link
    # speed is not their reference: latency-bound micro-batch messages).
    ("slow-link", "pp-dp", 8, "NET101", {"NET101": {"link_busbw_gbps": 100.0}}),
    ("bubble", "pp-dp", 4, "PIPE101", {}),
    ("bubble", "pp-dp", 8, "PIPE101", {}),
    _gap(
        ("exposed-allreduce", "tp-dp", 8, "COMM101"),
        "a larger standing cause ranks first: the TP all-reduces, exposed in the healthy job "
        "too (their COMM101 saving there, 341842 ns, is within 1.3% of the simulator's job "
        "with the TP waits removed); the injected DP cause's COMM101 ranks second, +5.8% of "
        "truth (test_scenario_injected_cause_tops_the_new_findings)",
    ),
    # FSDP's last two reduce-scatters of a step stay exposed after the fix (steptime's
    # _fsdp_tail): the root unit's, and the first block's behind only the embedding's short
    # backward. With the last alone excepted the saving was +31% of truth. The fix saves
    # 1.8-2.1% of the tiny model's step: the 2% floor of a finding is lowered to see it.
    ("exposed-allreduce", "fsdp", 4, "COMM102", {"COMM102": {"info_share": 0.01}}),
    ("exposed-allreduce", "fsdp", 8, "COMM102", {"COMM102": {"info_share": 0.01}}),
    ("slow-link", "tp-dp", 8, "NET101", {"NET101": {"link_busbw_gbps": 100.0}}),
]


def _slow_beyond_4_ranks(cases: list[Any]) -> list[Any]:
    """`cases` with those of more than 4 ranks marked `slow` (CI runs them; the default run
    keeps one job size of each case)."""
    out = []
    for case in cases:
        values, marks = (case.values, list(case.marks)) if hasattr(case, "values") else (case, [])
        if values[2] > 4:
            marks.append(pytest.mark.slow)
        out.append(pytest.param(*values, marks=marks, id=getattr(case, "id", None)))
    return out


@pytest.mark.parametrize(
    ("scenario", "layout", "ranks", "code", "options"), _slow_beyond_4_ranks(REPLAY_SCENARIOS)
)
def test_scenario_replayed_saving_is_within_10_percent(
    job, scenario: str, layout: str, ranks: int, code: str, options: dict
) -> None:
    _tops_within_10_percent(*job(scenario, layout, ranks), code, options)


# The same on the generator's default model, where backward holds enough compute to hide
# the gradient all-reduces: a late rank or a slow link then delays the calls queued behind
# the first one it holds up, hidden parts included (steptime's tail chain).
# No option: the default job's links run at the hardware table's figures for its H100 SXM,
# and NET101 measures its groups against them (tests/test_hardware.py).
NET: dict[str, Any] = {}
FULL_SCENARIOS = [
    ("straggler", "dp", 4, "SYNC101", {}),
    ("straggler", "dp", 8, "SYNC101", {}),
    ("straggler", "pp-dp", 4, "SYNC101", {}),
    ("straggler", "fsdp", 8, "SYNC101", {}),
    ("slow-link", "dp", 4, "NET101", NET),
    ("slow-link", "dp", 8, "NET101", NET),
    ("slow-link", "fsdp", 4, "NET101", NET),
    ("slow-link", "tp-dp", 8, "NET101", NET),
    ("slow-link", "pp-dp", 8, "NET101", NET),
    # The slow pipeline's calls each lose their saving where they are on the timeline (a
    # share of the group's rows put most of it on the warm-up waits: -10% of truth).
    _gap(
        ("slow-link", "pp-dp", 4, "NET101"),
        "at the hardware table's links (370 GB/s healthy, 74 slow) PIPE101 ranks first: it "
        "claims the slow pipeline's exposed sends as hideable (1.06 ms, nothing in the "
        "healthy job), above NET101's replayed fix of the link (0.813 ms against 0.812 ms "
        "truth); with 100 GB/s links NET101 ranked first",
    ),
    ("exposed-allreduce", "dp", 4, "COMM101", {}),
    ("small-messages", "dp", 8, "COMM201", {}),
    ("small-messages", "tp-dp", 4, "COMM201", {}),
    ("bubble", "pp-dp", 4, "PIPE101", {}),
    ("bubble", "pp-dp", 8, "PIPE101", {}),
    # A stage gains its own storm's time and, at each wait, the other stage's gain by then
    # (steptime's re-timed shifts; the larger of the two alone was -31% of truth).
    ("small-messages", "pp-dp", 4, "COMM201", {}),
    ("small-messages", "pp-dp", 8, "COMM201", {}),
    # The step's last two reduce-scatters excepted (+11% of truth with the last alone).
    ("exposed-allreduce", "fsdp", 4, "COMM102", {}),
    ("exposed-allreduce", "fsdp", 8, "COMM102", {}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "layout", "ranks", "code", "options"), FULL_SCENARIOS)
def test_scenario_replayed_saving_on_the_default_model(
    job, scenario: str, layout: str, ranks: int, code: str, options: dict
) -> None:
    _tops_within_10_percent(*job(scenario, layout, ranks, full=True), code, options)


def test_slow_pipeline_rows_lose_what_their_calls_save(job) -> None:
    """NET101's edit on a slow pipeline link takes from each of the group's timeline rows
    what its calls save at the reference, never more: a stage's long wait for the other
    stage (the warm-up) holds one transfer, and its wait is the replay's to re-time."""
    report, truth = job("slow-link", "pp-dp", 4, full=True)
    (f,) = only(report, "NET101")
    pg = truth["problems"][0]["pg_name"]
    assert f.process_group == pg and f.evidence["collectives"] == ["send_recv"]
    nbytes = truth["expected"]["pp_p2p"]["bytes_per_call"]
    bound = nbytes / f.evidence["median_busbw_gbps"] - nbytes / f.evidence["reference_busbw_gbps"]
    tables = Tables(report)
    rows = tables.collect(replay_timeline(tables)).filter(pl.col("part") == "event")
    share = f.edit.fraction
    mine = rows.filter(f.edit.where)
    if isinstance(share, pl.DataFrame):  # a share per key (Edit's documented forms)
        keys = [c for c in share.columns if c != "fraction"]
        mine = mine.join(share, on=keys, how="left")
        share = pl.col("fraction").fill_null(0.0)
    elif not isinstance(share, pl.Expr):
        share = pl.lit(float(share))
    lost = mine.select("ns", "calls", lost=pl.col("ns") * share.clip(0.0, 1.0))
    assert lost.height and lost["ns"].max() > 10 * bound  # the warm-up waits are there
    assert (lost["lost"] <= lost["calls"] * bound * 1.02 + 1).all(), lost.sort("lost").tail()
    assert (lost["lost"] >= lost["calls"] * bound * 0.98).all(), lost.sort("lost").head()


def _tops_within_10_percent(report: Report, truth: dict, code: str, options: dict) -> None:
    """The top finding is `code`'s, replayed, within 10% of truth's impact."""
    findings = run_rules(report, options=options)
    top = findings[0]
    assert top.code == code, [(f.code, f.impact_ns_per_step) for f in findings]
    assert top.evidence["saving_method"].startswith("replay:")
    expected = truth["problems"][0]["impact_ns_per_step"]
    assert abs(top.impact_ns_per_step - expected) <= 0.1 * expected, (
        top.impact_ns_per_step,
        expected,
    )


def _identity(f: Finding) -> tuple:
    """What a finding is about: its rule and process groups."""
    return (f.code, f.process_group, tuple(f.evidence.get("process_groups") or ()))


# tp-dp jobs hold a standing cause larger than some injected ones: the TP all-reduces, that
# the compute stream waits for, exposed in the healthy job too; so do pp-dp jobs on the
# default model, whose pipeline transfers cost more than a 2 ms straggler (PIPE101: hiding
# them). There the injected cause is the top finding the healthy job does not have, and
# its saving is within 10% of truth.
STANDING_SCENARIOS = [
    ("exposed-allreduce", "tp-dp", 8, "COMM101", {}, False),
    ("exposed-allreduce", "tp-dp", 4, "COMM101", {}, False),
    ("slow-link", "tp-dp", 4, "NET101", {"NET101": {"link_busbw_gbps": 100.0}}, False),
    ("straggler", "pp-dp", 8, "SYNC101", {}, True),
]


@pytest.mark.parametrize(
    ("scenario", "layout", "ranks", "code", "options", "full"), STANDING_SCENARIOS
)
def test_scenario_injected_cause_tops_the_new_findings(
    job, scenario: str, layout: str, ranks: int, code: str, options: dict, full: bool
) -> None:
    report, truth = job(scenario, layout, ranks, full)
    healthy = {
        _identity(f): f for f in run_rules(job("baseline", layout, ranks, full)[0], options=options)
    }
    findings = run_rules(report, options=options)
    new = [f for f in findings if _identity(f) not in healthy]
    assert new and new[0].code == code, [(f.code, f.impact_ns_per_step) for f in findings]
    top = new[0]
    assert top.evidence["saving_method"].startswith("replay:")
    expected = truth["problems"][0]["impact_ns_per_step"]
    assert abs(top.impact_ns_per_step - expected) <= 0.1 * expected, (
        top.impact_ns_per_step,
        expected,
    )
    # What ranks above it stands in the healthy job too, at about the same saving.
    for f in findings[: findings.index(top)]:
        before = healthy[_identity(f)].impact_ns_per_step
        assert abs(f.impact_ns_per_step - before) <= 0.1 * before, (f, before)


@pytest.mark.parametrize(
    "job", ["sample_traces/ep-4", "tests/data/h100-nccl/ep-4"], ids=["gloo", "nccl"]
)
def test_an_uneven_all_to_all_is_named_in_the_imbalance_advice(job: str) -> None:
    """ep-4 (gloo and NCCL captures) routes tokens unevenly (ep_tokens): all_to_all_volume
    sums what each rank sent and received, each rank's total against the mean rank's, and
    the mean call's busiest receiver against the call's mean are the capture's routing
    (dispatch: its expert's tokens, even here; combine: its own tokens back, uneven).
    SYNC104's advice and evidence name them instead of saying the trace does not show what
    the groups exchange. A DDP job has no all-to-all to name, and a sampled pair of a
    128-rank job's ranks (group size unknown) is not taken for the whole group."""
    from kineto_comm.capture.workloads import HIDDEN, ep_tokens
    from kineto_comm.rules_api import all_to_all_volume

    root = Path(__file__).resolve().parents[1]
    # Each rank on a host of its own (--ranks-per-host 1): the capture's contention
    # (CAPT101: 4 ranks on one GPU, or on 2 cores) is then not read, and SYNC104 weighs
    # the work; the capture as it is gets the capture's advice instead.
    report = analyze(root / job, jobs=1, ranks_per_host=1)
    as_captured = analyze(root / job, jobs=1)
    (qualified,) = [f for f in as_captured.findings if f.code == "SYNC104"]
    assert qualified.advice[0].startswith("Capture again") and "CAPT101" in qualified.message
    assert not any("is uneven" in a for a in qualified.advice)
    tokens = ep_tokens(4)
    sent = [sum(tokens[r]) for r in range(4)]
    received = [sum(tokens[s][r] for s in range(4)) for r in range(4)]
    total = [s + r for s, r in zip(sent, received, strict=True)]
    per_call = [max(x) / (sum(x) / 4) for x in (received, sent)]  # dispatch, combine
    volume = all_to_all_volume(Tables(report)).sort("rank")
    assert volume["rank"].to_list() == [0, 1, 2, 3]
    per_rank = 6 * HIDDEN * 4  # 6 calls of each direction, float32
    assert volume["sent_bytes"].to_list() == [per_rank * t for t in total]
    assert volume["received_bytes"].to_list() == volume["sent_bytes"].to_list()
    vs_mean = [t / (sum(total) / 4) for t in total]
    assert volume["received_vs_mean"].to_list() == pytest.approx(vs_mean)
    imbalance = sum(per_call) / 2
    assert volume["call_imbalance"].to_list() == pytest.approx([imbalance] * 4)
    busiest = sorted(r for r in range(4) if vs_mean[r] > 1.05)
    assert imbalance > 1.05 and 0 < len(busiest) < 4
    (sync104,) = [f for f in report.findings if f.code == "SYNC104"]
    (group,) = sync104.evidence["uneven_all_to_all"]
    assert sorted(group["busiest_ranks"]) == busiest
    assert group["call_imbalance"] == pytest.approx(imbalance, abs=1e-3)
    assert group["busiest_received_vs_mean"] == pytest.approx(max(vs_mean), abs=1e-3)
    ranks = ", ".join(map(str, busiest))
    line = sync104.advice[0]
    assert line.startswith("The all-to-all on group 0 is uneven: in the mean call the busiest")
    assert f"rank(s) {ranks} receive the most" in line
    assert not any("not known from the trace" in a for a in sync104.advice)

    sampled = analyze(shared("hta/trace_filter"), jobs=1, ignore=["ALL"])
    assert sampled.collectives.filter(pl.col("collective") == "all_to_all").height
    assert all_to_all_volume(Tables(sampled)).height == 0
    ddp = analyze(root / "sample_traces" / "ddp-4", jobs=1)
    assert all_to_all_volume(Tables(ddp)).height == 0
    late = [f for f in ddp.findings if f.code in ("SYNC101", "SYNC104")]
    assert late
    for f in late:
        assert f.evidence["uneven_all_to_all"] == []
        assert not any("all-to-all" in a for a in f.advice)


def test_device_contention_on_a_shared_gpu_and_not_alone() -> None:
    """The H100 captures run four ranks on one GPU: kernels whose launch returned long ago
    wait on a device running none of their rank's work (the `queued` blame); SYNC105 names
    it, its saving is that time replayed away as far as the kernels' launches let it
    (rules_api.queue_shift), and it says every rank reports one device id. Single-process
    traces (A100, V100; alexnet's 3 s first launch is the CPU's, in its launch call) have
    no such finding."""
    from kineto_comm.rules_api import Edit, queue_shift, replay_saving

    root = Path(__file__).resolve().parents[1]
    ep4 = root / "tests" / "data" / "h100-nccl" / "ep-4"
    # As captured, CAPT101 holds that time (the ranks share one GPU) and SYNC105 stands
    # down; read as one GPU per host (--ranks-per-host 1), SYNC105 names it.
    captured = analyze(ep4, jobs=1)
    assert not [f for f in captured.findings if f.code == "SYNC105"]
    (capt,) = [f for f in captured.findings if f.code == "CAPT101"]
    report = analyze(ep4, jobs=1, ranks_per_host=1)
    (f,) = [f for f in report.findings if f.code == "SYNC105"]
    assert capt.impact_ns_per_step >= f.impact_ns_per_step
    queued = report.step_blame.filter(pl.col("category") == "queued")["ns"].sum()
    assert queued > 0.2 * report.step_times.filter("complete")["step_ns"].sum()
    tables = Tables(report)
    where = pl.col("category") == "queued"
    shift = queue_shift(tables).select("rank", "step", fraction="share")
    assert f.impact_ns_per_step == replay_saving(tables, Edit("x", where, shift))
    assert 0 < f.impact_ns_per_step <= replay_saving(tables, Edit("all of it", where))
    assert f.evidence["shared_device_id"] is False
    assert f.advice[0].startswith("Look for other processes on the training GPUs")
    for rel in ("hta/nccl_parser_config", "hta/df_index_resolver", "hta/critical_path/alexnet"):
        alone = analyze(shared(rel), jobs=1)
        assert not [g for g in alone.findings if g.code == "SYNC105"], rel
        assert alone.step_blame.filter(pl.col("category") == "queued")["ns"].sum() < 1e5, rel


def test_device_contention_against_the_other_process_s_own_trace() -> None:
    """One process profiled alone on an H100 (`solo`), then beside a second process that
    keeps the GPU busy with large GEMMs (`shared-gpu`; that process's own trace, on the
    same host clock: `shared-gpu-hog`; tests/data/h100-nccl/README.md). Alone, every kernel
    that starts on an idle device does so within LAUNCH_LATENCY_NS of its launch call's
    end: no queued time, no SYNC105. Beside the other process, the queued time lies where
    the other process's kernels ran, and SYNC105's saving is within half again of what
    the step measurably lost (the mean step, beside it less alone): the queue before each
    step's first kernel moves the steps, and the CPU's launches bound the rest (replayed
    without those bounds, it claimed 3.7 times the loss)."""
    from kineto_comm.rules_api import LAUNCH_LATENCY_NS

    h100 = Path(__file__).resolve().parents[1] / "tests" / "data" / "h100-nccl"
    solo, shared_gpu, other = (
        analyze(h100 / name, jobs=1) for name in ("solo", "shared-gpu", "shared-gpu-hog")
    )

    def after_idle(report: Report) -> pl.DataFrame:
        launched = pl.coalesce("launch_end_ns", "launch_ns")
        return (
            report.kernels.sort("start_ns")
            .with_columns(_idle_from=pl.col("end_ns").cum_max().shift(1))
            .filter((pl.col("start_ns") > pl.col("_idle_from")) & (launched > pl.col("_idle_from")))
            .with_columns(
                _cpu=pl.min_horizontal("start_ns", launched + LAUNCH_LATENCY_NS),
                _late=pl.col("start_ns") - launched,
            )
        )

    alone = after_idle(solo)
    assert alone.height >= 100 and alone["_late"].max() < LAUNCH_LATENCY_NS
    assert solo.step_blame.filter(pl.col("category") == "queued").height == 0
    assert not [f for f in solo.findings if f.code == "SYNC105"]
    # Beside the other process: its kernels cover the victim's queued stretches.
    gaps = after_idle(shared_gpu).filter(pl.col("start_ns") > pl.col("_cpu"))
    spans = other.kernels.select("start_ns", "end_ns").sort("start_ns")
    covered = (
        gaps.select(a="_cpu", b="start_ns")
        .join(spans, how="cross")
        .select(
            (pl.min_horizontal("b", "end_ns") - pl.max_horizontal("a", "start_ns"))
            .clip(lower_bound=0)
            .sum()
        )
        .item()
    )
    queued = (gaps["start_ns"] - gaps["_cpu"]).sum()
    assert queued > 2_000_000 and covered >= 0.9 * queued, (covered, queued)  # 96%
    (f,) = [f for f in shared_gpu.findings if f.code == "SYNC105"]
    step = {
        name: r.step_times.filter("complete")["step_ns"].mean()
        for name, r in (("solo", solo), ("shared", shared_gpu))
    }
    lost = step["shared"] - step["solo"]
    assert lost > 0 and 0.5 * lost <= f.impact_ns_per_step <= 1.5 * lost, (f, lost)


def test_launch_bound_against_the_same_passes_from_a_cuda_graph() -> None:
    """An H100 forward pass of ~4 us kernels, 10 passes a step, run eagerly
    (`launch-eager`: the device idles 91% of the step, waiting for launches) and replayed
    from a CUDA graph (`launch-graph`; tests/data/h100-nccl/README.md). SYNC106 on the
    eager trace is an error whose saving, the step if the CPU always ran ahead inside it,
    is within 5% of what the graph measurably saved (16.47 ms of 18.56); no eager kernel
    waits in a queue. The gaps before collectives are not SYNC106's (HTA's
    df_index_resolver trace: those before its storm of all-reduces are COMM201's, which
    merging the calls removes, so SYNC102 does not claim them again)."""
    from kineto_comm.rules_api import Edit, replay_saving

    h100 = Path(__file__).resolve().parents[1] / "tests" / "data" / "h100-nccl"
    eager, graph = (analyze(h100 / name, jobs=1) for name in ("launch-eager", "launch-graph"))
    step = {
        name: r.step_times.filter("complete")["step_ns"].mean()
        for name, r in (("eager", eager), ("graph", graph))
    }
    saved = step["eager"] - step["graph"]
    (f,) = [f for f in eager.findings if f.code == "SYNC106"]
    assert f.severity == Severity.error
    assert abs(f.impact_ns_per_step - saved) <= 0.05 * saved, (f.impact_ns_per_step, saved)
    assert eager.step_blame.filter(pl.col("category") == "queued").height == 0
    # The graph launches a pass at once: no launch gap inside a step is left; the gap
    # before each step's first kernel (the host's time between steps) is in both runs.
    assert not [g for g in graph.findings if g.code == "SYNC106"]
    between = graph.step_blame.filter(pl.col("step_start").fill_null(False))
    assert between.height and set(between["category"]) <= {"launch", "queued"}
    mixed = analyze(shared("hta/df_index_resolver"), jobs=1)
    codes = {g.code: g for g in mixed.findings}
    assert {"COMM201", "SYNC106"} <= set(codes) and "SYNC102" not in codes
    tables = Tables(mixed)
    launch = pl.col("category") == "launch"
    inside = launch & pl.col("collective").is_null() & ~pl.col("step_start")
    mine = replay_saving(tables, Edit("x", inside))
    assert codes["SYNC106"].impact_ns_per_step == mine
    assert mine < replay_saving(tables, Edit("all", launch))
    storm = codes["COMM201"]
    assert set(storm.steps) == set(mixed.step_times.filter("complete")["step"])
    before = launch & (pl.col("collective") == "all_reduce")
    transfer = (pl.col("category") == "transfer") & (pl.col("collective") == "all_reduce")
    assert storm.impact_ns_per_step <= replay_saving(tables, Edit("all", before | transfer))


# ---------------------------------------------------------------- advice for the platform

# Advice that holds only for NCCL on GPUs: its tuning knobs and tests, GPU tools, streams.
GPU_ONLY = ("NCCL_", "nccl-tests", "nvidia-smi", "NVLink", "its own stream", "proxy threads")


@pytest.mark.parametrize(
    ("path", "codes_", "options"),
    [
        # gloo on CPUs (host timelines): COMM101 with too little compute to hide it (info).
        (shared("hta/cpu_only"), {"COMM101"}, None),
        # The README's sample: COMM101, SYNC104; NET101 against a 100 GB/s link (its
        # buckets are under NET101's 1 MB default).
        (REPO / "sample_traces/ddp-4", {"COMM101", "SYNC104", "NET101"}, 100.0),
        (REPO / "sample_traces/ep-4", {"COMM101", "SYNC104"}, None),  # generic COMM101 advice
        (REPO / "sample_traces/fsdp-2", {"SYNC101", "COMM102"}, None),
        (REPO / "tests/data/gloo/tp-dp-4", {"COMM101"}, None),  # tensor parallel
    ],
    ids=["hta-cpu_only", "ddp-4", "ep-4", "fsdp-2", "gloo-tp-dp-4"],
)
def test_advice_on_gloo_cpu_jobs_names_no_nccl_or_gpu_remedy(path, codes_, options) -> None:
    """A gloo job on CPUs is advised for what it runs on: no NCCL knob, no GPU tool, no stream
    or NVLink; the same rules on an NCCL job on GPUs keep them (next test)."""
    opts = {"NET101": {"link_busbw_gbps": options, "min_bytes": 0}} if options else None
    findings = run_rules(analyze(path, jobs=1, ignore=["ALL"]), options=opts)
    assert codes_ <= {f.code for f in findings}
    for f in findings:
        for line in f.advice:
            assert not any(word in line for word in GPU_ONLY), (f.code, line)


def test_advice_on_nccl_gpu_jobs_keeps_nccl_and_gpu_remedies() -> None:
    """tests/data/h100-nccl/tp-dp-8 (NCCL on H100s): COMM101's make-it-cheaper advice names
    NCCL's knobs and SYNC104's the proxy threads; NET101 against a link names nccl-tests."""
    path = REPO / "tests/data/h100-nccl/tp-dp-8"
    # Read as one GPU per host: as captured (8 ranks on one GPU) CAPT101 judges the capture
    # and SYNC104 and NET101 give way to it.
    findings = run_rules(
        analyze(path, jobs=1, ignore=["ALL"], ranks_per_host=1),
        options={"NET101": {"link_busbw_gbps": 100.0, "min_bytes": 0}},
    )
    advice = {f.code: " ".join(f.advice) for f in findings}
    assert "NCCL_ALGO" in advice["COMM101"]
    assert "NCCL's proxy threads" in advice["SYNC104"]
    assert "nccl-tests" in advice["NET101"]
