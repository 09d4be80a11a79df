"""What a trace's events are to the decoder: the categories kept and the role each plays, the
msgspec classes events decode into, the per-role tables' schemas, and RawTrace (one file's
tables and metadata).

Only the fields the analyses use are declared (msgspec skips the rest without building
objects), and events are typed by their phase so that flows and other unused phases cost no
fields. Both ways of reading a piece (scan.py, columns.py) share the category codes and name
tests here, so they give the same tables (tests/test_scan.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

import msgspec
import polars as pl

_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


# Categories kept from the event stream. Everything else (flows, instant events, python
# stacks, memory events) is dropped before columns are built. MTIA's device events
# (`mtia_ccp_events`: its kernels, DMA transfers and stream events) are device work, as HTA
# reads them (kernels.build_kernels gives their kinds).
MTIA_CAT = "mtia_ccp_events"
GPU_CATS = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", MTIA_CAT})
# CUDA synchronization events (torch.profiler's enable_cuda_sync_events): kept in `gpu` with
# the device events; only their "Stream Wait Event" rows are read (a stream waiting on an
# event another stream recorded), the others are dropped by the kernels model.
SYNC_CAT = "cuda_sync"
STREAM_WAIT = "Stream Wait Event"
RUNTIME_CATS = frozenset({"cuda_runtime", "Runtime", "cuda_driver", "mtia_runtime"})
# The runtime calls in which the CPU may wait for the device: a synchronisation (of a stream,
# an event, a context or the device) or a poll of an event or stream (a blocking
# work.wait(), a torch.cuda.Event.query() loop). Kept as `waits` (RawTrace), not as launches.
HOST_WAIT_CALLS = (
    *(f"cuda{w}Synchronize" for w in ("Stream", "Event", "Device", "Thread")),
    *(f"hip{w}Synchronize" for w in ("Stream", "Event", "Device")),
    *(f"cu{w}Synchronize" for w in ("Stream", "Event", "Ctx")),
    *(f"{api}{w}Query" for api in ("cuda", "hip", "cu") for w in ("Stream", "Event")),
)
# Python calls (torch.profiler's with_stack / with_modules): only the `nn.Module: X` ones are
# kept (ANCESTRY), as ops, for the attribution of calls to modules; never host rows.
PYTHON_CAT = "python_function"
CPU_CATS = frozenset({"cpu_op", "Operator", "user_annotation", PYTHON_CAT})
_KEEP_CATS = GPU_CATS | {SYNC_CAT} | RUNTIME_CATS | CPU_CATS
_DURATION_PH = frozenset({"X", "B", "E"})


class Args(msgspec.Struct, gc=False, omit_defaults=True):
    """The `args` fields the analyses read; all optional, several with types seen to vary."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_old: int | None = msgspec.field(default=None, name="external id")
    correlation: int | None = None
    stream: int | str | None = None
    device: int | str | None = None
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: str | int | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: str | list[int] | None = msgspec.field(default=None, name="Process Group Ranks")
    pg_id: int | str | None = msgspec.field(default=None, name="Process Group ID")
    seq: int | str | None = msgspec.field(default=None, name="Seq")
    src_rank: int | None = msgspec.field(default=None, name="Src Rank")
    dst_rank: int | None = msgspec.field(default=None, name="Dst Rank")
    wait_on_stream: int | None = None
    wait_on_corr: int | None = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")
    label: str | int | None = msgspec.field(default=None, name="name")


class _EventFields(msgspec.Struct, gc=False):
    """The fields of an event that the analyses use."""

    cat: str | None = None
    name: str | int | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    args: Args | None = None


class Event(_EventFields, gc=False):
    """One trace event of any phase: the permissive fallback for pieces the phase-tagged
    classes below cannot take (an unknown or missing `ph`)."""

    ph: str | None = None


META_CAT = "\0meta"  # the role key of metadata (M) events, which carry no category


