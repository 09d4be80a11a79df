"""What each process group is for: data, tensor, pipeline or expert parallelism, embedding
exchange, or FSDP.

Why: traces name groups by number ("0", "5") and rarely by purpose (`pg_desc` is often
`default_pg` or missing, and gloo traces carry no group at all), yet every judgement about
communication depends on the role: a slow tensor-parallel all-reduce sits on the critical path,
a slow data-parallel one may hide behind backward. The role is inferred from what the group
does (its mix of collectives and their volumes, where in the step's compute its calls start,
its message sizes, its ranks), by an ordered list of decisions, first match wins, and the
`evidence` column gives the numbers behind each one. One row per process group (the
`process_groups` table, docs/tables.md); the pooled group "?" (calls naming no group) is
split by kind of call where it evidently holds several groups' work. The features, the
decisions and the split in full: docs/analyses.md. The rules read each group's role
(`group_roles`, derived table `group_roles`) and each call's (`call_roles`) at the end.
"""

from __future__ import annotations

import polars as pl

from kineto_comm.analysis.sizes import UNKNOWN_GROUP, group_key, is_p2p
from kineto_comm.analysis.view import TableView, memo
from kineto_comm.analysis.waits import P2P
from kineto_comm.lazy import collect, collect_all, sample
from kineto_comm.model.collectives import parse_ranks
from kineto_comm.model.steps import steps_per_rank
from kineto_comm.rank_store import RankStore, as_store

# In full: docs/analyses.md, "Process-group roles".

ROLES = ("data_parallel", "tensor_parallel", "pipeline", "expert", "embedding", "fsdp", "unknown")
PROCESS_GROUP_SCHEMA: dict[str, pl.DataType] = {
    "process_group": pl.String(),
    "pg_desc": pl.String(),
    "ranks": pl.List(pl.Int64()),
    "size": pl.Int64(),
    "role": pl.String(),
    "evidence": pl.String(),
    "collectives": pl.List(pl.String()),
    "calls_per_step": pl.Float64(),
    "bytes_per_step": pl.Float64(),
    # A pooled group ("?") split by kind of call: the collective of its calls (null: the
    # rest of the pool) and their size (null: any).
    "pooled_collective": pl.String(),
    "pooled_bytes": pl.Int64(),
}
# Splits the pooled group's label from the kind of its calls (module doc).
_POOL_SEP = "|"
_OTHER = ("broadcast", "barrier", "reduce", "gather", "scatter", "unknown")
EARLY_FIRST_CALL = 0.15  # first all_reduce of the step before this share: in the first layer
FORWARD = 1 / 3  # calls before this share of the step's compute run in the forward pass
IN_FORWARD = 0.25  # this share of a group's all-reduces / reduce-scatters in the forward: TP
# Tensor parallelism all-reduces at least twice a step (each layer's attention and MLP, in
# the forward and again in the backward): a group of fewer calls per step is not one.
TP_CALLS = 2


def _pct(x: pl.Expr) -> pl.Expr:
    """A share as text: 0.4 -> "40%" (null stays null)."""
    return pl.format("{}%", (x * 100).round(0).cast(pl.Int64))


def _num(x: pl.Expr) -> pl.Expr:
    """A count-like float as short text: 12.0 -> "12", 2.5 -> "2.5"."""
    r = x.round(1)
    return (
        pl.when(r == r.round(0)).then(r.cast(pl.Int64).cast(pl.String)).otherwise(r.cast(pl.String))
    )


def _human_bytes(x: pl.Expr) -> pl.Expr:
    """Bytes as text in decimal units: 4.2e6 -> "4.2 MB"."""
    return (
        pl.when(x >= 1e9)
        .then(pl.format("{} GB", (x / 1e9).round(1)))
        .when(x >= 1e6)
        .then(pl.format("{} MB", (x / 1e6).round(1)))
        .when(x >= 1e3)
        .then(pl.format("{} kB", (x / 1e3).round(1)))
        .otherwise(pl.format("{} B", x.round(0).cast(pl.Int64)))
    )


_GROUP_TEXT = ("pg_desc", "pg_ranks")


# What the features read of the calls (and process_group).
_USED = [
    "rank",
    "step",
    "compute_before",
    "collective",
    "bytes",
    "group_size",
    "pg_desc",
    "pg_ranks",
    "annotation",
]

