"""What-if sweeps: how the communication share of a step grows with size and scale.

In the spirit of Pati et al. (2023), "Computation vs. Communication Scaling for Future
Transformers on Future Hardware": a step's compute time and communication time are each
given by a one-line model, and one configuration key is swept.

* compute: FLOPs per GPU and step = 6 x Psi_active x tokens / (t x p) (Kaplan et al. 2020:
  2 forward + 4 backward FLOPs per parameter and token; 8 with full activation recompute),
  tokens = b x s x m per data-parallel replica; time = FLOPs / (gpu_tflops x 1e12 x mfu).
* communication: for every row of `expected(config)`, calls x latency + wire_bytes_per_rank /
  bus bandwidth, summed per role. A group uses the intra-node bus bandwidth when it fits in
  a node, else the inter-node one, with Megatron's rank order (tp innermost, then dp, then
  pp): tp spans t ranks, dp t*d, ep t*ep, pp t*d*p.
* comm_share = comm / (compute + comm): the share of the step if nothing overlaps (an upper
  bound on exposed communication; overlap hides some of it in practice).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from .config import HardwareModel, ModelConfig
from .expected import bubble_fraction, expected

VARY = ("seq", "hidden", "layers", "dp", "micro_batch", "micro_batches", "tp", "pp")
ROLE_COLUMNS = ("data_parallel", "tensor_parallel", "pipeline", "expert")


def group_span(cfg: ModelConfig, group: str) -> int:
    """Consecutive global ranks a group of this kind spans (Megatron order tp, dp, pp)."""
    return {
        "tp": cfg.tp,
        "dp": cfg.tp * cfg.dp,
        "dp_expert": cfg.tp * cfg.dp,
        "ep": cfg.tp * cfg.ep,
        "pp": cfg.tp * cfg.dp * cfg.pp,
    }[group]


def compute_seconds(cfg: ModelConfig, hw: HardwareModel) -> float:
    """Compute time per GPU and step: 6 (8 with full recompute) x Psi_active x b*s*m / (t*p)."""
    factor = 8 if cfg.recompute == "full" else 6
    flops = factor * cfg.active_params * cfg.tokens * cfg.micro_batches / (cfg.tp * cfg.pp)
    return flops / (hw.gpu_tflops * 1e12 * hw.mfu)


def comm_seconds(cfg: ModelConfig, hw: HardwareModel) -> dict[str, float]:
    """Communication time per rank and step per role (no overlap), from `expected`."""
    exp = expected(cfg)
    out = dict.fromkeys(ROLE_COLUMNS, 0.0)
    if exp.height == 0:
        return out
    intra = pl.Series([group_span(cfg, g) <= hw.gpus_per_node for g in exp["group"]])
    busbw = pl.when(intra).then(hw.intra_busbw_gbps).otherwise(hw.inter_busbw_gbps) * 1e9
    times = exp.with_columns(busbw=busbw).select(
        "role",
        secs=pl.col("calls_per_step") * hw.latency_us * 1e-6
        + pl.col("wire_bytes_per_rank") / pl.col("busbw"),
    )
    for role, secs in times.group_by("role").agg(pl.col("secs").sum()).iter_rows():
        out[role] = out.get(role, 0.0) + secs
    return out


def _size(cfg: ModelConfig) -> int:
    """12*L*h^2 + V*h of the shapes (0 when unknown): scales a stated Psi in size sweeps."""
    if cfg.layers is None or cfg.hidden is None:
        return 0
    return 12 * cfg.layers * cfg.hidden**2 + cfg.embedding_params


def _vary(cfg: ModelConfig, key: str, value: Any) -> ModelConfig:
    """``cfg`` with ``key`` set to ``value`` (model size keeps a stated Psi proportional;
    dp is strong scaling: the global batch b*m*d sequences stays fixed)."""
    if key == "dp":
        value = int(value)
        if value < 1:
            raise ValueError(f"what_if: dp must be >= 1, got {value}")
        seqs = cfg.micro_batch * cfg.micro_batches * cfg.dp
        if seqs % value:
            raise ValueError(
                f"what_if: dp={value} does not divide the global batch of {seqs} sequences"
            )
        per = seqs // value
        b = cfg.micro_batch
        while per % b:
            b -= 1
        ep = cfg.ep if value % cfg.ep == 0 else 1
        return cfg.replace(dp=value, micro_batch=b, micro_batches=per // b, ep=ep)
    new = cfg.replace(**{key: value})
    if key in ("hidden", "layers") and cfg.params is not None:
        old = _size(cfg)
        if old == 0:
            raise ValueError(f"what_if: vary={key} needs model.layers and model.hidden")
        new = new.replace(params=round(cfg.params * _size(new) / old))
    return new


def what_if(
    config: ModelConfig,
    vary: str,
    values: Sequence[Any],
    hardware: HardwareModel | None = None,
) -> pl.DataFrame:
    """Sweep one key and model compute and communication time per step (see module doc).

    ``vary``: seq, hidden, layers (model size), dp (GPU count at a fixed global batch),
    micro_batch, micro_batches, tp or pp. Columns: vary, value, params, world_size,
    tokens_per_step (global), compute_s, comm_s, comm_s_<role> for data_parallel,
    tensor_parallel, pipeline and expert, wire_bytes_per_rank, bubble_fraction, comm_share.
    ValueError for an unknown key or a value the configuration rejects.
    """
    if vary not in VARY:
        raise ValueError(f"what_if: cannot vary {vary!r}; choose one of {', '.join(VARY)}")
    if not values:
        raise ValueError("what_if: values is empty")
    hw = hardware or HardwareModel()
    rows = []
    for value in values:  # a handful of sweep points, not trace rows
        cfg = _vary(config, vary, value)
        comp = compute_seconds(cfg, hw)
        comm = comm_seconds(cfg, hw)
        total = sum(comm.values())
        rows.append(
            {
                "vary": vary,
                "value": int(value),
                "params": cfg.params_total,
                "world_size": cfg.world_size,
                "tokens_per_step": cfg.tokens * cfg.micro_batches * cfg.dp,
                "compute_s": comp,
                "comm_s": total,
                **{f"comm_s_{r}": comm[r] for r in ROLE_COLUMNS},
                "wire_bytes_per_rank": int(expected(cfg)["wire_bytes_per_rank"].sum()),
                "bubble_fraction": bubble_fraction(cfg),
                "comm_share": total / (comp + total) if comp + total > 0 else 0.0,
            }
        )
    return pl.DataFrame(rows)


__all__ = ["VARY", "comm_seconds", "compute_seconds", "group_span", "what_if"]
