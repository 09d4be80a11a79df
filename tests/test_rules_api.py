"""The rules API's way through big jobs: lazy tables, derived per-rank tables, exact medians
from counts, and lazy waits and exposure that equal the whole-table definitions."""

from __future__ import annotations

import random

import polars as pl
import pytest

from kineto_comm import analyze, budget, rank_store, rules_api
from kineto_comm.analysis import derived
from kineto_comm.analysis.derived import DERIVED
from kineto_comm.rank_store import RankStore, keep
from kineto_comm.rules_api import (
    Tables,
    collective_exposure,
    collective_waits,
    collective_waits_lazy,
    impact_per_step,
    median_of_counts,
    step_blame,
)

from .conftest import REPO, SAMPLES


@pytest.mark.parametrize("seed", range(6))
def test_median_of_counts_is_polars_median_over_the_rows(seed):
    rng = random.Random(seed)
    rows = []
    for group in range(rng.randint(1, 6)):
        sizes = [rng.choice([None, 1, 8, 8, 64, 4096, 2**20]) for _ in range(rng.randint(1, 40))]
        rows += [(f"g{group % 3}", group, size) for size in sizes]
    calls = pl.DataFrame(rows, schema=["pg", "k", "bytes"], orient="row")
    want = calls.group_by("pg", "k").agg(median=pl.col("bytes").median())
    counts = calls.group_by("pg", "k", "bytes").agg(n=pl.len())
    got = median_of_counts(counts, ["pg", "k"], "bytes", "n")
    joined = want.join(got, on=["pg", "k"], how="full", coalesce=True)
    assert joined.height == want.height == got.height
    assert joined.filter(~pl.col("median").eq_missing(pl.col("median_right"))).is_empty()


def _ddp(spill: bool, monkeypatch) -> Tables:
    if spill:
        monkeypatch.setattr(budget, "SPILL_ABOVE", 0)
        monkeypatch.setattr(rank_store, "BATCH_ROWS", 1)  # a batch per rank
    report = analyze(SAMPLES / "ddp-4", jobs=1)
    assert report.rank_collectives.spilled == spill
    return Tables(report)


def _waits_by_definition(tables: Tables) -> pl.DataFrame:
    """collective_waits as documented, over the whole tables with window functions: a call
    of an instance every rank of its group ran waits from its arrival to the last one's (at
    most its duration); any other for its duration less the shortest of the same call."""
    coll = tables["collectives"]
    key = ["process_group", "collective", "call_index"]
    grouped = ~pl.col("collective").is_in(["send", "recv", "send_recv"])
    inst = tables["collective_instances"].filter(
        (pl.col("key_kind") != "p2p")
        & (pl.col("ranks_seen") == pl.col("group_size"))
        & (pl.col("ranks_seen") > 1)
    )
    arrival = (
        tables["collective_waits"]
        .join(inst.select("instance", "last_start_ns"), on="instance")
        .group_by("rank", "start_ns")
        .agg(_arr=(pl.col("last_start_ns") - pl.col("start_ns")).max())
    )
    shortest = pl.col("duration_ns") - pl.col("duration_ns").min().over(key)
    waited = (
        pl.when(grouped & pl.col("_arr").is_not_null())
        .then(pl.col("_arr").clip(0, pl.col("duration_ns")))
        .when(grouped)
        .then(shortest)
        .otherwise(0)
    )
    return (
        coll.join(arrival, on=["rank", "start_ns"], how="left", maintain_order="left")
        .with_columns(
            transfer_ns=pl.col("duration_ns") - waited,
            ranks_seen=pl.when(grouped).then(pl.len().over(key)).otherwise(1).cast(pl.Int64),
        )
        .drop("_arr")
        .with_columns(wait_ns=pl.col("duration_ns") - pl.col("transfer_ns"))
        .with_columns(arrived_last=pl.col("wait_ns") == 0)
    )