class _Phase(msgspec.Struct, gc=False, tag_field="ph"):
    """Events typed by their phase: msgspec picks the class from `ph` in C, so flows,
    instants, counters and the like (often a third of a trace) become empty objects whose
    fields are skipped, not decoded."""

    ph: ClassVar[str] = ""


class Complete(_Phase, _EventFields, tag="X"):
    ph: ClassVar[str] = "X"


class Begin(Complete, tag="B"):
    ph: ClassVar[str] = "B"


class End(Complete, tag="E"):
    ph: ClassVar[str] = "E"


class Meta(_Phase, tag="M"):
    ph: ClassVar[str] = "M"
    cat: ClassVar[str] = META_CAT
    name: str | int | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: Args | None = None


# Every other phase of the Chrome trace format; a phase outside this list sends its piece
# to the permissive `Event` decoder.
_OTHER_PHASES = "iIsftCbenSTpFPNODVvRc()"
_SKIPPED = tuple(
    msgspec.defstruct(
        f"_Skip{ord(p)}", [], bases=(_Phase,), tag=p, gc=False, namespace={"cat": None}
    )
    for p in _OTHER_PHASES
)
TaggedEvent = Union[(Complete, Begin, End, Meta, *_SKIPPED)]  # noqa: UP007 - built at runtime


class ShapeArgs(msgspec.Struct, gc=False):
    """Tensor shapes and types of a communication annotation (its message size)."""

    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")


class ShapeEvent(msgspec.Struct, gc=False):
    name: str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    args: ShapeArgs | None = None


class PGConfig(msgspec.Struct, gc=False):
    pg_name: str | int | None = None
    pg_desc: str | None = None
    pg_size: int | None = None
    ranks: list[int] | str | None = None
    backend_config: str | None = None


class DistInfo(msgspec.Struct, gc=False):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    pg_config: list[PGConfig] | None = None
    nccl_version: str | None = None


class DeviceProps(msgspec.Struct, gc=False):
    id: int | str | None = None
    name: str | None = None
    # Any: a damaged value is dropped (assemble._device), never a failed header.
    numSms: Any = None  # noqa: N815 - JSON keys
    totalGlobalMem: Any = None  # noqa: N815
    computeMajor: Any = None  # noqa: N815
    computeMinor: Any = None  # noqa: N815


class Top(msgspec.Struct, gc=False):
    traceEvents: list[TaggedEvent] = msgspec.field(default_factory=list)  # noqa: N815 - JSON key
    distributedInfo: DistInfo | None = None  # noqa: N815
    deviceProperties: list[DeviceProps] | None = None  # noqa: N815
    displayTimeUnit: str | None = None  # noqa: N815
    baseTimeNanoseconds: int | None = None  # noqa: N815
    schemaVersion: int | None = None  # noqa: N815
    host_name: str | None = None  # where the trace was taken (not every Kineto writes it)


class _TopAny(Top, gc=False):
    traceEvents: list[Event] = msgspec.field(default_factory=list)  # noqa: N815


class _Decoder:
    """Phase-tagged decoding, falling back to the permissive classes when a piece holds a
    phase the tagged union does not know (a schema problem, not a syntax one)."""

    def __init__(self, tagged: Any, permissive: Any) -> None:
        self.tagged = msgspec.json.Decoder(tagged)
        self.permissive = msgspec.json.Decoder(permissive)

    def decode(self, data: Any) -> Any:
        try:
            return self.tagged.decode(data)
        except msgspec.ValidationError:
            return self.permissive.decode(data)


