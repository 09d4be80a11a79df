"""The compiled scanner (kineto_comm/load/_scan.c) against the msgspec decoder it accelerates.

Whatever the scanner accepts must give the same tables as msgspec; whatever msgspec rejects,
the scanner must hand back (None) so that the msgspec path reports it as before.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from typing import Any

import msgspec
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from kineto_comm.load import decode, pieces, scan
from kineto_comm.load.decode import decode_file, decode_files
from kineto_comm.load.events import _EVENTS, Args
from tests.conftest import all_shared_traces

TABLES = ("gpu", "ops", "host", "threads", "waits")


@pytest.fixture
def scanner():
    if scan._scanner is None:
        if os.environ.get("CI"):
            pytest.fail("the compiled scanner was not built (pip install -e . builds it)")
        pytest.skip("the compiled scanner is not built on this machine")
    return scan._scanner


def test_scanner_checks_exactly_the_args_fields_of_the_decoder(scanner):
    fields = {f.encode_name for f in msgspec.structs.fields(Args)}
    assert set(scanner.arg_keys()) == fields


def _tables(path: Any, **kw: Any) -> dict[str, pl.DataFrame]:
    raw = decode_file(path, **kw)
    return {t: getattr(raw, t) for t in TABLES} | {
        "meta": pl.DataFrame(
            {
                "m": [
                    repr(
                        (
                            raw.rank,
                            raw.world_size,
                            raw.process_groups,
                            raw.device_names,
                            raw.base_time_ns,
                            raw.warnings,
                            raw.host_skipped,
                        )
                    )
                ]
            }
        )
    }


def _pure(monkeypatch: pytest.MonkeyPatch, path: Any, **kw: Any) -> dict[str, pl.DataFrame]:
    with monkeypatch.context() as m:
        m.setattr(scan, "_scanner", None)
        return _tables(path, **kw)


def _assert_same(a: dict[str, pl.DataFrame], b: dict[str, pl.DataFrame]) -> None:
    for key in a:
        assert_frame_equal(a[key], b[key]), key


def test_every_real_trace_gives_the_same_tables_with_and_without_the_scanner(scanner, monkeypatch):
    scanned = 0
    calls: list[bool] = []
    real_scan = scanner.scan

    def spy(*args: Any) -> Any:
        got = real_scan(*args)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(scan, "_scanner", type("Spy", (), {"scan": staticmethod(spy)}))
    for path in all_shared_traces():
        calls.clear()
        try:
            fast = _tables(path)
        except decode.TraceError as exc:
            with pytest.raises(decode.TraceError) as pure_exc:
                _pure(monkeypatch, path)
            assert str(pure_exc.value) == str(exc)
            continue
        _assert_same(fast, _pure(monkeypatch, path))
        scanned += bool(calls) and all(calls)
    # The old 2021 schema (string tids) and the AMD trace (string streams) go through msgspec;
    # every modern Kineto trace is read by the scanner.
    assert scanned >= len(all_shared_traces()) - 6


def test_pieces_of_any_size_give_the_same_tables_as_msgspec(scanner, monkeypatch, tmp_path):
    events = [_random_event(random.Random(i)) for i in range(3000)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0}]}, indent=1))
    for piece in (4096, 20000, 1 << 20):
        _assert_same(_tables(path, piece_bytes=piece), _pure(monkeypatch, path, piece_bytes=piece))


def test_a_file_of_a_few_pieces_is_scanned_whole_and_joins_the_batch(
    scanner, monkeypatch, tmp_path
):
    # Files of one to WHOLE_PIECES pieces were decoded piece by piece (a query set each),
    # not scanned whole and batched: 8 x 20 MB files took a fifth longer.
    events = [_random_event(random.Random(i)) for i in range(3000)]
    trace = {"traceEvents": events, "deviceProperties": [{"id": 0}]}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path in paths:
        path.write_text(json.dumps(trace, indent=1))
    piece = paths[0].stat().st_size // 3
    assert 1 < paths[0].stat().st_size / piece <= decode.WHOLE_PIECES
    stops: list[int] = []
    real_scan = pieces._scan_piece
    monkeypatch.setattr(pieces, "_scan_piece", lambda *a: stops.append(a[2]) or real_scan(*a))
    batched: list[int] = []
    real_batch = decode._scanned_batch
    monkeypatch.setattr(decode, "_scanned_batch", lambda p: batched.append(len(p)) or real_batch(p))
    whole = [decode_files(paths, piece)[0], decode_file(paths[0], piece)]
    assert stops == [-1, -1, -1] and batched == [2]  # one scan of all of each file
    with monkeypatch.context() as m:
        m.setattr(pieces, "WHOLE_PIECES", 1)
        in_pieces = _tables(paths[0], piece_bytes=piece)
    assert len(stops) > 3 + 1 and min(stops[3:-1]) >= 0  # that one went piece by piece
    for raw in whole:
        assert not isinstance(raw, Exception)
        got = {t: getattr(raw, t) for t in TABLES}
        _assert_same(got, in_pieces)
        _assert_same(got, _pure(monkeypatch, paths[0], piece_bytes=piece))
    # Cut off, the whole scan hands it back: pieces, then the cut salvaged, as msgspec does.
    cut = tmp_path / "cut.json"
    cut.write_bytes(paths[0].read_bytes()[: int(piece * 2.5)])
    stops.clear()
    salvaged = _tables(cut, piece_bytes=piece)
    assert stops[0] == -1 and min(stops[1:-1]) >= 0 and len(stops) > 2
    assert any("cut off" in w for w in salvaged["meta"]["m"][0].split("'"))
    _assert_same(salvaged, _pure(monkeypatch, cut, piece_bytes=piece))


# ------------------------------------------------------------- the scanner alone, piece-wise


def _pieces(events_json: bytes, host: bool = True) -> tuple[Any, Any]:
    """Columns of one piece (`[...]` of events) by the scanner (None: handed back) and by
    msgspec (an exception: msgspec rejects it); `host`: whether every CPU op is kept (else
    the scanner drops most of them itself)."""
    got = scan._scan_piece(events_json, 0, len(events_json) - 1, host)
    patched = b"[" + events_json[1:-1] + b"]"  # as the reader patches a piece for msgspec
    try:
        pure: Any = decode._columns(_EVENTS.decode(patched), host=host)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        pure = exc
    fast = None if got is None else decode._columns(got[0], host=host)
    return fast, pure


def _check(events_json: bytes) -> bool:
    """Scanner and msgspec agree on this piece, with and without the host table; True when
    the scanner took it."""
    taken = [_check_one(events_json, host) for host in (True, False)]
    assert taken[0] == taken[1], events_json
    return taken[0]


def _check_one(events_json: bytes, host: bool) -> bool:
    fast, pure = _pieces(events_json, host)
    if isinstance(pure, Exception):
        assert fast is None, f"scanner accepted what msgspec rejects ({pure}): {events_json!r}"
        return False
    if fast is None:
        return False
    assert fast.keys() == pure.keys(), events_json
    for key in pure:  # the scanner's tables also carry the batch key (`_file`, here 0)
        scanned = fast[key]
        if "_file" in scanned.columns:
            assert (scanned["_file"] == 0).all()
        assert_frame_equal(scanned.drop("_file", strict=False), pure[key])
    return True


@pytest.mark.parametrize(
    "name, kept",
    [
        ("record_param_comms", True),
        ("nccl:all_reduce", True),
        ("gloo:broadcast", True),
        ("ProfilerStep#12", True),
        ("ProfilerStep", False),  # no '#'
        ("aten::mm", False),
        ("NCCL:all_reduce", False),  # the span test is case-sensitive
        ("nccl", False),
        ("\\u006eccl:send", True),  # escaped: compared decoded
        ("nccl:\\u0061ll_gather", True),
        ("aten::\\u006dm", False),  # kept by the scanner, dropped after decoding
        (None, False),
    ],
)
def test_the_scanner_drops_only_the_cpu_ops_no_table_keeps(scanner, name, kept):
    """Without a host table the scanner lets go of CPU ops by their name's prefix; the ops
    table must be the one msgspec's path gives, whatever the name (annotations stay)."""
    op = {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 2, "ts": 1, "dur": 2}
    note = {**op, "cat": "user_annotation", "name": "my_region"}
    events = ("[" + json.dumps(op) + "," + json.dumps(note) + "]").replace("\\\\", "\\")
    assert _check(events.encode())
    fast, _ = _pieces(events.encode(), host=False)
    decoded = json.loads(events)[0]["name"]
    assert fast["ops"]["name"].to_list() == ([decoded] if kept else []) + ["my_region"]
    assert fast["host"].height == 0
    fast, _ = _pieces(events.encode(), host=True)
    assert fast["ops"].height + fast["host"].height == 2


