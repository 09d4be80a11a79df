"""A seeded fuzz campaign over the real traces: damaged and hostile input, case by case.

Every case is a real trace (../shared/traces, tests/data, sample_traces), trimmed to a few
hundred KB at an event boundary so that a case costs tens of milliseconds, then damaged by
one family of mutations (FAMILIES). `check_case` runs the CLI on it in this process and
decodes it four ways (scanner or pure decoder, whole or in small pieces), and returns what
is wrong with the outcome (an empty list when the contract holds):

- exit 0/1 with a valid JSON report, or exit 2 with one-line `error:` lines; never an
  "internal error", a traceback or an exception out of the CLI;
- no negative size, duration or count anywhere in the report;
- the four read paths give identical tables and warnings, or all reject the file;
- a multi-rank folder with one bad file reports every good rank with unchanged numbers.

tests/test_fuzz.py runs 36 cases by default, 300 with `-m slow` (CI) and >= 10,000 under
`-m fuzz`.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl

from tests.conftest import H100_TRACES, SAMPLES, SHARED_TRACES

TRIM_BYTES = 200_000  # events kept per seed (at an event boundary past this many bytes)
PIECE = 24 * 1024  # the small piece size the whole-file read is compared with

# Real traces that seed the cases: one of each kind of file found in the wild.
SEED_FILES = (
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/negative_queue_length_values_check/rank0.json.gz",
    "hta/trace_filter/sampled_rank-0.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "hta/mtia_inference_trace/mtia_inference_rank_0.json.gz",
    "hta/_history/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz",
    "hta/call_stack/backward_thread.json",
    "kineto-tb-plugin/worker0.1623143089861.pt.trace.json.gz",
)
# Multi-rank jobs whose folders get one bad file (real captures of this project).
JOBS = ("sample_traces/tp-2", "sample_traces/ddp-4", "tests/data/h100-nccl/tp-2")

HUGE = (
    2**63 - 1,
    2**63,
    -(2**63),
    2**64 + 5,
    10**30,
    9.2e15,
    9.3e15,
    1e18,
    -1e18,
    1e308,
    -9.2e15,
)
WRONG = (None, "x", "123", "", [], {}, [1, 2], {"a": 1}, True, False, -1, 0, 1.5, -0.0)
HOSTILE = (
    "[/]",
    "[bold red]x[/bold red]",
    "\x1b[31mred\x1b[0m",
    "\x1b]0;title\x07",
    "a\u0000b",
    "<script>alert(1)</script>",
    "[link=file:///etc/passwd]x[/link]",
    "\u202etxt",
    "x" * 5000,
)


@dataclass
class Case:
    """One fuzz case: the files of a trace folder (name -> bytes) and what made them."""

    family: str
    seed: int
    files: dict[str, bytes]
    what: str
    # For a multi-rank case: the job folder whose other files must report unchanged.
    job: str | None = None
    bad: str | None = None


@dataclass
class Seed:
    name: str
    text: bytes  # trimmed, decompressed JSON
    doc: Any = field(default=None)


_LAST_EVENT = re.compile(rb"\}\s*\]\s*[,}]")
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


def _trim(text: bytes, keep: int = TRIM_BYTES) -> bytes:
    """The trace with its events cut at the first boundary past `keep` bytes (header and
    trailer kept): still a whole, valid trace of the same file's bytes and layout."""
    if len(text) <= keep * 1.5:
        return text
    m = _BOUNDARY.search(text, keep)
    ends = list(_LAST_EVENT.finditer(text))
    if m is None or not ends or ends[-1].start() < m.start():
        return text
    end = ends[-1]
    out = text[: m.start() + 1] + text[end.start() + 1 :]
    json.loads(out)  # a trimmed seed must be whole, valid JSON
    return out


@cache
def seeds() -> tuple[Seed, ...]:
    out = []
    for rel in SEED_FILES:
        path = SHARED_TRACES / rel
        raw = path.read_bytes()
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        trimmed = _trim(text)
        out.append(Seed(rel, trimmed, json.loads(trimmed)))
    for path in (SAMPLES / "tp-2" / "rank-0.pt.trace.json.gz", H100_TRACES[0]):
        text = _trim(gzip.decompress(path.read_bytes()))
        out.append(Seed(str(path.relative_to(SAMPLES.parent)), text, json.loads(text)))
    return tuple(out)