_TOP = _Decoder(Top, _TopAny)
_SHAPE = msgspec.json.Decoder(ShapeEvent)
# CPU spans of collectives, as record_function names them: host-backend ones (gloo:broadcast,
# ...), and NCCL annotations (nccl:all_reduce). The tests of names below are built from these.
HOST_SPANS = ("gloo:", "ucc:", "mpi:")
_NCCL_SPANS = ("nccl:", "xccl:")
# Communication annotations carry the message size in `Input Dims` / `Input type`, which
# every other CPU op carries too. Decoding those two fields for every op costs a quarter of
# the decode, so they are read only for these events, found by name in the raw bytes (see
# _shapes).
# The c10d ops whose Input Dims give the output and the input size of a call ([output,
# input, ...]): the only record of the output (received) size in traces whose
# record_param_comms carry no sizes, and in gloo traces (uneven all-to-all receives what
# it does not send). Kept in the ops table (and in the host table, where one is kept). The
# point-to-point ops are kept for their Concrete Inputs, whose third entry is the peer (the
# group rank sent to or received from): gloo traces record it nowhere else.
SIZED_C10D = (
    "c10d::alltoall_base_",
    "c10d::_allgather_base_",
    "c10d::_reduce_scatter_base_",
    "c10d::send",
    "c10d::recv_",
)
# The all-to-all op whose Concrete Inputs hold the call's split sizes ([output, input,
# group, output_split_sizes, input_split_sizes, ...]): a piece that holds one reads its
# annotations' shapes whatever its record_param_comms say (columns._wants_shapes).
ALL_TO_ALL_OP = "c10d::alltoall_base_"
_ANNOTATION_PREFIXES = tuple(b'"' + p.encode() for p in (*_NCCL_SPANS, *HOST_SPANS, "c10d::"))
# Of the c10d ops, only the sized ones (one pass over the bytes for all of them).
_SIZED_NAMES = tuple(b'"' + p.encode() + b'"' for p in SIZED_C10D)
_SIZED_LONGEST = max(map(len, _SIZED_NAMES))
_NAME_KEY = re.compile(rb'"name"\s*:\s*$')
_EVENTS = _Decoder(list[TaggedEvent], list[Event])
_EMPTY_ARGS = Args()

# Columns of each per-role table (see RawTrace), with their types.
_STR = pl.String()
# The column telling whose a row is in a batch of files decoded together (decode_files).
_FILE = frozenset({"_file"})
_I64 = pl.Int64()
_F64 = pl.Float64()
_COMMON = {"ph": _STR, "pid": _STR, "tid": _STR, "ts_us": _F64, "dur_us": _F64}
_COLL = {
    "collective": _STR,
    "in_nelems": _I64,
    "out_nelems": _I64,
    "group_size": _I64,
    "dtype": _STR,
    "pg_name": _STR,
    "pg_desc": _STR,
    "pg_ranks": _STR,
    "seq": _I64,
    "src_rank": _I64,
    "dst_rank": _I64,
}
# A stream wait's fields (cuda_sync "Stream Wait Event"): the stream that recorded the event
# waited on, and the correlation of that cudaEventRecord call.
_SYNC = {"wait_on_stream": _I64, "wait_on_corr": _I64}
# The fields read from a row's args only where its role's detail test holds.
_DETAIL_FIELDS = (*_COLL, *_SYNC)
GPU_SCHEMA = {
    **_COMMON,
    "cat": _STR,
    "name": _STR,
    "external_id": _I64,
    "correlation": _I64,
    "stream": _I64,
    "device": _I64,
    # The launching runtime call's time, thread and duration (see _join_launches).
    "launch_ts_us": _F64,
    "launch_tid": _STR,
    "launch_dur_us": _F64,
    **_COLL,
    **_SYNC,
}
# Launches only: their time, thread and duration.
RUNTIME_SCHEMA = {"ph": _STR, "tid": _STR, "ts_us": _F64, "dur_us": _F64, "correlation": _I64}
# A host wait (HOST_WAIT_CALLS): which call, on which thread, when (RawTrace.waits).
WAITS_SCHEMA = {"tid": _STR, "name": _STR, "start_ns": _I64, "end_ns": _I64}
_RUNTIME_READS = [*RUNTIME_SCHEMA, "_file"]  # a scanned runtime call's columns that are read
OPS_SCHEMA = {
    **_COMMON,
    "cat": _STR,
    "name": _STR,
    **_COLL,
    "input_dims": _STR,
    "input_type": _STR,
    "concrete_inputs": _STR,  # the c10d ops' only (SIZED_C10D)
}
HOST_SCHEMA = {**_COMMON, "cat": _STR, "name": _STR}
_INT_LIKE = frozenset({"pid", "tid", "pg_name"})
# The scanner's details columns that hold text (as rows of the piece's names).
_DETAIL_TEXT = frozenset({"collective", "dtype", "pg_name", "pg_desc", "pg_ranks"})
_IDS = pl.List(pl.UInt32())
_PARSED_INT = frozenset({"stream", "device"})