KERNEL = (
    b'{"ph":"X","cat":"kernel","name":"ncclDevKernel_AllReduce_Sum_f32_RING_LL","pid":0,'
    b'"tid":7,"ts":10.5,"dur":3,"args":{"External id":4,"device":0,"stream":7,'
    b'"correlation":9,"Collective name":"allreduce","dtype":"Float","In msg nelems":1024,'
    b'"Process Group Ranks":[0,1],"Seq":"3"}}'
)
OP = b'{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":2,"ts":1,"dur":2,"args":{}}'
META = b'{"ph":"M","name":"thread_name","pid":1,"tid":2,"args":{"name":"main"}}'


@pytest.mark.parametrize(
    "events, taken",
    [
        (b"[" + KERNEL + b"," + OP + b"," + META + b"]", True),
        # Collective fields read by the scanner: args before the other fields, a null args
        # after an object, and values of the types only msgspec reads (an integer group
        # name, an integer beyond int64) beside ones the scanner reads.
        (
            b'[{"ph":"X","args":{"Collective name":"allreduce","In msg nelems":8,'
            b'"Process Group Name":"0","Process Group Ranks":"[0, 1]","Seq":4,"Src Rank":1},'
            b'"cat":"kernel","name":"ncclDevKernel_AllReduce_Sum_f32_RING_LL","pid":0,"tid":7,'
            b'"ts":1,"dur":2},{"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":1,'
            b'"tid":2,"ts":1,"dur":2,"args":{"Collective name":"send","Dst Rank":3},"args":null}'
            b',{"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":1,"tid":2,"ts":4,'
            b'"dur":2,"args":{"Collective name":"recv","Process Group Name":5,'
            b'"Out msg nelems":99999999999999999999,"dtype":"Float"}}]',
            True,
        ),
        (b"[]", True),
        (b"[ \n" + OP + b" ,\t" + OP + b" \r\n]", True),
        # Whitespace of every kind and length around every token (one space is a fast path).
        (
            b'[\t{ "ph" :  "X",\n\t"cat":\r\n"cpu_op" , "name": "a",  "pid":1 ,"tid" :2,'
            b' "ts": 1,"dur":\t2, "args": { "External id" :\n 5 } } ,  ' + OP + b"\n \t]",
            True,
        ),
        (b'[{"ph": "X","cat": "cpu_op","name":\x0b"a","ts":1}]', False),
        # Strings of 0, 7 and 8 bytes (seven or fewer are read from one word), and short ones
        # with an escape, a control character or a non-ASCII byte (those are not).
        (
            b'[{"ph":"X","cat":"cpu_op","name":"","pid":1,"tid":2,"ts":1,"dur":2,"args":'
            b'{"ab":"a\\"b","1234567":"12345678","\xc3\xa9":"a\\u0041","x":"\\n","y":""}}]',
            True,
        ),
        (b'[{"ph":"X","cat":"cpu_op","name":"a\tb","ts":1}]', False),
        # Mantissas of 19, 20 and 26 digits: past 19 the value comes from strtod.
        (
            b'[{"ph":"X","cat":"kernel","name":"k","ts":1234567890.123456789,'
            b'"dur":12345678901.23456789},{"ph":"X","cat":"kernel","name":"k",'
            b'"ts":0.0000000000000000000001234,"dur":9223372036854775807}]',
            True,
        ),
        (b'[{"ph":"s","id":1,"pid":"x","ts":"odd","cat":"ac2g"},' + OP + b"]", True),
        (b'[{"ph":"X","cat":"Trace","name":"f","pid":"Spans","tid":"t"}]', True),
        (
            b'[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":1,"args":null}]',
            True,
        ),
        (
            b'[{"ph":"X","cat":"kernel","name":"k \\"q\\" \\u00e9 \\ud83d\\ude00","pid":0,'
            b'"tid":7,"ts":1.25e3,"dur":-0.0}]',
            True,
        ),
        (
            b'[{"ph":"B","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1},'
            b'{"ph":"E","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":3}]',
            True,
        ),
        (b'[{"ph":"X","cat":"cpu_op","name":"a","name":"b","pid":1,"tid":1,"ts":1}]', True),
        (b'[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":12345678901234567890}]', None),
        (b'[{"ph":"X","cat":"cpu_op","name":"a","pid":"1","tid":1,"ts":1}]', False),
        (b'[{"ph":"X","cat":"cpu_op","name":5,"pid":1,"tid":1,"ts":1}]', False),
        (b'[{"ph":"Z","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1}]', False),
        (b'[{"cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1}]', False),
        (b'[{"ph":"X","cat":"kernel","name":"k","ts":1,"args":{"stream":"7"}}]', False),
        (b'[{"ph":"X","cat":"kernel","name":"k","ts":1,"args":{"Seq":1.5}}]', False),
        (b'[{"ph":"X","cat":"kernel","name":"k","ts":"1"}]', False),
        (b'[{"ph":"X","cat":"kernel","name":"k","ts":1e400}]', False),
        (b'[{"ph":"X","cat":"kernel","name":"k\xff","ts":1}]', False),
        (b'[{"ph":"X","cat":"python_function","name":"\xed\xa0\x80","ts":1}]', False),
        (b'[{"ph":"i","name":"\\ud800","ts":1}]', False),
        (b'[{"ph":"i","name":"a\x01","ts":1}]', False),
        (b'[{"ph":"i","name":"a","ts":01}]', False),
        (b'[{"ph":"i","name":"a","ts":1,}]', False),
        (b'[{"ph":"i","name":"a","ts":1}', False),
        (b'[{"ph":"i","name":"a","ts":tru}]', False),
        (b"[" + OP + b",]", False),
        (b"[" + OP + b"] ]", False),
        (b"[5]", False),
        (b'[{"ph":"X","cat":"kernel","args":{"Process Group Ranks":[1,"a"]}}]', False),
        (b'[{"ph":"X","\\u0063at":"kernel","name":"k","ts":1}]', False),
    ],
)
def test_scanner_takes_what_it_can_and_agrees_with_msgspec(scanner, events, taken):
    got = _check(events)
    if taken is not None:
        assert got is taken


