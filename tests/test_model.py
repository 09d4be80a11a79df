"""Kernels, collectives, steps and the time breakdown, on crafted and real traces."""

from __future__ import annotations

import itertools
import random

import polars as pl
import pytest

from kineto_comm import analyze
from kineto_comm.analysis.overlap import (
    _rank_time_order,
    breakdown,
    breakdowns,
    merge_intervals,
    subtract_intervals,
)
from kineto_comm.load.assemble import _join_launches
from kineto_comm.model.collectives import _compute_before
from kineto_comm.model.names import kernel_fields, normalize_collective

from .conftest import SAMPLES, cpu, host_wait, kernel, launch, shared, write_trace


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            ("all_reduce", "sum", "bfloat16", "RING", "LL"),
        ),
        (
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
            ("all_reduce", "sum", "float32", "RING", "LL"),
        ),
        (
            "ncclDevKernel_ReduceScatter_Sum_f32_RING_SIMPLE(x)",
            ("reduce_scatter", "sum", "float32", "RING", "SIMPLE"),
        ),
        ("ncclDevKernel_AllGather_RING_LL(x)", ("all_gather", None, None, "RING", "LL")),
        ("ncclDevKernel_SendRecv(x)", ("send_recv", None, None, None, None)),
        (
            "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
            ("send_recv", "sum", "int8", "RING", "SIMPLE"),
        ),
        (
            "ncclDevKernel_AllReduce_Sum_f16_TREE_LL128(x)",
            ("all_reduce", "sum", "float16", "TREE", "LL128"),
        ),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", ("unknown",) + (None,) * 4),
    ],
)
def test_kernel_names_are_parsed(name, expected):
    df = pl.DataFrame({"name": [name]}).select(**kernel_fields(pl.col("name")))
    row = df.row(0, named=True)
    got = (
        row["kernel_collective"],
        row["reduce_op"],
        row["kernel_dtype"],
        row["algorithm"],
        row["protocol"],
    )
    assert got == expected


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("allreduce", "all_reduce"),
        ("nccl:all_reduce", "all_reduce"),
        ("nccl:_allgather_base", "all_gather"),
        ("all_gather_into_tensor", "all_gather"),
        ("nccl:_reduce_scatter_base", "reduce_scatter"),
        ("reduce_scatter_tensor", "reduce_scatter"),
        ("nccl:all_to_all", "all_to_all"),
        ("alltoall_base", "all_to_all"),
        ("gloo:send", "send"),
        ("c10d::recv_", "recv"),
        ("broadcast", "broadcast"),
        ("barrier", "barrier"),
        ("something_else", "unknown"),
    ],
)
def test_collective_spellings_are_normalised(raw, canonical):
    got = pl.DataFrame({"c": [raw]}).select(normalize_collective(pl.col("c"))).item()
    assert got == canonical


def test_merge_and_subtract_intervals():
    df = pl.DataFrame({"g": [1, 1, 1, 1], "start_ns": [0, 5, 20, 22], "end_ns": [10, 12, 25, 23]})
    merged = merge_intervals(df, ["g"]).sort("start_ns")
    assert merged.select("start_ns", "end_ns").rows() == [(0, 12), (20, 25)]
    holes = pl.DataFrame({"g": [1], "start_ns": [3], "end_ns": [21]})
    left = subtract_intervals(df, holes, ["g"]).sort("start_ns")
    assert left.select("start_ns", "end_ns").rows() == [(0, 3), (21, 25)]


def test_breakdown_matches_hand_computed_timeline():
    # compute [0,100) and [150,200); comm [80,170) on another stream; memcpy [300,310).
    kernels = pl.DataFrame(
        {
            "rank": [0, 0, 0, 0],
            "kind": ["compute", "compute", "communication", "memcpy"],
            "start_ns": [0, 150, 80, 300],
            "end_ns": [100, 200, 170, 310],
        }
    )
    windows = pl.DataFrame(
        {"rank": [0, 0], "window": [1, 2], "start_ns": [0, 160], "end_ns": [160, 400]}
    )
    out = {r["window"]: r for r in breakdown(kernels, windows).iter_rows(named=True)}
    w1, w2 = out[1], out[2]
    assert (w1["compute_ns"], w1["comm_ns"], w1["overlap_ns"], w1["exposed_comm_ns"]) == (
        110,
        80,
        30,
        50,
    )
    assert w1["idle_ns"] == 0 and w1["wall_ns"] == 160
    assert (w2["compute_ns"], w2["comm_ns"], w2["overlap_ns"], w2["exposed_comm_ns"]) == (
        40,
        10,
        10,
        0,
    )
    assert w2["memcpy_ns"] == 10
    assert w2["idle_ns"] == 240 - 40 - 10


