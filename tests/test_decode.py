"""The decoder on real traces of every schema, and on crafted edge cases."""

from __future__ import annotations

import ctypes
import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from kineto_comm.errors import TraceError
from kineto_comm.load import decode, read, scan
from kineto_comm.load import pieces as decode_pieces
from kineto_comm.load.decode import decode_file
from kineto_comm.load.events import _BOUNDARY

from .conftest import (
    all_real_traces,
    cpu,
    host_wait,
    kernel,
    launch,
    shared,
    trace_params,
    write_trace,
)


@pytest.mark.parametrize("path", trace_params(all_real_traces()))
def test_every_real_trace_decodes_with_the_same_event_counts_as_json(path):
    raw = decode_file(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        events = json.load(fh)["traceEvents"]
    device = decode.GPU_CATS | {decode.SYNC_CAT}  # the CUDA sync events are kept with them
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in device]
    runtime = [
        e
        for e in events
        if e.get("ph") == "X" and e.get("cat") in decode.RUNTIME_CATS and e.get("ts") is not None
    ]
    # The host waits are kept apart from the launches (a CUDA sync event shares its call's
    # correlation, but no kernel is launched by one).
    waits = [e for e in runtime if e.get("name") in decode.HOST_WAIT_CALLS]
    calls = {
        (e.get("args") or {}).get("correlation")
        for e in runtime
        if e.get("name") not in decode.HOST_WAIT_CALLS
    }
    launched = sum(1 for e in gpu if (e.get("args") or {}).get("correlation") in calls - {None})
    assert raw.waits.height == len(waits)
    assert raw.gpu.height == len(gpu)
    assert raw.gpu["start_ns"].null_count() == 0
    # Every device event whose correlation has a runtime call gets that call as its launch.
    assert raw.gpu["launch_ns"].is_not_null().sum() == launched
    assert raw.gpu["launch_tid"].is_not_null().sum() <= launched


@pytest.mark.parametrize("scanned", [True, False])
def test_host_waits_are_kept_apart_from_the_launches(tmp_path, monkeypatch, scanned):
    """The runtime calls in which the CPU may wait for the device (HOST_WAIT_CALLS) become
    `waits` rows, named, on their thread; the launches still link their kernels; other
    runtime calls are not kept. A wait whose name is written with escapes is found too
    (the scanner hands such a file to msgspec)."""
    if not scanned:
        monkeypatch.setattr(scan, "_scanner", None)
    events = [
        kernel("gemm", 20.0, 10.0, corr=1),
        launch(5.0, 1),
        host_wait(8.0, 25.0, 2),
        host_wait(40.0, 1.0, 3, "cudaEventQuery", tid=200),
        host_wait(50.0, 1.0, 4, "cudaStreamQuery"),
        {**launch(60.0, 5), "name": "cudaEventRecord"},
    ]
    path = write_trace(tmp_path / "t.json", events)
    escaped = tmp_path / "escaped.json"
    text = path.read_bytes().replace(b'"cudaStreamQuery"', b'"cudaStream\\u0051uery"')
    assert b"\\u0051" in text
    escaped.write_bytes(text)
    for file in (path, escaped):
        raw = decode_file(file)
        waits = raw.waits.sort("start_ns")
        assert waits["name"].to_list() == [
            "cudaStreamSynchronize",
            "cudaEventQuery",
            "cudaStreamQuery",
        ]
        assert waits["tid"].to_list() == ["100", "200", "100"]
        assert (waits["end_ns"] - waits["start_ns"]).to_list() == [25_000, 1_000, 1_000]
        assert raw.gpu.height == 1
        assert raw.gpu["launch_ns"][0] == waits["start_ns"][0] - 3_000


