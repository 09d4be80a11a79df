"""Where in the code each communication call comes from: its phase of the step and its module.

A finding that says "exposed all_reduce on the data-parallel group" leaves the user to find
which part of the model and which phase issued it. Per call (`call_places`, per rank, from
the CPU events the loader keeps: load/events.py ANCESTRY_PREFIXES) the phase is forward,
backward, optimizer or other, by a cascade whose step is kept in `phase_source`; the
module is the FSDP annotation's module, else the `nn.Module` path, else the innermost
record_function, else `hook` (issued in a parameter's AccumulateGrad node: a gradient hook's
bucket), else `unknown` (`module_source`). Ranges are read on the CPU, around the launch
(record_function's GPU copies, `gpu_user_annotation`, are not loaded). A call is placed
where it was issued: the CPU thread and time of its kernel's launch, or, for a host backend
such as gloo (whose spans run on the backend's own thread), of the c10d op that issued it
(the k-th call of a rank is its k-th issuing c10d op). `attribution_table` sums the model of
time's exposure, waits and pipeline bubbles of the calls (analysis/steptime.py; never
recomputed here) per phase x
module x role x collective. docs/tables.md `attribution` states both in full.
"""

from __future__ import annotations

import polars as pl

from kineto_comm.analysis import model_of_time
from kineto_comm.analysis.roles import call_roles
from kineto_comm.analysis.steptime import P2P
from kineto_comm.analysis.view import TableView, memo
from kineto_comm.analysis.waits import CALL_KEY
from kineto_comm.lazy import collect_all

PHASES = ("forward", "backward", "optimizer", "other")
# The columns call_places adds to the collectives table.
PLACE_COLUMNS: dict[str, pl.DataType] = {
    "phase": pl.String(),
    "phase_source": pl.String(),
    "module": pl.String(),
    "module_source": pl.String(),
}
UNKNOWN = "unknown"
HOOK = "hook"
ROOT = "(root)"
_STEP = "ProfilerStep#"
_AUTOGRAD = "autograd::engine::evaluate_function"
_MODULE = "nn.Module: "
# A user annotation naming a phase, first match wins (FSDP's `FSDP::pre_backward (x)` is
# backward, `Optimizer.zero_grad#` optimizer, DDP's `DistributedDataParallel.forward`
# forward, HTA's `## forward ##`).
_PHASE_WORDS = (
    (r"(?i)^Optimizer\.|optimizer|zero_grad", "optimizer"),
    (r"(?i)backward", "backward"),
    (r"(?i)forward", "forward"),
)
# FSDP2 annotations name their module: `FSDP::all_gather (blocks.1)`, `FSDP::backward_prefetch
# for blocks.0`; without one (`FSDP::post_backward_reduce`, `... ()`) they are the root's.
_FSDP = r"^FSDP::"
_FSDP_FQN = r"^FSDP::\S+(?: \(([^)]*)\)| for (\S+))?$"
# Wrappers dropped from a module path: they hold the model, they are not a part of it.
_WRAPPERS = r"^(DistributedDataParallel|FullyShardedDataParallel)_\d+$"
# The c10d ops that issue a host backend's calls (outermost c10d op on its thread).
_C10D = "c10d::"
_COLLECTIVE_SPAN = r"^(nccl|xccl|gloo|ucc|mpi):"
_EMPTY_PLACES = {"_row": pl.UInt32(), **PLACE_COLUMNS}


def _levels(spans: pl.LazyFrame) -> pl.LazyFrame:
    """`spans` (rank, tid, start_ns, end_ns, ...) with _sid (a row id) and depth: how many
    other spans of its thread hold its start (0: outermost). One sweep over the starts and
    ends in time order (of two starting together, the longer opens first)."""
    keys = ["rank", "tid"]
    s = spans.with_row_index("_sid")
    stream = pl.concat(
        [
            s.select(*keys, "_sid", t="start_ns", _o=pl.lit(1, pl.Int8), _e=-pl.col("end_ns")),
            s.select(
                *keys,
                pl.lit(None, pl.UInt32).alias("_sid"),
                t="end_ns",
                _o=pl.lit(0, pl.Int8),
                _e=pl.lit(0, pl.Int64),
            ),
        ]
    )
    depth = (
        stream.sort(*keys, "t", "_o", "_e")
        .with_columns(
            depth=pl.when(pl.col("_o") == 1)
            .then(1)
            .otherwise(-1)
            .cast(pl.Int64)
            .cum_sum()
            .over(keys)
            - 1
        )
        .filter(pl.col("_sid").is_not_null())
        .select("_sid", "depth")
    )
    return s.join(depth, on="_sid")