# Words in the user annotations around a call that say what an all-to-all exchanges:
# embedding rows and sparse features (torchrec names its exchanges `## all2all_data:kjt
# values ##`, `## alltoall_fwd_single ##` for pooled embeddings, `## forward:sparse_arch
# ##`), or tokens routed to experts (mixture of experts).
EMBEDDING_WORDS = r"(?i)embed|sparse|kjt|torchrec|dlrm|all2all_data|alltoall_(fwd|bwd)_single"
EXPERT_WORDS = r"(?i)moe|expert|dispatch|combine|router|token"
# An all-to-all group's role by those words: (feature, role, what the evidence says).
_ALL_TO_ALL_PURPOSES = (
    ("_embed", "embedding", "embeddings or sparse features (embedding exchange, as in DLRM)"),
    ("_moe", "expert", "experts or token routing (mixture of experts)"),
)


# A store of no step rows, for jobs without steps.
_NO_STEPS = RankStore.from_frame(pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64}))


def _calls(
    collectives: pl.DataFrame | RankStore, steps: RankStore, key: pl.Expr | None = None
) -> pl.LazyFrame:
    """Calls with their position in the step's compute and their per-step weight; `key`
    the group they count in (group_key(), or _pool_key's split of the pooled group)."""
    store = as_store(collectives)
    per_rank = steps_per_rank(steps).rename({"n_steps": "_nsteps"}).lazy()
    # 1 / (rank's steps) for a call inside a step; 0 outside the steps of a rank that has
    # steps; 1 (the whole trace as one step) on a rank without steps.
    weight = (
        pl.when(pl.col("_nsteps").is_null())
        .then(1.0)
        .when(pl.col("step") >= 0)
        .then(1.0 / pl.col("_nsteps"))
        .otherwise(0.0)
    )
    # The group's description and rank list only go to counts per value: Categorical until
    # then, not a copy of a long text on every call.
    return (
        store.lazy(["process_group", *_USED], categorical=_GROUP_TEXT)
        .select(group_key() if key is None else key, *_USED)
        .join(per_rank, on="rank", how="left", build_side="force_right")
        .with_columns(_pos=pl.col("compute_before"), _w=weight)
    )


def _first_positions(
    collectives: pl.DataFrame | RankStore, steps: RankStore, key: pl.Expr | None = None
) -> pl.DataFrame:
    """Per group, the median over ranks and steps of where the group's first call of a step
    falls in the step's compute (`_first`) and where its first all_reduce does (`_ar_first`).

    A batch of whole ranks at a time: one aggregation over every call would hold a state per
    (group, rank, step), 0.5 GB at 2048 ranks of 950 steps. The positions per (group, rank,
    step) are kept with the group Categorical and let go once the medians are taken: held as
    text until the groups were decided, they raised the step's peak at 4096 ranks to 1.12
    GiB (0.90 now). Above lazy.SAMPLE_ROWS steps of all ranks, the medians are those of an
    evenly spread sample of steps, the same ones on every rank (docs/scale.md): the
    positions of every (group, rank, step) would be 0.3 GiB at 8192 ranks of 950 steps."""
    pos, coll = pl.col("compute_before"), pl.col("collective")
    found = [
        collect(
            sample(batch.lazy(), steps.height, "step")
            .select(
                group_key() if key is None else key, "rank", "step", "collective", "compute_before"
            )
            .filter(pos.is_not_null())
            .group_by("process_group", "rank", "step")
            .agg(_f=pos.min(), _fa=pos.filter(coll == "all_reduce").min())
            .select(pl.col("process_group").cast(pl.Categorical), "_f", "_fa")
        )
        for batch in as_store(collectives).batches(
            columns=["process_group", "rank", "step", "collective", "compute_before", "bytes"]
        )
    ]
    firsts = pl.concat(found)
    found.clear()
    return (
        firsts.group_by("process_group")
        .agg(_first=pl.col("_f").median(), _ar_first=pl.col("_fa").median())
        .with_columns(pl.col("process_group").cast(pl.String))
    )