def _two_step_trace(tmp_path):
    """Two steps; step 1 all-reduce overlaps compute, step 2 all-reduce is exposed."""
    ar = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)"
    events = [
        cpu("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        cpu("ProfilerStep#2", 1000, 1000, cat="user_annotation"),
        launch(10, 1),
        kernel("gemm", 100, 400, corr=1),
        cpu(
            "record_param_comms",
            20,
            30,
            **{
                "Collective name": "allreduce",
                "In msg nelems": 1_000_000,
                "Out msg nelems": 1_000_000,
                "Group size": 4,
                "dtype": "BFloat16",
                "Process Group Name": "3",
                "Process Group Description": "dp",
                "Process Group Ranks": "[0, 2, 4, 6]",
                "Seq": 7,
            },
        ),
        cpu("nccl:all_reduce", 25, 20, cat="user_annotation"),
        launch(30, 2),
        kernel(ar, 200, 200, stream=20, corr=2),
        launch(1010, 3),
        kernel("gemm", 1100, 300, corr=3),
        cpu(
            "nccl:all_reduce",
            1020,
            20,
            cat="user_annotation",
            **{"Input Dims": [[2048, 512]], "Input type": ["c10::BFloat16"]},
        ),
        launch(1030, 4),
        kernel(ar, 1500, 250, stream=20, corr=4),
    ]
    return write_trace(tmp_path / "rank0.json", events, rank=0, world_size=8)


def test_steps_collectives_and_metrics_from_a_crafted_trace(tmp_path):
    report = analyze(_two_step_trace(tmp_path), jobs=1)
    coll = report.collectives.sort("start_ns")
    assert coll["collective"].to_list() == ["all_reduce", "all_reduce"]
    first, second = coll.row(0, named=True), coll.row(1, named=True)
    assert first["source"] == "record_param_comms"
    assert (first["bytes"], first["dtype"], first["process_group"], first["seq"]) == (
        2_000_000,
        "bfloat16",
        "3",
        7,
    )
    assert first["pg_ranks"] == "[0, 2, 4, 6]" and first["group_size"] == 4
    assert (first["algorithm"], first["protocol"]) == ("RING", "LL")
    assert second["source"] == "annotation"
    assert second["bytes"] == 2048 * 512 * 2 and second["dtype"] == "bfloat16"
    assert coll["step"].to_list() == [1, 2]
    steps = {r["step"]: r for r in report.steps.iter_rows(named=True)}
    assert steps[1]["start_ns"] == 100_000 and steps[1]["end_ns"] == 1_100_000
    assert steps[1]["comm_ns"] == 200_000 and steps[1]["overlap_ns"] == 200_000
    assert steps[1]["exposed_comm_ns"] == 0
    assert steps[2]["exposed_comm_ns"] == 250_000
    assert steps[2]["end_ns"] == 1_750_000
    total = report.totals.row(0, named=True)
    assert total["comm_ns"] == 450_000 and total["exposed_comm_ns"] == 250_000
    assert total["wall_ns"] == 1_650_000


def test_trace_without_step_markers_is_one_window(tmp_path):
    path = write_trace(tmp_path / "t.json", [kernel("a", 0, 10), kernel("b", 20, 10)])
    report = analyze(path, jobs=1)
    assert report.steps["step"].to_list() == [-1]
    assert report.steps["wall_ns"].to_list() == [30_000]


def test_sweep_orders_events_by_rank_then_time_whatever_the_clocks():
    # Rank 1's times straddle where one (rank, time) integer key would wrap around.
    times = [(1, (1 << 62) + 1), (0, 1), (1, (1 << 62) - 10), (0, 0), (1, 5)]
    events = pl.DataFrame(times, schema=["rank", "t"], orient="row")
    assert _rank_time_order(events).rows() == sorted(times)
    assert _rank_time_order(events.head(0)).height == 0


@pytest.mark.parametrize("base", [0, 1 << 45, -(1 << 45)])
def test_kernels_get_the_first_runtime_call_with_their_file_and_correlation(base):
    runtime = pl.DataFrame(
        {
            "_file": [0, 0, 1, 1, 0],
            "correlation": [base + 1, base + 2, base + 1, None, base + 1],
            "start_ns": [10, 20, 30, 40, 50],
            "end_ns": [12, 25, 39, 41, 53],
            "tid": ["a", "b", "c", "d", "e"],
        }
    )
    # The last: file 0's id one key width above file 1's call (no such call in file 0).
    gpu = pl.DataFrame(
        {
            "_file": [1, 0, 0, 1, 0],
            "correlation": [base + 1, base + 1, base + 3, None, base + 1 + (1 << 40)],
        }
    )
    got = _join_launches(gpu, runtime).select("launch_ns", "launch_tid", "launch_end_ns")
    nothing = (None, None, None)
    assert got.rows() == [(30, "c", 39), (10, "a", 12), nothing, nothing, nothing]


def test_kernels_know_where_their_launching_thread_last_waited_for_the_device(tmp_path):
    """waited_ns: the device work a host wait of the launching thread outlasted, before the
    launch. A stream sync that returns 3 us after a kernel ended waited for it; one that
    returns at once waited for nothing; a run of event polls 13 us apart waited for the
    kernel that ended during it, and so did a copy whose call returned after the copy;
    another thread's waits are not this thread's. Found with the scanner and without it."""
    from kineto_comm.load import scan

    events = [
        kernel("gemm_a", 0.0, 100.0, corr=1),
        launch(-10.0, 1),
        host_wait(50.0, 53.0, 90),  # returns at 103: waited for gemm_a (ends at 100)
        kernel("gemm_b", 115.0, 100.0, corr=2),
        launch(110.0, 2),
        host_wait(220.0, 3.0, 91),  # returns at once: gemm_b ended at 215
        kernel("gemm_c", 240.0, 150.0, corr=3),
        launch(230.0, 3),
        *[host_wait(300.0 + 13 * i, 1.0, 92 + i, "cudaEventQuery") for i in range(8)],
        kernel("gemm_d", 410.0, 50.0, corr=4),  # launched after the polls saw gemm_c end
        launch(405.0, 4),
        *[host_wait(380.0 + 5 * i, 1.0, 120 + i, "cudaEventQuery", tid=200) for i in range(8)],
        kernel("copy", 505.0, 50.0, corr=5, cat="gpu_memcpy"),
        launch(500.0, 5, dur=60.0),  # a blocking copy: returns at 560, after it ended
        kernel("gemm_e", 575.0, 10.0, corr=6),
        launch(570.0, 6),
        kernel("gemm_f", 590.0, 10.0, corr=7),
        launch(380.0, 7, tid=200),  # launched by the other thread before its polls ended
    ]
    write_trace(tmp_path / "rank0.json", events, world_size=1)
    # Where each kernel's thread last waited, in us from the first kernel's start.
    expect = {"gemm_a": None, "gemm_b": 100, "gemm_c": 100, "gemm_d": 390, "copy": 390}
    expect |= {"gemm_e": 555, "gemm_f": None}
    for scanner in (scan._scanner, None):
        decode_scanner = scan._scanner
        scan._scanner = scanner
        try:
            k = analyze(tmp_path, jobs=1, ignore=["ALL"]).kernels.sort("start_ns")
        finally:
            scan._scanner = decode_scanner
        start = k["start_ns"].min()
        got = dict(
            zip(
                k["name"].to_list(),
                [None if w is None else (w - start) // 1000 for w in k["waited_ns"].to_list()],
                strict=True,
            )
        )
        assert got == expect, (scanner, got)


def test_extra_comm_patterns_mark_kernels_as_communication(tmp_path):
    path = write_trace(
        tmp_path / "t.json", [kernel("deep_ep::dispatch<8>", 0, 10), kernel("gemm", 0, 10)]
    )
    plain = analyze(path, jobs=1)
    custom = analyze(path, jobs=1, comm_patterns=["dispatch|combine"])
    assert plain.collectives.height == 0
    assert custom.kernels.filter(pl.col("kind") == "communication")["name"].to_list() == [
        "deep_ep::dispatch<8>"
    ]


def test_collective_metadata_from_nccl_data_kernel_args():
    report = analyze(shared("hta/nccl_parser_config/nccl_data.json.gz"), jobs=1)
    coll = report.collectives
    assert coll.height == 21
    assert (coll["source"] == "kernel_args").all()
    ar = coll.filter(pl.col("collective") == "all_reduce")
    assert ar.height == 15
    assert set(ar["dtype"]) == {"float32"}
    assert set(ar["process_group"]) == {"0"} and set(ar["pg_ranks"]) == {"[0, 1]"}
    assert ar["bytes"].null_count() == 0
    assert (ar["bytes"] == ar["in_nelems"] * 4).all()
    assert set(coll["collective"]) == {"all_reduce", "broadcast"}


def test_old_traces_take_sizes_from_nccl_annotations():
    report = analyze(shared("hta/trace_diff/control/control.json.gz"), jobs=1)
    coll = report.collectives
    assert set(coll["source"]) == {"annotation"}
    # SendRecv kernels launched from nccl:all_to_all are all-to-all, not send/recv.
    assert set(coll["collective"]) == {"all_reduce", "all_to_all"}
    assert coll["bytes"].null_count() == 0


def test_gloo_capture_uses_the_host_timeline():
    report = analyze(SAMPLES / "pp-4", jobs=1)
    assert set(report.ranks["timeline"]) == {"host"}
    assert report.ranks["rank"].to_list() == [0, 1, 2, 3]
    assert set(report.collectives["collective"]) == {"send", "recv"}
    # Blocking p2p on the main thread cannot overlap that thread's compute.
    assert (report.totals["overlap_ns"] == 0).all()
    assert (report.totals["compute_ns"] > 0).all()


def test_a_training_thread_blocked_on_a_gloo_collective_is_not_computing():
    """The tensor-parallel gloo sample: every gloo:all_reduce runs on the backend's
    pt_gloo_runloop thread while the training thread waits inside the _ReduceFromTP /
    _CopyToTPBackward op that issued it. That wait was compute, so both ranks showed 100%
    overlap and no exposed communication (issue 52). DDP's bucketed all-reduce returns into
    backward ops that keep computing: its overlap stays."""
    tp = analyze(SAMPLES / "tp-2", jobs=1, ignore=["ALL"]).totals.sort("rank")
    for row in tp.iter_rows(named=True):
        assert row["exposed_comm_ns"] > 0.8 * row["comm_ns"], row
        assert row["overlap_ns"] < 0.2 * row["comm_ns"], row
    ddp = analyze(SAMPLES / "ddp-4", jobs=1, ignore=["ALL"]).totals
    assert (ddp["overlap_ns"] > 0.05 * ddp["comm_ns"]).all()


@pytest.mark.parametrize("apart", [0, 1 << 61])
def test_breakdowns_equal_a_nanosecond_by_nanosecond_count(apart):
    """Random timelines (several ranks, overlapping and zero-length kernels, kinds outside
    the four, two sets of windows): every metric equals counting each nanosecond, and the
    compute edges are the first and (one past) the last nanosecond with compute running.
    `apart` puts each rank's clock that far from the previous one's (too far for one sort
    key)."""
    rng = random.Random(7)
    metrics = {
        "compute_ns": lambda k: "compute" in k,
        "comm_ns": lambda k: "communication" in k,
        "overlap_ns": lambda k: {"compute", "communication"} <= k,
        "exposed_comm_ns": lambda k: "communication" in k and "compute" not in k,
        "memcpy_ns": lambda k: "memcpy" in k,
        "memset_ns": lambda k: "memset" in k,
        "busy_ns": lambda k: bool(k & {"compute", "communication", "memcpy", "memset"}),
    }
    for _ in range(40):
        rows = []
        for rank in range(rng.randint(1, 3)):
            for _ in range(rng.randint(0, 25)):
                start = rng.randint(0, 300) + rank * apart
                kind = rng.choice(["compute", "communication", "memcpy", "memset", "other"])
                rows.append((rank, kind, start, start + rng.choice([0, 1, 7, 40, 120])))
        kernels = pl.DataFrame(
            rows, schema=["rank", "kind", "start_ns", "end_ns"], orient="row"
        ).cast({"rank": pl.Int64})
        window_sets = []
        for _ in range(2):
            wins = []
            for rank in range(3):
                edges = sorted(e + rank * apart for e in rng.sample(range(400), rng.randint(2, 5)))
                wins += [(rank, i, a, b) for i, (a, b) in enumerate(itertools.pairwise(edges))]
            window_sets.append(
                pl.DataFrame(wins, schema=["rank", "window", "start_ns", "end_ns"], orient="row")
            )
        for wins, got in zip(window_sets, breakdowns(kernels, window_sets), strict=True):
            assert got.height == wins.height
            for row in got.iter_rows(named=True):
                expected = dict.fromkeys(metrics, 0)
                computing = []
                for t in range(row["start_ns"], row["end_ns"]):
                    running = {k for r, k, a, b in rows if r == row["rank"] and a <= t < b}
                    for name, holds in metrics.items():
                        expected[name] += holds(running)
                    if "compute" in running:
                        computing.append(t)
                assert {name: row[name] for name in metrics} == expected, row
                assert row["compute_start_ns"] == (computing[0] if computing else None), row
                assert row["compute_end_ns"] == (computing[-1] + 1 if computing else None), row
                assert row["idle_ns"] == row["wall_ns"] - expected["busy_ns"]


def test_compute_before_is_the_share_of_the_steps_compute_started_by_then():
    """Random kernel tables (several ranks, steps interleaved in time, step -1, compute and
    communication kernels starting together, steps without compute, calls sharing a start):
    each call's compute_before equals the share of its rank's step's compute time in the
    compute kernels that started at or before it, counted row by row."""
    rng = random.Random(11)
    for _ in range(60):
        rows = []
        for rank in range(rng.randint(1, 3)):
            for _ in range(rng.randint(0, 30)):
                start = rng.randint(0, 60)
                kind = rng.choice(["compute", "compute", "communication", "memcpy"])
                step = rng.choice([-1, 0, 1, 2])
                rows.append((rank, step, kind, start, start + rng.choice([0, 1, 5, 30])))
        rng.shuffle(rows)
        kernels = pl.DataFrame(
            rows, schema=["rank", "step", "kind", "start_ns", "end_ns"], orient="row"
        ).cast({"rank": pl.Int64, "step": pl.Int64})
        calls = kernels.filter(pl.col("kind") == "communication").select(
            "rank", "step", "start_ns", call=pl.int_range(pl.len())
        )
        got = _compute_before(calls.lazy(), kernels.lazy()).collect()
        assert got.get_column("call").to_list() == calls.get_column("call").to_list()
        for row in got.iter_rows(named=True):
            mine = [
                (a, b)
                for r, s, k, a, b in rows
                if (r, s) == (row["rank"], row["step"]) and k == "compute" and s >= 0
            ]
            total = sum(b - a for a, b in mine)
            before = sum(b - a for a, b in mine if a <= row["start_ns"])
            expected = round(before / total, 9) if total > 0 else None
            assert row["compute_before"] == expected, (row, mine)


@pytest.mark.parametrize("low", [0, -(1 << 40), (1 << 61)])
def test_pair_key_orders_and_tells_apart_pairs_as_the_two_columns_do(low):
    from kineto_comm.keys import pair_key

    pairs = [(3, low + 7), (-2, low), (3, low), (0, None), (-2, low + 7), (3, low + 7)]
    frame = pl.DataFrame(pairs, schema=["a", "b"], orient="row")
    key = pair_key([frame, frame.head(2)], "a", "b")
    assert key is not None
    got = frame.with_columns(k=key)
    assert got.drop_nulls().sort("k")["k"].n_unique() == 4
    assert got.drop_nulls().sort("k").select("a", "b").rows() == sorted(
        p for p in pairs if p[1] is not None
    )
    assert got.filter(pl.col("b").is_null())["k"].to_list() == [None]
    wide = pl.DataFrame({"a": [0, 1 << 31], "b": [0, 1 << 31]})
    assert pair_key([wide], "a", "b") is None


def _p2p_op(kind: str, ts: float, peer: int, nelems: int | None = 4096) -> dict:
    """A send or recv's record_param_comms (group "1" of ranks 0 and 2)."""
    end = {"Dst Rank": peer} if kind == "send" else {"Src Rank": peer}
    sizes = {} if nelems is None else {"In msg nelems": nelems, "Out msg nelems": nelems}
    return cpu(
        "record_param_comms",
        ts,
        10,
        **{
            "Collective name": kind,
            **sizes,
            "Group size": 2,
            "dtype": "Float",
            "Process Group Name": "1",
            "Process Group Ranks": "[0, 2]",
            **end,
        },
    )


def _batch(ts: float, corr: int, ops: list[tuple], dur: float = 20) -> list[dict]:
    """One batch_isend_irecv on NCCL: its ops' record_param_comms (`_p2p_op`'s arguments
    but the time: kind, peer and optionally nelems), then its one SendRecv kernel launched
    in a `nccl:coalesced` span (started 100 us after `ts`, `dur` us long)."""
    events = [_p2p_op(op[0], ts + 5 * i, *op[1:]) for i, op in enumerate(ops)]
    return [
        *events,
        cpu("nccl:coalesced", ts + 30, 20, cat="user_annotation"),
        launch(ts + 35, corr),
        kernel(
            "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
            ts + 100,
            dur,
            stream=20,
            corr=corr,
        ),
    ]


def test_a_batched_kernel_takes_the_ops_queued_since_the_last_launch(tmp_path):
    """batch_isend_irecv on NCCL: the batch's one SendRecv kernel is launched in a
    `nccl:coalesced` span and names nothing; its ops' record_param_comms come before, and
    launch nothing. An unbatched send launched its own kernel inside its op: it is not part
    of the next batch, which holds the one recv queued after it. A batch of a send and a
    recv is a send_recv of the group they share, with what it sent and received (unknown
    where an op's size is); its peer where both ops have the same, else none."""
    events = [
        cpu("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        # An unbatched send: its op encloses its kernel's launch (the kernel names itself).
        _p2p_op("send", 10, 2),
        launch(12, 1),
        kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 20, 10, 20, 1),
        *_batch(100, 2, [("recv", 2)]),  # a batch of one recv
        *_batch(200, 3, [("send", 2), ("recv", 2)]),  # a send and a recv
        *_batch(300, 4, [("send", 2), ("recv", 2, None)]),  # its recv records no size
        *_batch(400, 5, [("send", 2), ("recv", 3)]),  # to one stage, from another
    ]
    report = analyze(write_trace(tmp_path / "rank0.json", events, rank=0, world_size=4), jobs=1)
    calls = report.collectives.sort("start_ns")
    assert calls["collective"].to_list() == ["send", "recv", *["send_recv"] * 3]
    assert calls["process_group"].to_list() == ["1"] * 5
    assert calls["peer"].to_list() == [2, 2, 2, 2, None]
    assert calls["in_bytes"].to_list() == [16_384] * 5
    assert calls["out_bytes"].to_list() == [16_384, 16_384, 16_384, None, 16_384]


def test_a_batched_exchange_with_one_stage_meets_the_stages_batch(tmp_path):
    """Megatron-LM's 1F1B on two stages (ranks 0 and 2), three micro-batches, batched p2p:
    stage 0 sends an activation, then twice sends the next one and receives a gradient in
    one kernel (send_forward_recv_backward), then receives the last gradient; stage 1
    mirrors it, 300 us later. Each two-op kernel exchanges with one peer: it is matched
    with the peer's (keyed by the pair), so all four transfers pair up, and the early
    stage's kernels, which last until the late one's have moved the data, wait for them."""
    stage0 = [("send", 2)], [("send", 2), ("recv", 2)], [("send", 2), ("recv", 2)], [("recv", 2)]
    stage1 = [("recv", 0)], [("send", 0), ("recv", 0)], [("send", 0), ("recv", 0)], [("send", 0)]
    for rank, batches, late, dur in ((0, stage0, 0, 320), (2, stage1, 300, 20)):
        events = [cpu("ProfilerStep#1", 0, 5000, cat="user_annotation")]
        for i, ops in enumerate(batches):
            events += _batch(1000 * i + late, i + 1, ops, dur)
        write_trace(tmp_path / f"rank{rank}.json", events, rank=rank, world_size=4)
    report = analyze(tmp_path, jobs=1)
    calls = report.collectives.sort("rank", "start_ns")
    assert calls["collective"].to_list() == ["send", *["send_recv"] * 2, "recv"] + [
        "recv",
        *["send_recv"] * 2,
        "send",
    ]
    assert calls["peer"].to_list() == [2] * 4 + [0] * 4
    inst = report.collective_instances
    assert inst.height == 4 and (inst["ranks_seen"] == 2).all()
    assert (inst["key_kind"] == "p2p").all()
    waits = report.collective_waits.sort("rank", "start_ns")
    assert waits.filter(pl.col("rank") == 0)["wait_ns"].to_list() == [300_000] * 4
    assert waits.filter(pl.col("rank") == 2)["wait_ns"].to_list() == [0] * 4
