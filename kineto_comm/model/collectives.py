"""One row per communication kernel, with what it moved, in which group, and how.

Metadata is taken from the best source present (column `source`): the kernel's own args, the
`record_param_comms` op around its launch, the `nccl:*` / `gloo:*` annotation around it, or
only the kernel's name. Launches are linked by time on the launching thread (correlation ->
runtime call -> the enclosing op), which works across PyTorch versions whose External ids
differ. Why one table: every analysis of communication (matching, waits, roles, sizes,
bandwidth, storms) reads its calls from here, in one vocabulary (names.py).

The sources and the columns (`COLLECTIVE_COLUMNS`) in full: the comment below the imports;
docs/tables.md documents the columns for users.
"""

from __future__ import annotations

import polars as pl

from kineto_comm.lazy import collect
from kineto_comm.load.decode import COLLECTIVE_SPAN, SIZED_C10D, RawTrace
from kineto_comm.load.discover import MAX_RANKS
from kineto_comm.model.names import (
    dtype_bytes,
    first_input_type,
    first_tensor_numel,
    kernel_fields,
    normalize_collective,
    normalize_dtype,
    nth_tensor_numel,
)

# In full (the module docstring says what and why):
#
# One row per communication kernel, with what it moved, in which group, and how.
#
# Metadata is taken from the best source present, in this order (column `source`):
#     kernel_args          the kernel's own args (newer Kineto copies the collective args there)
#     record_param_comms   the innermost `record_param_comms` op around the kernel's launch;
#                          for a batched point-to-point kernel (batch_isend_irecv on NCCL,
#                          launched in a `nccl:coalesced` span), its batch's send and recv ops
#     annotation           the innermost `nccl:*` / `gloo:*` op around the launch (op name,
#                          `Input Dims`, `Input type`), or the host span itself for gloo
#     kernel_name          only the kernel name (`ncclDevKernel_AllReduce_Sum_bf16_RING_LL`)
# Launches are linked by time on the launching thread (correlation -> runtime call -> the
# enclosing op), which works across PyTorch versions whose External ids differ.
#
# Columns (`COLLECTIVE_COLUMNS`):
#     rank, device, stream, name, start_ns, end_ns, duration_ns, launch_ns, step
#     collective      canonical name (see names.COLLECTIVES)
#     reduce_op, algorithm, protocol   parsed from the kernel name (null when absent)
#     dtype           canonical dtype; in_nelems, out_nelems; in_bytes, out_bytes
#     bytes           message size as nccl-tests counts it (the larger of in/out bytes)
#     group_size, process_group (pg_name), pg_desc, pg_ranks (text "[0, 1]")
#     seq             sequence number in the group where the trace records it
#     call_index      0-based order of this call among the rank's calls of the same
#                     (process_group, collective): the fallback key for cross-rank matching
#     in_splits, out_splits   an all-to-all's split sizes as the trace writes them
#                     ("[8, 16, 8, 16]": rows along the first dimension sent to, and received
#                     from, each rank of the group in group order; "[]": an even split),
#                     from its c10d::alltoall_base_ op's Concrete Inputs (null elsewhere)
#     source          where the metadata came from (above)
#     annotation      the innermost user annotation (record_function) around the call's launch,
#                     other than the step and collective spans ("## all2all_data:kjt values
#                     ##"): what the code was doing, which the roles read (null for host
#                     backends and where none encloses it)
#     compute_before  share (0..1) of the rank's compute time in the call's step that started
#                     before the call: where in the step's work it runs, whatever share of
#                     the wall time communication takes (null outside steps or when the
#                     step has no compute)