def _features(calls: pl.LazyFrame, firsts: pl.DataFrame, world: int, rows: int) -> pl.LazyFrame:
    """One row per group with the numbers the decision and the evidence use (`rows`: how
    many calls there are; `firsts`: the `_first_positions` of each group).

    Every pass over the calls aggregates them into few groups (per group, or per group and
    value): on a big job the streaming engine runs such a pass in bounded memory, where
    modes, distinct ranks and medians over every call would each hold a copy of millions of
    rows (this step made the parent's peak at 1024 ranks, bench/README.md). The modes, the
    distinct ranks and the median then come from those small tables."""
    coll, pos, size = pl.col("collective"), pl.col("_pos"), pl.col("bytes")
    placed = pos.is_not_null()

    def share(mask: pl.Expr) -> pl.Expr:
        """Share of the group's calls where mask holds."""
        return mask.mean()

    def forward(mask: pl.Expr) -> pl.Expr:
        """Share of the placed calls where mask holds that start in the forward pass."""
        held = mask & placed
        return pl.when(held.sum() > 0).then(((pos < FORWARD) & held).sum() / held.sum())

    def volume(mask: pl.Expr) -> pl.Expr:
        """Bytes of the group's calls where mask holds."""
        return pl.when(mask).then(size).sum()

    def counts(column: str) -> pl.LazyFrame:
        """Calls per (group, value of `column`), nulls left out."""
        found = (
            calls.filter(pl.col(column).is_not_null())
            .group_by("process_group", column)
            .agg(_n=pl.len())
        )
        return (
            found.with_columns(pl.col(column).cast(pl.String)) if column in _GROUP_TEXT else found
        )

    def mode(found: pl.DataFrame, column: str, name: str) -> pl.LazyFrame:
        """Per group, the smallest of the most frequent values of `column` (as `name`) and
        its count."""
        return (
            found.lazy()
            .filter(pl.col("_n") == pl.col("_n").max().over("process_group"))
            .group_by("process_group")
            .agg(pl.col(column).min().alias(name), pl.col("_n").first())
        )

    totals, sizes, descs, rank_lists, group_sizes, seen, mixes = collect_all(
        [
            calls.group_by("process_group").agg(
                _calls=pl.len(),
                _mean_bytes=size.mean(),
                _forward=forward(pl.lit(True)),
                _ar_forward=forward(coll == "all_reduce"),
                _rs_forward=forward(coll == "reduce_scatter"),
                _other=share(coll.is_in(list(_OTHER))),
                _p2p=share(is_p2p(coll)),
                _a2a=share(coll == "all_to_all"),
                _embed=share(pl.col("annotation").str.contains(EMBEDDING_WORDS).fill_null(False)),
                _moe=share(pl.col("annotation").str.contains(EXPERT_WORDS).fill_null(False)),
                _ag=share(coll == "all_gather"),
                _rs=share(coll == "reduce_scatter"),
                _ar=share(coll == "all_reduce"),
                _ag_bytes=volume(coll == "all_gather"),
                _rs_bytes=volume(coll == "reduce_scatter"),
                _ar_bytes=volume(coll == "all_reduce"),
            ),
            counts("bytes"),
            counts("pg_desc"),
            counts("pg_ranks"),
            counts("group_size"),
            # Per rank, its calls and bytes that count towards the per-step means, and their
            # weight (the same for all of them): exact integer sums, weighted once per rank,
            # so the means do not depend on the order the engine adds the calls in.
            calls.group_by("process_group", "rank").agg(
                _counted=(pl.col("_w") > 0).sum(),
                # Unknown sizes count as none; a rank none of whose calls has a size: null.
                _counted_bytes=pl.when(size.is_not_null().any()).then(
                    pl.when(pl.col("_w") > 0).then(size.fill_null(0)).sum()
                ),
                _weight=pl.col("_w").max(),
            ),
            calls.group_by("process_group", "collective").agg(_n=pl.len(), _cw=pl.col("_w").sum()),
        ],
        rows,
    )
    # The share of calls with the most common size, among the calls that have a size.
    top_size = mode(sizes, "bytes", "_top").join(
        sizes.lazy().group_by("process_group").agg(_sized=pl.col("_n").sum()), on="process_group"
    )
    feats = (
        totals.lazy()
        .join(
            seen.lazy()
            .sort("process_group", "rank")
            .group_by("process_group", maintain_order=True)
            .agg(
                _seen=pl.col("rank"),
                _nranks=pl.len(),
                calls_per_step=(pl.col("_counted") * pl.col("_weight")).sum(),
                bytes_per_step=pl.when(pl.col("_counted_bytes").is_not_null().any()).then(
                    (pl.col("_counted_bytes") * pl.col("_weight")).sum()
                ),
            ),
            on="process_group",
            how="left",
        )
        .join(mode(descs, "pg_desc", "pg_desc").drop("_n"), on="process_group", how="left")
        .join(mode(rank_lists, "pg_ranks", "_pg_ranks").drop("_n"), on="process_group", how="left")
        .join(mode(group_sizes, "group_size", "_gsize").drop("_n"), on="process_group", how="left")
        .join(
            top_size.select("process_group", _top_size=pl.col("_n") / pl.col("_sized")),
            on="process_group",
            how="left",
        )
    )
    mix = (
        mixes.lazy()
        .join(feats.select("process_group", "_nranks"), on="process_group")
        .sort(["process_group", "_n", "collective"], descending=[False, True, False])
        .group_by("process_group", maintain_order=True)
        .agg(
            collectives=pl.col("collective"),
            _mix=pl.format("{} {}", _num(pl.col("_cw") / pl.col("_nranks")), "collective").str.join(
                " + "
            ),
        )
    )
    parsed = parse_ranks("_pg_ranks")
    ranks = pl.when(parsed.list.len() > 0).then(parsed).otherwise(pl.col("_seen"))
    return (
        feats.join(firsts.lazy(), on="process_group", how="left")
        .join(mix, on="process_group", how="left")
        .with_columns(
            ranks=ranks.list.sort(),
            _from_pg_ranks=(parsed.list.len() > 0).fill_null(False),
            # Rounded: Polars' float sums vary in the last bits with the memory layout, and
            # the same traces must print the same numbers.
            calls_per_step=(pl.col("calls_per_step") / pl.col("_nranks")).round(6),
            bytes_per_step=(pl.col("bytes_per_step") / pl.col("_nranks")).round(3),
        )
        .with_columns(size=pl.coalesce("_gsize", pl.col("ranks").list.len()).cast(pl.Int64))
        .with_columns(
            _dmin=pl.col("ranks").list.diff(null_behavior="drop").list.min(),
            _dmax=pl.col("ranks").list.diff(null_behavior="drop").list.max(),
            _world=pl.lit(world, dtype=pl.Int64),
        )
        .with_columns(
            _layout=pl.when(pl.col("ranks").list.len() < 2)
            .then(pl.lit("single"))
            .when((pl.col("_dmin") == 1) & (pl.col("_dmax") == 1))
            .then(pl.lit("contiguous"))
            .when(pl.col("_dmin") == pl.col("_dmax"))
            .then(pl.lit("strided"))
            .otherwise(pl.lit("scattered"))
        )
    )