@cache
def job_files(job: str) -> dict[str, bytes]:
    folder = SAMPLES.parent / job
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.json*"))}


# ------------------------------------------------------------------------ the families


def _events(doc: Any) -> list[Any]:
    ev = doc.get("traceEvents") if isinstance(doc, dict) else doc
    return ev if isinstance(ev, list) else []


def _dump(doc: Any, rng: random.Random) -> bytes:
    return json.dumps(doc, indent=rng.choice((None, 1, 2)), allow_nan=True).encode()


def fam_bytes(rng: random.Random, s: Seed) -> tuple[bytes, str]:
    b = bytearray(s.text)
    what = []
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(b))
        op = rng.choice(("flip", "set", "insert", "delete", "dup"))
        if op == "flip":
            b[i] ^= 1 << rng.randrange(8)
        elif op == "set":
            b[i] = rng.choice(b'{}[],:"\\0 \x00\xff\xc3e-.9n')
        elif op == "insert":
            b[i:i] = rng.choice((b"{", b"}", b",", b'"', b"]", b"\xff\xfe", b"\x00", b"1e999"))
        elif op == "delete":
            del b[i : i + rng.randint(1, 64)]
        else:
            n = rng.randint(1, 200)
            b[i:i] = b[i : i + n]
        what.append(f"{op}@{i}")
    return bytes(b), " ".join(what)


def fam_truncate(rng: random.Random, s: Seed) -> tuple[bytes, str]:
    cut = rng.choice((rng.randrange(1, len(s.text)), len(s.text) - rng.randint(1, 64)))
    return s.text[:cut], f"cut at {cut} of {len(s.text)}"


def fam_gzip(rng: random.Random, s: Seed) -> tuple[bytes, str]:
    z = bytearray(gzip.compress(s.text, compresslevel=1))
    op = rng.choice(("flip", "truncate", "garbage", "members", "header"))
    if op == "flip":
        i = rng.randrange(10, len(z))
        z[i] ^= 1 << rng.randrange(8)
        what = f"flip@{i}"
    elif op == "truncate":
        i = rng.randrange(10, len(z))
        del z[i:]
        what = f"truncate@{i}"
    elif op == "garbage":
        z += bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
        what = "garbage after the stream"
    elif op == "members":
        half = len(s.text) // 2
        z = bytearray(gzip.compress(s.text[:half]) + gzip.compress(s.text[half:]))
        what = "two gzip members"
    else:
        z[rng.randrange(2, 10)] ^= 0xFF
        what = "header byte"
    return bytes(z), what


def _pick_event(rng: random.Random, events: list[Any], test: Callable[[Any], bool]) -> Any:
    pool = [e for e in events if isinstance(e, dict) and test(e)]
    return rng.choice(pool) if pool else None


def fam_types(rng: random.Random, s: Seed) -> tuple[bytes, str]:
    doc = json.loads(s.text)
    events = _events(doc)
    value = rng.choice(WRONG)
    where = rng.random()
    if where < 0.15 and isinstance(doc, dict):
        key = rng.choice(
            ("traceEvents", "deviceProperties", "distributedInfo", "baseTimeNanoseconds")
            + tuple(doc)
        )
        doc[key] = value
        what = f"top {key} = {value!r}"
    else:
        e = _pick_event(rng, events, lambda e: True)
        if e is None:
            return _dump(doc, rng), "no events"
        if where < 0.6 or not isinstance(e.get("args"), dict) or not e["args"]:
            key = rng.choice(("ph", "cat", "name", "ts", "dur", "pid", "tid", "args", "id"))
            e[key] = value
        else:
            key = "args." + rng.choice(list(e["args"]))
            e["args"][key[5:]] = value
        what = f"event {e.get('name')!r} {key} = {value!r}"
    return _dump(doc, rng), what