# What may sit at any byte of a string or of the whitespace between tokens: fine, or
# something the scanner must stop at (the end of the string, an escape, a byte msgspec
# rejects there, a non-ASCII character).
STRING_BYTES = [b"a", b"\x7f", b'\\"', b"\\u00e9", b"\\n", b"\xc3\xa9", b"\x01", b"\t", b'"']
SPACE_BYTES = [b" ", b"\n", b"\r", b"\t", b"\x0b", b"\x00", b"x"]


def _names_agree(scanner: Any, events_json: bytes) -> None:
    """The scanner takes the piece only where msgspec does, and then reads the same names."""
    got = scanner.scan(events_json, 0, len(events_json) - 1, scan._SCAN_CODES, "s")
    try:
        pure = _EVENTS.decode(events_json)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        assert got is None, events_json
        return
    if got is not None:
        names = {msgspec.json.decode(b'"' + raw + b'"') for raw in got[3]}
        assert names == {e.name for e in pure}, events_json


@pytest.mark.parametrize("length", [0, 7, 8, 15, 16, 17, 31, 32, 33])
def test_strings_and_spaces_of_every_length_agree_with_msgspec(scanner, length):
    # Strings and whitespace are read 8 or 16 bytes at a time: a byte that ends or spoils
    # one must count wherever it falls in such a block, and nothing past the end may.
    for at in range(length + 1):
        for byte in STRING_BYTES:
            text = b"a" * at + byte + b"b" * (length - at)
            _names_agree(scanner, b'[{"ph":"X","cat":"cpu_op","name":"' + text + b'"},' + OP + b"]")
        for byte in SPACE_BYTES:
            gap = b" " * at + byte + b"\n" * (length - at)
            _names_agree(scanner, b'[{"ph":"X",' + gap + b'"cat":"cpu_op","name":"n"},' + OP + b"]")


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 2 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 7, 2**40, -(2**63), 2**63 - 1, 2**64, 10**30])
    if kind == 3:
        return rng.choice([0.5, -2.25, 1e-7, 3e300, 1700000000123.456, 12.000000, -0.0])
    if kind == 4:
        return rng.choice(["", "a", "é", "ncclDevKernel_X", 'q"uote', "tab\t", "😀", "x\\y"])
    if kind == 5:
        return rng.choice(["stream 7", "0x1", "Spans"])
    if kind == 6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    if kind == 7:
        return [rng.randrange(8) for _ in range(rng.randrange(4))]
    return {rng.choice(ARG_NAMES): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


ARG_NAMES = [f.encode_name for f in msgspec.structs.fields(Args)] + ["cbid", "grid", "Ev Idx"]
CATS = [
    "kernel",
    "cuda_runtime",
    "cpu_op",
    "user_annotation",
    "Kernel",
    "Runtime",
    "gpu_memcpy",
    "cuda_sync",
    "ac2g",
    "python_function",
    "Trace",
]
NAMES = [
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    "record_param_comms",
    "nccl:all_reduce",
    "gloo:send",
    "ProfilerStep#3",
    "aten::mm",
    "cudaLaunchKernel",
    "gemm",
    "thread_name",
    "Stream Wait Event",
    "c10d::send",
    "cudaEventQuery",
    "cudaStreamSynchronize",
]


def _random_event(rng: random.Random, odd: float = 0.0) -> dict[str, Any]:
    """A Kineto-like event; with probability `odd` per field, a value of any type."""

    def pick(good: Any) -> Any:
        return _random_value(rng) if rng.random() < odd else good

    args = {"External id": rng.randrange(1, 50), "correlation": rng.randrange(1, 50)}
    if rng.random() < 0.5:
        args |= {"device": 0, "stream": rng.choice([7, 13])}
    if rng.random() < 0.2:
        args |= {"wait_on_stream": rng.choice([-1, 7, 13]), "wait_on_cuda_event_record_corr_id": 9}
    if rng.random() < 0.3:
        args |= {
            "Collective name": "allreduce",
            "In msg nelems": rng.randrange(1, 4096),
            "dtype": "BFloat16",
            "Process Group Ranks": [0, 1],
            "Group size": 2,
        }
    if rng.random() < odd:
        args[rng.choice(ARG_NAMES)] = _random_value(rng)
    event = {
        "ph": pick(rng.choice("XXXXXXBEMsfi")),
        "cat": pick(rng.choice(CATS)),
        "name": pick(rng.choice(NAMES)),
        "pid": pick(rng.choice([0, 100000])),
        "tid": pick(rng.choice([7, 100000])),
        "ts": pick(round(rng.uniform(0, 1e7), 3)),
        "dur": pick(round(rng.uniform(0, 100), 3)),
        "args": pick(args),
    }
    for key in list(event):
        if rng.random() < odd / 2:
            del event[key]
    return event


@pytest.mark.parametrize("seed", range(40))
def test_random_pieces_agree_with_msgspec(scanner, seed):
    rng = random.Random(seed)
    odd = rng.choice([0.0, 0.02, 0.1, 0.3])
    events = [_random_event(rng, odd) for _ in range(rng.randrange(1, 60))]
    text = json.dumps(events, indent=rng.choice([None, 1, 4]), ensure_ascii=rng.random() < 0.5)
    data = text.encode()
    if rng.random() < 0.3:  # damage it: cut it short or flip a byte
        at = rng.randrange(len(data))
        data = (
            data[:at]
            + (b"" if rng.random() < 0.5 else bytes([rng.randrange(256)]))
            + data[at + 1 :]
        )
    taken = _check(data)
    if odd == 0.0 and data == text.encode():
        assert taken, "a plain Kineto-like piece should be read by the scanner"


def test_the_environment_can_turn_the_scanner_off(scanner):
    code = "import kineto_comm.load.scan as s; print(s._scanner is None)"
    run = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "KINETO_COMM_PURE_DECODER": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == "True"


@pytest.mark.parametrize("dur", [2.0, 1e18, -5.0, None], ids=["plain", "huge", "negative", "none"])
def test_a_launch_call_s_end_is_the_same_with_and_without_the_scanner(
    scanner, monkeypatch, tmp_path, dur
):
    """The launch call's end (launch_end_ns) from either path: start plus its duration; a
    negative or missing duration is 0, one beyond the time range leaves the end unknown and
    keeps the launch (msgspec once dropped such a call, and its kernel's launch with it)."""
    from tests.conftest import kernel, launch, write_trace

    call = launch(100.0, 7)
    if dur is None:
        del call["dur"]
    else:
        call["dur"] = dur
    path = write_trace(tmp_path / "t.json", [kernel("gemm", 200.0, 10.0, corr=7), call])
    fast = _tables(path)
    _assert_same(fast, _pure(monkeypatch, path))
    gpu = fast["gpu"]
    assert gpu["launch_ns"].to_list() == [gpu["start_ns"][0] - 100_000]
    expected = {2.0: 2_000, -5.0: 0, None: 0}.get(dur)
    end = gpu["launch_end_ns"][0]
    assert end is None if expected is None else end == gpu["launch_ns"][0] + expected