def _decide(feats: pl.LazyFrame) -> pl.LazyFrame:
    """Apply the rules of the module docstring; adds role and evidence."""
    c = pl.col
    ag_vs_rs = c("_ag_bytes") / c("_rs_bytes")
    ag_vs_ar = c("_ag_bytes") / c("_ar_bytes")
    comparable_rs = (ag_vs_rs >= 0.25) & (ag_vs_rs <= 4.0)
    comparable_ar = (ag_vs_ar >= 0.25) & (ag_vs_ar <= 4.0)
    early_first = (c("_ar_first") < EARLY_FIRST_CALL).fill_null(False)
    spread = (c("_ar_forward") >= IN_FORWARD).fill_null(False)
    uniform = (c("_top_size") >= 0.8).fill_null(False)
    sub_contig = (c("_layout") == "contiguous") & (c("size") < c("_world"))
    tp_score = (
        early_first.cast(pl.Int64) * 2
        + spread.cast(pl.Int64)
        + uniform.cast(pl.Int64)
        + sub_contig.cast(pl.Int64)
        - (c("_layout") == "strided").cast(pl.Int64)
    )
    score_text = pl.format(
        "{}tensor-parallel score {}/5, 3 needed (first all_reduce before 15% of the compute: {}, "
        ">=25% in the forward: {}, >=80% one size: {}, contiguous sub-group: {}, strided: {})",
        pl.when((c("calls_per_step") < TP_CALLS).fill_null(False) & (tp_score >= 3))
        .then(pl.lit(f"under {TP_CALLS} calls per step, too few for tensor parallelism ("))
        .otherwise(pl.lit("")),
        tp_score,
        early_first,
        spread,
        uniform,
        sub_contig,
        c("_layout") == "strided",
    )
    score_text = (
        pl.when((c("calls_per_step") < TP_CALLS).fill_null(False) & (tp_score >= 3))
        .then(pl.format("{})", score_text))
        .otherwise(score_text)
    )
    rules: list[tuple[pl.Expr, str, pl.Expr]] = [
        (
            c("_other") >= 0.5,
            "unknown",
            pl.format("{} of calls are broadcast/barrier/other", _pct(c("_other"))),
        ),
        (c("_p2p") >= 0.5, "pipeline", pl.format("{} of calls are send/recv", _pct(c("_p2p")))),
        *(
            (
                (c("_a2a") >= 0.5) & (c(share) > 0),
                role,
                pl.format(
                    f"{{}} of calls are all_to_all; {{}} sit in annotations naming {what}",
                    _pct(c("_a2a")),
                    _pct(c(share)),
                ),
            )
            for share, role, what in _ALL_TO_ALL_PURPOSES
        ),
        (
            c("_a2a") >= 0.5,
            "unknown",
            pl.format(
                "{} of calls are all_to_all of unknown purpose (no annotation around them "
                "names experts or embeddings)",
                _pct(c("_a2a")),
            ),
        ),
        (
            (c("_ag") > 0) & (c("_rs") > 0) & (c("_ag") + c("_rs") >= 0.5) & comparable_rs,
            "sp",
            pl.format(
                "all_gather/reduce_scatter volume ratio {}, {} of reduce_scatters in the forward",
                ag_vs_rs.round(2),
                _pct(c("_rs_forward")),
            ),
        ),
        (
            (c("_ag") >= 0.25) & (c("_rs") == 0) & (c("_ar") > 0) & comparable_ar,
            "fsdp",
            pl.format(
                "all_gather/all_reduce volume ratio {} and no reduce_scatter: the all_reduce "
                "is taken as FSDP's gradient reduction (gloo runs reduce-scatter as all_reduce); "
                "data_parallel with sharded parameters is the same reading",
                ag_vs_ar.round(2),
            ),
        ),
        (
            c("_ag") + c("_rs") >= 0.5,
            "fsdp",
            pl.format(
                "{} of calls are all_gather/reduce_scatter without the other half",
                _pct(c("_ag") + c("_rs")),
            ),
        ),
        (c("_ar") >= 0.5, "ar", score_text),
    ]
    role: pl.Expr = pl.lit("unknown")
    why: pl.Expr = pl.lit("no dominant collective pattern")
    for cond, name, text in reversed(rules):
        if name == "sp":
            value = (
                pl.when((c("_rs_forward") >= IN_FORWARD).fill_null(False))
                .then(pl.lit("tensor_parallel"))
                .otherwise(pl.lit("fsdp"))
            )
        elif name == "ar":
            value = (
                pl.when((tp_score >= 3) & (c("calls_per_step") >= TP_CALLS).fill_null(True))
                .then(pl.lit("tensor_parallel"))
                .otherwise(pl.lit("data_parallel"))
            )
        else:
            value = pl.lit(name)
        role = pl.when(cond.fill_null(False)).then(value).otherwise(role)
        why = pl.when(cond.fill_null(False)).then(text).otherwise(why)
    placement = (
        pl.when(c("_forward").is_not_null())
        .then(
            pl.format(
                "{} in the forward (before a third of the step's compute), first call at {}",
                _pct(c("_forward")),
                _pct(c("_first")),
            )
        )
        .otherwise(pl.lit("no step with compute to place the calls by"))
    )
    n_ranks = c("ranks").list.len()
    ranks_text = pl.when(c("_layout") == "strided").then(
        pl.format("{} ranks strided by {}", n_ranks, c("_dmin"))
    )
    ranks_text = ranks_text.when(c("_layout") == "single").then(pl.lit("1 rank"))
    ranks_text = ranks_text.otherwise(pl.format("{} {} ranks", n_ranks, c("_layout")))
    ranks_text = (
        pl.when(c("_from_pg_ranks"))
        .then(ranks_text)
        .otherwise(pl.format("{} with traces (no pg_ranks)", ranks_text))
    )
    unnamed = (
        pl.when(c("process_group") == UNKNOWN_GROUP)
        .then(pl.lit("; no process-group names in the trace: the calls of all groups are pooled"))
        .when(c("process_group").str.starts_with(UNKNOWN_GROUP + _POOL_SEP))
        .then(
            pl.lit(
                "; no process-group names in the trace: the pooled calls split by kind, as "
                "calls of different groups do different work"
            )
        )
        .otherwise(pl.lit(""))
    )
    sized = (
        pl.when(c("_mean_bytes").is_null())
        .then(pl.lit("sizes unknown"))
        .otherwise(
            pl.format(
                "mean {}, {} of calls one size",
                _human_bytes(c("_mean_bytes")),
                _pct(c("_top_size").fill_null(0.0)),
            )
        )
    )
    evidence = pl.format(
        "{} per step, {}; {}; {}; {}{}",
        c("_mix"),
        sized,
        placement,
        ranks_text,
        why,
        unnamed,
    )
    return feats.with_columns(role=role, evidence=evidence)