def _numeric_slots(doc: Any) -> list[tuple[Any, Any, str]]:
    slots: list[tuple[Any, Any, str]] = []
    if isinstance(doc, dict):
        for key in ("baseTimeNanoseconds",):
            if key in doc:
                slots.append((doc, key, key))
        info = doc.get("distributedInfo")
        if isinstance(info, dict):
            for key in ("rank", "world_size", "pg_count"):
                slots.append((info, key, f"distributedInfo.{key}"))
            for pg in info.get("pg_config") or []:
                if isinstance(pg, dict) and isinstance(pg.get("ranks"), list) and pg["ranks"]:
                    slots.append((pg["ranks"], 0, "pg_config.ranks[0]"))
    for e in _events(doc):
        if not isinstance(e, dict):
            continue
        for key in ("ts", "dur"):
            if key in e:
                slots.append((e, key, key))
        args = e.get("args")
        if isinstance(args, dict):
            for key, v in args.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    slots.append((args, key, f"args.{key}"))
    return slots


def fam_huge(rng: random.Random, s: Seed) -> tuple[bytes, str]:
    doc = json.loads(s.text)
    slots = _numeric_slots(doc)
    what = []
    # Prefer the fields the analyses read: collective sizes, times, ranks.
    hot = [x for x in slots if re.search(r"nelems|ts|dur|rank|world|size|base", x[2], re.I)]
    for _ in range(rng.randint(1, 3)):
        pool = hot if hot and rng.random() < 0.8 else slots
        if not pool:
            break
        obj, key, label = rng.choice(pool)
        value = rng.choice(HUGE)
        obj[key] = value
        what.append(f"{label}={value!r}")
    if rng.random() < 0.2:
        step = _pick_event(rng, _events(doc), lambda e: str(e.get("name", "")).startswith("Prof"))
        if step is not None:
            step["name"] = "ProfilerStep#" + "9" * rng.choice((19, 20, 25, 40))
            what.append("a huge step number")
    return _dump(doc, rng), " ".join(what) or "nothing numeric"


def fam_nonfinite(rng: random.Random, s: Seed) -> tuple[bytes, str]:
    text = s.text
    spots = [m for m in re.finditer(rb'"(ts|dur|In msg nelems|rank|stream)"\s*:\s*-?[0-9.]+', text)]
    if not spots:
        return text, "no number"
    m = rng.choice(spots)
    token = rng.choice((b"NaN", b"Infinity", b"-Infinity", b"nan", b"1e400"))
    colon = text.index(b":", m.start())
    return text[: colon + 1] + b" " + token + text[m.end() :], f"{m.group(1)!r} = {token!r}"