@pytest.mark.parametrize("spill", [False, True])
def test_lazy_waits_and_exposure_follow_their_definitions(spill, monkeypatch):
    tables = _ddp(spill, monkeypatch)
    waits = collective_waits(tables)
    assert waits.equals(_waits_by_definition(tables))
    assert waits.equals(tables.collect(collective_waits_lazy(tables)))
    assert (waits["wait_ns"] > 0).any() and waits["arrived_last"].any()
    # A call's exposure is the time the model of time charges to it: per (rank, step) the
    # calls' exposure adds up to the blame's communication rows exactly.
    blame = tables.collect(step_blame(tables))
    for transfer_only, cats in (
        (True, ["transfer", "pipeline_bubble"]),
        (False, ["transfer", "pipeline_bubble", "wait"]),
    ):
        exposure = collective_exposure(tables, transfer_only)
        assert exposure.drop("exposed_ns", "last_call").equals(waits), transfer_only
        assert 0 < exposure["exposed_ns"].sum() < exposure["duration_ns"].sum()
        per_step = exposure.group_by("rank", "step").agg(pl.col("exposed_ns").sum())
        charged = (
            blame.filter(pl.col("category").is_in(cats))
            .group_by("rank", "step")
            .agg(exposed_ns=pl.col("ns").sum())
        )
        both = per_step.join(charged, on=["rank", "step"], how="full", coalesce=True)
        both = both.with_columns(pl.col("exposed_ns", "exposed_ns_right").fill_null(0))
        assert both["exposed_ns"].equals(both["exposed_ns_right"], check_names=False), both
        # Never more than the part of the call it is the exposure of.
        length = pl.col("transfer_ns") if transfer_only else pl.col("duration_ns")
        assert exposure.select((pl.col("exposed_ns") <= length).all()).item()
    # The transfer alone is never more exposed than the whole call.
    both = (
        collective_exposure(tables, True)["exposed_ns"]
        <= collective_exposure(tables, False)["exposed_ns"]
    )
    assert both.all()


def test_derived_tables_are_built_once_per_rules_run_and_kept_like_their_source(monkeypatch):
    tables = _ddp(True, monkeypatch)
    built = []

    def per_batch(calls: pl.DataFrame) -> pl.DataFrame:
        built.append(calls["rank"].unique().to_list())
        return calls.group_by("rank").agg(calls=pl.len())

    first = tables.derived(("test", "calls"), "collectives", per_batch, ["rank"])
    again = tables.derived(("test", "calls"), "collectives", per_batch, ["rank"])
    assert sorted(built) == [[0], [1], [2], [3]]  # one batch per rank, built once
    store = tables._memo[("test", "calls")]
    assert store.spilled  # the source is in files, so is what is derived from it
    want = tables["collectives"].group_by("rank").agg(calls=pl.len()).sort("rank")
    assert tables.collect(first).sort("rank").equals(want)
    assert tables.collect(again).equals(tables.collect(first))


# The rule API's readers of the registry (kineto_comm.analysis.derived), by table name.
READERS = {
    "step_times": rules_api.step_times,
    "rank_blame": rules_api.step_blame,
    "replay_timeline": rules_api.replay_timeline,
    "call_waits": rules_api.collective_waits_lazy,
    "call_exposure": rules_api.collective_exposure_lazy,
    "group_roles": rules_api.group_roles,
    "cost_fit": rules_api.cost_fit,
    "all_to_all_volume": rules_api.all_to_all_volume,
    "queue_shift": rules_api.queue_shift,
    "attribution": rules_api.attribution,
}