def evidence_phrase(evidence: str | None) -> str:
    """The deciding phrase of an `evidence` text (`_decide` writes "mix per step, sizes;
    placement; ranks; reason"): its reason up to the first detail ("tensor-parallel score
    5/5", "100% of calls are send/recv"). A terminal's table holds one short phrase; the
    whole evidence stays in the JSON and HTML."""
    if not evidence:
        return ""
    parts = evidence.split("; ", 3)
    reason = parts[3] if len(parts) == 4 else evidence
    for stop in ("; ", " (", ": ", ", "):
        reason = reason.split(stop, 1)[0]
    return reason


def process_groups(
    collectives: pl.DataFrame | RankStore,
    steps: pl.DataFrame | RankStore,
    ranks: pl.DataFrame,
) -> pl.DataFrame:
    """One row per process group with its inferred role and the evidence (docs/tables.md)."""
    if collectives.height == 0:
        return pl.DataFrame(schema=PROCESS_GROUP_SCHEMA)
    steps = as_store(steps) if steps.height else _NO_STEPS
    world = collect(
        as_store(collectives).lazy(["rank"]).select(pl.col("rank").n_unique()), collectives.height
    ).item()
    if ranks.height and "world_size" in ranks.columns:
        world = max(world, int(ranks["world_size"].max() or 0))
    key = _pool_key(collectives, ranks)
    firsts = _first_positions(collectives, steps, key)
    feats = _features(_calls(collectives, steps, key), firsts, world, collectives.height)
    label = pl.col("process_group")
    pooled = label.str.starts_with(UNKNOWN_GROUP + _POOL_SEP)
    kind = label.str.split(_POOL_SEP)
    return collect(
        _decide(feats)
        .with_columns(
            pooled_collective=pl.when(pooled).then(kind.list.get(1, null_on_oob=True)),
            pooled_bytes=pl.when(pooled).then(
                kind.list.get(2, null_on_oob=True).cast(pl.Int64, strict=False)
            ),
        )
        .with_columns(
            process_group=pl.when(pooled).then(pl.lit(UNKNOWN_GROUP)).otherwise(label),
            pooled_collective=pl.col("pooled_collective").replace("", None),
            # The calls of groups of different ranks, pooled: how many ranks each call
            # joined is not known (the ranks with traces are not its group).
            size=pl.when(pooled & pl.lit(several_sets(ranks)) & pl.col("_gsize").is_null())
            .then(None)
            .otherwise(pl.col("size")),
        )
        .sort(
            pl.col("process_group").str.len_chars(),
            "process_group",
            "pooled_collective",
            "pooled_bytes",
            nulls_last=True,
        )
        .select(list(PROCESS_GROUP_SCHEMA))
        .cast(PROCESS_GROUP_SCHEMA)
    )