def fam_dupkeys(rng: random.Random, s: Seed) -> tuple[bytes, str]:
    doc = json.loads(s.text)
    if not isinstance(doc, dict):
        return s.text, "not an object"
    events = _events(doc)
    key = rng.choice(("traceEvents", "distributedInfo", "deviceProperties", "baseTimeNanoseconds"))
    first = {
        "traceEvents": events[: len(events) // 3],
        "distributedInfo": {"rank": 5, "world_size": 8, "backend": "nccl"},
        "deviceProperties": [],
        "baseTimeNanoseconds": 12345,
    }[key]
    body = json.dumps(doc, indent=1)
    dup = f'{{\n "{key}": {json.dumps(first)},' + body[1:]
    return dup.encode(), f"{key} twice"


def fam_nesting(rng: random.Random, s: Seed) -> tuple[bytes, str]:
    depth = rng.choice((200, 1000, 3000, 20000))
    kind = rng.choice(("list", "dict"))
    deep = "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth
    where = rng.choice(("top", "args", "event"))
    doc = json.loads(s.text)
    marker = "__DEEP__"
    if where == "top" and isinstance(doc, dict):
        doc["deepKey"] = marker
    else:
        e = _pick_event(rng, _events(doc), lambda e: True)
        if e is None:
            return s.text, "no events"
        if where == "args":
            e.setdefault("args", {})
            if isinstance(e["args"], dict):
                e["args"]["deep"] = marker
        else:
            e["deep"] = marker
    text = json.dumps(doc).replace(f'"{marker}"', deep)
    return text.encode(), f"{kind} nested {depth} deep in {where}"


def fam_distinfo(rng: random.Random, s: Seed) -> tuple[bytes, str]:
    doc = json.loads(s.text)
    if not isinstance(doc, dict):
        return s.text, "not an object"
    info = doc.get("distributedInfo")
    if not isinstance(info, dict):
        info = doc["distributedInfo"] = {"backend": "nccl"}
    key = rng.choice(("rank", "world_size", "pg_config", "backend", "pg_count"))
    value = rng.choice(
        {
            "rank": (-1, -7, 2**63, 3.5, "1", "x", None, 10**6),
            "world_size": (0, -4, 2**63, 2**62, "8", None, 1),
            "pg_config": (
                [{"pg_name": "[/]", "ranks": [0, 2**64]}],
                [{"ranks": "0,1"}],
                [None],
                "x",
                [{"pg_name": 7, "pg_desc": ["a"], "ranks": [-1, 1]}],
            ),
            "backend": ("[bold]x", None, 5, "\x1b[31m"),
            "pg_count": (-1, 2**64, "x"),
        }[key]
    )
    info[key] = value
    return _dump(doc, rng), f"distributedInfo.{key} = {value!r}"


def fam_collargs(rng: random.Random, s: Seed) -> tuple[bytes, str]:
    doc = json.loads(s.text)
    pool = [
        e
        for e in _events(doc)
        if isinstance(e, dict)
        and isinstance(e.get("args"), dict)
        and re.search(r"nccl|record_param_comms|gloo|c10d", str(e.get("name")), re.I)
    ]
    if not pool:
        return fam_huge(rng, s)
    what = []
    for e in rng.sample(pool, min(len(pool), rng.randint(1, 5))):
        key = rng.choice(
            (
                "In msg nelems",
                "Out msg nelems",
                "In split size",
                "Out split size",
                "dtype",
                "Group size",
                "Process Group Ranks",
                "Process Group Name",
                "Collective name",
                "Input Dims",
                "Input type",
            )
        )
        value = rng.choice(
            (
                2**63 - 1,
                -(2**63),
                -5,
                0,
                "[1, 2]",
                "[[1,2],[3]]",
                "[/]",
                "[0, 99999999999999999999999]",
                [[2**63]],
                [1, -1],
                None,
                "\x1b[2J",
                "all_to_all[/]",
            )
        )
        e["args"][key] = value
        what.append(f"{key}={value!r}")
    return _dump(doc, rng), " ".join(what)


def fam_markup(rng: random.Random, s: Seed) -> tuple[bytes, str]:
    doc = json.loads(s.text)
    text = rng.choice(HOSTILE)
    where = rng.choice(("device", "kernel", "group", "dtype", "thread"))
    if where == "device" and isinstance(doc, dict):
        doc["deviceProperties"] = [{"id": 0, "name": text}]
    elif where == "thread":
        e = _pick_event(rng, _events(doc), lambda e: e.get("ph") == "M")
        if e is not None:
            e["args"] = {"name": text}
    else:
        e = _pick_event(
            rng,
            _events(doc),
            lambda e: (
                isinstance(e.get("args"), dict)
                and re.search(r"nccl|record_param|gloo", str(e.get("name")), re.I) is not None
            ),
        )
        if e is not None:
            if where == "kernel":
                e["name"] = str(e.get("name")) + text
            else:
                key = "Process Group Name" if where == "group" else "dtype"
                e["args"][key] = text
    return _dump(doc, rng), f"{where} = {text[:40]!r}"


FAMILIES: dict[str, Callable[[random.Random, Seed], tuple[bytes, str]]] = {
    "bytes": fam_bytes,
    "truncate": fam_truncate,
    "gzip": fam_gzip,
    "types": fam_types,
    "huge": fam_huge,
    "nonfinite": fam_nonfinite,
    "dupkeys": fam_dupkeys,
    "nesting": fam_nesting,
    "distinfo": fam_distinfo,
    "collargs": fam_collargs,
    "markup": fam_markup,
}
ALL_FAMILIES = (*FAMILIES, "multirank")


def make_case(family: str, seed: int) -> Case:
    rng = random.Random(f"{family}:{seed}")
    if family == "multirank":
        job = JOBS[seed % len(JOBS)]
        files = dict(job_files(job))
        bad = rng.choice(sorted(files))
        text = gzip.decompress(files[bad])
        inner = rng.choice([f for f in FAMILIES if f != "gzip"])
        data, what = FAMILIES[inner](rng, Seed(bad, text))
        files[bad] = data  # plain JSON under the .gz name when not gzip: a wrong suffix too
        if rng.random() < 0.7:
            files[bad] = gzip.compress(data, compresslevel=1)
        return Case(family, seed, files, f"{bad}: {inner}: {what}", job=job, bad=bad)
    pool = seeds()
    s = pool[seed % len(pool)]
    data, what = FAMILIES[family](rng, s)
    name = Path(s.name).name.removesuffix(".gz")
    if family == "gzip":
        name += ".gz"
    return Case(family, seed, {name: data}, f"{s.name}: {what}")


# ---------------------------------------------------------------------------- checking


# Deviations from the analytical model (model_comparison: bytes_dev_pct, calls_dev_pct) are
# signed: the trace moves less than the model or more.
_SIGNED = re.compile(r"(start|end|offset|estimate|residual|_dev_pct|^step$|^steps$|^ts)", re.I)
_UNSIGNED = re.compile(r"(_ns|bytes|count|calls|size|_gbps|_share|_fraction|instances|^rank)", re.I)


def negatives(doc: Any, path: str = "") -> list[str]:
    """Paths of negative sizes, durations and counts in a JSON report."""
    out: list[str] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if v < 0 and _UNSIGNED.search(k) and not _SIGNED.search(k):
                    out.append(f"{path}.{k}={v}")
            else:
                out.extend(negatives(v, f"{path}.{k}"))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:2000]):
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if v < 0 and _UNSIGNED.search(path.rsplit(".", 1)[-1]):
                    out.append(f"{path}[{i}]={v}")
            else:
                out.extend(negatives(v, f"{path}[{i}]"))
    return out


