"""The immutable result of an analysis: merged per-rank tables, errors and findings.

Why one object: every renderer, rule and `diff` reads the same tables, so no two parts of
the report can disagree about a number. Each table (`TABLE_NAMES`) is documented column by
column in docs/tables.md; times are integer nanoseconds, sizes bytes. The per-rank tables
(`kernels`, `collectives`, `collective_waits`, `steps`) are properties over their
`RankStore` (`STORES`: a big job keeps them in files, kineto_comm.rank_store), read whole,
a few ranks at a time (`.batches()`) or as one query (`.lazy()`). The model of time
(`step_times`, `step_blame`, `savings`, `blame_accounts`, `critical_path`,
`critical_path_kernels`) is filled after the rules run (rules_engine.step_model);
`interference` and `inferred_config` after the cross-rank tables (analyze.py);
`collective_summary()` aggregates collectives per rank, collective, process group and dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import polars as pl

from kineto_comm.analysis.overlap import METRICS
from kineto_comm.analysis.stragglers import NOISE_NS
from kineto_comm.lazy import collect
from kineto_comm.rank_store import RankStore
from kineto_comm.version import __version__

SCHEMA_VERSION = 1
TABLE_NAMES = (
    "ranks",
    "kernels",
    "collectives",
    "steps",
    "totals",
    "offsets",
    "collective_instances",
    "collective_waits",
    "stragglers",
    "message_sizes",
    "message_size_summary",
    "process_groups",
    "pipeline",
    "storms",
    "all_to_all_pairs",
    "all_to_all_loads",
    "model_comparison",
    "step_times",
    "critical_path",
    "critical_path_kernels",
    "step_blame",
    "framework",
    "interference",
    "inferred_config",
    "hardware",
    "expected_busbw",
    "attribution",
)

# The tables kept per rank (kineto_comm.rank_store), by name -> the Report's field for them.
STORES = {
    "kernels": "rank_kernels",
    "collectives": "rank_collectives",
    "steps": "rank_steps",
    "collective_waits": "rank_waits",
}


def _known_sum(column: str) -> pl.Expr:
    """The column's sum, null (unknown, not 0) where no row has a value: calls whose trace
    gives no size."""
    return pl.when(pl.col(column).is_not_null().any()).then(pl.col(column).sum())


# The bandwidths of a matched call (collective_instances), by nccl-tests' definitions, and
# its share of what its link should give (analysis.hardware).
_BANDWIDTHS = ("algbw_gbps", "busbw_gbps", "expected_busbw_gbps", "speed_of_light")


@dataclass(frozen=True)
class Report:
    """Everything `analyze()` found. Treat the tables as read-only."""

    ranks: pl.DataFrame
    totals: pl.DataFrame
    rank_steps: RankStore = field(default_factory=RankStore)
    rank_kernels: RankStore = field(default_factory=RankStore)
    rank_collectives: RankStore = field(default_factory=RankStore)
    offsets: pl.DataFrame = field(default_factory=pl.DataFrame)
    collective_instances: pl.DataFrame = field(default_factory=pl.DataFrame)
    rank_waits: RankStore = field(default_factory=RankStore)
    stragglers: pl.DataFrame = field(default_factory=pl.DataFrame)
    message_sizes: pl.DataFrame = field(default_factory=pl.DataFrame)
    message_size_summary: pl.DataFrame = field(default_factory=pl.DataFrame)
    process_groups: pl.DataFrame = field(default_factory=pl.DataFrame)
    pipeline: pl.DataFrame = field(default_factory=pl.DataFrame)
    storms: pl.DataFrame = field(default_factory=pl.DataFrame)
    # Each all-to-all's bytes per (sender, receiver) and each receiver's load
    # (kineto_comm.analysis.alltoall).
    all_to_all_pairs: pl.DataFrame = field(default_factory=pl.DataFrame)
    all_to_all_loads: pl.DataFrame = field(default_factory=pl.DataFrame)
    model_comparison: pl.DataFrame = field(default_factory=pl.DataFrame)
    # What the trace shows of the framework: the settings in use (analysis.framework).
    framework: pl.DataFrame = field(default_factory=pl.DataFrame)
    # Kernels slower beside the other kind than alone (kineto_comm.analysis.interference).
    interference: pl.DataFrame = field(default_factory=pl.DataFrame)
    # The training configuration the trace tells (analysis.inferred_config): one row.
    inferred_config: pl.DataFrame = field(default_factory=pl.DataFrame)
    # What the hardware should give (analysis.hardware): each rank's device and GPU model,
    # and each group's expected bus bandwidth per collective.
    hardware: pl.DataFrame = field(default_factory=pl.DataFrame)
    expected_busbw: pl.DataFrame = field(default_factory=pl.DataFrame)
    # The model of time (kineto_comm.analysis.steptime): per step its time and critical
    # rank, the critical rank's blame rows, and the savings of the findings' fixes.
    step_times: pl.DataFrame = field(default_factory=pl.DataFrame)
    # The critical path of each step as segments on its ranks, and kernel by kernel
    # (kineto_comm.analysis.depgraph: the walk back along the kernel dependency graph).
    critical_path: pl.DataFrame = field(default_factory=pl.DataFrame)
    critical_path_kernels: pl.DataFrame = field(default_factory=pl.DataFrame)
    step_blame: pl.DataFrame = field(default_factory=pl.DataFrame)
    # The median step's largest non-compute costs and the findings that take them out, or
    # why none does (kineto_comm.analysis.reconcile).
    blame_accounts: pl.DataFrame = field(default_factory=pl.DataFrame)
    # Where the calls' exposed time, waits and bubbles come from: phase x module x role x
    # collective (kineto_comm.analysis.attribution).
    attribution: pl.DataFrame = field(default_factory=pl.DataFrame)
    savings: dict[str, Any] = field(default_factory=dict)
    errors: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    findings: tuple[Any, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    meta: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def kernels(self) -> pl.DataFrame:
        """Every rank's kernels (docs/tables.md), on the clock of the other tables."""
        return self.rank_kernels.frame()

    @property
    def collectives(self) -> pl.DataFrame:
        """Every rank's collective calls (docs/tables.md), on the clock of the other tables."""
        return self.rank_collectives.frame()

    @property
    def steps(self) -> pl.DataFrame:
        """Every rank's steps (docs/tables.md), on the clock of the other tables."""
        return self.rank_steps.frame()

    @property
    def collective_waits(self) -> pl.DataFrame:
        """Every rank's wait in every matched call (docs/tables.md)."""
        return self.rank_waits.frame()

    def table(self, name: str) -> pl.DataFrame:
        """A table by name (see TABLE_NAMES and docs/tables.md)."""
        if name not in TABLE_NAMES:
            raise KeyError(f"unknown table {name!r}; known: {', '.join(TABLE_NAMES)}")
        return getattr(self, name)

    def collective_summary(self) -> pl.DataFrame:
        """count, bytes (the nccl-tests size), in_bytes and out_bytes (what the rank put in
        and got out: sent and received, for all_to_all) and time per (rank, collective,
        process_group, dtype)."""
        keys = ["rank", "collective", "process_group", "dtype"]
        calls = self.rank_collectives
        if calls.height == 0:
            return pl.DataFrame(
                schema={
                    "rank": pl.Int64,
                    "collective": pl.String,
                    "process_group": pl.String,
                    "dtype": pl.String,
                    "count": pl.Int64,
                    "bytes": pl.Int64,
                    "in_bytes": pl.Int64,
                    "out_bytes": pl.Int64,
                    "total_ns": pl.Int64,
                }
            )
        return collect(
            calls.lazy([*keys, "bytes", "in_bytes", "out_bytes", "duration_ns"])
            .group_by(keys)
            .agg(
                count=pl.len().cast(pl.Int64),
                # No call with a size: unknown (null), not 0 bytes.
                bytes=_known_sum("bytes"),
                in_bytes=_known_sum("in_bytes"),
                out_bytes=_known_sum("out_bytes"),
                total_ns=pl.col("duration_ns").sum(),
            )
            .sort(["rank", "total_ns"], descending=[False, True]),
            calls.height,
        )

    def collective_totals(self) -> pl.DataFrame:
        """Per (collective, process_group, dtype) over all ranks: ranks, calls, bytes,
        mean_bytes, time_ns (kernel time, waiting included), and algbw_gbps and busbw_gbps,
        the medians over the calls of their `collective_instances` bandwidths (bytes over the
        call's transfer time, as nccl-tests measures them: busbw = algbw x the collective's
        factor in every row; a send and its recv share their transfer's; null where the
        calls have no size), expected_busbw_gbps and speed_of_light (their medians of what
        the link should give and of busbw / that: analysis.hardware; null where unknown),
        in the renderers' order (most time first).

        One aggregation over the per-rank calls, their instances' bandwidths joined in: a big
        job's calls are read once and not assembled."""
        keys = ["collective", "process_group", "dtype"]
        calls = self.rank_collectives
        if calls.height == 0:
            return pl.DataFrame(
                schema={
                    **dict.fromkeys(keys, pl.String),
                    **dict.fromkeys(("ranks", "calls", "bytes", "time_ns"), pl.Int64),
                    "mean_bytes": pl.Float64,
                    **dict.fromkeys(_BANDWIDTHS, pl.Float64),
                }
            )
        # Each call's bandwidths are its instance's (the rank's row in collective_waits, by
        # its start): a send and a recv both get their transfer's, each dtype its own calls'.
        inst = self.collective_instances
        if self.rank_waits.height and {"instance", *_BANDWIDTHS[:2]} <= set(inst.columns):
            # A Report built without the hardware's columns: unknown, not missing.
            known = inst.lazy().with_columns(
                pl.lit(None, pl.Float64).alias(c) for c in _BANDWIDTHS if c not in inst.columns
            )
            link = (
                self.rank_waits.lazy(["instance", "rank", "start_ns"])
                .unique(["rank", "start_ns"], keep="first")
                .join(known.select("instance", *_BANDWIDTHS), on="instance")
                .drop("instance")
            )
            rows = calls.lazy(["rank", "start_ns", *keys, "bytes", "duration_ns"]).join(
                link, on=["rank", "start_ns"], how="left"
            )
        else:
            rows = calls.lazy(["rank", *keys, "bytes", "duration_ns"]).with_columns(
                *[pl.lit(None, pl.Float64).alias(c) for c in _BANDWIDTHS]
            )
        return collect(
            rows.group_by(keys)
            .agg(
                pl.col("rank").n_unique().cast(pl.Int64).alias("ranks"),
                pl.len().cast(pl.Int64).alias("calls"),
                _known_sum("bytes").cast(pl.Int64).alias("bytes"),
                pl.col("bytes").mean().alias("mean_bytes"),
                pl.col("duration_ns").sum().cast(pl.Int64).alias("time_ns"),
                *[pl.col(c).median().cast(pl.Float64) for c in _BANDWIDTHS],
            )
            # Ties broken by name: the same report always renders the same document.
            .sort(["time_ns", *keys], descending=[True, False, False, False], nulls_last=True),
            calls.height,
        )

    def skew_summary(self) -> pl.DataFrame:
        """Per (process_group, collective): matched calls, arrival skew and bus bandwidth."""
        inst = self.collective_instances
        if inst.height == 0:
            return pl.DataFrame()
        shared = pl.col("arrival_skew_ns").filter(pl.col("ranks_seen") > 1)
        return (
            inst.group_by("process_group", "collective")
            .agg(
                calls=pl.len().cast(pl.Int64),
                ranks=pl.col("ranks_seen").max(),
                # Over the calls two ranks or more ran (one rank's call has no skew: null
                # where there is none). Interpolated as numpy and pandas (HTA) take
                # percentiles: the nearest call put the p95 of 12 below their mean when
                # one was an outlier.
                mean_skew_ns=shared.mean().round().cast(pl.Int64),
                p95_skew_ns=shared.quantile(0.95, interpolation="linear").round().cast(pl.Int64),
                median_busbw_gbps=pl.col("busbw_gbps").median(),
                # The calls the stragglers table counts (two ranks or more, a skew above
                # its noise). Ties are listed, all of them (as SYNC104 lists the ranks tied
                # for the most lateness): `most_often_last` is the lowest of them.
                most_often_last_ranks=pl.col("last_rank")
                .filter((pl.col("ranks_seen") > 1) & (pl.col("arrival_skew_ns") >= NOISE_NS))
                .mode()
                .sort(),
            )
            .with_columns(
                most_often_last=pl.col("most_often_last_ranks").list.first(),
                most_often_last_ranks=pl.col("most_often_last_ranks").cast(pl.List(pl.Int64)),
            )
            .select(pl.exclude("most_often_last_ranks"), "most_often_last_ranks")
            .sort(-pl.col("mean_skew_ns"), "process_group", "collective", nulls_last=True)
        )

    def _steps_by_rank(self) -> dict[int, Callable[[], pl.DataFrame]]:
        """Per rank with step rows, a function giving them (the JSON document's columns, in
        start order): the rows are read only when asked for, a rank at a time."""
        columns = ["step", "start_ns", "end_ns", *METRICS]
        store = self.rank_steps
        if store.height == 0:
            return {}
        if store.spilled:  # a big job: each rank's rows are read from its own file
            return {r: partial(_rank_steps, store, r, columns) for r in self.ranks["rank"]}
        # In memory: gathered by their positions in (rank, start) order, not sorted into a
        # copy of every rank's rows.
        by_rank: dict[int, Callable[[], pl.DataFrame]] = {}
        for steps in store.batches(columns=["rank", *columns]):
            order = steps.select(pl.arg_sort_by("rank", "start_ns")).to_series()
            ranks = steps.select(pl.col("rank").gather(order))
            rows, at = steps.select(columns), 0
            for r, n in ranks.group_by("rank", maintain_order=True).len().iter_rows():
                by_rank[r] = partial(_gather, rows, order.slice(at, n))
                at += n
        return by_rank

    def _to_dict(
        self, steps_of: Callable[[int, Callable[[], pl.DataFrame] | None], Any]
    ) -> dict[str, Any]:
        """The document's tables (what every analysis has; render.json_doc adds the
        summary, findings and the cross-rank tables), each rank's `steps` given by
        `steps_of(rank, rows)`, `rows()` giving its step rows: the JSON renderer writes them
        a rank at a time instead of holding every rank's rows as Python objects."""
        steps_by_rank = self._steps_by_rank()
        totals_by_rank = {row["rank"]: row for row in self.totals.iter_rows(named=True)}
        ranks = []
        for row in self.ranks.sort("rank").iter_rows(named=True):
            rank = row["rank"]
            total = totals_by_rank.get(rank)
            ranks.append(
                {
                    **row,
                    "steps": steps_of(rank, steps_by_rank.get(rank)),
                    "totals": None
                    if total is None
                    else {k: v for k, v in total.items() if k not in ("rank",)},
                }
            )
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "kineto-comm", "version": __version__},
            "units": {"time": "ns", "size": "bytes", "bandwidth": "GB/s (1 GB = 1e9 bytes)"},
            "ranks": ranks,
            "collectives": self.collective_summary().to_dicts(),
            "offsets": self.offsets.to_dicts(),
            "skew": self.skew_summary().to_dicts(),
            "stragglers": self.stragglers.to_dicts(),
            "process_groups": self.process_groups.to_dicts(),
            "message_sizes": self.message_size_summary.to_dicts(),
            "pipeline": self.pipeline.to_dicts(),
            "storms": self.storms.to_dicts(),
            "model_comparison": self.model_comparison.to_dicts(),
            "inferred_config": self.inferred_config.to_dicts(),
            "step_times": self.step_times.to_dicts(),
            "critical_path": self.critical_path.to_dicts(),
            "critical_path_kernels": self.critical_path_kernels.to_dicts(),
            "step_blame": self.step_blame.to_dicts(),
            "blame_accounts": self.blame_accounts.to_dicts(),
            "attribution": self.attribution.to_dicts(),
            "savings": dict(self.savings),
            "errors": [{"file": f, "message": m} for f, m in self.errors],
            "warnings": list(self.warnings),
            "findings": [f.to_dict() if hasattr(f, "to_dict") else f for f in self.findings],
        }


def _rank_steps(store: RankStore, rank: int, columns: list[str]) -> pl.DataFrame:
    """Rank `rank`'s step rows (only `columns`) in start order."""
    rows = store.frame([rank], columns)
    return rows.sort("start_ns", maintain_order=True).select(columns) if rows.width else rows


def _gather(frame: pl.DataFrame, rows: pl.Series) -> pl.DataFrame:
    """The rows of `frame` at positions `rows`, in that order."""
    return frame.select(pl.all().gather(rows))


def problem_lines(report: Report) -> list[str]:
    """The report's warnings, then one line per unusable file: `warning: ...`, `error:
    <file>: <problem>`. The end of a text file; on a terminal the CLI prints them to stderr
    instead, once."""
    # Here, not in render.text: the CLI prints them whatever the format, without loading
    # the text renderer (rich) for a JSON report.
    return [f"warning: {w}" for w in report.warnings] + [
        f"error: {file}: {message}" for file, message in report.errors
    ]