COLLECTIVE_COLUMNS = (
    "rank",
    "device",
    "stream",
    "name",
    "start_ns",
    "end_ns",
    "duration_ns",
    "launch_ns",
    "step",
    "collective",
    "reduce_op",
    "algorithm",
    "protocol",
    "dtype",
    "in_nelems",
    "out_nelems",
    "in_bytes",
    "out_bytes",
    "bytes",
    "group_size",
    "process_group",
    "pg_desc",
    "pg_ranks",
    "seq",
    "peer",
    "call_index",
    "in_splits",
    "out_splits",
    "source",
    "annotation",
    "compute_before",
)
_RPC = ("collective", "in_nelems", "out_nelems", "group_size", "dtype", "pg_name", "pg_desc")
_RPC_MORE = ("pg_ranks", "seq", "src_rank", "dst_rank")


def _enclosing(
    rows: pl.LazyFrame, ops: pl.LazyFrame, columns: list[str], prefix: str
) -> pl.LazyFrame:
    """Add `prefix`+column of the innermost op (on the rank's launching thread) around each
    launch."""
    cand = ops.select(
        "rank",
        pl.col("tid").alias("launch_tid"),
        pl.col("start_ns").alias(f"{prefix}start"),
        pl.col("end_ns").alias(f"{prefix}end"),
        *[pl.col(c).alias(f"{prefix}{c}") for c in columns],
    ).sort(f"{prefix}start")
    keyed = rows.with_columns(_at=pl.col("launch_ns").fill_null(-1)).sort("_at")
    joined = keyed.join_asof(
        cand,
        left_on="_at",
        right_on=f"{prefix}start",
        by=["rank", "launch_tid"],
        strategy="backward",
        check_sortedness=False,
    )
    inside = pl.col(f"{prefix}end") >= pl.col("_at")
    return joined.with_columns(
        pl.when(inside).then(pl.col(f"{prefix}{c}")).otherwise(None).alias(f"{prefix}{c}")
        for c in columns
    ).drop("_at", f"{prefix}start", f"{prefix}end")


def _first_known(*exprs: pl.Expr) -> pl.Expr:
    """The first expression that is neither null nor 'unknown'."""
    cleaned = [pl.when(e == "unknown").then(None).otherwise(e) for e in exprs]
    return pl.coalesce(*cleaned).fill_null("unknown")


# The table's derived columns, built once (building Polars expressions costs milliseconds
# of Python per rank; they do not depend on the data).
_HOST = pl.col("device") == -1
_ANN_NAME = pl.when(_HOST).then(pl.col("name")).otherwise(pl.col("ann_name"))
_ANN_DIMS = pl.coalesce("arg_input_dims", "ann_input_dims")
_ANN_TYPE = pl.coalesce("arg_input_type", "ann_input_type")
_PARSED = kernel_fields(pl.col("name"))
_FIELDS = {
    "collective": _first_known(
        normalize_collective(pl.col("arg_collective")),
        normalize_collective(pl.col("rpc_collective")),
        normalize_collective(_ANN_NAME),
        pl.col("kernel_collective"),
    ),
    "dtype": pl.coalesce(
        normalize_dtype(pl.col("arg_dtype")),
        normalize_dtype(pl.col("rpc_dtype")),
        normalize_dtype(first_input_type(_ANN_TYPE)),
        pl.col("kernel_dtype"),
    ),
    "in_nelems": pl.coalesce("arg_in_nelems", "rpc_in_nelems", first_tensor_numel(_ANN_DIMS)),
    "out_nelems": pl.coalesce("arg_out_nelems", "rpc_out_nelems"),
    "group_size": pl.coalesce("arg_group_size", "rpc_group_size"),
    "process_group": pl.coalesce("arg_pg_name", "rpc_pg_name"),
    "pg_desc": pl.coalesce("arg_pg_desc", "rpc_pg_desc"),
    "pg_ranks": pl.coalesce("arg_pg_ranks", "rpc_pg_ranks"),
    "seq": pl.coalesce("arg_seq", "rpc_seq"),
    "_src": pl.coalesce("arg_src_rank", "rpc_src_rank"),
    "_dst": pl.coalesce("arg_dst_rank", "rpc_dst_rank"),
    "source": pl.when(pl.col("arg_collective").is_not_null())
    .then(pl.lit("kernel_args"))
    .when(pl.col("rpc_collective").is_not_null())
    .then(pl.lit("record_param_comms"))
    .when(_ANN_NAME.is_not_null())
    .then(pl.lit("annotation"))
    .otherwise(pl.lit("kernel_name")),
}
# The other end of a point-to-point transfer: the destination of a send, the source of a
# recv (as global ranks, as PyTorch records them).
_PEER = (
    pl.when(pl.col("collective") == "send")
    .then(pl.col("_dst"))
    .when(pl.col("collective") == "recv")
    .then(pl.col("_src"))
    .otherwise(pl.coalesce("_dst", "_src"))
)
# Else the c10d op's peer, a rank of the call's group (_with_c10d_sizes), as a global rank.
_PEER_OF_OP = (
    pl.col("pg_ranks")
    .str.extract_all(r"-?\d+")
    .list.get(pl.col("_group_peer"), null_on_oob=True)
    .cast(pl.Int64, strict=False)
)
_SIZES = {
    "in_bytes": pl.col("in_nelems") * dtype_bytes(pl.col("dtype")),
    "out_bytes": pl.col("out_nelems") * dtype_bytes(pl.col("dtype")),
    "duration_ns": pl.col("end_ns") - pl.col("start_ns"),
}
_BYTES = pl.max_horizontal("in_bytes", "out_bytes")
_CALL_INDEX = pl.int_range(pl.len(), dtype=pl.Int64).over(
    "rank", pl.col("process_group").fill_null("?"), "collective"
)


