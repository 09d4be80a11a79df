"""The public rule API: what a rule is, the tables it reads, and helpers it may use.

A rule is a pure function from the analysis tables (docs/tables.md) to findings, plus the
metadata users see in `kineto-comm rules` / `kineto-comm explain CODE`:

    from kineto_comm.rules_api import Finding, Option, Severity, Tables, rule

    @rule(
        code="XMPL101",
        name="too-many-all-reduces",
        summary="More than `limit` all-reduces per step.",
        tables=("collectives", "steps"),
        options=(Option("limit", 100, "All-reduces per rank and step that are fine."),),
    )
    def too_many_all_reduces(tables: Tables, options: dict) -> list[Finding]:
        '''What it does: ...  Why is this bad? ...  How to fix: ...'''
        ...

Everything here is stable: built-in rules (top-level `rules/`) use nothing else from
kineto_comm. Helpers are column-wise Polars; times are integer ns.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from kineto_comm.analysis.bandwidth import busbw_factor
from kineto_comm.analysis.overlap import merge_intervals
from kineto_comm.findings import Finding, Severity
from kineto_comm.rank_store import RankStore

__all__ = [
    "Finding",
    "Option",
    "Rule",
    "RuleFunction",
    "Severity",
    "Tables",
    "busbw_factor",
    "collective_exposure",
    "collective_waits",
    "group_roles",
    "hosts_of",
    "impact_per_step",
    "make_finding",
    "mean_step_ns",
    "n_steps",
    "parse_ranks",
    "rule",
    "severity_for",
    "uncovered_ns",
]

CODE_RE = re.compile(r"^[A-Z]+[0-9]+$")
NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
DOC_SECTIONS = ("What it does", "Why is this bad?", "How to fix")
SOURCES = ("built-in", "plugin", "file")


@dataclass(frozen=True)
class Option:
    """One rule option: its name, default value (which fixes its type) and what it means."""

    name: str
    default: Any
    description: str

    def coerce(self, value: Any) -> Any:
        """`value` converted to the default's type; ValueError when it cannot be."""
        kind = type(self.default)
        if self.default is None or isinstance(value, kind):
            return value
        if kind is bool:
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
                return value.lower() in ("true", "1")
            raise ValueError(f"expected true or false, got {value!r}")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if kind in (int, float) and isinstance(value, str):
            return kind(value)
        if kind in (list, tuple) and isinstance(value, (list, tuple)):
            return kind(value)
        raise ValueError(f"expected {kind.__name__}, got {value!r}")


RuleFunction = Callable[["Tables", dict[str, Any]], "list[Finding]"]


@dataclass(frozen=True)
class Rule:
    """A rule: metadata plus `check(tables, options) -> list[Finding]`.

    code: letters then digits (`COMM101`); the letters are the family.
    name: kebab-case (`exposed-communication`), also accepted by --select/--ignore.
    doc: the documentation with the sections What it does / Why is this bad? / How to fix.
    tables: the report tables the rule reads (names from docs/tables.md).
    source: built-in, plugin or file; origin: where it was loaded from.
    """

    code: str
    name: str
    summary: str
    doc: str
    check: RuleFunction
    options: tuple[Option, ...] = ()
    tables: tuple[str, ...] = ()
    source: str = "built-in"
    origin: str = ""

    def __post_init__(self) -> None:
        if not CODE_RE.match(self.code):
            raise ValueError(f"rule code {self.code!r} must be capital letters then digits")
        if not NAME_RE.match(self.name):
            raise ValueError(f"rule name {self.name!r} must be kebab-case")
        if not self.summary.strip() or "\n" in self.summary.strip():
            raise ValueError(f"rule {self.code}: summary must be one non-empty line")
        missing = [s for s in DOC_SECTIONS if s not in self.doc]
        if missing:
            raise ValueError(f"rule {self.code}: docstring lacks section(s) {', '.join(missing)}")
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            raise ValueError(f"rule {self.code}: duplicate option names")

    @property
    def family(self) -> str:
        """The code's letters: COMM101 -> COMM."""
        return re.match(r"^[A-Z]+", self.code).group(0)  # type: ignore[union-attr]

    def defaults(self) -> dict[str, Any]:
        """Option name -> default value."""
        return {o.name: o.default for o in self.options}

    def __call__(self, tables: Tables, options: dict[str, Any] | None = None) -> list[Finding]:
        """Run the check with defaults overridden by `options`."""
        return self.check(tables, {**self.defaults(), **(options or {})})


