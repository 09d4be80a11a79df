"""Vocabulary of communication: kernel-name patterns, collective names, data types.

Everything here is a Polars expression so that names are parsed column-wise. Collective
names arrive in many spellings (`allreduce` in record_param_comms, `nccl:all_reduce` in
annotations, `AllReduce` in kernel names, `_allgather_base`, `reduce_scatter_tensor`...);
they are all mapped onto one set: all_reduce, all_gather, reduce_scatter, all_to_all,
broadcast, reduce, send, recv, send_recv, barrier, gather, scatter, unknown.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from kineto_comm.errors import UsageError

# Kernels that move data between ranks. HTA uses `^nccl.*Kernel`; this also covers any case,
# RCCL and NCCL's symmetric-memory kernels (`ncclSymkDevKernel_*`).
DEFAULT_COMM_KERNEL_PATTERNS: tuple[str, ...] = (r"(?i)^(nccl|rccl)\w*kernel",)

# Kernel-name vocabulary (order matters: longer alternatives first).
_ALGOS = r"COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|TREE|RING|PAT"
_PROTOS = r"LL128|LL|SIMPLE"
_REDOPS = r"PreMulSum|SumPostDiv|Sum|Prod|Max|Min|Avg"
_TYPES = (
    r"int8_t|uint8_t|int32_t|uint32_t|int64_t|uint64_t|half|float|double|bf16|f16|f32|f64|"
    r"i8|u8|i32|u32|i64|u64|fp8_e4m3|fp8_e5m2|f8e4m3|f8e5m2|e4m3|e5m2"
)
_END = r"(?:_|\(|$)"

_KERNEL_COLLECTIVE = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "sendrecv": "send_recv",
    "send": "send",
    "recv": "recv",
    "alltoall": "all_to_all",
    "generic": "unknown",
}

# Normalised spellings (lower case, no underscores, suffixes removed) -> canonical name.
_COLLECTIVE = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "allgatherintotensor": "all_gather",
    "reducescatter": "reduce_scatter",
    "reducescattertensor": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
    "alltoallsingle": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "send": "send",
    "recv": "recv",
    "recvanysource": "recv",
    "sendrecv": "send_recv",
    "barrier": "barrier",
    "gather": "gather",
    "scatter": "scatter",
    "monitoredbarrier": "barrier",
}

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "send",
    "recv",
    "send_recv",
    "barrier",
    "gather",
    "scatter",
    "unknown",
)
POINT_TO_POINT = ("send", "recv", "send_recv")

# dtype spellings from record_param_comms (`Float`, `BFloat16`), annotations' Input type
# (`float`, `c10::BFloat16`) and kernel names (`bf16`, `int8_t`) -> (name, bytes per element).
_DTYPES = {
    "float": "float32",
    "float32": "float32",
    "f32": "float32",
    "bfloat16": "bfloat16",
    "c10::bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "half": "float16",
    "c10::half": "float16",
    "float16": "float16",
    "f16": "float16",
    "double": "float64",
    "float64": "float64",
    "f64": "float64",
    "int": "int32",
    "int32": "int32",
    "int32_t": "int32",
    "i32": "int32",
    "uint32_t": "uint32",
    "u32": "uint32",
    "long": "int64",
    "long int": "int64",
    "int64": "int64",
    "int64_t": "int64",
    "i64": "int64",
    "uint64_t": "uint64",
    "u64": "uint64",
    "byte": "uint8",
    "unsigned char": "uint8",
    "uint8": "uint8",
    "uint8_t": "uint8",
    "u8": "uint8",
    "char": "int8",
    "signed char": "int8",
    "int8": "int8",
    "int8_t": "int8",
    "i8": "int8",
    "bool": "bool",
    "short": "int16",
    "short int": "int16",
    "float8_e4m3fn": "float8_e4m3",
    "c10::float8_e4m3fn": "float8_e4m3",
    "fp8_e4m3": "float8_e4m3",
    "f8e4m3": "float8_e4m3",
    "e4m3": "float8_e4m3",
    "float8_e5m2": "float8_e5m2",
    "c10::float8_e5m2": "float8_e5m2",
    "fp8_e5m2": "float8_e5m2",
    "f8e5m2": "float8_e5m2",
    "e5m2": "float8_e5m2",
}
DTYPE_BYTES = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float64": 8,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "int16": 2,
    "float8_e4m3": 1,
    "float8_e5m2": 1,
}


def _lookup(mapping: dict[str, object], dtype: pl.DataType) -> Callable[[pl.Expr], pl.Expr]:
    """An expression builder mapping text through `mapping` (null where a value is not a key).

    The keys are an Enum and the values a Series gathered at each row's key index: a query
    pays some 0.1 ms for it, where `replace_strict` builds its table on every run (~0.4 ms,
    on tables of a few hundred rows where that is most of the cost)."""
    keys = pl.Enum(list(mapping))
    values = pl.Series(list(mapping.values()), dtype=dtype)
    return lambda raw: pl.lit(values).gather(raw.cast(keys, strict=False).to_physical())


_canonical_collective = _lookup(_COLLECTIVE, pl.String())
_kernel_collective = _lookup(_KERNEL_COLLECTIVE, pl.String())
_canonical_dtype = _lookup(_DTYPES, pl.String())
_dtype_bytes = _lookup(DTYPE_BYTES, pl.Int64())


def check_comm_patterns(patterns: tuple[str, ...]) -> None:
    """Raise UsageError for the first pattern Polars' regex engine (Rust syntax: no
    look-around) rejects; else every rank file would fail on it alone."""
    for pattern in patterns:
        try:
            pl.select(pl.lit("", dtype=pl.String).str.contains(pattern))
        except pl.exceptions.ComputeError as exc:
            lines = [line for line in str(exc).splitlines() if line.strip()]
            why = next((line[len("error: ") :] for line in lines if line.startswith("error: ")), "")
            why = why or lines[0].removeprefix("regex error: ")
            raise UsageError(
                f"comm pattern {pattern!r} is not a valid regular expression ({why})"
            ) from None


def comm_kernel_expr(name: pl.Expr, extra_patterns: tuple[str, ...] = ()) -> pl.Expr:
    """True where a kernel name is a communication kernel (defaults plus user patterns)."""
    patterns = DEFAULT_COMM_KERNEL_PATTERNS + tuple(extra_patterns)
    return name.str.contains("|".join(f"(?:{p})" for p in patterns)).fill_null(False)


def normalize_collective(raw: pl.Expr) -> pl.Expr:
    """Map any spelling of a collective (args, annotation or op name) to the canonical name."""
    key = (
        raw.str.to_lowercase()
        .str.replace(r"^[a-z0-9]+::?", "")  # nccl:, gloo:, c10d::
        .str.replace_all(r"_(base|coalesced|into_tensor|tensor_coalesced)$", "")
        .str.replace_all(r"_+$", "")
        .str.replace_all("_", "")
    )
    return _canonical_collective(key).fill_null("unknown")


def kernel_fields(name: pl.Expr) -> dict[str, pl.Expr]:
    """Collective, reduction op, dtype, algorithm and protocol parsed from an NCCL kernel name."""
    coll = (
        name.str.extract(r"(?i)^(?:nccl|rccl)\w*?Kernel_([A-Za-z]+)", 1)
        .str.to_lowercase()
        .pipe(_kernel_collective)
        .fill_null("unknown")
    )
    return {
        "kernel_collective": coll,
        "algorithm": name.str.extract(rf"_({_ALGOS}){_END}", 1),
        "protocol": name.str.extract(rf"_({_PROTOS}){_END}", 1),
        "reduce_op": name.str.extract(rf"_({_REDOPS}){_END}", 1).str.to_lowercase(),
        "kernel_dtype": normalize_dtype(name.str.extract(rf"_({_TYPES}){_END}", 1)),
    }


def normalize_dtype(raw: pl.Expr) -> pl.Expr:
    """Canonical dtype name (float32, bfloat16, ...) from any spelling; null if unknown."""
    key = raw.str.strip_chars().str.strip_chars("[]'\"").str.to_lowercase()
    return _canonical_dtype(key)


def dtype_bytes(dtype: pl.Expr) -> pl.Expr:
    """Bytes per element of a canonical dtype; null if unknown."""
    return _dtype_bytes(dtype)


def first_tensor_numel(input_dims: pl.Expr) -> pl.Expr:
    """Element count of the first tensor in an `Input Dims` text such as `[[8, 1024]]`."""
    inner = input_dims.str.extract(r"^\s*\[\s*\[([0-9,\s]*)\]", 1)
    return (
        inner.str.split(",")
        .list.eval(pl.element().str.strip_chars().cast(pl.Int64, strict=False).product())
        .list.first()
    )


def nth_tensor_numel(input_dims: pl.Expr, n: int) -> pl.Expr:
    """Element count of the `n`-th (0-based) tensor in an `Input Dims` text such as
    `[[2883584], [3145728], [], []]`; null where it has no such entry, the entry is empty,
    or the count is beyond 2^40 (damage: it would wrap)."""
    entry = input_dims.str.extract_all(r"\[[0-9,\s]*\]").list.get(n, null_on_oob=True)
    sizes = entry.str.extract_all(r"\d+").cast(pl.List(pl.Float64), strict=False)
    count = sizes.list.eval(pl.element().product()).list.first()
    return pl.when(sizes.list.len() > 0).then(
        pl.when(count < 2**40).then(count.cast(pl.Int64, strict=False))
    )


def first_input_type(input_type: pl.Expr) -> pl.Expr:
    """The first entry of an `Input type` list text such as `["float", "Scalar"]`."""
    return input_type.str.extract(r"^\s*\[\s*\"([^\"]*)\"", 1)