def test_float_microseconds_with_base_become_exact_nanoseconds(tmp_path):
    path = write_trace(
        tmp_path / "t.json",
        [kernel("k", 4458677009853.422, 2636.669)],
        baseTimeNanoseconds=1711964646000000000,
    )
    raw = decode_file(path)
    assert raw.gpu["start_ns"][0] == 1711964646000000000 + 4458677009853422
    assert raw.gpu["end_ns"][0] - raw.gpu["start_ns"][0] == 2636669


def test_epoch_microseconds_keep_nanosecond_precision(tmp_path):
    # 1.7e15 us is beyond float64's exact range once multiplied by 1000.
    path = write_trace(tmp_path / "t.json", [kernel("k", 1712195495505583.0, 4.928)])
    raw = decode_file(path)
    assert raw.gpu["start_ns"][0] == 1712195495505583000
    assert raw.gpu["end_ns"][0] == 1712195495505587928


def test_old_schema_string_tids_and_lowercase_external_id():
    raw = decode_file(shared("kineto-tb-plugin/worker0.1623143089861.pt.trace.json.gz"))
    kernels = raw.gpu.filter(pl.col("cat") == "Kernel")
    assert kernels.height > 8000
    assert kernels["external_id"].null_count() == 0
    assert kernels["tid"].str.starts_with("stream").all()


def test_integer_beyond_int64_in_args_does_not_break_decoding():
    raw = decode_file(
        shared("hta/_history/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz")
    )
    assert raw.gpu.height == 1
    assert raw.ops["name"].to_list() == ["record_param_comms"]


def test_begin_end_pairs_become_complete_events(tmp_path):
    events = [
        {"ph": "B", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 5, "ts": 10},
        {"ph": "B", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 5, "ts": 12},
        {"ph": "E", "cat": "cpu_op", "pid": 1, "tid": 5, "ts": 15},
        {"ph": "E", "cat": "cpu_op", "pid": 1, "tid": 5, "ts": 30},
    ]
    raw = decode_file(write_trace(tmp_path / "t.json", events))
    got = dict(zip(raw.host["name"], raw.host["end_ns"] - raw.host["start_ns"], strict=True))
    assert got == {"outer": 20_000, "inner": 3_000}


def test_bare_event_array_is_accepted(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([kernel("k", 1.0, 2.0), kernel("k2", 5.0, 1.0)]))
    assert decode_file(path).gpu.height == 2


def test_truncated_trace_keeps_events_before_the_cut(tmp_path):
    events = [kernel(f"k{i}", 10.0 * i, 5.0) for i in range(200)]
    full = write_trace(tmp_path / "full.json", events).read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(full[: int(len(full) * 0.6)])
    raw = decode_file(cut)
    assert 100 < raw.gpu.height < 200
    assert any("cut off" in w for w in raw.warnings)
    assert raw.gpu["name"].to_list() == [f"k{i}" for i in range(raw.gpu.height)]


def test_truncated_gzip_stream_keeps_events_before_the_cut(tmp_path):
    events = [kernel(f"k{i}", 10.0 * i, 5.0) for i in range(3000)]
    data = write_trace(tmp_path / "full.json.gz", events).read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: int(len(data) * 0.5)])
    raw = decode_file(cut)
    assert 0 < raw.gpu.height < 3000
    assert raw.warnings


def test_large_file_is_decoded_in_pieces_with_identical_results(tmp_path, monkeypatch):
    events = [kernel(f"k{i}", 10.0 * i, 5.0, corr=i) for i in range(4000)]
    events += [launch(10.0 * i - 3, i) for i in range(4000)]
    path = write_trace(tmp_path / "t.json", events, baseTimeNanoseconds=5)
    whole = decode_file(path)
    monkeypatch.setattr(decode_pieces, "PIECE_BYTES", 50_000)
    monkeypatch.setattr(read, "_READ_BYTES", 16_384)
    pieces = decode_file(path)
    assert pieces.gpu.equals(whole.gpu)  # linked by the scanner whole, by a join in pieces
    assert pieces.gpu["launch_ns"].is_not_null().all()
    assert pieces.base_time_ns == 5 and pieces.rank == 0