def rule(
    *,
    code: str,
    name: str,
    summary: str,
    tables: Sequence[str] = (),
    options: Sequence[Option] = (),
    doc: str | None = None,
) -> Callable[[RuleFunction], Rule]:
    """Decorator turning `check(tables, options) -> list[Finding]` into a Rule.

    The documentation is `doc` or the function's docstring.
    """

    def wrap(fn: RuleFunction) -> Rule:
        return Rule(
            code=code,
            name=name,
            summary=summary,
            doc=inspect.cleandoc(doc if doc is not None else (fn.__doc__ or "")),
            check=fn,
            options=tuple(options),
            tables=tuple(tables),
        )

    return wrap


class Tables(Mapping[str, pl.DataFrame]):
    """Read-only name -> DataFrame view over a Report (or a dict of DataFrames).

    A table that is absent (or not yet produced by the analysis) reads as an empty
    DataFrame, so rules test `tables.has(name)` or `.height` rather than catching errors.
    A process group the trace does not name reads as "?" in every table (the analysis
    tables' convention), so joins on `process_group` match across tables.
    """

    def __init__(self, source: Any) -> None:
        self._source = source
        # Results of the helpers below that several rules ask for (collective_exposure
        # reads every rank's kernels): computed once per Tables, i.e. once per rules run.
        self._memo: dict[Any, pl.DataFrame] = {}

    def __getitem__(self, name: str) -> pl.DataFrame:
        src = self._source
        if isinstance(src, Mapping):
            value = src.get(name)
            if isinstance(value, RankStore):
                value = value.frame()
        else:
            try:
                value = src.table(name)
            except KeyError:
                value = None
        return _normal(value)

    def once(self, key: Hashable, compute: Callable[[], pl.DataFrame]) -> pl.DataFrame:
        """`compute()`, run the first time `key` is asked for in this rules run and remembered
        after: how rules share a table that is costly to build (e.g. one that reads every
        rank's kernels). Keys should name their owner (("mypackage", "what", ...))."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def rank_batches(self, name: str, columns: Sequence[str] = ()) -> Iterator[pl.DataFrame]:
        """The table in DataFrames of whole ranks (every row of a rank in the same one),
        with only `columns` (those the table has) when given.

        How rules read `kernels`, `collectives` and `collective_waits`: a big job keeps them
        in files, one per rank, and reading them a few ranks and columns at a time keeps
        memory bounded whatever the rank count (kineto_comm.rank_store). Other tables come
        as one DataFrame.
        """
        src = self._source
        if isinstance(src, Mapping):
            store = src.get(name)
        else:
            from kineto_comm.report import STORES

            store = getattr(src, STORES[name], None) if name in STORES else None
        if isinstance(store, RankStore):
            for batch in store.batches(columns=list(columns) or None):
                yield _normal(batch)
        else:
            table = self[name]
            yield table.select(c for c in columns if c in table.columns) if columns else table

    def __iter__(self) -> Iterator[str]:
        src = self._source
        if isinstance(src, Mapping):
            return iter(src)
        from kineto_comm.report import TABLE_NAMES

        return iter(TABLE_NAMES)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def has(self, name: str, *columns: str) -> bool:
        """True when the table has rows and all the given columns."""
        df = self[name]
        return df.height > 0 and all(c in df.columns for c in columns)


def _normal(value: Any) -> pl.DataFrame:
    if not isinstance(value, pl.DataFrame):
        return pl.DataFrame()
    if "process_group" in value.columns and value.schema["process_group"] == pl.String:
        value = value.with_columns(pl.col("process_group").fill_null("?"))
    return value


def severity_for(share: float, warn: float, error: float) -> Severity | None:
    """error at >= `error`, warning at >= `warn`, None below (no finding)."""
    if share >= error:
        return Severity.error
    if share >= warn:
        return Severity.warning
    return None


def mean_step_ns(tables: Tables) -> int:
    """Mean step time: per step the longest rank's device window, averaged over steps.

    Only complete steps count (step >= 0, not the last one when there are several, whose
    window is cut at its last kernel); without step markers the whole trace is one step.
    """
    steps = tables["steps"]
    if steps.height == 0:
        return 0
    per_step = steps.group_by("step").agg(wall=pl.col("wall_ns").max()).sort("step")
    real = per_step.filter(pl.col("step") >= 0)
    if real.height >= 2:
        real = real.head(real.height - 1)
    use = real if real.height else per_step
    value = use["wall"].mean()
    return int(value) if value is not None else 0


def n_steps(tables: Tables) -> int:
    """Number of distinct steps (at least 1 when there is any step row)."""
    steps = tables["steps"]
    return max(1, steps["step"].n_unique()) if steps.height else 1


def parse_ranks(col: str | pl.Expr) -> pl.Expr:
    """A `pg_ranks` string such as "[0, 2, 4]" as a list of Int64."""
    expr = pl.col(col) if isinstance(col, str) else col
    return expr.str.extract_all(r"\d+").cast(pl.List(pl.Int64))


def hosts_of(ranks: pl.Expr, ranks_per_host: int) -> pl.Expr:
    """Number of distinct hosts a list of ranks spans (rank // ranks_per_host)."""
    return (ranks.list.eval(pl.element() // max(1, ranks_per_host))).list.n_unique()


def _merge(intervals: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Disjoint union of [start_ns, end_ns) intervals per `by` group, sorted."""
    return merge_intervals(intervals, by).sort([*by, "start_ns"])


def _covered_before(t: str, union: pl.DataFrame, by: list[str], frame: pl.DataFrame) -> pl.Series:
    """For each row of `frame`, the length of `union` (per `by`) lying before time column `t`."""
    u = union.with_columns(
        _acc=(pl.col("end_ns") - pl.col("start_ns")).cum_sum().over(by)
        - (pl.col("end_ns") - pl.col("start_ns"))
    ).rename({"start_ns": "_us", "end_ns": "_ue"})
    hit = (
        frame.select(*by, _t=pl.col(t))
        .with_row_index("_row")
        .sort("_t")
        .join_asof(
            u.sort("_us"),
            left_on="_t",
            right_on="_us",
            by=by,
            strategy="backward",
            check_sortedness=False,
        )
        .sort("_row")
    )
    inside = pl.min_horizontal(pl.col("_t"), pl.col("_ue")) - pl.col("_us")
    return hit.select((pl.col("_acc") + inside).fill_null(0))["_acc"]


def uncovered_ns(
    intervals: pl.DataFrame, cover: pl.DataFrame, by: Sequence[str] = ("rank",)
) -> pl.Series:
    """Per row of `intervals` (start_ns, end_ns, `by`), the ns not covered by `cover`'s union.

    O((n + m) log m): a cumulative "covered time before t" function evaluated at both ends.
    """
    by = list(by)
    if intervals.height == 0:
        return pl.Series("uncovered_ns", [], dtype=pl.Int64)
    length = (intervals["end_ns"] - intervals["start_ns"]).clip(lower_bound=0)
    if cover.height == 0:
        return length.alias("uncovered_ns").cast(pl.Int64)
    cast = {c: intervals.schema[c] for c in by}
    union = _merge(cover.with_columns(pl.col(c).cast(t) for c, t in cast.items()), by)
    ends = _covered_before("end_ns", union, by, intervals)
    starts = _covered_before("start_ns", union, by, intervals)
    return (length - (ends - starts)).clip(lower_bound=0).alias("uncovered_ns").cast(pl.Int64)


P2P = ("send", "recv", "send_recv")


def collective_waits(tables: Tables) -> pl.DataFrame:
    """Every collectives row with how long it waited for its group and how long it moved data.

    Adds `transfer_ns` (the shortest duration of the same call over the group's ranks: the
    rank that did not wait), `wait_ns = duration_ns - transfer_ns`, `ranks_seen` and
    `arrived_last` (this rank's wait is the group's minimum). Calls are matched by
    (process_group, collective, call_index), which needs no clock alignment; point-to-point
    calls are their own match (wait 0).
    """
    coll = tables["collectives"]
    if coll.height == 0:
        return coll
    key = ["process_group", "collective", "call_index"]
    grouped = pl.col("collective").is_in(P2P).not_()
    transfer = (
        pl.when(grouped)
        .then(pl.col("duration_ns").min().over(key))
        .otherwise(pl.col("duration_ns"))
    )
    out = coll.with_columns(
        transfer_ns=transfer,
        ranks_seen=pl.when(grouped).then(pl.len().over(key)).otherwise(1).cast(pl.Int64),
    ).with_columns(wait_ns=pl.col("duration_ns") - pl.col("transfer_ns"))
    return out.with_columns(arrived_last=pl.col("wait_ns") == pl.col("wait_ns").min().over(key))


def collective_exposure(tables: Tables, transfer_only: bool = True) -> pl.DataFrame:
    """collective_waits() plus `exposed_ns`: the part of each call with no compute kernel
    running on its rank. With `transfer_only`, only the call's last `transfer_ns` count (the
    time it moved data, not the time it sat waiting for late ranks)."""
    return tables.once(
        ("collective_exposure", transfer_only), lambda: _exposure(tables, transfer_only)
    )


def _exposure(tables: Tables, transfer_only: bool) -> pl.DataFrame:
    waits = collective_waits(tables)
    if waits.height == 0:
        return waits.with_columns(exposed_ns=pl.lit(0, dtype=pl.Int64))
    start = pl.col("end_ns") - pl.col("transfer_ns") if transfer_only else pl.col("start_ns")
    iv = waits.select("rank", start_ns=start, end_ns=pl.col("end_ns")).with_row_index("_row")
    exposed, seen = [], []
    need = ("rank", "kind", "start_ns", "end_ns")
    for kernels in tables.rank_batches("kernels", need):  # a few ranks at a time (big jobs)
        if kernels.height == 0 or kernels.width < len(need):
            continue
        compute = kernels.filter(pl.col("kind") == "compute").select("rank", "start_ns", "end_ns")
        ranks = kernels["rank"].unique()
        calls = iv.filter(pl.col("rank").is_in(ranks.cast(iv.schema["rank"]).implode()))
        exposed.append(calls.select("_row", exposed_ns=uncovered_ns(calls, compute, ["rank"])))
        seen.append(ranks)
    # Calls on ranks without kernels: nothing covers them.
    rest = (
        iv.filter(~pl.col("rank").is_in(pl.concat(seen).cast(iv.schema["rank"]).implode()))
        if seen
        else iv
    )
    exposed.append(rest.select("_row", exposed_ns=uncovered_ns(rest, rest.clear(), ["rank"])))
    found = pl.concat(exposed).sort("_row")["exposed_ns"]
    return waits.with_columns(exposed_ns=found)


ROLE_PATTERNS = (
    (r"(?i)tensor|(^|_)tp($|_)", "tensor_parallel"),
    (r"(?i)pipeline|(^|_)pp($|_)", "pipeline"),
    (r"(?i)expert|moe|(^|_)ep($|_)", "expert"),
    (r"(?i)fsdp|shard|zero", "fsdp"),
    (r"(?i)data|(^|_)dp($|_)|default", "data_parallel"),
)


def group_roles(tables: Tables) -> pl.DataFrame:
    """process_group -> role (data_parallel, tensor_parallel, pipeline, expert, fsdp, unknown).

    From the process_groups table when the analysis filled it; otherwise inferred from the
    group description (Megatron's TENSOR_MODEL_PARALLEL_GROUP, default_pg, ...) and what the
    group does: only point-to-point -> pipeline; all-gather and reduce-scatter on a
    data-parallel group -> fsdp. Columns: process_group, role, size, ranks (list[int]).
    """
    pgs = tables["process_groups"]
    if tables.has("process_groups", "process_group", "role"):
        size = pl.col("size") if "size" in pgs.columns else pl.lit(None, dtype=pl.Int64)
        ranks = (
            pl.col("ranks").cast(pl.String).pipe(parse_ranks)
            if "ranks" in pgs.columns and pgs.schema["ranks"] == pl.String
            else (pl.col("ranks") if "ranks" in pgs.columns else pl.lit(None))
        )
        return pgs.select(
            pl.col("process_group").cast(pl.String), "role", size=size.cast(pl.Int64), ranks=ranks
        )
    coll = tables["collectives"]
    if coll.height == 0:
        return pl.DataFrame(
            schema={
                "process_group": pl.String,
                "role": pl.String,
                "size": pl.Int64,
                "ranks": pl.List(pl.Int64),
            }
        )
    per = coll.group_by("process_group").agg(
        desc=pl.col("pg_desc").drop_nulls().first().fill_null(""),
        size=pl.col("group_size").max(),
        ranks=pl.col("pg_ranks").drop_nulls().first(),
        p2p_only=pl.col("collective").is_in(P2P).all(),
        sharded=pl.col("collective").is_in(["all_gather", "reduce_scatter"]).any(),
    )
    role = (
        pl.when(pl.col("sharded") & pl.col("_r").is_in(["data_parallel", "unknown"]))
        .then(pl.lit("fsdp"))
        .otherwise(pl.col("_r"))
    )
    return (
        per.with_columns(
            _r=pl.when(pl.col("p2p_only"))
            .then(pl.lit("pipeline"))
            .otherwise(_desc_role(pl.col("desc")))
        )
        .with_columns(role=role)
        .select(
            pl.col("process_group").cast(pl.String),
            "role",
            pl.col("size").cast(pl.Int64),
            ranks=parse_ranks("ranks"),
        )
    )


def _desc_role(desc: pl.Expr) -> pl.Expr:
    """Role from a group description by ROLE_PATTERNS (first match wins)."""
    out = pl.lit("unknown")
    for pattern, name in reversed(ROLE_PATTERNS):
        out = pl.when(desc.str.contains(pattern)).then(pl.lit(name)).otherwise(out)
    return out


def make_finding(
    rule_: Rule | str,
    severity: Severity,
    title: str,
    message: str,
    *,
    impact_ns_per_step: float,
    step_ns: int,
    ranks: Sequence[int] = (),
    steps: Sequence[int] = (),
    process_group: str | None = None,
    window_ns: tuple[int, int] | None = None,
    evidence: dict[str, Any] | None = None,
    advice: Sequence[str] = (),
) -> Finding:
    """A Finding with `step_share = impact / step_ns` and JSON-safe ints, sorted ranks."""
    code = rule_.code if isinstance(rule_, Rule) else rule_
    impact = max(0, int(round(impact_ns_per_step or 0)))
    return Finding(
        code=code,
        severity=severity,
        title=title,
        message=message,
        impact_ns_per_step=impact,
        step_share=round(impact / step_ns, 4) if step_ns > 0 else None,
        ranks=tuple(sorted({int(r) for r in ranks})),
        steps=tuple(sorted({int(s) for s in steps})),
        process_group=process_group,
        window_ns=(int(window_ns[0]), int(window_ns[1])) if window_ns else None,
        evidence=dict(evidence or {}),
        advice=tuple(advice),
        rule=rule_.name if isinstance(rule_, Rule) else "",
    )


def impact_per_step(
    rows: pl.DataFrame, value: str, by: Sequence[str] = (), steps: int | None = None
) -> pl.DataFrame:
    """Step time a cause costs: `value` summed per (by, rank, step), the worst rank taken per
    (by, step) (a synchronous job waits for its slowest rank), averaged over `steps` (default:
    the steps present). Returns by + impact_ns, ranks (list), steps (list) and calls (mean
    rows per rank and step)."""
    by = list(by)
    schema = {
        **{c: rows.schema.get(c, pl.String) for c in by},
        "impact_ns": pl.Float64,
        "ranks": pl.List(pl.Int64),
        "steps": pl.List(pl.Int64),
        "calls": pl.Int64,
    }
    if rows.height == 0:
        return pl.DataFrame(schema=schema)
    if (rows["step"] >= 0).any():
        rows = rows.filter(pl.col("step") >= 0)
    n = steps or max(1, rows["step"].n_unique())
    per_rank = rows.group_by([*by, "rank", "step"]).agg(v=pl.col(value).sum(), calls=pl.len())
    per_step = per_rank.group_by([*by, "step"]).agg(v=pl.col("v").max())
    totals = per_step.group_by(by or pl.lit(0).alias("_all")).agg(impact_ns=pl.col("v").sum() / n)
    members = (
        per_rank.filter(pl.col("v") > 0)
        .group_by(by or pl.lit(0).alias("_all"))
        .agg(
            ranks=pl.col("rank").unique().sort(),
            steps=pl.col("step").unique().sort(),
            calls=pl.col("calls").mean().round().cast(pl.Int64),
        )
    )
    key = by or ["_all"]
    return totals.join(members, on=key, how="left").drop("_all", strict=False).select(list(schema))
