"""Model and hardware configuration for the synthetic trace generator, and the analytical formulas.

Everything the generator simulates is derived from these two small dataclasses, so that
``truth.json`` can state the expected message sizes and call counts from the same closed-form
formulas a reader would use (Psi = 12*L*h^2 + V*h parameters, bf16 = 2 bytes, ...).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# The closed forms live in kineto_comm.analytic so the generator and the model cannot drift.
from kineto_comm.analytic.formulas import block_grad_elems, buckets, ceil_div, pipeline_bubble
from kineto_comm.analytic.formulas import busbw_factor as _busbw_factor

DTYPE_BYTES = {"BFloat16": 2, "Half": 2, "Float": 4}
DTYPE_NCCL = {"BFloat16": "bf16", "Half": "f16", "Float": "f32"}


@dataclass(frozen=True)
class ModelConfig:
    """A GPT-like transformer: ``layers`` blocks of hidden size ``hidden`` plus a (tied) embedding.

    ``micro_batch`` sequences of ``seq`` tokens form one micro-batch; ``micro_batches`` of them
    form one optimizer step (gradient accumulation, or the pipeline's m).
    """

    layers: int = 8
    hidden: int = 1024
    seq: int = 1024
    micro_batch: int = 4
    micro_batches: int = 1
    vocab: int = 32000
    dtype: str = "BFloat16"
    bucket_mb: float = 25.0  # DDP bucket_cap_mb

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "seq", "micro_batch", "micro_batches", "vocab"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.bucket_mb <= 0:
            raise ValueError(f"model.bucket_mb must be > 0, got {self.bucket_mb!r}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(
                f"model.dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}"
            )

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element (B in the formulas)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def tokens(self) -> int:
        """Tokens in one micro-batch: b*s."""
        return self.micro_batch * self.seq

    @property
    def layer_params(self) -> int:
        """Parameters of one transformer block: 12*h^2 (qkv 3h^2, proj h^2, fc1 4h^2, fc2 4h^2)."""
        return 12 * self.hidden * self.hidden

    @property
    def embedding_params(self) -> int:
        """Parameters of the (tied) token embedding: V*h."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Psi = 12*L*h^2 + V*h."""
        return self.layers * self.layer_params + self.embedding_params

    def to_dict(self) -> dict[str, Any]:
        """The config plus the derived sizes, as written to truth.json."""
        d = asdict(self)
        d.update(
            dtype_bytes=self.dtype_bytes,
            params=self.params,
            layer_params=self.layer_params,
            embedding_params=self.embedding_params,
            tokens_per_micro_batch=self.tokens,
        )
        return d


@dataclass(frozen=True)
class Hardware:
    """Throughputs the durations are computed from (H100-like numbers).

    Compute kernels take ``flops / tflops``; memory-bound kernels ``bytes / hbm`` plus a floor.
    A collective of ``nbytes`` on a group of n ranks takes
    ``latency + busbw_factor(op, n) * nbytes / busbw`` (nccl-tests convention:
    all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, send/recv 1). The healthy
    ``busbw`` is the hardware table's (kineto_comm/data/hardware.toml) for the traces' device,
    an H100 SXM, per collective: its NVLink figure inside a host, ``network``'s across hosts
    (analysis.hardware.link_figures); ``busbw_gbps`` set: that one figure for every link,
    and the traces name a device the table does not know (kineto.CUSTOM_GPU): nothing is
    expected of its links.
    """

    tflops: float = 300.0
    hbm_gbps: float = 2000.0
    busbw_gbps: float | None = None
    network: str = "400G-IB"
    latency_us: float = 12.0
    launch_us: float = 6.0
    cpu_op_us: float = 18.0
    kernel_floor_us: float = 2.0
    gpus_per_host: int = 8
    extra: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable copy for truth.json."""
        return asdict(self)


_CANONICAL = {
    "allreduce": "all_reduce",
    "_allgather_base": "all_gather",
    "_reduce_scatter_base": "reduce_scatter",
    "send": "send",
    "recv": "recv",
}


def busbw_factor(coll: str, n: int) -> float:
    """The nccl-tests bus-bandwidth factor of a collective (record_param_comms name) on n ranks."""
    if coll not in _CANONICAL:
        raise ValueError(f"no bus bandwidth factor for {coll!r}")
    return _busbw_factor(_CANONICAL[coll], n)


# The device the traces' headers name (kineto.H100): its key in the hardware table.
GPU = "h100-sxm"


def link_busbw(hw: Hardware, ranks: list[int], per_host: int) -> dict[str, float]:
    """Per canonical collective, the healthy bus bandwidth of a group of `ranks` with hosts of
    `per_host` consecutive ranks: the hardware table's (Hardware's docstring)."""
    from kineto_comm.analysis.hardware import link_figures, load_table

    if hw.busbw_gbps is not None:
        return dict.fromkeys(
            ("all_reduce", "all_gather", "reduce_scatter", "send_recv"), hw.busbw_gbps
        )
    table = load_table()
    on_host: dict[int, int] = {}
    for r in ranks:
        on_host[r // per_host] = on_host.get(r // per_host, 0) + 1
    net = table["network"][hw.network] if len(on_host) > 1 else None
    return link_figures(table["gpu"][GPU], net, min(on_host.values()))


def table_collective(coll: str) -> str:
    """The hardware table's name of a record_param_comms collective (send, recv: send_recv)."""
    canonical = _CANONICAL[coll]
    return "send_recv" if canonical in ("send", "recv") else canonical


def comm_ns(hw: Hardware, coll: str, nbytes: int, n: int, busbw_gbps: float) -> int:
    """Duration in ns of one collective instance once every rank has arrived."""
    wire = busbw_factor(coll, n) * nbytes
    return int(round(hw.latency_us * 1000.0 + wire / busbw_gbps))  # GB/s == bytes/ns


def gemm_ns(hw: Hardware, flops: float) -> int:
    """Duration in ns of a compute-bound kernel."""
    return max(int(round(flops / (hw.tflops * 1000.0))), int(hw.kernel_floor_us * 1000))


def mem_ns(hw: Hardware, nbytes: float) -> int:
    """Duration in ns of a memory-bound kernel (elementwise, norms, optimizer)."""
    return int(round(nbytes / hw.hbm_gbps + hw.kernel_floor_us * 1000.0))


def grad_tensor_elems(model: ModelConfig, tp: int = 1) -> list[int]:
    """Per-layer weight gradients in backward order (fc2, fc1, proj, qkv), divided by tp."""
    return block_grad_elems(model.hidden, tp)


__all__ = [
    "DTYPE_BYTES",
    "DTYPE_NCCL",
    "Hardware",
    "ModelConfig",
    "buckets",
    "busbw_factor",
    "ceil_div",
    "comm_ns",
    "gemm_ns",
    "grad_tensor_elems",
    "link_busbw",
    "table_collective",
    "mem_ns",
    "pipeline_bubble",
]