def several_sets(ranks: pl.DataFrame) -> bool:
    """Some rank's pg_config lists groups of different ranks (`ranks.pg_rank_sets` > 1):
    calls that name no group may be on any of them."""
    return (
        "pg_rank_sets" in ranks.columns
        and ranks.height > 0
        and int(ranks["pg_rank_sets"].max() or 0) > 1
    )


def _pool_key(collectives: pl.DataFrame | RankStore, ranks: pl.DataFrame) -> pl.Expr | None:
    """The group a call counts in when the pooled group ("?": calls that name none) holds
    calls of several groups doing different work: "?|collective|bytes" for the pooled
    calls, the all-reduces apart from the rest, each size apart (tensor-parallel
    activations have one size, a gradient all-reduce another), where the pool has
    all-to-alls and all-reduces (an embedding exchange and a dense gradient all-reduce are
    not one group's work: HTA's torchrec traces) or the ranks' pg_config lists groups of
    different ranks (gloo records no group per call: tests/data/gloo/tp-dp-4). None where
    nothing splits (the pool stays one group)."""
    store = as_store(collectives)
    kinds = set(
        collect(
            store.lazy(["process_group", "collective"])
            .filter(pl.col("process_group").is_null())
            .select(pl.col("collective").unique()),
            store.height,
        )["collective"].drop_nulls()
    )
    a2a = {"all_to_all", "all_reduce"} <= kinds
    several = several_sets(ranks) and "all_reduce" in kinds
    if not (a2a or several):
        return None
    coll = pl.col("collective")
    kind = (
        pl.when(coll == "all_reduce")
        .then(pl.format("all_reduce|{}", pl.col("bytes").cast(pl.String).fill_null("")))
        .otherwise(pl.lit(""))
    )
    split = pl.format("{}{}{}", pl.lit(UNKNOWN_GROUP), pl.lit(_POOL_SEP), kind)
    return (
        pl.when(pl.col("process_group").is_null())
        .then(split)
        .otherwise(pl.col("process_group").cast(pl.String))
        .alias("process_group")
    )


