"""Issue #76 §2-3 (branch grade): a finding is graded and ranked by what its fix buys, a
collective that cannot be hidden gets a number for "make it cheaper" (the cost fit's merge of
its calls), and latency-bound calls are found whatever their count, sizes known or not."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from kineto_comm import analyze
from kineto_comm.analysis.costfit import cost_fit, merge_removal
from kineto_comm.findings import Finding, Severity
from kineto_comm.rules_api import Tables, step_times
from kineto_comm.rules_api import cost_fit as job_fit
from kineto_comm.rules_engine import builtin_rules
from tests.conftest import REPO, SAMPLES, shared

H100 = REPO / "tests" / "data" / "h100-nccl"
DEFAULTS = {r.code: r.defaults() for r in builtin_rules()}


def _floor(code: str) -> float:
    """The rule's info share: below it a fix buys too little to be more than info."""
    return float(DEFAULTS[code].get("info_share", 0.01))


def _loud(findings: tuple[Finding, ...]) -> list[Finding]:
    return [f for f in findings if f.severity.level >= Severity.warning.level]


def _check_graded(findings: tuple[Finding, ...]) -> None:
    """No warning or error whose saving is below its rule's info share, none above what its
    saving earns on the rule's ladder, and severities ranked worst first."""
    for f in _loud(findings):
        share = f.step_share or 0.0
        assert share >= max(_floor(f.code), 0.01), (f.code, f.severity, share, f.title)
        opts = DEFAULTS[f.code]
        if f.severity is Severity.error and "error_share" in opts:
            assert share >= opts["error_share"], (f.code, share, f.title)
        if "warn_share" in opts:
            assert share >= opts["warn_share"], (f.code, share, f.title)
    levels = [f.severity.level for f in findings]
    assert levels == sorted(levels, reverse=True)


def _blame_ns(report, where: pl.Expr) -> float:
    """Mean per complete step of the critical ranks' blame rows `where` selects."""
    times = step_times(Tables(report)).filter(pl.col("complete"))
    rows = report.step_blame.join(times.select("step"), on="step").filter(where)
    return rows["ns"].sum() / max(1, times.height)


# ---------------------------------------------------------------- §2 grade by the saving


def test_h100_ddp4_make_it_cheaper_is_a_replayed_merge() -> None:
    """h100 ddp-4: ~135 KB buckets taking ~20 ms each. Hiding them saves 0.2% of the step
    (too little compute). Read as one GPU per rank (`ranks_per_host=1`), the finding is the
    merge the cost fit replays (latency, not bandwidth: 4 buckets a step into 1), with DDP's
    setting; its saving is within the blame table's all_reduce transfer and launch rows. As
    captured, the 4 ranks time-slice one GPU: that "latency" is their turns on it (CAPT101,
    first), so no merge is offered, and no 0% fix is an error either way."""
    captured = analyze(H100 / "ddp-4", jobs=1)
    _check_graded(captured.findings)
    assert captured.findings[0].code == "CAPT101"
    assert not [f for f in captured.findings if f.title.startswith("Merge")]
    report = analyze(H100 / "ddp-4", jobs=1, ranks_per_host=1)
    _check_graded(report.findings)
    (f,) = [f for f in report.findings if f.code == "COMM101"]
    merge = f.evidence["merge"]
    assert f.title.startswith("Merge the latency-bound all_reduce")
    assert merge["latency_share"] >= 0.5
    assert merge["merged_calls_per_step"] < merge["calls_per_step"]
    assert f.evidence["saving_method"].startswith("replay: merge")
    assert f.impact_ns_per_step > f.evidence["hide_saving_ns"]
    assert any("raise bucket_cap_mb" in a for a in f.advice)
    # The exposed share stays, as evidence in the text.
    assert f"({f.evidence['exposed_share']:.0%} of the step" in f.message
    ar = pl.col("collective") == "all_reduce"
    bound = _blame_ns(report, ar & pl.col("category").is_in(["transfer", "launch"]))
    assert 0 < f.impact_ns_per_step <= bound


def test_latency_grows_with_ranks_for_the_same_bytes() -> None:
    """The same buckets at 4 and 8 ranks (h100 ddp-4, ddp-8): the fit puts the growth in the
    latency (18 ms to 81 ms a call for ~135 KB), not in the bytes."""
    fits = {}
    for name in ("ddp-4", "ddp-8"):
        (row,) = job_fit(Tables(analyze(H100 / name, jobs=1))).iter_rows(named=True)
        fits[name] = row
    assert fits["ddp-4"]["median_bytes"] == fits["ddp-8"]["median_bytes"]
    assert fits["ddp-8"]["latency_ns"] > 2 * fits["ddp-4"]["latency_ns"]
    assert all(f["latency_share"] >= 0.9 for f in fits.values())