def _innermost(points: pl.LazyFrame, spans: pl.LazyFrame, value: str = "value") -> pl.LazyFrame:
    """_row and `value` of the innermost span (on the point's rank and thread) around each
    point (rank, tid, _row, at); spans: rank, tid, start_ns, end_ns, value, properly nested
    per thread as a thread's ranges are. No pairs: at a point the open spans are the starts
    before it less the ends before it; the innermost is the latest-starting span one level
    below that count, found by an as-of join per (rank, tid, depth)."""
    keys = ["rank", "tid"]
    s = _levels(spans.select(*keys, "start_ns", "end_ns", "value"))
    stream = pl.concat(
        [
            s.select(*keys, t="start_ns", _o=pl.lit(0, pl.Int8), _d=pl.lit(1, pl.Int64)),
            points.select(*keys, t="at", _o=pl.lit(1, pl.Int8), _d=pl.lit(0, pl.Int64)),
            s.select(*keys, t="end_ns", _o=pl.lit(2, pl.Int8), _d=pl.lit(-1, pl.Int64)),
        ]
    )
    at = (
        stream.sort(*keys, "t", "_o")
        .with_columns(depth=pl.col("_d").cum_sum().over(keys) - 1)
        .filter(pl.col("_o") == 1)
        .select(*keys, "t", "depth")
        .unique()
        .filter(pl.col("depth") >= 0)
        .sort("t")
    )
    found = at.join_asof(
        s.select(*keys, "depth", "start_ns", "end_ns", "value").sort("start_ns"),
        left_on="t",
        right_on="start_ns",
        by=[*keys, "depth"],
        strategy="backward",
        check_sortedness=False,
    ).filter(pl.col("end_ns") >= pl.col("t"))
    return points.join(
        found.select(*keys, at="t", **{value: "value"}), on=[*keys, "at"], how="inner"
    ).select("_row", value)


def _module_paths(modules: pl.LazyFrame) -> pl.LazyFrame:
    """Each `nn.Module: X` span (rank, tid, start_ns, end_ns, name) with `value`, its path of
    module names from the outermost (`TinyTransformer_0.Block_1.Attention_1`), wrappers
    (DDP, FSDP) left out."""
    keys = ["rank", "tid"]
    name = pl.col("name").str.strip_prefix(_MODULE)
    tree = _levels(
        modules.select(
            *keys,
            "start_ns",
            "end_ns",
            _name=pl.when(name.str.contains(_WRAPPERS)).then(None).otherwise(name),
        )
    ).collect()
    # Each span's parent: the latest-starting span one level up at its start.
    parents = (
        tree.lazy()
        .with_columns(_up=pl.col("depth") - 1)
        .sort("start_ns")
        .join_asof(
            tree.lazy().select(*keys, _up="depth", _ps="start_ns", _parent="_sid").sort("_ps"),
            left_on="start_ns",
            right_on="_ps",
            by=[*keys, "_up"],
            strategy="backward",
            check_sortedness=False,
        )
        .select("_sid", "_parent")
        .collect()
    )
    paths = tree.select("_sid", path="_name")
    up = parents.select("_sid", _at="_parent")
    own = tree.select(_at="_sid", _n="_name")
    links = parents.select(_at="_sid", _next="_parent")
    # Walk up: each pass prepends one more ancestor's name (a model is a few levels deep).
    for _ in range(int(tree.get_column("depth").max() or 0)):
        step = up.join(own, on="_at", how="left").join(links, on="_at", how="left")
        paths = (
            paths.join(step.select("_sid", "_n"), on="_sid", how="left")
            .with_columns(path=pl.concat_str(["_n", "path"], separator=".", ignore_nulls=True))
            .drop("_n")
        )
        up = step.select("_sid", _at="_next")
    # Collected, with only its own columns: a lazy join here under _levels' row index gave
    # no rows (polars 1.x, its projection pushed through the join).
    found = tree.join(paths.select("_sid", value=pl.col("path").replace("", None)), on="_sid")
    return found.select(*keys, "start_ns", "end_ns", "value").lazy()


