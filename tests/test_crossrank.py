"""Cross-rank matching, clock alignment, instances, waits and stragglers against ground truth."""

from __future__ import annotations

import polars as pl
import pytest

from kineto_comm import analyze
from kineto_comm.analysis.match import instances, match_keys, waits
from kineto_comm.rules_api import Tables, replay_timeline
from kineto_comm.synth import generate

from .conftest import REPO, SAMPLES, shared


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Synthetic jobs shared by the tests of this module: name -> (dir, truth)."""
    root = tmp_path_factory.mktemp("xr")
    specs = {
        "skew": ("clock-skew", "dp", 8),
        "skew-tp": ("clock-skew", "tp-dp", 16),
        "skew-pp": ("clock-skew", "pp-dp", 16),
        "straggler-dp": ("straggler", "dp", 8),
        "straggler-tp": ("straggler", "tp-dp", 8),
        "baseline": ("baseline", "dp", 8),
        "pp": ("baseline", "pp-dp", 4),
        "slow": ("slow-link", "tp-dp", 8),
    }
    return {
        name: (root / name, generate(sc, root / name, ranks=n, layout=lay, steps=3, seed=1))
        for name, (sc, lay, n) in specs.items()
    }


def test_clock_offsets_recovered_within_5us(jobs):
    folder, truth = jobs["skew"]
    report = analyze(folder, jobs=1)
    got = dict(report.offsets.select("rank", "offset_ns").iter_rows())
    want = {int(r): v for r, v in truth["clock_offsets_ns"].items()}
    assert any(v != 0 for v in want.values())
    for rank, offset in want.items():
        assert abs(got[rank] - (offset - want[0])) <= 5_000, (rank, got[rank], offset)
    # Unaligned, the offset shows up as arrival skew; aligned, the ranks arrive together.
    offset = max(abs(v) for v in want.values())
    assert report.collective_instances["arrival_skew_ns"].max() < offset / 4
    unaligned = analyze(folder, jobs=1, align=False)
    assert (unaligned.offsets["offset_ns"] == 0).all()
    assert unaligned.collective_instances["arrival_skew_ns"].min() > offset / 2


def test_clock_offsets_recovered_where_calls_across_hosts_are_few(jobs):
    """Tensor parallel inside each of two hosts, data parallel across them: most of a rank's
    calls are with its own host, and its few calls across hosts still set its offset."""
    folder, truth = jobs["skew-tp"]
    report = analyze(folder, jobs=1)
    want = {int(r): v for r, v in truth["clock_offsets_ns"].items()}
    assert len(set(want.values())) == 2  # two hosts, two clocks
    got = dict(report.offsets.select("rank", "offset_ns").iter_rows())
    for rank, offset in want.items():
        assert abs(got[rank] - (offset - want[0])) <= 5_000, (rank, got[rank], offset)
    assert report.offsets.filter(pl.col("method") == "reference")["rank"].to_list() == [0]


def test_ranks_linked_only_by_point_to_point_keep_their_own_clocks(jobs):
    """Pipeline stages exchange only sends and recvs, whose ends need not meet, and every
    data-parallel group stays inside one host: each host (device ids 0..7 again and again)
    is on its lowest rank's clock, and the text report says that the hosts are not aligned
    with each other."""
    import io

    from kineto_comm.render.text import render_text

    folder, truth = jobs["skew-pp"]
    report = analyze(folder, jobs=1)
    dp = [g["ranks"] for g in truth["process_groups"] if g["role"] == "dp"]
    assert len(dp) > 1
    offsets = report.offsets
    refs = offsets.filter(pl.col("method") == "reference")["rank"].to_list()
    per_host = truth["ranks_per_host"]
    assert all(min(g) // per_host == max(g) // per_host for g in dp)
    assert refs == list(range(0, truth["world_size"], per_host))
    assert set(offsets["host_source"]) == {"device_ids"}
    assert (offsets["offset_ns"] == 0).all()  # one clock inside each host
    out = io.StringIO()
    render_text(report, out, width=400)
    said = f"each set is on the clock of its lowest rank: {', '.join(map(str, refs))}"
    assert said in out.getvalue()


def test_offsets_are_applied_per_link_and_a_tight_pair_stays_together():
    """Ranks 0-1 and 2-3 are tensor-parallel pairs whose ends agree to 1 us (rank 1's clock
    3 ms off rank 0's, rank 3's 1 ms off rank 2's); 0 and 2 meet only in calls whose ends
    scatter by +-4 ms around 2 ms (a shared GPU's data-parallel group). Each pair's gap is
    applied; the loose link's is not (its ranks may share a clock as far as the ends
    tell), and it moves neither 2 nor 3: the pair keeps its 1 ms."""
    import random

    from kineto_comm.analysis.align import estimate_offsets

    rng = random.Random(3)
    rows = []
    for call in range(40):  # the pairs' calls: many, tight
        t = 1_000_000_000 + call * 10_000_000
        rows += [(call, 0, t), (call, 1, t + 3_000_000 + rng.randint(-500, 500))]
        rows += [(100 + call, 2, t + 2_000_000), (100 + call, 3, t + 3_000_000)]
    for call in range(9):  # across the pairs: few, loose
        t = 5_000_000_000 + call * 10_000_000
        scatter = rng.choice([-4_000_000, 0, 4_000_000, 2_500_000, -2_500_000])
        rows += [(200 + call, 0, t), (200 + call, 2, t + 2_000_000 + scatter)]
    keyed = pl.DataFrame(rows, schema=["instance", "rank", "end_ns"], orient="row").with_columns(
        device=pl.lit(0), collective=pl.lit("all_reduce")
    )
    out = {r["rank"]: r for r in estimate_offsets(keyed, [0, 1, 2, 3]).iter_rows(named=True)}
    assert [out[r]["method"] for r in range(4)] == [
        "reference",
        "collective-end",
        "insignificant",
        "collective-end",
    ]
    assert abs(out[1]["offset_ns"] - 3_000_000) < 1_000
    assert out[2]["offset_ns"] == 0 and abs(out[2]["estimate_ns"]) > 100_000
    assert out[3]["offset_ns"] - out[2]["offset_ns"] == 1_000_000
    assert out[3]["estimate_ns"] - out[2]["estimate_ns"] == 1_000_000


def test_offsets_never_come_from_point_to_point_calls():
    """The real 4-stage pipeline capture (sends and recvs only, one clock) with 3 ms added to
    the ends of stages 2 and 3: no offset is estimated or applied, whereas fitting the sends'
    and recvs' ends would shift ranks by their 1-4 ms of misfit."""
    from kineto_comm.analysis.align import estimate_offsets

    report = analyze(REPO / "tests" / "data" / "h100-nccl" / "pp-4", jobs=1)
    keyed = match_keys(report.collectives)
    assert set(keyed["collective"].unique()) <= {"send", "recv", "send_recv"}
    assert keyed["instance"].is_not_null().sum() > 100
    moved = keyed.with_columns(
        pl.col("end_ns") + pl.when(pl.col("rank") >= 2).then(3_000_000).otherwise(0)
    )
    ranks = report.ranks["rank"].to_list()
    out = estimate_offsets(moved, ranks)
    assert out["method"].to_list() == ["none"] * len(ranks)
    assert (out["offset_ns"] == 0).all()


@pytest.mark.parametrize("job", ["straggler-dp", "straggler-tp"])
def test_straggler_named_and_delay_recovered_within_5_percent(jobs, job):
    folder, truth = jobs[job]
    problem = truth["problems"][0]
    report = analyze(folder, jobs=1)
    named = report.stragglers.filter(pl.col("is_straggler"))
    assert named["rank"].to_list() == problem["ranks"]
    delay = named["delay_ns"][0]
    assert delay == pytest.approx(problem["delay_ns"], rel=0.05)
    assert named["confidence"][0] >= 0.5


def test_baseline_has_no_straggler_and_full_matches(jobs):
    folder, truth = jobs["baseline"]
    report = analyze(folder, jobs=1)
    assert not report.stragglers["is_straggler"].any()
    inst = report.collective_instances
    assert (inst["ranks_seen"] == truth["world_size"]).all()
    assert (inst["key_kind"] == "seq").all()
    waits_table = report.collective_waits
    assert waits_table.height == inst.height * truth["world_size"]
    assert (waits_table["wait_ns"] >= 0).all()
    assert (
        waits_table.group_by("instance").agg(pl.col("arrived_last").sum())["arrived_last"] == 1
    ).all()


def test_bus_bandwidth_follows_nccl_tests_definitions(jobs):
    folder, truth = jobs["baseline"]
    inst = analyze(folder, jobs=1).collective_instances
    busbw = truth["process_groups"][0]["busbw_gbps"]
    big = inst.filter(pl.col("bytes") >= 16_000_000)
    assert big.height > 0
    n = truth["world_size"]
    # all_reduce: busbw = bytes / transfer * 2(n-1)/n, GB = 1e9 bytes.
    row = big.row(0, named=True)
    assert row["busbw_gbps"] == pytest.approx(
        row["bytes"] / row["transfer_ns"] * 2 * (n - 1) / n, rel=1e-9
    )
    # Large messages run near the generator's link speed (latency makes them a bit slower).
    assert big["busbw_gbps"].median() == pytest.approx(busbw, rel=0.15)


def test_slow_link_group_has_low_bus_bandwidth(jobs):
    folder, truth = jobs["slow"]
    inst = analyze(folder, jobs=1).collective_instances
    slow = truth["problems"][0]
    per_group = (
        inst.filter(pl.col("bytes") >= 1_000_000)
        .group_by("process_group")
        .agg(pl.col("busbw_gbps").median())
    )
    # The slowed group's link runs at a fraction of the healthy ones' (the table's figure).
    healthy = max(g["busbw_gbps"] for g in truth["process_groups"])
    slow_groups = {g["pg_name"] for g in truth["process_groups"] if g["busbw_gbps"] < healthy / 2}
    assert slow_groups, slow
    worst = per_group.sort("busbw_gbps")["process_group"][0]
    assert worst in slow_groups


def test_point_to_point_sends_meet_their_receives(jobs):
    folder, _ = jobs["pp"]
    inst = analyze(folder, jobs=1).collective_instances
    p2p = inst.filter(pl.col("key_kind") == "p2p")
    assert p2p.height > 0
    assert (p2p["ranks_seen"] == 2).all()
    assert set(p2p["collective"]) == {"send_recv"}


def test_unequal_call_counts_match_what_they_can(jobs):
    folder, _ = jobs["baseline"]
    coll = analyze(folder, jobs=1, align=False).collectives
    # Rank 3 lost its last two calls (e.g. a trace cut short).
    last = coll.filter(pl.col("rank") == 3).sort("start_ns").tail(2)
    trimmed = coll.join(last.select("rank", "start_ns"), on=["rank", "start_ns"], how="anti")
    keyed = match_keys(trimmed)
    table = instances(keyed)
    assert table.filter(pl.col("ranks_seen") == 7).height == 2
    assert waits(keyed, table).height == trimmed.height


@pytest.mark.parametrize(
    "path",
    [SAMPLES / "ddp-4", SAMPLES / "pp-4", SAMPLES / "tp-2", SAMPLES / "fsdp-2"],
    ids=lambda p: p.name,
)
def test_cross_rank_tables_on_real_captures(path):
    report = analyze(path, jobs=1)
    assert report.collective_instances.height > 0
    assert report.stragglers.height == report.ranks.height
    # Ranks of one host share a clock: no offset is applied.
    assert (report.offsets["offset_ns"] == 0).all()


def test_skew_percentile_is_the_one_numpy_and_pandas_take() -> None:
    """The skew table's p95 on the real 4-rank all-to-all capture (12 calls, one 9.0 ms
    outlier among 6.7-6.8 ms): interpolated between calls as numpy and pandas (HTA) take
    percentiles, not the nearest call's, which put it below the mean."""
    import numpy as np

    report = analyze(REPO / "tests" / "data" / "h100-nccl" / "ep-4", jobs=1)
    inst = report.collective_instances
    (row,) = report.skew_summary().iter_rows(named=True)
    skew = inst["arrival_skew_ns"].to_numpy()
    assert row["calls"] == len(skew) == 12
    assert row["p95_skew_ns"] == round(float(np.percentile(skew, 95)))
    assert row["mean_skew_ns"] == round(float(skew.mean()))
    assert row["p95_skew_ns"] > row["mean_skew_ns"]


def test_cross_rank_tables_on_the_real_sampled_pair():
    report = analyze(shared("hta/trace_filter"), jobs=1)
    assert report.ranks["rank"].to_list() == [0, 1]
    inst = report.collective_instances
    assert inst.height > 0 and (inst["ranks_seen"] <= 2).all()
    # Devices 0 and 1 (local rank = device id): one host, one clock.
    offsets = report.offsets
    assert offsets["host_source"].to_list() == ["device_ids"] * 2
    assert offsets["host"].n_unique() == 1
    assert offsets["method"].to_list() == ["reference", "same-host"]
    assert (offsets["offset_ns"] == 0).all()


H100 = REPO / "tests" / "data" / "h100-nccl"


@pytest.mark.parametrize("name", ["fsdp-2", "tp-2", "tp-dp-8", "ddp-4"])
def test_ranks_of_one_host_share_its_clock(name):
    """The real NCCL captures run every rank on the one H100 (one device id, one host): no
    offset inside the host, so the skews are the raw clock's. Fitted per rank
    (ranks_per_host=1), their steady end differences (2.24 ms per pair) pass for offsets."""
    report = analyze(H100 / name, jobs=1)
    offsets = report.offsets
    assert set(offsets["host_source"]) == {"shared_device"}
    assert offsets["host"].n_unique() == 1
    assert (offsets["offset_ns"] == 0).all()
    assert offsets["method"].to_list() == ["reference"] + ["same-host"] * (offsets.height - 1)
    raw = analyze(H100 / name, jobs=1, align=False)
    skew = ["instance", "arrival_skew_ns", "last_rank"]
    assert report.collective_instances.select(skew).equals(raw.collective_instances.select(skew))
    per_rank = analyze(H100 / name, jobs=1, ranks_per_host=1).offsets
    assert set(per_rank["host_source"]) == {"ranks_per_host"}
    assert per_rank["host"].n_unique() == per_rank.height
    if name in ("tp-2", "tp-dp-8"):  # what the per-rank fit invents on one clock
        assert per_rank["offset_ns"].abs().max() > 1_000_000


def test_host_names_group_the_ranks():
    """The gloo captures' headers say "host_name": "vm": one host, whatever their devices."""
    report = analyze(SAMPLES / "ddp-4", jobs=1)
    assert report.ranks["host_name"].to_list() == ["vm"] * 4
    assert report.offsets["host"].to_list() == ["vm"] * 4
    assert set(report.offsets["host_source"]) == {"host_name"}
    two = analyze(SAMPLES / "ddp-4", jobs=1, ranks_per_host=2).offsets
    assert two["host"].to_list() == ["host 0", "host 0", "host 1", "host 1"]


def test_ordinal_is_the_position_within_each_key_in_frame_order() -> None:
    """match._ordinal (a sort and a boundary scan) against the window it replaces."""
    import random

    from kineto_comm.analysis.match import _ordinal

    rng = random.Random(7)
    n = 5_000
    rows = pl.DataFrame(
        {
            "rank": [rng.randrange(4) for _ in range(n)],
            "_pg": [rng.choice(["0", "1", "?"]) for _ in range(n)],
            "seq": [rng.choice([None, *range(30)]) for _ in range(n)],
        },
        schema={"rank": pl.Int64, "_pg": pl.String, "seq": pl.Int64},
    )
    window = rows.select(pl.int_range(pl.len(), dtype=pl.Int64).over("rank", "_pg", "seq"))
    assert _ordinal(rows, "rank", "_pg", "seq").to_list() == window.to_series().to_list()
    assert _ordinal(rows.head(1), "rank").to_list() == [0]


def _reference_instances(rows: pl.DataFrame) -> list[int]:
    """Instance numbers computed row by row in Python, as docs/tables.md defines them: the
    key of each call (by kind), numbered in (process_group, key_kind, key) order."""
    rows = rows.sort("rank", "start_ns", maintain_order=True)
    data = rows.to_dicts()
    seq_groups = {}
    for r in data:
        pg = r["process_group"] or "?"
        if not (r["collective"] in ("send", "recv", "send_recv") and r["peer"] is not None):
            seq_groups[pg] = seq_groups.get(pg, True) and r["seq"] is not None
    counts: dict[tuple, int] = {}
    keys = []
    for r in data:
        pg = r["process_group"] or "?"
        is_p2p = r["collective"] in ("send", "recv", "send_recv")
        recv = r["collective"] == "recv"
        sender, receiver = (r["peer"], r["rank"]) if recv else (r["rank"], r["peer"])
        by_direction = ("d", r["rank"], pg, sender, receiver)
        by_number = ("n", r["rank"], pg, r["seq"])
        for k in (by_direction, by_number):
            counts[k] = counts.get(k, -1) + 1
        if is_p2p and r["peer"] is not None:
            key = ("p2p", f"{sender}>{receiver}#{counts[by_direction]}")
        elif is_p2p:
            key = ("unpaired", f"r{r['rank']}:{r['collective']}#{r['call_index']}")
        elif seq_groups[pg]:
            key = ("seq", f"{r['seq']}.{counts[by_number]}")
        else:
            key = ("order", f"{r['collective']}#{r['call_index']}")
        keys.append((pg, *key))
    number = {k: i for i, k in enumerate(sorted(set(keys)))}
    return [number[k] for k in keys]


def test_match_keys_agree_with_a_row_by_row_reference_in_any_row_order(jobs):
    """Every key kind at once (sequence numbers, call order, paired and unpaired transfers),
    from rows in call order (no sort) and shuffled (sorted first): the same instances."""
    folder, _ = jobs["pp"]
    coll = analyze(folder, jobs=1).collectives
    collective = coll.filter(~pl.col("collective").is_in(["send", "recv"]))
    first_group = collective["process_group"].drop_nulls()[0]
    lose_peer = (pl.col("collective") == "send") & (pl.col("rank") == 0)
    coll = coll.with_columns(
        # One group without sequence numbers (matched by call order) ...
        seq=pl.when(pl.col("process_group") == first_group).then(None).otherwise("seq"),
        # ... and rank 0's sends without a peer (a trace that records none: unpaired).
        peer=pl.when(lose_peer).then(None).otherwise("peer"),
    )
    cols = ["rank", "start_ns", "instance", "key_kind", "key"]
    ordered = match_keys(coll).select(cols)
    assert set(ordered["key_kind"]) == {"seq", "order", "p2p", "unpaired"}
    assert ordered["instance"].to_list() == _reference_instances(coll)
    shuffled = match_keys(coll.sample(fraction=1.0, shuffle=True, seed=3)).select(cols)
    # (Calls of one rank that start together, such as a send and a recv, may swap places.)
    assert shuffled.sort(cols).equals(ordered.sort(cols))


def test_merged_tables_are_in_rank_order_whatever_the_file_names(tmp_path):
    """Files whose names sort against their ranks (rank 3 first): the merged tables still
    run rank by rank, with each rank's rows in its own order."""
    import shutil

    for i, name in enumerate(["d", "c", "b", "a"]):
        shutil.copy(SAMPLES / "pp-4" / f"rank-{i}.pt.trace.json.gz", tmp_path / f"{name}.json.gz")
    renamed = analyze(tmp_path, jobs=1)
    original = analyze(SAMPLES / "pp-4", jobs=1)
    assert renamed.ranks["file"].to_list()[0].endswith("d.json.gz")
    for name in ("collectives", "steps", "totals"):
        table = getattr(renamed, name)
        assert table["rank"].is_sorted(), name
        assert table.equals(getattr(original, name)), name
    assert renamed.collective_instances.equals(original.collective_instances)


@pytest.mark.parametrize("instance_base", [0, 2**61])
@pytest.mark.parametrize("repeated", [False, True])
def test_a_call_repeated_on_a_rank_is_found_in_any_batch(instance_base, repeated):
    """one_row_per_call (what decides whether instances count rows or distinct ranks, and
    whether offsets take each pair's latest end) finds a rank's repeated call whatever the
    batches, also where instance and rank cannot share one integer (ids near 2**61)."""
    from kineto_comm.analysis.match import one_row_per_call
    from kineto_comm.rank_store import Part, RankStore

    rows = pl.DataFrame(
        {
            "instance": [0, 0, instance_base + 1, instance_base + 1, instance_base + 2, None],
            "rank": [0, 1, 0, 1, 1, 1],
            "end_ns": [100, 130, 200, 260, 300, 310],
        }
    )
    if repeated:  # rank 1 ran instance 1 twice (e.g. a kernel split in two)
        rows = pl.concat(
            [rows, pl.DataFrame({"instance": [instance_base + 1], "rank": [1], "end_ns": [250]})]
        )
    rows = rows.with_columns(pl.col("instance").cast(pl.Int64))
    per_rank = [Part(rows=g.height, frame=g) for _, g in rows.group_by("rank", maintain_order=True)]
    assert one_row_per_call(RankStore.from_frame(rows)) is not repeated
    assert one_row_per_call(RankStore(per_rank)) is not repeated  # a batch per rank


def test_offsets_the_same_when_a_call_repeats_on_a_rank(jobs):
    """A rank's call seen twice (the same instance on two rows, the second ending earlier)
    leaves the estimated offsets as they were."""
    from kineto_comm.analysis.align import estimate_offsets

    folder, _ = jobs["skew"]
    report = analyze(folder, jobs=1)
    keyed = match_keys(report.collectives)
    ranks = report.ranks["rank"].to_list()
    base = estimate_offsets(keyed, ranks)
    extra = keyed.filter(pl.col("instance").is_not_null()).head(3)
    twice = pl.concat([keyed, extra.with_columns(pl.col("end_ns") - 1)])
    assert twice.select(pl.struct("instance", "rank").is_duplicated().any()).item()
    assert estimate_offsets(twice, ranks).equals(base)


def test_straggler_tie_in_a_step_goes_to_the_lowest_rank_whatever_the_row_order():
    """Two ranks each last once in the same step, as late as each other: the step's "winner"
    (what `confidence` counts) is the lower rank, however the rows arrive."""
    from kineto_comm.analysis.stragglers import stragglers

    inst = pl.DataFrame(
        {
            "instance": [0, 1, 2],
            "step": [0, 0, 1],
            "ranks_seen": [3, 3, 3],
            "last_rank": [2, 1, 1],
            "arrival_skew_ns": [50_000, 50_000, 50_000],
            "last_start_ns": [150_000, 351_000, 550_000],
        }
    )
    # Each last rank is 40 us late of its own: rank 2 in call 0, rank 1 in 1 and 2 (in call
    # 1 it trails the second-latest by 41 us, 1 us of which its wait in call 0 held it up).
    starts = {0: [100_000, 110_000, 150_000], 1: [300_000, 351_000, 310_000]}
    starts[2] = [500_000, 550_000, 510_000]
    rows = [
        (i, r, starts[i][r], 0 if r == inst["last_rank"][i] else 1_000)
        for i in range(3)
        for r in range(3)
    ]
    waits = pl.DataFrame(rows, schema=["instance", "rank", "start_ns", "wait_ns"], orient="row")
    seen = set()
    for seed in range(12):
        shuffled = waits.sample(fraction=1.0, shuffle=True, seed=seed)
        table = stragglers(inst, shuffled, noise_ns=0)
        seen.add(tuple(table["confidence"].round(9)))
    assert len(seen) == 1, seen
    conf = dict(zip(table["rank"], table["confidence"], strict=True))
    # Step 0 is a tie, so rank 1 wins both steps: 2/2 x its 2/3 of the lateness.
    assert conf[1] > conf[2] and conf[2] == 0.0, conf


def test_a_job_without_a_usable_file_has_every_table_with_its_columns(tmp_path):
    # A CI script reading report.totals["exposed_comm_ns"] on a job whose traces are all
    # damaged gets no rows, not ColumnNotFoundError: every table has the columns and types
    # it has on a real job (they had none but `ranks`).
    (tmp_path / "rank-0.json").write_text("not json")
    empty = analyze(tmp_path)
    real = analyze(SAMPLES / "ddp-4")
    assert empty.errors and not real.errors
    tables = ["ranks", "totals", "offsets", "collective_instances", "stragglers", "storms"]
    tables += ["message_sizes", "message_size_summary", "process_groups", "pipeline"]
    for name in tables:
        assert getattr(empty, name).schema == getattr(real, name).schema, name
        assert getattr(empty, name).height == 0, name
    for name in ("rank_kernels", "rank_collectives", "rank_steps", "rank_waits"):
        store, full = getattr(empty, name), getattr(real, name)
        assert store.height == 0 and store.frame().schema == full.frame().schema, name


def test_files_of_different_jobs_are_not_compared():
    """HTA's _history holds three files of three jobs, years apart: one warning says so, one
    job is analysed and the other two files are left out, so no call is matched across them
    (before: a skew of 172 billion ms and a straggler delaying its groups by 1.7e12 ms per
    step)."""
    report = analyze(shared("hta/_history"), jobs=1)
    said = [w for w in report.warnings if w.startswith("files of 3 jobs")]
    assert len(said) == 1 and "time range)" in said[0]
    assert report.ranks["rank"].to_list() == [0]
    assert len(report.errors) == 2
    assert all("another job than ranks 0" in problem for _, problem in report.errors)
    span = (report.totals["end_ns"] - report.totals["start_ns"]).max()
    assert not [f for f in report.findings if f.impact_ns_per_step > span]
    # One job's files say nothing of the kind.
    assert not [w for w in analyze(SAMPLES / "tp-2", jobs=1).warnings if "jobs" in w]


@pytest.mark.parametrize(
    "path",
    [
        shared("hta/call_stack"),  # one profiled step: it is the complete one
        shared("hta/amd_trace"),  # two: the last is cut, one complete
        shared("hta/trace_filter"),  # two ranks of two steps
        shared("hta/nccl_parser_config"),  # three: two complete
        SAMPLES / "tp-2",
    ],
    ids=lambda p: p.name,
)
def test_fewer_than_two_complete_steps_are_said(path) -> None:
    """The report warns exactly when the model of time has one complete step to take every
    per-step figure from (two profiled steps leave one: `capture --steps 2` did, silently)."""
    report = analyze(path, jobs=1)
    complete = report.step_times.filter(pl.col("complete") & (pl.col("step") >= 0)).height
    said = [w for w in report.warnings if "profiled step" in w]
    assert complete >= 1
    assert bool(said) == (complete < 2), (complete, said)
    if said:
        assert "every per-step figure rests on that one step" in said[0]


def test_a_trace_of_one_step_says_its_figures_rest_on_it() -> None:
    """HTA's call_stack trace profiles one ProfilerStep: the report says every per-step
    figure rests on that step; a capture of three steps says nothing of the kind."""
    one = analyze(shared("hta/call_stack"), jobs=1, ignore=["ALL"])
    assert one.steps.filter(pl.col("step") >= 0)["step"].n_unique() == 1
    assert [w for w in one.warnings if "one profiled step" in w]
    three = analyze(SAMPLES / "tp-2", jobs=1, ignore=["ALL"])
    assert not [w for w in three.warnings if "one profiled step" in w]


def test_a_group_name_with_two_rank_lists_is_said(tmp_path) -> None:
    """One job names each group once: the H100 tp-dp-8 capture's files agree. Rank 3's file
    edited to list other ranks for its tensor-parallel group '2' gives one line naming the
    group and the files that disagree."""
    import gzip
    import json
    import shutil

    src = REPO / "tests" / "data" / "h100-nccl" / "tp-dp-8"
    assert not [w for w in analyze(src, jobs=1, ignore=["ALL"]).warnings if "lists" in w]
    job = tmp_path / "job"
    shutil.copytree(src, job)
    victim = next(job.glob("rank-3.*"))
    doc = json.loads(gzip.decompress(victim.read_bytes()))
    groups = doc["distributedInfo"]["pg_config"]
    tp = next(g for g in groups if g["pg_name"] == "2")
    tp["ranks"] = [3, 4]
    victim.write_bytes(gzip.compress(json.dumps(doc).encode()))
    said = [w for w in analyze(job, jobs=1, ignore=["ALL"]).warnings if "lists" in w]
    assert said == [
        "process group '2' lists different ranks in the files of ranks 2, 3 (2 versions): the "
        "files may come from different jobs, or the groups were named per rank"
    ]


GLOO_TP_DP = REPO / "tests" / "data" / "gloo" / "tp-dp-4"


def test_calls_that_name_no_group_in_a_job_of_several_groups_stay_alone() -> None:
    """The real 4-rank gloo capture of tensor (ranks 0-1, 2-3) and data parallelism (0-2,
    1-3): gloo names no group on its calls, and each rank is in groups of different ranks,
    so which ranks a call joined cannot be told. Matched by their order, rank 0's k-th call
    met the k-th of every rank, a tensor-parallel all-reduce of ranks 0-1 with that of 2-3,
    and the report counted 307 ms of waits where the layout's own groups give 98 ms (by the
    calls' shapes: [8, 32, 64] activations are the tensor-parallel ones). Now no call is
    matched with another rank's, the report says why, and nothing reads a wait into them."""
    from kineto_comm.rules_api import Tables, collective_waits, step_blame

    report = analyze(GLOO_TP_DP, jobs=1)
    assert report.ranks["pg_rank_sets"].to_list() == [3, 3, 3, 3]
    calls = report.collectives
    assert calls.height and calls["process_group"].null_count() == calls.height
    inst = report.collective_instances
    assert inst.height == calls.height
    assert set(inst["key_kind"]) == {"ungrouped"} and (inst["ranks_seen"] == 1).all()
    assert inst["busbw_gbps"].null_count() == inst.height  # the group's size is unknown
    (warning,) = [w for w in report.warnings if "name no process group" in w]
    assert f"{calls.height} calls" in warning and "ranks 0, 1, 2, 3" in warning
    assert (report.collective_waits["wait_ns"] == 0).all()
    assert not report.stragglers["is_straggler"].any()
    tables = Tables(report)
    assert (collective_waits(tables)["wait_ns"] == 0).all()
    assert step_blame(tables).filter(pl.col("category") == "wait").collect().height == 0
    assert not {"SYNC101", "SYNC104"} & {f.code for f in report.findings}
    (skew,) = report.skew_summary().iter_rows(named=True)
    assert skew["mean_skew_ns"] is None and skew["p95_skew_ns"] is None


def test_named_calls_of_a_job_of_several_groups_are_matched() -> None:
    """The real 8-rank NCCL capture of the same layout names each call's group: its ranks
    are in groups of different ranks too, and every call meets its group's."""
    report = analyze(H100 / "tp-dp-8", jobs=1)
    assert (report.ranks["pg_rank_sets"] > 1).all()
    inst = report.collective_instances
    assert "ungrouped" not in set(inst["key_kind"])
    assert (inst["ranks_seen"] == inst["group_size"]).all()
    assert not any("name no process group" in w for w in report.warnings)


@pytest.mark.parametrize(
    "path",
    [
        REPO / "tests" / "data" / "h100-nccl" / "pp-4",
        REPO / "tests" / "data" / "h200-nccl" / "pp-dp-8",
    ],
    ids=["h100-pp-4", "h200-pp-dp-8"],
)
def test_a_send_that_ended_before_its_peer_arrived_waited_for_no_one(path) -> None:
    """NCCL completes a small send into the receiver's buffer: on these pipeline captures
    some sends end before their receive starts (h100 pp-4: 48 of 144 calls, up to 6.6 ms
    before). Such a call waited for no one (wait 0; the replay's timeline does not hold it
    until its peer arrives); no call waits longer than it lasts; a receive that started first waited
    for its send's start."""
    report = analyze(path, jobs=1, ignore=["ALL"])
    waits = report.collective_waits.join(
        report.collective_instances.select("instance", "last_start_ns", "key_kind"), on="instance"
    )
    assert (waits["wait_ns"] <= waits["duration_ns"]).all()
    early = waits.filter(pl.col("end_ns") <= pl.col("last_start_ns"))
    assert early.height > 0 and (early["key_kind"] == "p2p").all()
    assert (early["wait_ns"] == 0).all()
    # The replay does not hold them until their peer arrives (no `sync` row).
    tables = Tables(report)
    rows = tables.collect(replay_timeline(tables)).join(
        early.select("rank", at_ns="start_ns"), on=["rank", "at_ns"]
    )
    assert rows.height >= early.height and not rows["sync"].fill_null(False).any()
    waited = waits.filter(pl.col("end_ns") > pl.col("last_start_ns"))
    assert (waited["wait_ns"] == waited["last_start_ns"] - waited["start_ns"]).all()
    assert (waited["wait_ns"] > 0).any()