def test_tp_dp8_errors_are_the_fixes_that_buy_most() -> None:
    """h100 tp-dp-8: COMM101's all-reduces that hiding cannot help were errors at 0.1% of
    the step, above a 14 ms fix; now no such error, and the fix that buys most is first:
    the capture's (CAPT101: 8 ranks on one GPU, whose queued time SYNC105 leaves to it)."""
    findings = analyze(H100 / "tp-dp-8", jobs=1).findings
    _check_graded(findings)
    assert findings[0].code == "CAPT101"
    assert findings[0].impact_ns_per_step == max(f.impact_ns_per_step for f in findings)
    # The tensor-parallel all-reduce (no setting merges it) stays, as info: hiding buys 0.1%.
    tp = [f for f in findings if f.code == "COMM101" and "tensor-parallel" in f.title]
    assert [f.severity for f in tp] == [Severity.info] and "too little compute" in tp[0].title


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [
        *(p for p in sorted(SAMPLES.iterdir()) if p.is_dir()),
        *(p for p in sorted(H100.iterdir()) if p.is_dir()),
        *(p for p in sorted((REPO / "tests" / "data" / "h200-nccl").iterdir()) if p.is_dir()),
        *(p for p in sorted((REPO / "tests" / "data" / "gloo").iterdir()) if p.is_dir()),
    ],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_every_real_trace_grades_by_the_saving(path: Path) -> None:
    """On every real trace folder: no error or warning whose replayed saving is below its
    rule's info share (or 1% of the step), nor above what its saving earns."""
    _check_graded(analyze(path, jobs=1).findings)


# ---------------------------------------------------------------- §3 small collectives


def test_sample_ddp4_buckets_are_latency_bound_so_advice_says_bigger() -> None:
    """sample ddp-4 (gloo): ~0.13 MB buckets, mostly latency by the fit: the advice never
    says smaller buckets start earlier, it says to raise bucket_cap_mb."""
    report = analyze(SAMPLES / "ddp-4", jobs=1)
    (row,) = job_fit(Tables(report)).iter_rows(named=True)
    assert row["latency_share"] >= 0.5
    advice = " ".join(a for f in report.findings for a in f.advice)
    assert "smaller buckets start earlier" not in advice
    (f,) = [f for f in report.findings if f.code == "COMM101"]
    assert "raise bucket_cap_mb" in " ".join(f.advice)


def test_df_index_resolver_storm_of_unknown_size() -> None:
    """hta/df_index_resolver: 404 all-reduces a step of no known size, ~10 us each, after
    the backward. COMM201 finds them by their times and replays their merge (latencies and
    launches), advising DDP's bucketed reduction or all_reduce_coalesced; SYNC102 leaves
    their launch gaps to it (one finding per cause)."""
    report = analyze(shared("hta/df_index_resolver"), jobs=1)
    (f,) = [f for f in report.findings if f.code == "COMM201"]
    assert f.evidence["calls_per_step"] >= 400 and f.evidence["merge"]["fit_method"] == "times"
    assert f.evidence["saving_method"].startswith("replay: merge")
    assert f.step_share >= _floor("COMM201")
    assert f.title.startswith("Merge the 404 small all_reduce calls")
    advice = " ".join(f.advice)
    assert "all_reduce_coalesced" in advice and "DDP" in advice
    ar = pl.col("collective") == "all_reduce"
    bound = _blame_ns(report, ar & pl.col("category").is_in(["transfer", "launch"]))
    assert 0 < f.impact_ns_per_step <= bound
    assert "SYNC102" not in [g.code for g in report.findings]
    _check_graded(report.findings)


def test_cost_fit_recovers_latency_and_bandwidth() -> None:
    """Calls generated as 20 us + bytes at 10 GB/s bus bandwidth (all_reduce on 4 ranks:
    bus bytes 1.5 x bytes), 1 KiB to 64 MiB: the fit gets both back; with one size only, the
    prior bandwidth bounds the latency from below; with no size, the small calls' floor."""
    sizes = [2**k for k in range(10, 27)]
    calls = pl.DataFrame(
        {
            "process_group": "0",
            "collective": "all_reduce",
            "bytes": sizes,
            "n": 4,
            "transfer_ns": [20_000 + 1.5 * b / 10.0 for b in sizes],
        }
    )
    (fit,) = cost_fit(calls, prior_busbw_gbps=1.0).iter_rows(named=True)
    assert fit["method"] == "fit"
    assert fit["latency_ns"] == pytest.approx(20_000, rel=0.01)
    assert fit["busbw_gbps"] == pytest.approx(10.0, rel=0.01)
    one = calls.filter(pl.col("bytes") == 2**17)
    (prior,) = cost_fit(one, prior_busbw_gbps=10.0).iter_rows(named=True)
    assert prior["method"] == "prior bandwidth"
    assert prior["latency_ns"] == pytest.approx(20_000, rel=0.01)
    # A lower prior bandwidth leaves the bytes more of the time: less latency, never more.
    (low,) = cost_fit(one, prior_busbw_gbps=1.0).iter_rows(named=True)
    assert 0 <= low["latency_ns"] < prior["latency_ns"]
    # Merged: 17 calls of 1 KiB..64 MiB below a 1 GiB target become one, 16 latencies saved.
    rows = calls.with_columns(rank=0, step=0)
    (merged,) = merge_removal(rows, cost_fit(calls, 1.0), 1 << 30).iter_rows(named=True)
    assert (merged["n"], merged["m"]) == (17, 1)
    assert merged["removed_ns"] == pytest.approx(16 * 20_000, rel=0.02)
    unsized = calls.with_columns(bytes=pl.lit(None, dtype=pl.Int64))
    (times,) = cost_fit(unsized, 1.0).iter_rows(named=True)
    assert times["method"] == "times" and times["latency_ns"] < times["median_ns"]