def call_places(calls: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Per row of `calls` (communication kernels or host spans: rank, start_ns, launch_ns,
    launch_tid), in its order: phase, phase_source, module, module_source (PLACE_COLUMNS).
    `ops`: the ranks' CPU ops (RawTrace.ops: rank, tid, cat, name, start_ns, end_ns)."""
    n = calls.height
    if n == 0:
        return pl.DataFrame(schema=PLACE_COLUMNS)
    o = ops.lazy().select(
        pl.col("rank").cast(pl.Int64),
        pl.col("tid").cast(pl.String),
        "cat",
        "name",
        "start_ns",
        "end_ns",
    )
    c = (
        calls.lazy()
        .select(
            pl.col("rank").cast(pl.Int64),
            "start_ns",
            "launch_ns",
            pl.col("launch_tid").cast(pl.String),
            # A receive feeds the work after it; any other call ships or reduces the work
            # before it (_neighbour).
            _recv=(
                pl.col("name").str.contains("(?i)recv") & ~pl.col("name").str.contains("(?i)send")
                if "name" in calls.columns
                else pl.lit(False)
            ),
        )
        .with_row_index("_row")
    )
    points = _issue_points(c, o).collect().lazy()
    annotation = (
        (pl.col("cat") == "user_annotation")
        & ~pl.col("name").str.contains(_COLLECTIVE_SPAN)
        & ~pl.col("name").str.starts_with(_STEP)
    )
    phase_word = pl.lit(None, dtype=pl.String)
    for pattern, phase in reversed(_PHASE_WORDS):
        phase_word = (
            pl.when(pl.col("name").str.contains(pattern)).then(pl.lit(phase)).otherwise(phase_word)
        )
    named = o.with_columns(_phase=phase_word)
    ann_phase = named.filter(
        (annotation | pl.col("name").str.starts_with("Optimizer.")) & pl.col("_phase").is_not_null()
    ).select("rank", "tid", "start_ns", "end_ns", value="_phase")
    autograd = o.filter(pl.col("name").str.starts_with(_AUTOGRAD))
    modules = o.filter(
        (pl.col("cat") == "python_function") & pl.col("name").str.starts_with(_MODULE)
    )
    fsdp = (
        o.filter(annotation & pl.col("name").str.contains(_FSDP))
        .with_columns(_m=pl.col("name").str.extract_groups(_FSDP_FQN))
        .select(
            "rank",
            "tid",
            "start_ns",
            "end_ns",
            value=pl.coalesce(
                pl.col("_m").struct.field("1").replace("", None),
                pl.col("_m").struct.field("2"),
                pl.lit(ROOT),
            ),
        )
    )
    notes = named.filter(
        annotation & pl.col("_phase").is_null() & ~pl.col("name").str.contains(_FSDP)
    ).select("rank", "tid", "start_ns", "end_ns", value="name")
    # The span sets first (small): a lookup is planned only where its set has rows.
    sets = collect_all(
        [
            ann_phase,
            autograd.select("rank", "tid", "start_ns", "end_ns", value="name"),
            fsdp,
            modules.select("rank", "tid", "start_ns", "end_ns", "name"),
            notes,
        ]
    )
    names = ("_p_annotation", "_p_autograd", "_m_fsdp", "_m_module", "_m_note")
    _, auto_set, fsdp_set, module_set, _ = sets
    if module_set.height:
        sets[3] = _module_paths(module_set.lazy()).collect()
    base = (
        c.select("_row", "rank", "start_ns", "_recv")
        .join(points.select("_row", "tid", "at"), on="_row", how="left")
        .collect()
    )
    queries = [
        _innermost(points, spans.lazy(), name)
        for name, spans in zip(names, sets, strict=True)
        if spans.height
    ]
    lazy_base = base.lazy()
    queries.append(_step_order(lazy_base, o, auto_set.lazy()))
    if module_set.height:
        queries.append(_neighbour(lazy_base, auto_set.lazy(), module_set.lazy()))
    # Each lookup once, all in one go (a lazy frame used twice is computed twice).
    out = base
    for f in collect_all(queries):
        out = out.join(f, on="_row", how="left")
    out = out.with_columns(
        pl.lit(None, dtype=pl.String).alias(n) for n in (*names, "_p_near") if n not in out.columns
    )
    # Ranks with Python module events (with_stack / with_modules) or FSDP's annotations: a
    # backward call no module encloses comes from a hook there; elsewhere no guess.
    stacked = pl.concat([module_set.select("rank"), fsdp_set.select("rank")]).unique()
    out = out.join(stacked.with_columns(_stacked=pl.lit(True)), on="rank", how="left")
    if auto_set.height:
        threads = _backward_threads(o).collect()
        out = out.join(threads.with_columns(_bthread=pl.lit(True)), on=["rank", "tid"], how="left")
    else:
        out = out.with_columns(_bthread=pl.lit(None, dtype=pl.Boolean))
    out = out.lazy()
    phase_rows = [
        ("_p_annotation", "annotation"),
        ("_p_autograd", "autograd"),
        ("_m_module", "python_stack"),
    ]
    phase = pl.lit("other")
    source = pl.lit("none")
    order = pl.col("_p_order")
    phase = pl.when(order.is_not_null()).then(order).otherwise(phase)
    source = pl.when(order.is_not_null()).then(pl.lit("step_order")).otherwise(source)
    # With module calls in the trace, the nearest work a call ships or feeds is known.
    near = pl.col("_p_near").is_not_null() & pl.col("_stacked").fill_null(False)
    phase = pl.when(near).then(pl.col("_p_near")).otherwise(phase)
    source = pl.when(near).then(pl.lit("neighbour")).otherwise(source)
    bthread = pl.col("_bthread").fill_null(False)
    phase = pl.when(bthread).then(pl.lit("backward")).otherwise(phase)
    source = pl.when(bthread).then(pl.lit("backward_thread")).otherwise(source)
    for column, name in reversed(phase_rows):
        value = {"_m_module": pl.lit("forward"), "_p_autograd": pl.lit("backward")}.get(
            column, pl.col(column)
        )
        phase = pl.when(pl.col(column).is_not_null()).then(value).otherwise(phase)
        source = pl.when(pl.col(column).is_not_null()).then(pl.lit(name)).otherwise(source)
    out = out.with_columns(phase=phase, phase_source=source)
    # A gradient hook (DDP's bucket all-reduce) runs in a parameter's AccumulateGrad node.
    hook = pl.col("_p_autograd").str.contains("AccumulateGrad").fill_null(False) & pl.col(
        "_stacked"
    ).fill_null(False)
    module = pl.coalesce(
        "_m_fsdp", "_m_module", "_m_note", pl.when(hook).then(pl.lit(HOOK)), pl.lit(UNKNOWN)
    )
    msource = (
        pl.when(pl.col("_m_fsdp").is_not_null())
        .then(pl.lit("fsdp_annotation"))
        .when(pl.col("_m_module").is_not_null())
        .then(pl.lit("nn_module"))
        .when(pl.col("_m_note").is_not_null())
        .then(pl.lit("record_function"))
        .when(hook)
        .then(pl.lit(HOOK))
        .otherwise(pl.lit(UNKNOWN))
    )
    placed = out.with_columns(module=module, module_source=msource).select(*_EMPTY_PLACES)
    return placed.collect().sort("_row").drop("_row")


def _issue_points(calls: pl.LazyFrame, ops: pl.LazyFrame) -> pl.LazyFrame:
    """_row, rank, tid, at: where each call was issued. A kernel: its launch. A host span
    (no launch): the rank's k-th outermost c10d op for its k-th call (the backend runs them
    in order on its own thread)."""
    launched = calls.filter(pl.col("launch_ns").is_not_null()).select(
        "_row", "rank", tid="launch_tid", at="launch_ns"
    )
    spans = (
        calls.filter(pl.col("launch_ns").is_null())
        .sort("rank", "start_ns", "_row")
        .with_columns(_k=pl.int_range(pl.len()).over("rank"))
    )
    c10d = ops.filter(pl.col("name").str.starts_with(_C10D))
    # The issuing op is the outermost c10d op (one may call another).
    issuing = (
        _levels(c10d)
        .filter(pl.col("depth") == 0)
        .sort("rank", "start_ns")
        .with_columns(_k=pl.int_range(pl.len()).over("rank"))
        .select("rank", "_k", "tid", at="start_ns")
    )
    hosted = spans.join(issuing, on=["rank", "_k"], how="inner").select("_row", "rank", "tid", "at")
    return pl.concat([launched, hosted])


def _backward_threads(ops: pl.LazyFrame) -> pl.LazyFrame:
    """rank, tid of the autograd engine's own threads: backward nodes run there and no step
    marker does (a GPU job's backward runs on a device thread of the engine)."""
    per = ops.group_by("rank", "tid").agg(
        _b=pl.col("name").str.starts_with(_AUTOGRAD).any(),
        _s=pl.col("name").str.starts_with(_STEP).any(),
    )
    return per.filter(pl.col("_b") & ~pl.col("_s")).select("rank", "tid")


def _step_order(out: pl.LazyFrame, ops: pl.LazyFrame, autograd: pl.LazyFrame) -> pl.LazyFrame:
    """_row, _p_order: a call placed by where it was issued in its step (a ProfilerStep
    range of its rank) against the step's backward (its first to last autograd node on any
    thread): before it forward, inside it backward; after it, or in a step without one,
    other."""
    steps = ops.filter(pl.col("name").str.starts_with(_STEP)).select(
        "rank", _s0="start_ns", _s1="end_ns"
    )
    inside = (
        out.select("_row", "rank", "at")
        .join(steps, on="rank")
        .filter((pl.col("at") >= pl.col("_s0")) & (pl.col("at") <= pl.col("_s1")))
    )
    back = (
        inside.select("rank", "_s0", "_s1")
        .unique()
        .join(autograd.select("rank", "start_ns", "end_ns"), on="rank")
        .filter((pl.col("start_ns") >= pl.col("_s0")) & (pl.col("start_ns") <= pl.col("_s1")))
        .group_by("rank", "_s0")
        .agg(_b0=pl.col("start_ns").min(), _b1=pl.col("end_ns").max())
    )
    at = pl.col("at")
    return (
        inside.join(back, on=["rank", "_s0"], how="left")
        .with_columns(
            _p_order=pl.when(pl.col("_b0").is_null())
            .then(pl.lit("other"))
            .when(at < pl.col("_b0"))
            .then(pl.lit("forward"))
            .when(at <= pl.col("_b1"))
            .then(pl.lit("backward"))
            .otherwise(pl.lit("other"))
        )
        .unique("_row", keep="first")
        .select("_row", "_p_order")
    )


_CALL_KEYS = ("rank", "stream", "start_ns", "end_ns", "name")


def with_places(
    collectives: pl.DataFrame, kernels: pl.DataFrame, ops: pl.DataFrame
) -> pl.DataFrame:
    """The collectives table with PLACE_COLUMNS: each call's row of `kernels` (the
    communication rows, with launch_ns and launch_tid) placed by call_places, joined back by
    rank, stream, start and end (the collectives table keeps no launch thread)."""
    if collectives.height == 0:
        return collectives.with_columns(
            pl.lit(None, dtype=t).alias(n) for n, t in PLACE_COLUMNS.items()
        )
    comm = kernels.filter(pl.col("kind") == "communication")
    places = pl.concat([comm.select(_CALL_KEYS), call_places(comm, ops)], how="horizontal").unique(
        list(_CALL_KEYS), keep="first", maintain_order=True
    )
    return collectives.join(places, on=list(_CALL_KEYS), how="left", maintain_order="left")


_KEYS = ("phase", "module", "role", "collective")
_SUMS = ("exposed_ns", "wait_ns", "bubble_ns")
ATTRIBUTION_SCHEMA: dict[str, pl.DataType] = {
    **{k: pl.String() for k in _KEYS},
    "module_source": pl.String(),
    "calls": pl.Float64(),
    **{c: pl.Int64() for c in _SUMS},
    **{f"critical_{c}": pl.Int64() for c in _SUMS},
}


def attribution_table(calls: pl.LazyFrame, step_times: pl.DataFrame) -> pl.DataFrame:
    """Per phase x module x role x collective, the model of time's cost of its calls per
    step: `exposed_ns` (transfer no compute hid), `wait_ns` (exposed waiting for the group),
    `bubble_ns` (a pipeline's point-to-point calls, all of it) summed over ranks, and the
    same on each step's critical rank (`critical_*`); `calls` per step over ranks;
    `module_source` how the module was found (the most frequent). Largest on the critical
    rank first.

    calls: rank, step, phase, module, module_source, role, collective, exposed_ns (of the
    transfer), exposed_all_ns (the wait's exposed time too), as steptime.rank_time charges
    them (its pipeline_bubble rows: point-to-point calls of a pipeline group).
    step_times: step, critical_rank, complete. Steps are the complete ones (all of them
    where none is)."""
    complete = (
        step_times.filter(pl.col("complete")) if "complete" in step_times.columns else step_times
    )
    if complete.height == 0:
        complete = step_times
    n = max(complete.height, 1)
    steps = complete.select(
        pl.col("step").cast(pl.Int64), _critical=pl.col("critical_rank").cast(pl.Int64)
    ).lazy()
    bubble = pl.col("collective").is_in(P2P) & (pl.col("role") == "pipeline")
    exposed = pl.col("exposed_ns").fill_null(0)
    whole = pl.col("exposed_all_ns").fill_null(0)
    rows = (
        calls.with_columns(pl.col("step").cast(pl.Int64), pl.col("rank").cast(pl.Int64))
        .join(steps, on="step", how="inner")
        .with_columns(
            pl.col(k).cast(pl.String).fill_null(UNKNOWN) for k in (*_KEYS, "module_source")
        )
        .with_columns(
            exposed_ns=pl.when(bubble).then(0).otherwise(exposed),
            wait_ns=pl.when(bubble).then(0).otherwise(whole - exposed),
            bubble_ns=pl.when(bubble).then(whole).otherwise(0),
            _on=pl.col("rank") == pl.col("_critical"),
        )
    )
    out = (
        rows.group_by(*_KEYS)
        .agg(
            module_source=pl.col("module_source").mode().sort().first(),
            calls=pl.len() / n,
            **{c: pl.col(c).sum() // n for c in _SUMS},
            **{f"critical_{c}": pl.col(c).filter("_on").sum() // n for c in _SUMS},
        )
        .with_columns(
            _critical=pl.sum_horizontal(*(f"critical_{c}" for c in _SUMS)),
            _total=pl.sum_horizontal(*_SUMS),
        )
        .sort("_critical", "_total", *_KEYS, descending=[True, True, False, False, False, False])
        .select(*(pl.col(c).cast(t) for c, t in ATTRIBUTION_SCHEMA.items()))
    )
    return out.collect()


def _neighbour(out: pl.LazyFrame, autograd: pl.LazyFrame, modules: pl.LazyFrame) -> pl.LazyFrame:
    """_row, _p_near: for a call outside every phase range, the phase of the nearest work
    of its rank it ships or feeds: backward nodes and module calls, the last one ended
    before it (a send of the activations a forward made, of the gradients a backward
    made), or for a receive the first one after it (the forward or backward it feeds)."""
    work = pl.concat(
        [
            autograd.select("rank", "start_ns", "end_ns", _w=pl.lit("backward")),
            modules.select("rank", "start_ns", "end_ns", _w=pl.lit("forward")),
        ]
    )
    at = out.select("_row", "rank", "at", "_recv").filter(pl.col("at").is_not_null()).sort("at")
    before = at.join_asof(
        work.select("rank", "end_ns", _before="_w").sort("end_ns"),
        left_on="at",
        right_on="end_ns",
        by="rank",
        strategy="backward",
        check_sortedness=False,
    )
    after = at.join_asof(
        work.select("rank", "start_ns", _after="_w").sort("start_ns"),
        left_on="at",
        right_on="start_ns",
        by="rank",
        strategy="forward",
        check_sortedness=False,
    )
    both = before.select("_row", "_recv", "_before").join(after.select("_row", "_after"), on="_row")
    near = (
        pl.when(pl.col("_recv"))
        .then(pl.coalesce("_after", "_before"))
        .otherwise(pl.coalesce("_before", "_after"))
    )
    return both.select("_row", _p_near=near)


def job_attribution(tables: TableView) -> pl.DataFrame:
    """The `attribution` table of a job (derived table `attribution`): the model of time's
    exposure, waits and bubbles of its calls per phase x module x role x collective, per
    step, over ranks and on the critical rank, from the per-call exposure the blame's pass
    charged (model_of_time.exposed_per_call) and each call's role (roles.call_roles);
    empty where the calls have no phase (no collectives). Built once per rules run."""

    def compute() -> pl.DataFrame:
        if not tables.has("collectives", "phase"):
            return pl.DataFrame(schema=ATTRIBUTION_SCHEMA)
        cols = ["rank", *CALL_KEY, "phase", "module", "module_source"]
        if tables.has("collectives", "bytes"):
            cols.append("bytes")
        calls = tables.lazy("collectives", cols).with_columns(
            pl.col("rank").cast(pl.Int64),
            pl.col("process_group").cast(pl.String),
            pl.col("collective").cast(pl.String),
            pl.col("call_index").cast(pl.Int64),
        )
        exposure = model_of_time.exposed_per_call(tables).select(
            "rank", *CALL_KEY, "exposed_ns", "exposed_all_ns", "step"
        )
        joined = call_roles(
            tables, calls.join(exposure, on=["rank", *CALL_KEY], how="inner", nulls_equal=True)
        )
        assert isinstance(joined, pl.LazyFrame)
        return attribution_table(joined, model_of_time.step_times(tables))

    return memo(tables, "attribution", compute)