def parse_int(text: pl.Expr) -> pl.Expr:
    """An integer from text such as `7`, `stream 7` or `0x0` (AMD traces); null if none."""
    hexa = text.str.extract(r"^0x([0-9a-fA-F]+)$", 1)
    return (
        pl.when(hexa.is_not_null())
        .then(hexa.str.to_integer(base=16, strict=False))
        .otherwise(text.str.extract(r"(-?\d+)", 1).cast(pl.Int64, strict=False))
    )


@dataclass
class RawTrace:
    """One file's events split by role, with exact start_ns/end_ns, and its metadata.

    Each table has its schema's columns except ph, ts_us and dur_us, which become
    start_ns and end_ns (and launch_ts_us and launch_dur_us, which become launch_ns and
    launch_end_ns).

    - `gpu`: kernels, memcpy and memset on the device timeline (GPU_SCHEMA), each with
      launch_ns, launch_end_ns and launch_tid: when the first runtime call with its
      correlation started and returned, and on which thread (null if none), and the CUDA
      sync events (cat SYNC_CAT; a stream wait with wait_on_stream and wait_on_corr). The
      CUDA/HIP runtime calls serve only this link and are not kept.
    - `ops`: communication ops (record_param_comms, nccl:*, gloo:*) and user annotations
      such as ProfilerStep#N (OPS_SCHEMA).
    - `host`: every other CPU op: name, where and when it ran (HOST_SCHEMA); only filled
      for traces without device activity (the host timeline of gloo and CPU-only runs).
    - `threads`: process/thread name metadata (kind, pid, tid, label).
    - `waits`: the runtime calls in which the CPU may have waited for the device
      (HOST_WAIT_CALLS; WAITS_SCHEMA): synchronisations and polls.
    """

    file: str
    gpu: pl.DataFrame
    ops: pl.DataFrame
    host: pl.DataFrame
    threads: pl.DataFrame
    waits: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=WAITS_SCHEMA))
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    device_names: list[str] = field(default_factory=list)
    # The header's deviceProperties: id, name, sms, memory_bytes, compute_capability.
    devices: list[dict[str, Any]] = field(default_factory=list)
    base_time_ns: int = 0
    host_name: str | None = None
    nbytes: int = 0
    warnings: list[str] = field(default_factory=list)
    host_skipped: bool = False  # `host` left empty: the trace has device activity


# The host-side span of a collective call (a name starting with one of those prefixes).
COLLECTIVE_SPAN = "^(" + "|".join(re.escape(p[:-1]) for p in (*_NCCL_SPANS, *HOST_SPANS)) + "):"
# The name tests below, as Polars expressions here and in Python for the scanner's distinct
# names (_names), share these.
_COMM_KERNEL_NAME = r"(?i)^(nccl|rccl)"
_PARAM_COMMS = "record_param_comms"
_STEP_MARK = "ProfilerStep#"
# Device rows whose args are read: communication kernels and stream waits.
_DEVICE_DETAIL = (
    pl.col("name").str.contains(_COMM_KERNEL_NAME) | (pl.col("name") == STREAM_WAIT)
).fill_null(False)
_COMM_OP = (
    pl.col("name").str.starts_with(_PARAM_COMMS) | pl.col("name").str.contains(COLLECTIVE_SPAN)
).fill_null(False)
# Each kept category has a code, role * 16 + its index among its role's; code // 16 is the
# role: 0 device, 1 runtime calls, 2 CPU ops, 3 metadata. Roles and the `cat` column come
# from these codes, so category strings are looked up once per event and never turned into
# columns one by one.
_ROLES = (sorted(GPU_CATS | {SYNC_CAT}), sorted(RUNTIME_CATS), sorted(CPU_CATS), [META_CAT])
_CODE = {cat: role * 16 + i for role, cats in enumerate(_ROLES) for i, cat in enumerate(cats)}
# The runtime calls named in HOST_WAIT_CALLS: a device-role code of their own (found by
# name, never by category), split off the device rows as the `waits` table (_assemble).
_HOST_WAIT = len(_ROLES[0])
_HOST_WAIT_CAT = "\x00host_wait"
assert _HOST_WAIT < 16 and all(len(c) < 16 for c in _ROLES), "a role's codes are 0-15"
_CAT_OF = pl.Series(
    "cat",
    [
        _HOST_WAIT_CAT if i == _HOST_WAIT else next((c for c, k in _CODE.items() if k == i), None)
        for i in range(64)
    ],
)
_HOST_WAIT_NAMES = tuple(n.encode() for n in HOST_WAIT_CALLS)