# ---------------------------------------------------------------- the rules' view

ROLE_PATTERNS = (
    (r"(?i)tensor|(^|_)tp($|_)", "tensor_parallel"),
    (r"(?i)pipeline|(^|_)pp($|_)", "pipeline"),
    (r"(?i)expert|moe|(^|_)ep($|_)", "expert"),
    (r"(?i)fsdp|shard|zero", "fsdp"),
    (r"(?i)data|(^|_)dp($|_)|default", "data_parallel"),
)


def group_roles(tables: TableView) -> pl.DataFrame:
    """process_group -> role (derived table `group_roles`): `_group_roles`, once per rules
    run."""
    return memo(tables, "group_roles", lambda: _group_roles(tables))


def _group_roles(tables: TableView) -> pl.DataFrame:
    """process_group -> role (data_parallel, tensor_parallel, pipeline, expert, fsdp, unknown).

    From the process_groups table when the analysis filled it; otherwise inferred from the
    group description (Megatron's TENSOR_MODEL_PARALLEL_GROUP, default_pg, ...) and what the
    group does: only point-to-point -> pipeline; all-gather and reduce-scatter on a
    data-parallel group -> fsdp. Columns: process_group, role, size, ranks (list[int]).
    """
    pgs = tables["process_groups"]
    if tables.has("process_groups", "process_group", "role"):
        if "pooled_collective" in pgs.columns and "calls_per_step" in pgs.columns:
            # A pooled group split by kind of call (roles.py): one row per group here, the
            # kind with the most calls; call_roles gives each call its own kind's role.
            pgs = pgs.sort(
                "calls_per_step", descending=True, nulls_last=True, maintain_order=True
            ).unique("process_group", keep="first", maintain_order=True)
        size = pl.col("size") if "size" in pgs.columns else pl.lit(None, dtype=pl.Int64)
        ranks = (
            pl.col("ranks").cast(pl.String).pipe(parse_ranks)
            if "ranks" in pgs.columns and pgs.schema["ranks"] == pl.String
            else (pl.col("ranks") if "ranks" in pgs.columns else pl.lit(None))
        )
        return pgs.select(
            pl.col("process_group").cast(pl.String), "role", size=size.cast(pl.Int64), ranks=ranks
        )
    if not tables.has("collectives"):
        return pl.DataFrame(
            schema={
                "process_group": pl.String,
                "role": pl.String,
                "size": pl.Int64,
                "ranks": pl.List(pl.Int64),
            }
        )
    cols = ["process_group", "pg_desc", "group_size", "pg_ranks", "collective"]
    per = tables.collect(
        tables.lazy("collectives", cols)
        .group_by("process_group")
        .agg(
            desc=pl.col("pg_desc").drop_nulls().first().fill_null(""),
            size=pl.col("group_size").max(),
            ranks=pl.col("pg_ranks").drop_nulls().first(),
            p2p_only=pl.col("collective").is_in(P2P).all(),
            sharded=pl.col("collective").is_in(["all_gather", "reduce_scatter"]).any(),
        )
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
            .otherwise(desc_role(pl.col("desc")))
        )
        .with_columns(role=role)
        .select(
            pl.col("process_group").cast(pl.String),
            "role",
            pl.col("size").cast(pl.Int64),
            ranks=parse_ranks("ranks"),
        )
    )