def _frame(value: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    frame = value.collect() if isinstance(value, pl.LazyFrame) else value
    if frame.schema.get("process_group") == pl.String:  # Tables' "?" for an unnamed group
        frame = frame.with_columns(pl.col("process_group").fill_null("?"))
    return frame


def _rows(frame: pl.DataFrame) -> pl.DataFrame:
    """The frame's rows in one order (a table built in batches has no order of its own)."""
    return frame.sort([c for c, t in frame.schema.items() if not t.is_nested()], nulls_last=True)


@pytest.mark.parametrize("spill", [False, True])
def test_derived_tables_read_by_name_are_the_readers_tables(spill, monkeypatch):
    """Every public derived table reads by name (`tables[name]`, `tables.lazy(name)`) as the
    rule API's reader gives it (the Report's own where it holds one), on an expert-parallel
    job in memory and spilled to files; it has the columns the registry declares, and is
    built once per Tables (a second read is the same frame). `step_blame` by name is the
    critical rank's rows: per step they sum to the step's time."""
    if spill:
        monkeypatch.setattr(budget, "SPILL_ABOVE", 0)
        monkeypatch.setattr(rank_store, "BATCH_ROWS", 1)
    report = analyze(SAMPLES / "ep-4", jobs=1)
    assert report.rank_collectives.spilled == spill
    public = [name for name, d in DERIVED.items() if d.public]
    assert set(READERS) == set(public) - {"step_blame"}
    tables = Tables(report)
    for name in public:
        table = tables[name]
        assert set(DERIVED[name].columns) <= set(table.columns), name
        if name in READERS:
            # The Report's own step_times adds each step's critical path to the same rows.
            fresh = Tables(report)  # kept while its lazy tables' files are read
            read = _frame(READERS[name](fresh))
            assert _rows(read).equals(_rows(table.select(read.columns))), name
        if DERIVED[name].lazy:
            assert _rows(tables.collect(tables.lazy(name))).equals(_rows(table)), name
        elif name != "step_blame":
            assert derived.read(tables, name) is derived.read(tables, name), name
    # What the rules of this job read is there (all-to-alls with sizes: a volume per rank).
    for name in ("step_times", "rank_blame", "call_exposure", "cost_fit", "all_to_all_volume"):
        assert tables[name].height > 0, name
    assert tables["all_to_all_volume"]["rank"].sort().to_list() == [0, 1, 2, 3]
    listed = (REPO / "docs" / "tables.md").read_text().split("## Derived tables")[1]
    assert [n for n in public if f"| `{n}` |" not in listed] == []  # documented
    blame = tables["step_blame"].group_by("step").agg(pl.col("ns").sum())
    times = tables["step_times"].join(blame, on="step")
    assert times.height == tables["step_times"].height
    assert (times["ns"] == times["step_ns"]).all()


def test_lazy_tables_normalise_groups_and_impact_takes_lazy_rows(monkeypatch):
    tables = Tables(
        {
            "collectives": pl.DataFrame(
                {
                    "rank": [0, 0, 1, 1],
                    "step": [0, 1, 0, 1],
                    "process_group": [None, "1", None, "1"],
                    "cost": [5, 7, 3, 9],
                }
            )
        }
    )
    lazy = tables.lazy("collectives", ["rank", "step", "process_group", "cost", "nope"])
    assert lazy.collect_schema().names() == ["rank", "step", "process_group", "cost"]
    assert tables.collect(lazy)["process_group"].to_list() == ["?", "1", "?", "1"]
    eager = impact_per_step(tables["collectives"], "cost", ["process_group"])
    lazily = impact_per_step(lazy, "cost", ["process_group"], tables=tables)
    assert eager.sort("process_group").equals(lazily.sort("process_group"))
    # Per group: the worst rank per step, averaged over the job's steps (two here).
    assert dict(zip(eager["process_group"], eager["impact_ns"], strict=True)) == {
        "?": 2.5,
        "1": 4.5,
    }
    # A job below the sample size keeps every row.
    assert tables.collect(tables.sample(lazy, "rank")).equals(tables.collect(lazy))


def _impact_by_definition(rows: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """impact_per_step as documented, over every rank's sums per (by, rank, step) at once."""
    per = rows.group_by([*by, "rank", "step"]).agg(v=pl.col("cost").sum(), calls=pl.len())
    if (per["step"] >= 0).any():
        per = per.filter(pl.col("step") >= 0)
    n = max(1, per["step"].n_unique())
    impact = (
        per.group_by([*by, "step"])
        .agg(pl.col("v").max())
        .group_by(by)
        .agg(impact_ns=pl.col("v").sum() / n)
    )
    members = (
        per.filter(pl.col("v") > 0)
        .group_by(by)
        .agg(
            ranks=pl.col("rank").unique().sort(),
            steps=pl.col("step").unique().sort(),
            calls=pl.col("calls").mean().round().cast(pl.Int64),
        )
    )
    return impact.join(members, on=by, how="left", nulls_equal=True)


@pytest.mark.parametrize("seed", range(8))
def test_impact_folded_over_views_of_a_few_ranks_follows_its_definition(seed, monkeypatch):
    """A function of the tables is called on views of a few whole ranks (here: one rank
    each) and the sums are folded per step: the same result as all ranks' sums at once."""
    monkeypatch.setattr(rank_store, "SLICE_ROWS", 1)
    rng = random.Random(seed)
    n_ranks = rng.randint(1, 6)
    steps = [-1, 0, 1, 2, 3] if rng.random() < 0.7 else [-1]
    rows = [
        (rank, rng.choice(steps), rng.choice(["a", "b", "?"]), rng.choice([0, 0, 1, 5, 40]))
        for rank in range(n_ranks)
        for _ in range(rng.randint(0, 12))
    ]
    calls = pl.DataFrame(rows, schema=["rank", "step", "process_group", "cost"], orient="row")
    parts = [keep(calls.filter(pl.col("rank") == r), None) for r in range(n_ranks)]
    tables = Tables({"collectives": RankStore(parts)})
    seen = []

    def costs(view: Tables) -> pl.LazyFrame:
        seen.append(view.collect(view.lazy("collectives", ["rank"]))["rank"].unique().to_list())
        return view.lazy("collectives")

    got = impact_per_step(costs, "cost", ["process_group"], tables=tables)
    want = _impact_by_definition(calls, ["process_group"])
    assert got.sort("process_group").equals(want.select(got.columns).sort("process_group"))
    # Planned on every rank, then run on a view per rank (each rank in exactly one).
    with_rows = sorted(calls["rank"].unique().to_list())
    if len(with_rows) > 1:
        assert sorted(seen[0]) == with_rows
        assert sorted(r for s in seen[1:] for r in s) == with_rows
        assert all(len(s) <= 1 for s in seen[1:]) and len(seen) > 2
    overall = impact_per_step(costs, "cost", tables=tables)
    assert (
        overall["impact_ns"].to_list()
        == _impact_by_definition(calls.with_columns(k=pl.lit(0)), ["k"])["impact_ns"].to_list()
    )


@pytest.mark.parametrize(
    "path",
    [
        REPO / "tests" / "data" / "h100-nccl" / "ddp-4",
        REPO / "tests" / "data" / "h100-nccl" / "tp-2",
        SAMPLES / "fsdp-2",
    ],
    ids=lambda p: p.name if p.parent == SAMPLES else f"h100/{p.name}",
)
def test_one_wait_per_call_whatever_reads_it(path) -> None:
    """Real captures whose calls end up to 11 ms apart (four NCCL ranks sharing one H100;
    gloo rings): every call's wait in the rule API, the blame's and SYNC104's input, is
    the report's collective_waits (the stragglers table's and the critical path's) for
    the same call, where every rank of its group was traced. The shortest member's
    duration read 1.8x the waits on h100/ddp-4 and a ninth of them on h100/tp-2."""
    report = analyze(path, jobs=1)
    mine = collective_waits(Tables(report)).select("rank", "start_ns", "wait_ns", "transfer_ns")
    theirs = report.collective_waits.join(
        report.collective_instances.select("instance", "ranks_seen", "group_size"),
        on="instance",
    ).filter(pl.col("ranks_seen") == pl.col("group_size"))
    both = theirs.join(mine, on=["rank", "start_ns"], suffix="_api")
    assert both.height == theirs.height > 0
    assert both["wait_ns_api"].to_list() == both["wait_ns"].clip(0, both["duration_ns"]).to_list()
    assert (both["transfer_ns"] == both["duration_ns"] - both["wait_ns_api"]).all()
    assert (both["wait_ns"] > 0).any()