def test_nested_object_lists_in_args_survive_piece_cuts(tmp_path, monkeypatch):
    # `}, {` inside an event's args must not be taken for an event boundary.
    events = [cpu("op", float(i), 1.0, extra=[{"a": j} for j in range(50)]) for i in range(400)]
    path = write_trace(tmp_path / "t.json", events)
    monkeypatch.setattr(decode_pieces, "PIECE_BYTES", 20_000)
    monkeypatch.setattr(read, "_READ_BYTES", 4_096)
    tries = []
    real = decode_pieces._decode_events
    monkeypatch.setattr(decode_pieces, "_decode_events", lambda *a: tries.append(1) or real(*a))
    assert decode_file(path).host.height == 400
    # A cut inside an event is followed by one twice as far past it, not by every `}, {`
    # of the event's args (each try decodes the piece from its start again).
    assert len(tries) <= 3 * (path.stat().st_size // 20_000 + 1)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (b"@", "JSON is malformed"),
        (b'{"ts": "soon"}, ', "counting events from byte"),
        (b'{"ph": "X", "cat": "kernel", "name": "k\xff", "ts": 1, "dur": 1}, ', "not UTF-8"),
    ],
    ids=["bad-character", "wrong-type", "not-utf8"],
)
def test_damage_inside_a_large_file_is_reported_without_trying_every_later_cut(
    tmp_path, monkeypatch, damage, problem
):
    # A piece that does not decode is cut further on only while its end falls inside a
    # value: damaged JSON used to be retried at every later event boundary, each time
    # decoding the piece from its start (hours on a 90 MB file). The file is rejected, as
    # when it is read whole: the answer must not depend on the piece size (it kept the
    # pieces before the damage, where a smaller file read whole was rejected).
    events = [kernel(f"k{i}", 10.0 * i, 5.0, corr=i) for i in range(4000)]
    full = write_trace(tmp_path / "full.json", events).read_bytes()
    at = _BOUNDARY.search(full, int(len(full) * 0.6)).end() - 1  # an event's `{`
    path = tmp_path / "bad.json"
    path.write_bytes(full[:at] + damage + full[at:])
    monkeypatch.setattr(decode_pieces, "PIECE_BYTES", 50_000)
    monkeypatch.setattr(read, "_READ_BYTES", 16_384)
    tries = []
    real = decode_pieces._decode_events
    monkeypatch.setattr(decode_pieces, "_decode_events", lambda *a: tries.append(1) or real(*a))
    with pytest.raises(TraceError, match=problem) as pieces:
        decode_file(path)
    assert len(tries) == 1  # msgspec decodes the damaged piece once: no retries
    assert str(path) in str(pieces.value) and "\n" not in str(pieces.value)
    # The same damage in the first piece, or in a file read whole: the same one line.
    for piece in (int(len(full) * 0.7), len(full) * 2):
        monkeypatch.setattr(decode_pieces, "PIECE_BYTES", piece)
        with pytest.raises(TraceError, match=problem) as info:
            decode_file(path)
        assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("damage", "inside", "problem"),
    [(b"\xff", 2, "a string holds byte 0xff, not UTF-8"), (b"@", 0, "JSON is malformed")],
    ids=["not-utf8", "bad-character"],
)
def test_damage_in_the_last_part_is_damage_not_a_cut(
    tmp_path, monkeypatch, damage, inside, problem
):
    # The part after the last piece is decoded by finish(): a string there that is not
    # UTF-8 made the whole file "not a JSON trace (binary data)", pieces read or not, and
    # other damage was called a cut (and its events salvaged as if the file ended there).
    events = [kernel(f"k{i}", 10.0 * i, 5.0, corr=i) for i in range(4000)]
    full = write_trace(tmp_path / "full.json", events).read_bytes()
    at = full.index(b'"k3000"') + inside  # in the name, or in place of its opening quote
    path = tmp_path / "bad.json"
    path.write_bytes(full[:at] + damage + full[at + 1 :])
    monkeypatch.setattr(decode_pieces, "PIECE_BYTES", len(full) // 2)
    with pytest.raises(TraceError, match=problem) as info:
        decode_file(path)
    assert "cut off" not in str(info.value)
    if not inside:  # msgspec says where: the byte given is the file's
        assert f"(byte {at})" in str(info.value)


def test_a_json_object_without_trace_events_is_not_an_empty_trace(tmp_path):
    # A config or report JSON beside the traces became a rank with no events (it took a
    # rank number, and its world size of none made the job look mixed).
    other = tmp_path / "config.json"
    other.write_text('{"lr": 0.1, "ranks": [0, 1]}')
    with pytest.raises(TraceError, match="not a trace") as info:
        decode_file(other)
    assert str(other) in str(info.value)
    empty = write_trace(tmp_path / "empty.json", [])  # a trace without events still is one
    assert decode_file(empty).gpu.height == 0


def test_a_base_time_beyond_int64_nanoseconds_is_ignored_with_a_warning(tmp_path):
    # A damaged header (2**63) made the times Int128 in one file and an OverflowError in a
    # batch; with other files the merged tables could not be stacked.
    events = [kernel("k", 10.0, 5.0)]
    bad = write_trace(tmp_path / "bad.json", events, baseTimeNanoseconds=2**63)
    good = write_trace(tmp_path / "good.json", events, rank=1, baseTimeNanoseconds=7_000)
    alone = decode_file(bad)
    batch = decode.decode_files([bad, good])
    for raw in (alone, batch[0]):
        assert raw.gpu["start_ns"].dtype == pl.Int64
        assert raw.gpu["start_ns"].to_list() == [10_000]
        assert [w for w in raw.warnings if "baseTimeNanoseconds" in w and "ignored" in w]
    assert batch[1].gpu["start_ns"].to_list() == [17_000] and not batch[1].warnings


def test_unknown_or_missing_phase_falls_back_without_losing_events(tmp_path):
    # Phase-tagged decoding skips flows cheaply; a phase it does not know (or none) sends
    # the piece to the permissive decoder, which must give the same tables.
    events = [kernel(f"k{i}", 10.0 * i, 5.0, corr=i) for i in range(50)]
    events += [launch(10.0 * i - 3, i) for i in range(50)]
    events += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": 100, "args": {"name": "main"}}]
    events += [{"ph": "f", "cat": "ac2g", "id": 3, "pid": 0, "tid": 7, "ts": 4.0}]
    clean = decode_file(write_trace(tmp_path / "clean.json", events))
    odd = events + [{"ph": "Z", "cat": "other", "ts": 1.0}, {"cat": "cpu_op", "name": "x"}]
    fallback = decode_file(write_trace(tmp_path / "odd.json", odd))
    assert clean.gpu.height == 50 and clean.gpu["launch_ns"].is_not_null().all()
    assert fallback.gpu.equals(clean.gpu)
    assert fallback.threads.equals(clean.threads)
    assert clean.threads["label"].to_list() == ["main"]


def test_host_ops_are_kept_when_a_trace_listing_devices_has_no_device_activity(tmp_path):
    # A header with deviceProperties makes the first read skip the host table; a trace
    # that then has no kernels (a gloo run on a GPU machine) is read again with it.
    src = Path(__file__).parent.parent / "sample_traces" / "ddp-4" / "rank-0.pt.trace.json.gz"
    with gzip.open(src, "rb") as fh:
        doc = json.load(fh)
    plain = decode_file(write_trace(tmp_path / "plain.json", doc["traceEvents"]))
    listed = decode_file(
        write_trace(
            tmp_path / "listed.json", doc["traceEvents"], deviceProperties=[{"id": 0, "name": "G"}]
        )
    )
    assert plain.gpu.height == 0 and plain.host.height > 100
    assert listed.host.equals(plain.host) and listed.ops.equals(plain.ops)
    with_gpu = decode_file(
        write_trace(
            tmp_path / "gpu.json",
            [*doc["traceEvents"], kernel("k", 1.0, 1.0, corr=1)],
            deviceProperties=[{"id": 0, "name": "G"}],
        )
    )
    assert with_gpu.host_skipped and with_gpu.host.height == 0
    assert with_gpu.ops.equals(plain.ops)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"hello world", "not a JSON trace"),
        (b'{"traceEvents": [{"ph": "X", "ts": ', "truncated"),
        (b"\x00\x01\x02binary", "not a JSON trace"),
        (b'{"traceEvents": [{"ph": "X", "name": "a\xffb", "ts": 1}]}', "0xff, not UTF-8"),
    ],
)
def test_unusable_files_raise_one_line_trace_errors(tmp_path, content, problem):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceError) as info:
        decode_file(path)
    assert problem in str(info.value)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_corrupt_gzip_is_a_trace_error(tmp_path):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00" + b"garbage" * 50)
    with pytest.raises(TraceError, match="gzip"):
        decode_file(path)