def call_roles(
    tables: TableView, frame: pl.DataFrame | pl.LazyFrame
) -> pl.DataFrame | pl.LazyFrame:
    """`frame` (process_group, and collective and bytes where it has them) plus `role`: its
    group's (group_roles), and for a call of a pooled group that the process_groups table
    splits by kind of call (no group named per call: roles.py), its kind's role (an
    all_to_all's, an all_reduce's of its size), so a dense gradient all-reduce pooled with
    embedding all-to-alls is not 'embedding'. Null where the group is unknown."""
    roles = group_roles(tables).lazy().select(pl.col("process_group").alias("_pg"), "role")
    lazy = isinstance(frame, pl.LazyFrame)
    pg = pl.col("process_group").cast(pl.String).fill_null(UNKNOWN_GROUP)
    out = frame.lazy().with_columns(_pg=pg).join(roles, on="_pg", how="left")
    columns = frame.collect_schema().names() if lazy else frame.columns
    pools = memo(tables, "role_pools", lambda: _role_pools(tables))
    if pools is not None and "collective" in columns:
        kinds, sized, rest, split = pools
        out = out.join(
            kinds.lazy(), left_on=["_pg", "collective"], right_on=["_pg", "_pc"], how="left"
        )
        if "bytes" in columns and sized.height:
            out = out.join(
                sized.lazy(),
                left_on=["_pg", "collective", pl.col("bytes").cast(pl.Int64)],
                right_on=["_pg", "_pc", "_pb"],
                how="left",
            )
        else:
            out = out.with_columns(_sr=pl.lit(None, dtype=pl.String))
        out = (
            out.join(rest.lazy(), on="_pg", how="left")
            .with_columns(
                role=pl.coalesce(
                    "_sr",
                    "_kr",
                    pl.when(~pl.col("collective").is_in(split)).then(pl.col("_rr")),
                    "role",
                )
            )
            .drop("_kr", "_sr", "_rr")
        )
    out = out.drop("_pg")
    return out if lazy else out.collect()


def _role_pools(
    tables: TableView,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, list[str]] | None:
    """What `call_roles` joins for the pooled groups (None when the process_groups table
    splits none): each kind's role (`_kr`), each sized kind's (`_sr`), the rest of the
    pool's (`_rr`) and the kinds split; read once per rules run."""
    pgs = tables["process_groups"]
    if "pooled_collective" not in pgs.columns:
        return None
    pooled = pgs.filter(pl.col("pooled_collective").is_not_null()).select(
        _pg="process_group", _pc="pooled_collective", _pb="pooled_bytes", _pr="role"
    )
    if not pooled.height:
        return None
    kinds = pooled.filter(pl.col("_pb").is_null()).select("_pg", "_pc", _kr="_pr")
    sized = pooled.filter(pl.col("_pb").is_not_null()).select("_pg", "_pc", "_pb", _sr="_pr")
    # The rest of the pool: calls of a kind the split has no row for.
    rest = pgs.filter(
        pl.col("pooled_collective").is_null()
        & pl.col("process_group").is_in(pooled["_pg"].unique().implode())
    ).select(_pg="process_group", _rr="role")
    return kinds, sized, rest, pooled["_pc"].unique().to_list()


def desc_role(desc: pl.Expr) -> pl.Expr:
    """Role from a group description by ROLE_PATTERNS (first match wins)."""
    out = pl.lit("unknown")
    for pattern, name in reversed(ROLE_PATTERNS):
        out = pl.when(desc.str.contains(pattern)).then(pl.lit(name)).otherwise(out)
    return out