def run_cli(args: list[str]) -> tuple[int, str, str]:
    """The CLI in this process: (exit code, stdout, stderr); an exception out of main()
    is returned as exit code -1 with its repr."""
    from kineto_comm.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    import sys

    argv = sys.argv
    sys.argv = ["kineto-comm", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BaseException as exc:  # noqa: BLE001 - the point is to catch everything
        return -1, out.getvalue(), f"{type(exc).__name__}: {exc}"
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def _decode_all(path: Path) -> dict[str, Any]:
    """The file decoded four ways: scanner/pure x whole/pieces -> tables or error text."""
    from kineto_comm.load import decode
    from kineto_comm.load import scan as scanner

    got: dict[str, Any] = {}
    real = scanner._scanner
    for scan in (True, False):
        scanner._scanner = real if scan else None
        try:
            for piece in (None, PIECE):
                key = f"{'scanner' if scan else 'pure'}/{'whole' if piece is None else 'pieces'}"
                try:
                    raw = decode.decode_file(path, piece)
                except decode.TraceError as exc:
                    got[key] = ("error", exc.problem)
                    continue
                got[key] = (
                    "ok",
                    {t: getattr(raw, t) for t in ("gpu", "ops", "host", "threads")},
                    (
                        raw.rank,
                        raw.world_size,
                        raw.backend,
                        raw.process_groups,
                        raw.device_names,
                        raw.base_time_ns,
                        raw.warnings,
                    ),
                )
        finally:
            scanner._scanner = real
    return got


def _disagreements(got: dict[str, Any]) -> list[str]:
    out = []
    (first, ref), *rest = got.items()
    for key, other in rest:
        if ref[0] != other[0]:
            out.append(
                f"{first} {ref[0]} ({ref[1] if ref[0] == 'error' else ''}) but {key}"
                f" {other[0]} ({other[1] if other[0] == 'error' else ''})"
            )
            continue
        if ref[0] == "error":
            continue
        if ref[2] != other[2]:
            out.append(
                f"{first} and {key} differ in metadata/warnings: {ref[2]!r} vs {other[2]!r}"[:600]
            )
        for t, frame in ref[1].items():
            if not frame.equals(other[1][t], null_equal=True) or frame.schema != other[1][t].schema:
                out.append(f"{first} and {key} differ in table {t}")
    return out


def _bad_times(got: dict[str, Any]) -> list[str]:
    out = []
    for key, value in got.items():
        if value[0] != "ok":
            continue
        for t, frame in value[1].items():
            if {"start_ns", "end_ns"} <= set(frame.columns):
                n = frame.filter(pl.col("end_ns") < pl.col("start_ns")).height
                if n:
                    out.append(f"{key}: {n} rows of {t} end before they start")
        break
    return out


def _lines_ok(stderr: str, code: int) -> list[str]:
    out = []
    lines = [line for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if not line.startswith(("error: ", "warning: ")):
            out.append(f"stderr line not one-line error/warning: {line[:200]!r}")
        if "internal error" in line or "Traceback" in line:
            out.append(f"internal error: {line[:300]!r}")
    if code == 2 and not any(line.startswith("error: ") for line in lines):
        out.append("exit 2 without an error line")
    return out


def _totals_by_file(doc: dict[str, Any]) -> dict[str, Any]:
    """Each file's totals, less start and end (on the clock the aligned job puts them)."""
    return {
        Path(r["file"]).name: {
            k: v for k, v in (r.get("totals") or {}).items() if k not in ("start_ns", "end_ns")
        }
        for r in doc.get("ranks", [])
    }


@cache
def clean_report(job: str, folder_key: str) -> dict[str, Any]:
    """The JSON report of a job's unharmed files (folder_key: where they were written)."""
    code, out, err = run_cli(["report", folder_key, "--format", "json", "--exit-zero", "-j", "1"])
    assert code == 0, err
    return json.loads(out)


def check_case(case: Case, folder: Path) -> list[str]:
    """What is wrong with the tool's handling of `case` (written under `folder`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in case.files.items():
        (folder / name).write_bytes(data)
    problems: list[str] = []
    text_out = folder.parent / f"{folder.name}.txt"
    code, out, err = run_cli(
        ["report", str(folder), "--format", "json", "-j", "1", "--also", f"text={text_out}"]
    )
    if code == -1:
        return [f"exception out of the CLI: {err[:300]}"]
    problems += _lines_ok(err, code)
    if code in (0, 1):
        try:
            doc = json.loads(out)
        except ValueError as exc:
            problems.append(f"exit {code} but stdout is not JSON ({exc})")
            doc = {}
        problems += [f"negative value {n}" for n in negatives(doc)[:5]]
        if text_out.exists():
            text = text_out.read_text(errors="replace")
            if "\x1b" in text:
                problems.append("an ESC byte reached the text report")
        else:
            problems.append("the text report was not written")
    elif code == 2:
        if out.strip():
            problems.append("exit 2 with output on stdout")
        doc = {}
    else:
        problems.append(f"exit code {code}")
        doc = {}
    if case.job is not None:
        clean = clean_report(case.job, str(SAMPLES.parent / case.job))
        want = {k: v for k, v in _totals_by_file(clean).items() if k != case.bad}
        have = _totals_by_file(doc)
        for name, totals in want.items():
            if name not in have:
                problems.append(f"good rank file {name} missing from the report")
            elif have[name] != totals:
                problems.append(f"good rank file {name} reported with other totals")
    else:
        for name in case.files:
            got = _decode_all(folder / name)
            problems += _disagreements(got)
            problems += _bad_times(got)
    return problems


def run_cases(cases: list[tuple[str, int]], root: Path) -> list[tuple[str, int, float, list[str]]]:
    """Check each (family, seed) case in a folder of its own under `root`; per case its
    family, seed, seconds and problems (each prefixed with what the case was)."""
    results = []
    for family, seed in cases:
        start = time.perf_counter()
        try:
            case = make_case(family, seed)
            problems = check_case(case, root / f"{family}-{seed}")
            problems = [f"{case.what[:200]}: {p}" for p in problems]
        except Exception as exc:  # noqa: BLE001 - a harness failure is a problem too
            problems = [f"harness raised {type(exc).__name__}: {exc}"]
        results.append((family, seed, time.perf_counter() - start, problems))
    return results


def _worker(args: tuple[list[tuple[str, int]], str]) -> list[tuple[str, int, float, list[str]]]:
    cases, root = args
    return run_cases(cases, Path(root))


def campaign(
    per_family: int, root: Path, processes: int = 2
) -> list[tuple[str, int, float, list[str]]]:
    """per_family cases of every family, over `processes` worker processes."""
    import multiprocessing as mp

    cases = [(f, s) for s in range(per_family) for f in ALL_FAMILIES]
    chunks = [cases[i :: processes * 8] for i in range(processes * 8)]
    if processes <= 1:
        return run_cases(cases, root)
    with mp.get_context("spawn").Pool(processes) as pool:
        parts = pool.map(_worker, [(c, str(root)) for c in chunks])
    return [r for part in parts for r in part]