def build_collectives(
    kernels: pl.DataFrame, raw: RawTrace, process_groups: pl.DataFrame | None = None
) -> pl.DataFrame:
    """The collectives table of the ranks in `kernels` from their kernel rows (with `arg_*`
    columns), in (rank, start) order; `raw` and `process_groups` carry a `rank` column too."""
    comm = kernels.filter(pl.col("kind") == "communication")
    if comm.height == 0:
        return pl.DataFrame(schema=_empty_schema())
    ops = raw.ops.lazy()
    rpc = ops.filter(pl.col("name") == "record_param_comms")
    ann = ops.filter(pl.col("name").str.contains(COLLECTIVE_SPAN))
    found = _enclosing(comm.lazy(), rpc, [*_RPC, *_RPC_MORE], "rpc_")
    found = _with_batch_ops(found, ops, rpc)
    found = _enclosing(found, ann, ["name", "input_dims", "input_type"], "ann_")
    notes = ops.filter(
        (pl.col("cat") == "user_annotation")
        & ~pl.col("name").str.contains(COLLECTIVE_SPAN)
        & ~pl.col("name").str.starts_with("ProfilerStep#")
    )
    found = _enclosing(found, notes, ["name"], "note_").rename({"note_name": "annotation"})
    out = found.with_columns(**_PARSED).with_columns(**_FIELDS)
    out = _with_c10d_sizes(out, ops.filter(pl.col("name").is_in(SIZED_C10D)))
    if process_groups is not None and process_groups.height:
        out = _named_from_config(out, process_groups.lazy())
        out = out.join(
            process_groups.lazy().select(
                "rank",
                pl.col("pg_name").alias("process_group"),
                pl.col("ranks_text").alias("_pg_ranks"),
                pl.col("pg_size").alias("_pg_size"),
                pl.col("pg_desc").alias("_pg_desc"),
            ),
            on=["rank", "process_group"],
            how="left",
        ).with_columns(
            pg_ranks=pl.coalesce("pg_ranks", "_pg_ranks"),
            group_size=pl.coalesce("group_size", "_pg_size"),
            pg_desc=pl.coalesce("pg_desc", "_pg_desc"),
        )
    out = out.with_columns(peer=pl.coalesce(_PEER, _PEER_OF_OP)).drop("_group_peer")
    out = out.with_columns(**_SIZES).with_columns(bytes=_BYTES)
    # Calls that start together are ordered by launch, end and stream: the joins above keep
    # no order, and a file must get the same table alone or modelled with others.
    out = out.sort(
        "rank", "start_ns", "launch_ns", "end_ns", "stream", nulls_last=True, maintain_order=True
    ).with_columns(call_index=_CALL_INDEX)
    return collect(_compute_before(out, kernels.lazy()).select(COLLECTIVE_COLUMNS))