# CPU events kept in `ops`: annotations (ProfilerStep#N, user ranges), communication ops and
# the ops of a torch.compile'd graph (CompiledFunction, CompiledFunctionBackward: how the
# framework table sees torch.compile where its kernels are not Triton's).
_SIZED_OP = pl.col("name").is_in(SIZED_C10D).fill_null(False)
_COMPILED = "CompiledFunction"
# The CPU events that say where a call was issued from (kineto_comm.analysis.attribution):
# the backward engine's nodes, optimizer steps, modules (python_function `nn.Module: X`)
# and the c10d ops that issue a host backend's calls. Kept in `ops` and, where a file keeps
# its host table, there too (as the sized c10d ops), so the host timeline is unchanged.
ANCESTRY_PREFIXES = ("autograd::engine::evaluate_function", "Optimizer.", "nn.Module:", "c10d::")
_ANCESTRY = pl.any_horizontal(pl.col("name").str.starts_with(p) for p in ANCESTRY_PREFIXES)
_OP_NAME = (
    _COMM_OP
    | pl.col("name").str.starts_with(_STEP_MARK).fill_null(False)
    | _SIZED_OP
    | pl.col("name").str.starts_with(_COMPILED).fill_null(False)
    | _ANCESTRY.fill_null(False)
)
_IS_OP = (pl.col("cat") == "user_annotation") | _OP_NAME
_PYTHON_ROW = (pl.col("cat") == PYTHON_CAT).fill_null(False)
# Rows of a file that keeps its host table kept there as well as in `ops` (CPU ops only:
# annotations and Python calls are `ops` rows alone, as before).
_HOST_TOO = (_SIZED_OP | _ANCESTRY.fill_null(False)) & pl.col("cat").is_in(["cpu_op", "Operator"])
# Tests of an event's name alone, evaluated per distinct name of a scanned piece (Scanned).
_NAME_TESTS = {"_device_detail": _DEVICE_DETAIL, "_op_name": _OP_NAME, "_comm_op": _COMM_OP}


# The roles tabulated alike (code // 16, table, schema, which rows carry collective details);
# CPU ops (2) and metadata (3) need more and are handled on their own.
_DEVICE_ROLES = (
    (1, "runtime", RUNTIME_SCHEMA, None),
    (0, "gpu", GPU_SCHEMA, _DEVICE_DETAIL),
)


# _OP_NAME as name prefixes, for the scanner: it lets go of the other CPU ops of a file
# that keeps no host table (most of a GPU trace's rows) before they become rows at all.
_OP_PREFIXES = tuple(
    p.encode()
    for p in (_PARAM_COMMS, *_NCCL_SPANS, *HOST_SPANS, _STEP_MARK, *ANCESTRY_PREFIXES, _COMPILED)
)
assert all(any(n.startswith(p) for p in ANCESTRY_PREFIXES) for n in SIZED_C10D)
_ANNOTATION = _CODE["user_annotation"]  # kept whatever its name (_IS_OP)