def test_process_group_config_with_text_rank_lists(tmp_path):
    path = write_trace(tmp_path / "t.json", [kernel("k", 0, 1)])
    doc = json.loads(path.read_text())
    doc["distributedInfo"]["pg_config"] = [
        {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": "[0, 1, 2, 3]"},
        {"pg_name": 7, "pg_desc": "tp", "ranks": [0, 1]},
    ]
    path.write_text(json.dumps(doc))
    groups = decode_file(path).process_groups
    assert [(g["pg_name"], g["pg_size"], g["ranks"]) for g in groups] == [
        ("0", 4, [0, 1, 2, 3]),
        ("7", 2, [0, 1]),
    ]


def test_a_batchs_read_buffer_is_used_again_only_when_nothing_reads_it():
    """Whole rank files of a batch are read into one buffer, one after the other: a file
    whose bytes something still reads (a table, a closure, an exception) or views must not
    be overwritten by the next file."""
    if not read._PRIVATE:
        pytest.skip("no private anonymous maps here: every file gets a new bytearray")
    buffer = read._Buffer()
    first = buffer.take(100)
    first[:5] = b"first"
    held = first  # still read by someone: the next file gets new memory
    second = buffer.take(80)
    assert second is not held and bytes(held[:5]) == b"first"
    del first, held
    mine = id(second)
    del second
    third = buffer.take(4 << 20)  # nothing reads it but the buffer: used again, grown
    assert id(third) == mine and len(third) == 4 << 20
    third[-5:] = b"grown"  # pages past the first size are there (no bus error)
    view = memoryview(third)  # a view of it: it cannot change under the view
    assert buffer.take(10) is not third and len(view) == 4 << 20
    view.release()


def test_a_batchs_read_buffer_asks_for_huge_pages_where_linux_has_them():
    """The read buffer is marked for transparent huge pages (VmFlags `hg` in smaps): reading
    a file of a few MB into it then faults in 2 MB pages, not one fault per 4 kB page."""
    smaps, thp = Path("/proc/self/smaps"), Path("/sys/kernel/mm/transparent_hugepage")
    if not read._PRIVATE or read._HUGE is None or not (smaps.exists() and thp.exists()):
        pytest.skip("no private anonymous maps or no transparent huge pages here")
    buffer = read._Buffer()
    mapped = buffer.take(4 << 20)
    at = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
    flags, inside = None, False
    for line in smaps.read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's header: "start-end perms ..."
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= at < hi
        elif inside and line.startswith("VmFlags:"):
            flags = line.split()[1:]
            break
    assert flags is not None, "the buffer's mapping is not in smaps"
    assert "hg" in flags


def test_the_files_of_a_batch_share_one_read_buffer_and_keep_their_own_tables(tmp_path):
    """decode_files reads each whole file into the batch's buffer; every file still gets
    the tables it gets alone, and a file that fails in between costs only itself."""
    paths = []
    for i in range(3):
        events = [kernel(f"k{i}_{j}", 1000 * j, 10, corr=j) for j in range(50 + 10 * i)]
        paths.append(write_trace(tmp_path / f"r{i}.json", events))
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": ')
    got = decode.decode_files([paths[0], bad, paths[1], paths[2]])
    assert isinstance(got[1], TraceError)
    for path, raw in zip(paths, [got[0], got[2], got[3]], strict=True):
        alone = decode_file(path)
        assert raw.gpu.equals(alone.gpu) and raw.gpu.height == alone.gpu.height > 0


def test_a_file_that_grows_after_its_size_was_read_keeps_all_its_events(tmp_path, monkeypatch):
    """A rank file still being written: its size is read, it grows, and what came after is
    read in blocks behind the part read whole (into the batch's buffer): all events count."""
    events = [kernel(f"k{j}", 1000 * j, 10, corr=j) for j in range(400)]
    path = write_trace(tmp_path / "r0.json", events)
    alone = decode_file(path)
    real = read.os.fstat

    class Half:
        def __init__(self, fd: int) -> None:
            self.st_size = real(fd).st_size // 2

    monkeypatch.setattr(read.os, "fstat", Half)
    (grown,) = decode.decode_files([path])
    assert not isinstance(grown, Exception)
    assert grown.gpu.equals(alone.gpu) and grown.gpu.height == 400


@pytest.mark.parametrize("pure", [False, True], ids=["scanner", "msgspec"])
def test_python_call_stacks_change_no_table(tmp_path, monkeypatch, pure):
    """A capture with Python call stacks (tests/data/gloo/ddp-stack-2, torch.profiler's
    with_stack: a python_function event per Python call, over a third of its events)
    reports exactly as its files do without them: they are neither ops, nor steps, nor the
    annotations around collectives. They only say where calls come from: the modules
    (kineto_comm.analysis.attribution), which the bare files leave unknown."""
    from kineto_comm import analyze

    from .conftest import REPO

    if pure:
        monkeypatch.setattr(scan, "_scanner", None)
    src = REPO / "tests" / "data" / "gloo" / "ddp-stack-2"
    bare = tmp_path / "bare"
    bare.mkdir()
    stacks = 0
    for path in sorted(src.iterdir()):
        with gzip.open(path, "rb") as fh:
            doc = json.load(fh)
        kept = [e for e in doc["traceEvents"] if e.get("cat") != "python_function"]
        stacks += len(doc["traceEvents"]) - len(kept)
        with gzip.open(bare / path.name, "wt") as fh:
            json.dump({**doc, "traceEvents": kept}, fh)
    assert stacks > 1000
    full, stripped = analyze(src, jobs=1), analyze(bare, jobs=1)
    modules = ("module", "module_source")
    for name in ("kernels", "collectives", "steps", "totals", "collective_instances"):
        assert (
            getattr(full, name)
            .drop("file", *modules, strict=False)
            .equals(getattr(stripped, name).drop("file", *modules, strict=False))
        ), name
    assert full.step_blame.equals(stripped.step_blame)
    # DDP's bucket all-reduce comes from a backward hook: said where the stacks show it,
    # never guessed without them.
    assert set(full.collectives["module"]) == {"hook"}
    assert set(stripped.collectives["module"]) == {"unknown"}

    def bare(f: Any) -> dict:
        out = f.to_dict()
        out["evidence"].pop("where", None)
        out["message"] = out["message"].split(" Where (critical rank):")[0]
        return out

    assert [bare(f) for f in full.findings] == [bare(f) for f in stripped.findings]
