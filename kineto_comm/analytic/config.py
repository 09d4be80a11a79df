"""The analytical model's inputs: a training configuration (ModelConfig) and simple hardware.

`ModelConfig` describes one GPT-like training job the way its launcher does: model size
(parameters, or layers / hidden / vocabulary), tokens (sequence length, micro-batch size,
micro-batches per optimizer step), dtype, the parallel degrees and the memory-saving options
that change communication (ZeRO stage or FSDP strategy, sequence parallelism, activation
recompute, interleaved pipeline stages). Build it from keyword arguments or from the ``[model]``
table of a TOML file with `load_config`; every key is documented in docs/analytic-model.md.
Invalid keys or values raise ValueError with a one-line message naming the key.

`HardwareModel` holds the few throughput numbers the what-if time model needs (stated defaults,
overridable): GPU TFLOP/s and MFU for compute, bus bandwidth inside and across nodes and a
per-call latency for communication. Units: TFLOP/s = 1e12 FLOP/s, GB/s with 1 GB = 1e9 bytes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

# Canonical dtype names (as kineto_comm.model.names writes them) and their sizes in bytes.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8": 1}
_DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "float16": "float16",
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
    "float32": "float32",
    "fp8": "float8",
    "float8": "float8",
}
FSDP_STRATEGIES = {"full_shard": 3, "shard_grad_op": 2, "no_shard": 0}
RECOMPUTE = ("none", "selective", "full")


def _canon_dtype(key: str, value: Any) -> str:
    """A canonical dtype name from any usual spelling, or ValueError naming ``key``."""
    if not isinstance(value, str) or value.strip().lower() not in _DTYPE_ALIASES:
        raise ValueError(f"model.{key}: unknown dtype {value!r}; use one of bf16, fp16, fp32, fp8")
    return _DTYPE_ALIASES[value.strip().lower()]


@dataclass(frozen=True)
class ModelConfig:
    """One training job, as far as its communication is concerned (keys: docs/analytic-model.md).

    Model size: ``params`` (Psi, total parameters of the whole model) or ``layers``, ``hidden``
    and ``vocab`` (then Psi = 12*L*h^2 + V*h, or + 2*V*h with untied embeddings); give both
    to state Psi exactly while keeping the shapes for the per-layer formulas. Tokens: ``seq``
    tokens per sequence, ``micro_batch`` sequences per micro-batch (b), ``micro_batches`` per
    optimizer step per data-parallel replica (m; the pipeline's m). Degrees: ``dp`` (d),
    ``tp`` (t), ``pp`` (p), ``ep`` (expert parallel, carved out of dp). ``zero`` (0-3) or
    ``fsdp`` (full_shard | shard_grad_op | no_shard) choose how data parallelism shards.
    """

    params: int | None = None
    layers: int | None = None
    hidden: int | None = None
    vocab: int | None = None
    seq: int = 2048
    micro_batch: int = 1
    micro_batches: int = 1
    dtype: str = "bfloat16"
    grad_dtype: str | None = None
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    zero: int = 0
    fsdp: str | None = None
    sequence_parallel: bool = False
    recompute: str = "none"
    virtual_stages: int = 1
    bucket_mb: float = 25.0
    tied_embeddings: bool = True
    pp_scatter_gather: bool = True
    experts: int = 0
    top_k: int = 2
    moe_every: int = 1
    capacity_factor: float = 1.0
    activation_bytes: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for key in ("params", "layers", "hidden", "vocab", "activation_bytes"):
            v = getattr(self, key)
            if v is not None:
                set_(self, key, _int(key, v, 1))
        for key in ("seq", "micro_batch", "micro_batches", "dp", "tp", "pp", "ep"):
            set_(self, key, _int(key, getattr(self, key), 1))
        set_(self, "virtual_stages", _int("virtual_stages", self.virtual_stages, 1))
        set_(self, "experts", _int("experts", self.experts, 0))
        set_(self, "top_k", _int("top_k", self.top_k, 1))
        set_(self, "moe_every", _int("moe_every", self.moe_every, 1))
        for key in ("sequence_parallel", "tied_embeddings", "pp_scatter_gather"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"model.{key} must be true or false, got {getattr(self, key)!r}")
        for key in ("bucket_mb", "capacity_factor"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"model.{key} must be a number > 0, got {v!r}")
            set_(self, key, float(v))
        set_(self, "dtype", _canon_dtype("dtype", self.dtype))
        if self.grad_dtype is not None:
            set_(self, "grad_dtype", _canon_dtype("grad_dtype", self.grad_dtype))
        rc = self.recompute
        if isinstance(rc, bool):
            rc = "full" if rc else "none"
        if not isinstance(rc, str) or rc.lower() not in RECOMPUTE:
            raise ValueError(f"model.recompute must be one of {', '.join(RECOMPUTE)}, got {rc!r}")
        set_(self, "recompute", rc.lower())
        zero = self.zero
        if isinstance(zero, bool) or not isinstance(zero, int) or not 0 <= zero <= 3:
            raise ValueError(f"model.zero must be an integer 0..3, got {zero!r}")
        if self.fsdp is not None:
            if not isinstance(self.fsdp, str) or self.fsdp.lower() not in FSDP_STRATEGIES:
                raise ValueError(
                    f"model.fsdp must be one of {', '.join(FSDP_STRATEGIES)}, got {self.fsdp!r}"
                )
            set_(self, "fsdp", self.fsdp.lower())
            if zero not in (0, FSDP_STRATEGIES[self.fsdp]):
                raise ValueError(
                    f"model.zero={zero} contradicts model.fsdp={self.fsdp!r}; give only one"
                )
        if self.params is None and None in (self.layers, self.hidden, self.vocab):
            missing = [k for k in ("layers", "hidden", "vocab") if getattr(self, k) is None]
            raise ValueError(
                f"model.{missing[0]} is required when model.params is not given "
                "(Psi = 12*L*h^2 + V*h)"
            )
        shaped = self.tp > 1 or self.pp > 1 or self.sequence_parallel or self.ep > 1
        if shaped and self.hidden is None and self.activation_bytes is None:
            raise ValueError("model.hidden is required for tensor, pipeline or expert parallelism")
        if self.pp > 1 and self.layers is None and self.activation_bytes is None:
            raise ValueError("model.layers is required for pipeline parallelism (pp > 1)")
        if self.tp > 1 and self.layers is None:
            raise ValueError("model.layers is required for tensor parallelism (tp > 1)")
        if self.layers is not None and self.layers % (self.pp * self.virtual_stages):
            raise ValueError(
                f"model.layers={self.layers} must be divisible by pp*virtual_stages="
                f"{self.pp * self.virtual_stages}"
            )
        if self.hidden is not None and self.hidden % self.tp:
            raise ValueError(f"model.hidden={self.hidden} must be divisible by tp={self.tp}")
        if self.virtual_stages > 1 and self.pp == 1:
            raise ValueError("model.virtual_stages > 1 needs pipeline parallelism (pp > 1)")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("model.sequence_parallel needs tensor parallelism (tp > 1)")
        if self.ep > 1:
            if self.experts < self.ep or self.experts % self.ep:
                raise ValueError(
                    f"model.experts={self.experts} must be a positive multiple of ep={self.ep}"
                )
            if self.dp % self.ep:
                raise ValueError(f"model.ep={self.ep} must divide model.dp={self.dp}")
        if self.experts and self.layers is None:
            raise ValueError("model.layers is required for mixture-of-experts (experts > 0)")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"model.top_k={self.top_k} exceeds model.experts={self.experts}")
        if self.experts and self.hidden is None:
            raise ValueError("model.hidden is required for mixture-of-experts (experts > 0)")

    # -- derived sizes ----------------------------------------------------------------------
    @property
    def shard_stage(self) -> int:
        """The effective ZeRO stage (FSDP full_shard = 3, shard_grad_op = 2, no_shard = 0)."""
        return FSDP_STRATEGIES[self.fsdp] if self.fsdp is not None else self.zero

    @property
    def dtype_bytes(self) -> int:
        """B: bytes per element of parameters and activations."""
        return DTYPE_BYTES[self.dtype]

    @property
    def grad_bytes(self) -> int:
        """Bytes per element of the communicated gradients (grad_dtype, else dtype)."""
        return DTYPE_BYTES[self.grad_dtype or self.dtype]

    @property
    def world_size(self) -> int:
        """GPUs: d * t * p (expert parallelism is carved out of the data-parallel ranks)."""
        return self.dp * self.tp * self.pp

    @property
    def act_bytes(self) -> int:
        """One micro-batch's activations per replica, b*s*h*B (``activation_bytes`` when
        given: the size a trace measures, e.g. a tensor-parallel all-reduce's message)."""
        if self.activation_bytes is not None:
            return self.activation_bytes
        assert self.hidden is not None
        return self.tokens * self.hidden * self.dtype_bytes

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch per replica: b*s."""
        return self.micro_batch * self.seq

    @property
    def moe_layers(self) -> int:
        """Mixture-of-experts layers: every ``moe_every``-th block when experts > 0."""
        return (self.layers or 0) // self.moe_every if self.experts else 0

    @property
    def expert_params(self) -> int:
        """Parameters in expert MLPs: moe_layers * experts * 8h^2 (0 for a dense model)."""
        if not self.experts:
            return 0
        assert self.hidden is not None
        return self.moe_layers * self.experts * 8 * self.hidden * self.hidden

    @property
    def embedding_params(self) -> int:
        """V*h, twice with untied input and output embeddings (0 when the shapes are unknown)."""
        if self.vocab is None or self.hidden is None:
            return 0
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params_total(self) -> int:
        """Psi: ``params`` when given, else 12*L*h^2 + V*h (+ V*h untied) + MoE expert MLPs."""
        if self.params is not None:
            return self.params
        assert self.layers is not None and self.hidden is not None
        h2 = self.hidden * self.hidden
        dense_mlp_layers = self.layers - self.moe_layers
        return (
            self.layers * 4 * h2
            + dense_mlp_layers * 8 * h2
            + self.expert_params
            + self.embedding_params
        )

    @property
    def dense_params(self) -> int:
        """Psi minus the expert MLP parameters: what the full data-parallel group reduces."""
        return self.params_total - self.expert_params

    @property
    def active_params(self) -> int:
        """Parameters one token touches: dense + expert * top_k / experts (for FLOPs)."""
        if not self.experts:
            return self.params_total
        return self.dense_params + self.expert_params * self.top_k // self.experts

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some keys changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The keys as given (TOML-compatible), plus nothing derived."""
        return dataclasses.asdict(self)


def _int(key: str, value: Any, low: int) -> int:
    """``value`` as an int >= ``low`` (floats like 1.3e9 accepted when integral)."""
    if isinstance(value, bool):
        raise ValueError(f"model.{key} must be an integer >= {low}, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or value < low:
        raise ValueError(f"model.{key} must be an integer >= {low}, got {value!r}")
    return value


MODEL_KEYS = tuple(f.name for f in fields(ModelConfig))


def config_from_dict(d: dict[str, Any], where: str = "model") -> ModelConfig:
    """A ModelConfig from a mapping; unknown keys raise ValueError naming the key."""
    if not isinstance(d, dict):
        raise ValueError(f"[{where}] must be a table of keys, got {type(d).__name__}")
    for key in d:
        if key not in MODEL_KEYS:
            raise ValueError(f"{where}.{key}: unknown key; known keys: {', '.join(MODEL_KEYS)}")
    try:
        return ModelConfig(**d)
    except TypeError as exc:  # pragma: no cover - keys are checked above
        raise ValueError(f"{where}: {exc}") from None


def _read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; ValueError (one line) when it cannot be read or parsed."""
    import tomllib

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ValueError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{p}: invalid TOML: {exc}") from None


def load_config(path: str | Path) -> ModelConfig:
    """The ModelConfig in the ``[model]`` table of a TOML file (keys: docs/analytic-model.md).

    Other top-level tables are allowed (``[hardware]`` is read by `load_hardware`); a missing
    ``[model]`` table, an unknown key or an invalid value raises ValueError naming the key.
    """
    doc = _read_toml(path)
    if "model" not in doc:
        raise ValueError(f"{path}: no [model] table")
    return config_from_dict(doc["model"])


@dataclass(frozen=True)
class HardwareModel:
    """Throughputs of the what-if time model (defaults: an H100 SXM cluster, 8 GPUs a node).

    gpu_tflops: dense bf16 peak per GPU (989 TFLOP/s for H100 SXM); mfu: the share of it a
    training step achieves (0.4 is typical of well-tuned Megatron runs); intra_busbw_gbps:
    nccl-tests bus bandwidth inside a node (NVLink 4: ~360 GB/s); inter_busbw_gbps: across
    nodes (one 400 Gb/s NIC per GPU: ~45 GB/s); latency_us: fixed cost per collective call;
    gpus_per_node: where groups start spanning nodes.
    """

    gpu_tflops: float = 989.0
    mfu: float = 0.4
    intra_busbw_gbps: float = 360.0
    inter_busbw_gbps: float = 45.0
    latency_us: float = 10.0
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"hardware.{f.name} must be a number > 0, got {v!r}")
        if self.mfu > 1:
            raise ValueError(f"hardware.mfu must be in (0, 1], got {self.mfu!r}")
        if not float(self.gpus_per_node).is_integer():
            raise ValueError(f"hardware.gpus_per_node must be an integer, got {self.gpus_per_node}")


HARDWARE_KEYS = tuple(f.name for f in fields(HardwareModel))


def load_hardware(path: str | Path) -> HardwareModel:
    """The ``[hardware]`` table of a TOML file (defaults when absent); ValueError naming a key."""
    doc = _read_toml(path).get("hardware", {})
    if not isinstance(doc, dict):
        raise ValueError("[hardware] must be a table of keys")
    for key in doc:
        if key not in HARDWARE_KEYS:
            raise ValueError(f"hardware.{key}: unknown key; known keys: {', '.join(HARDWARE_KEYS)}")
    return HardwareModel(**doc)


__all__ = [
    "DTYPE_BYTES",
    "HARDWARE_KEYS",
    "MODEL_KEYS",
    "HardwareModel",
    "ModelConfig",
    "config_from_dict",
    "load_config",
    "load_hardware",
]