# The span NCCL's batched point-to-point calls (batch_isend_irecv, coalescing) launch their
# one kernel in, after the batch's send and recv ops have returned.
BATCH_SPAN = "nccl:coalesced"


def _with_batch_ops(calls: pl.LazyFrame, ops: pl.LazyFrame, rpc: pl.LazyFrame) -> pl.LazyFrame:
    """A batched point-to-point kernel's metadata (`rpc_*`), from its batch's ops.

    `batch_isend_irecv` on NCCL launches one kernel for the batch in a `nccl:coalesced`
    span, whose args, like the kernel's, name nothing; each send and recv of the batch
    recorded its `record_param_comms` (group, peer, size) before, on the same thread, where
    it only queued the transfer (pytorch/pytorch#194693). The batch is those ops since the
    thread's previous batch span and its previous communication launch. A batch of one op
    gives the kernel that op's metadata. A batch of several, which one kernel carries
    together, gives the group they share, what the batch sent (in) and received (out), and
    `send_recv` (or send, or recv, where all its ops are); and the peer where all its ops
    have the same (an exchange with one stage, matched with that stage's batch), else none
    (a send to one stage and a receive from another: which part of the kernel's time moved
    which op is not recorded, so the kernel is matched with neither peer's)."""
    spans = ops.filter(pl.col("name") == BATCH_SPAN).select("rank", "tid", "start_ns", "end_ns")
    fields = [*_RPC, *_RPC_MORE]
    # A batch's ops come after the thread's previous batch span and after its previous
    # communication launch (an unbatched send launches its own kernel inside its op).
    launches = (
        calls.filter(pl.col("launch_ns").is_not_null())
        .select("rank", tid="launch_tid", _launch="launch_ns")
        .sort("_launch")
    )
    bounds = (
        spans.select(
            "rank",
            "tid",
            _batch="start_ns",
            _prev_end=pl.col("end_ns").shift(1).over("rank", "tid", order_by="start_ns"),
        )
        .sort("_batch")
        .join_asof(
            launches,
            left_on="_batch",
            right_on="_launch",
            by=["rank", "tid"],
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
        .select(
            "rank",
            "tid",
            "_batch",
            _after=pl.max_horizontal(
                pl.col("_prev_end").fill_null(0), pl.col("_launch").fill_null(0)
            ),
        )
    )
    queued = (
        rpc.filter(pl.col("collective").is_in(["send", "recv"]))
        .select("rank", "tid", "start_ns", *fields)
        .sort("start_ns")
        .join_asof(
            bounds,
            left_on="start_ns",
            right_on="_batch",
            by=["rank", "tid"],
            strategy="forward",
            check_sortedness=False,
        )
        .filter(pl.col("_batch").is_not_null() & (pl.col("start_ns") >= pl.col("_after")))
    )
    one = pl.len() == 1
    sends, recvs = pl.col("collective") == "send", pl.col("collective") == "recv"
    same_group = pl.col("pg_name").n_unique() == 1
    # The other end of each op; a batch whose ops all have the same one (Megatron-LM's
    # 1F1B steady state: send_forward_recv_backward, an activation out to the next stage
    # and its gradient back) exchanges with that peer, matched with its batch there.
    op_peer = pl.when(sends).then(pl.col("dst_rank")).otherwise(pl.col("src_rank"))
    one_peer = (op_peer.n_unique() == 1) & (op_peer.null_count() == 0)

    def summed(c: str, part: pl.Expr) -> pl.Expr:
        # What the batch sent (in) or received (out): its sends' (recvs') sizes together;
        # unknown when one of them is.
        chosen = pl.when(part.any())
        total = chosen.then(pl.col(c).filter(part).sum()).otherwise(pl.col(c).sum())
        missing = chosen.then(pl.col(c).filter(part).null_count()).otherwise(pl.col(c).null_count())
        return pl.when(missing == 0).then(total)

    several = {
        "collective": pl.when(sends.all())
        .then(pl.lit("send"))
        .when(recvs.all())
        .then(pl.lit("recv"))
        .otherwise(pl.lit("send_recv")),
        "in_nelems": summed("in_nelems", sends),
        "out_nelems": summed("out_nelems", recvs),
        "dtype": pl.when(pl.col("dtype").n_unique() == 1).then(pl.col("dtype").first()),
        "src_rank": pl.when(one_peer).then(op_peer.first()),
        "dst_rank": pl.when(one_peer).then(op_peer.first()),
        **{
            c: pl.when(same_group).then(pl.col(c).first())
            for c in ("group_size", "pg_name", "pg_desc", "pg_ranks")
        },
    }
    batches = queued.group_by("rank", "tid", "_batch").agg(
        pl.when(one).then(pl.col(c).first()).otherwise(several.get(c)).alias(f"_b_{c}")
        for c in fields
    )
    launched = _enclosing(calls, spans, ["start_ns"], "_span_")
    return (
        launched.join(
            batches,
            left_on=["rank", "launch_tid", "_span_start_ns"],
            right_on=["rank", "tid", "_batch"],
            how="left",
        )
        .with_columns(
            pl.when(pl.col("rpc_collective").is_null())
            .then(pl.col(f"_b_{c}"))
            .otherwise(pl.col(f"rpc_{c}"))
            .alias(f"rpc_{c}")
            for c in fields
        )
        .drop("_span_start_ns", *[f"_b_{c}" for c in fields])
    )


# What each sized c10d op (decode.SIZED_C10D) calls, canonically.
_C10D_COLLECTIVE = {
    "c10d::alltoall_base_": "all_to_all",
    "c10d::_allgather_base_": "all_gather",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::send": "send",
    "c10d::recv_": "recv",
}


# An all-to-all op's Concrete Inputs (output, input, group, output_split_sizes,
# input_split_sizes, ...): its split sizes, as written ("[8, 16]", "[]": even).
def _nth_concrete(n: int) -> pl.Expr:
    """The n-th of an op's Concrete Inputs when it is a list of integers, else null."""
    value = (
        pl.col("concrete_inputs")
        .str.extract_all(r'"[^"]*"')
        .list.get(n, null_on_oob=True)
        .str.strip_chars('"')
    )
    return pl.when(value.str.contains(r"^\[[\d,\s]*\]$")).then(value)


_ALL_TO_ALL = pl.col("name") == "c10d::alltoall_base_"
# The third of a point-to-point op's Concrete Inputs (tensors, group, peer, tag): the peer's
# rank in the call's group.
_GROUP_PEER = (
    pl.col("concrete_inputs")
    .str.extract(r'^\s*\[\s*"[^"]*"\s*,\s*"[^"]*"\s*,\s*"(\d+)"', 1)
    .cast(pl.Int64, strict=False)
)


def _with_c10d_sizes(calls: pl.LazyFrame, c10d: pl.LazyFrame) -> pl.LazyFrame:
    """The calls' sizes where neither their args nor a record_param_comms give them, from
    the c10d op that made each call (its Input Dims are [output, input, ...]; the output,
    what a rank receives, is recorded nowhere else in older and gloo traces). A kernel's op
    encloses its launch; a host backend (gloo) runs the call on its own thread after the op
    returned, in the order the ops were issued, so there the k-th call of a collective on a
    rank is its k-th op of that collective. An op of another collective gives nothing.
    A point-to-point op gives no size (its annotation has it) but the peer's group rank
    (`_group_peer`, its Concrete Inputs: gloo traces record the peer nowhere else); an
    all-to-all op its split sizes (`in_splits`, `out_splits`, its Concrete Inputs)."""
    p2p = pl.col("name").is_in(["c10d::send", "c10d::recv_"])
    ops = c10d.select(
        "rank",
        "tid",
        "start_ns",
        "end_ns",
        pl.col("name").replace_strict(_C10D_COLLECTIVE, default=None).alias("_coll"),
        pl.when(~p2p).then(nth_tensor_numel(pl.col("input_dims"), 0)).alias("_out"),
        pl.when(~p2p).then(nth_tensor_numel(pl.col("input_dims"), 1)).alias("_in"),
        pl.when(p2p).then(_GROUP_PEER).alias("_peer"),
        pl.when(_ALL_TO_ALL).then(_nth_concrete(4)).alias("_isplit"),
        pl.when(_ALL_TO_ALL).then(_nth_concrete(3)).alias("_osplit"),
    )
    nth = pl.int_range(pl.len(), dtype=pl.Int64).over("rank", "_coll", order_by="start_ns")
    key = ["rank", "start_ns", "end_ns", "launch_tid", "_coll"]
    host = (
        calls.filter(_HOST)
        .select("rank", "start_ns", "end_ns", "launch_tid", _coll="collective")
        .with_columns(_nth=nth)
        .join(ops.with_columns(_nth=nth), on=["rank", "_coll", "_nth"], how="inner")
        .select(
            *key, h_out="_out", h_in="_in", h_peer="_peer", h_isplit="_isplit", h_osplit="_osplit"
        )
        .unique(key, keep="first")
    )
    same = pl.col("c10d_coll") == pl.col("collective")
    return (
        _enclosing(calls, ops, ["_coll", "_out", "_in", "_peer", "_isplit", "_osplit"], "c10d")
        .with_columns(_coll="collective")
        .join(host, on=key, how="left")
        .with_columns(
            in_nelems=pl.coalesce(
                "arg_in_nelems",
                "rpc_in_nelems",
                pl.when(same).then("c10d_in").otherwise("h_in"),
                "in_nelems",
            ),
            out_nelems=pl.coalesce("out_nelems", pl.when(same).then("c10d_out").otherwise("h_out")),
            _group_peer=pl.when(same).then("c10d_peer").otherwise("h_peer"),
            in_splits=pl.when(same).then("c10d_isplit").otherwise("h_isplit"),
            out_splits=pl.when(same).then("c10d_osplit").otherwise("h_osplit"),
        )
        .drop(
            *("c10d_coll", "c10d_out", "c10d_in", "c10d_peer", "c10d_isplit", "c10d_osplit"),
            *("_coll", "h_out", "h_in", "h_peer", "h_isplit", "h_osplit"),
        )
    )


def _named_from_config(calls: pl.LazyFrame, groups: pl.LazyFrame) -> pl.LazyFrame:
    """Calls whose trace names no group (gloo's annotations carry none) get the one group of
    the rank's `distributedInfo.pg_config` they can be on: the only group of the call's
    size, or, with the size unknown, the rank's only group. Where several could be, the
    call stays unnamed rather than guessed; its size is still known where all the rank's
    groups have one size (a job whose groups all span the world: the bus bandwidth needs
    the size, not the group)."""
    key = pl.col("rank"), pl.col("pg_size")
    sole = pl.len().over(key) == 1
    by_size = groups.filter(sole).select("rank", "pg_size", _by_size="pg_name")
    only = groups.filter(pl.len().over("rank") == 1).select("rank", _only="pg_name")
    one_size = (
        groups.group_by("rank")
        .agg(_sizes=pl.col("pg_size").n_unique(), _size=pl.col("pg_size").first())
        .filter((pl.col("_sizes") == 1) & pl.col("_size").is_not_null())
        .select("rank", "_size")
    )
    return (
        calls.join(
            by_size, left_on=["rank", "group_size"], right_on=["rank", "pg_size"], how="left"
        )
        .join(only, on="rank", how="left")
        .join(one_size, on="rank", how="left")
        .with_columns(
            process_group=pl.coalesce(
                "process_group",
                pl.when(pl.col("group_size").is_null()).then("_only").otherwise("_by_size"),
            ),
            group_size=pl.coalesce("group_size", "_size"),
        )
        .drop("_by_size", "_only", "_size")
    )


def _compute_before(calls: pl.LazyFrame, kernels: pl.LazyFrame) -> pl.LazyFrame:
    """Add compute_before: the share of the call's step's compute kernel time that started
    before the call (a compute kernel starting with it counts as before).

    Why: the roles tell a gradient reduction (it cannot start before the forward pass, about
    a third of the compute) from a tensor-parallel one (inside the first layer) by where the
    call sits in the step. On the wall clock that breaks when communication takes most of
    the step (a fast GPU, slow links): backward then starts a few percent into the step.

    One sort of the kernels by (rank, step, start) and running sums over it, each group's
    found at its boundaries: no per-group hashing (a window per step, a group-by and an as-of
    join by step cost four times as much on a batch of rank files' first call:
    bench/README.md, twenty-ninth session)."""
    at = ["rank", "step", "start_ns"]
    kind = pl.col("kind")

    def changes(*keys: str, offset: int) -> pl.Expr:
        """Whether the row differs in `keys` from the row `offset` away (none: it does)."""
        return ~pl.all_horizontal(pl.col(k).eq_missing(pl.col(k).shift(offset)) for k in keys)

    def at_last_of(*keys: str) -> pl.Expr:
        """_upto at the last row of each run of rows with the same `keys`."""
        return pl.when(changes(*keys, offset=-1)).then(pl.col("_upto")).backward_fill()

    rows = kernels.select(
        *at,
        _c=pl.when((kind == "compute") & (pl.col("step") >= 0))
        .then(pl.col("end_ns") - pl.col("start_ns"))
        .otherwise(0),
        _call=kind == "communication",
    ).sort(at)
    # The step's compute time up to and including each row (the running sum less its value
    # where the step begins); then per row, at the end of its run of rows with the same
    # start (_done) and at the end of the step (_all).
    total = pl.col("_c").cum_sum()
    upto = (
        total - pl.when(changes("rank", "step", offset=1)).then(total - pl.col("_c")).forward_fill()
    )
    share = (
        rows.with_columns(_upto=upto)
        .with_columns(_done=at_last_of(*at), _all=at_last_of("rank", "step"))
        .filter("_call")
        .select(
            *at,
            # Rounded: the division's last bit varies with the memory layout (a file alone
            # or in a batch), and the same file must give the same table.
            compute_before=pl.when(pl.col("_all") > 0).then(
                (pl.col("_done") / pl.col("_all")).round(9)
            ),
        )
        .unique(at, keep="first")
    )
    return calls.join(share, on=at, how="left", nulls_equal=True, maintain_order="left")


def _empty_schema() -> dict[str, pl.DataType]:
    s, i = pl.String(), pl.Int64()
    types: dict[str, pl.DataType] = {c: i for c in COLLECTIVE_COLUMNS}
    types["compute_before"] = pl.Float64()
    for c in (
        "name",
        "collective",
        "reduce_op",
        "algorithm",
        "protocol",
        "dtype",
        "process_group",
        "pg_desc",
        "pg_ranks",
        "in_splits",
        "out_splits",
        "source",
        "annotation",
    ):
        types[c] = s
    return types


def parse_ranks(col: str | pl.Expr) -> pl.Expr:
    """A `pg_ranks` string such as "[0, 2, 4]" as a list of Int64: the one reading of it
    (roles and the pipeline table use it too). A number that cannot be a rank (negative,
    or beyond MAX_RANKS: damage) is left out rather than wrapped or failing the cast."""
    expr = pl.col(col) if isinstance(col, str) else col
    numbers = expr.str.extract_all(r"-?\d+").cast(pl.List(pl.Int64), strict=False)
    return numbers.list.eval(pl.element().filter(pl.element().is_between(0, MAX_RANKS - 1)))
