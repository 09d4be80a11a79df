"""Expected communication per optimizer step and per group role, from the standard formulas.

`expected(config)` returns one row per (role, group, collective) with what one rank moves per
step, averaged over all ranks of the job (pipeline stages differ: stage 0 holds the embedding,
inner stages talk to two neighbours; the mean over ranks is what a whole-job trace measures):

    role, group, collective    which role and process group (dp | dp_expert | tp | pp | ep)
                               carries it, and the collective
    group_size                 ranks in that group
    calls_per_step             calls per rank per step (mean over ranks, may be fractional)
    message_bytes              mean message: the full buffer, the `bytes` of `collectives`
    bytes_per_step             calls_per_step x message_bytes: logical volume per rank, step
    wire_bytes_per_rank        bytes_per_step x the nccl-tests bus factor: bytes each rank sends
    formula, reference         the closed form and where it comes from

Sizes are bytes. Psi is the parameter count, B the bytes per element, b*s*h one micro-batch's
activations. In full (each column, each formula): docs/analytic-model.md, "Expected
communication".
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from .config import ModelConfig
from .formulas import block_grad_elems, buckets, busbw_factor, ceil_div, pipeline_bubble

EXPECTED_SCHEMA = {
    "role": pl.String,
    "group": pl.String,
    "collective": pl.String,
    "group_size": pl.Int64,
    "calls_per_step": pl.Float64,
    "message_bytes": pl.Int64,
    "bytes_per_step": pl.Int64,
    "wire_bytes_per_rank": pl.Int64,
    "formula": pl.String,
    "reference": pl.String,
}
ROLE_OF_GROUP = {
    "dp": "data_parallel",
    "dp_expert": "data_parallel",
    "tp": "tensor_parallel",
    "pp": "pipeline",
    "ep": "expert",
}
REF_DDP = "Li et al. 2020 (PyTorch DDP); nccl-tests bus factor"
REF_ZERO = "Rajbhandari et al. 2020 (ZeRO), sec. 7"
REF_FSDP = "Zhao et al. 2023 (PyTorch FSDP); Rajbhandari et al. 2020 (ZeRO-3)"
REF_TP = "Shoeybi et al. 2019 (Megatron-LM), sec. 3; Anthony et al. 2024"
REF_SP = "Korthikanti et al. 2022 (sequence parallelism), sec. 4.2.2"
REF_PP = "Narayanan et al. 2021, sec. 2.2 and 4.1 (scatter/gather); Anthony et al. 2024"
REF_EP = "Lepikhin et al. 2020 (GShard); Rajbhandari et al. 2022 (DeepSpeed-MoE)"


@dataclass
class _Row:
    group: str
    collective: str
    group_size: int
    calls: float
    nbytes: int
    formula: str
    reference: str


def _stage_units(cfg: ModelConfig, stage: int, expert: bool) -> list[list[int]] | None:
    """Gradient tensors (elements per rank) of one pipeline stage, grouped into wrap units.

    Units in gradient-ready order: the output embedding first on the last stage when untied,
    then per block (last block first) its weights fc2, fc1, proj, qkv divided by t (MoE blocks
    keep only proj and qkv; the expert list holds their fc2, fc1 of the experts/ep local
    experts instead), the input embedding last on stage 0. Each embedding is a unit of its own
    (as FSDP wraps it). None when the shapes (layers, hidden) are unknown.
    """
    if cfg.layers is None or cfg.hidden is None:
        return None
    t, p, h = cfg.tp, cfg.pp, cfg.hidden
    per = cfg.layers // p
    out: list[list[int]] = []
    if not expert and stage == p - 1 and not cfg.tied_embeddings and cfg.vocab:
        out.append([cfg.vocab * h // t])
    for i in reversed(range(stage * per, (stage + 1) * per)):
        fc2, fc1, proj, qkv = block_grad_elems(h, t)
        moe = cfg.experts > 0 and (i + 1) % cfg.moe_every == 0
        if expert:
            if moe:
                out.append([fc2, fc1] * (cfg.experts // cfg.ep))
        else:
            out.append([proj, qkv] if moe else [fc2, fc1, proj, qkv])
    if not expert and stage == 0 and cfg.vocab:
        out.append([cfg.vocab * h // t])
    return out


def _dp_rows(cfg: ModelConfig, group: str, n: int, elems: int, expert: bool) -> list[_Row]:
    """Gradient (and, when sharded, parameter) collectives of one data-parallel group.

    ``elems`` is the per-rank parameter count this group synchronises (Psi/(t*p) for the dense
    group). Unsharded DDP all-reduces the gradients once per step (no_sync on the other
    micro-batches) in ``bucket_mb`` buckets; ZeRO-1 reduce-scatters the gradients and
    all-gathers the updated parameters once per step; ZeRO-2 reduce-scatters on every
    micro-batch; FSDP shard_grad_op all-gathers once per micro-batch forward; ZeRO-3 / FSDP
    full_shard all-gathers in forward and again in backward and reduce-scatters on every
    micro-batch, one call per wrapped unit (the embedding and each block).
    """
    if n < 2 or elems == 0:
        return []
    m, B, Bg = cfg.micro_batches, cfg.dtype_bytes, cfg.grad_bytes
    cap = int(cfg.bucket_mb * 1024 * 1024)
    stage = cfg.shard_stage
    G, P = elems * Bg, elems * B
    per_stage = [_stage_units(cfg, s, expert) for s in range(cfg.pp)]
    if stage == 0:
        if all(us is not None for us in per_stage):
            calls = (
                sum(len(buckets([e * Bg for u in us or [] for e in u], cap)) for us in per_stage)
                / cfg.pp
            )
        else:
            calls = float(ceil_div(G, cap))
        return [_Row(group, "all_reduce", n, calls, G, "Psi/(t*p) * B_grad", REF_DDP)]
    if stage in (1, 2):
        if cfg.fsdp == "shard_grad_op":
            units, pad = _units(per_stage, n, elems, cap)
            return [
                _Row(
                    group,
                    "all_gather",
                    n,
                    m * units,
                    m * (P + pad * B),
                    "m * Psi/(t*p) * B (forward only)",
                    REF_FSDP,
                ),
                _Row(
                    group,
                    "reduce_scatter",
                    n,
                    m * units,
                    m * (G + pad * Bg),
                    "m * Psi/(t*p) * B_grad",
                    REF_FSDP,
                ),
            ]
        rs_times = m if stage == 2 else 1
        return [
            _Row(
                group,
                "reduce_scatter",
                n,
                rs_times * ceil_div(G, cap),
                rs_times * G,
                "Psi/(t*p) * B_grad" + (" per micro-batch" if stage == 2 else ""),
                REF_ZERO,
            ),
            _Row(group, "all_gather", n, ceil_div(P, cap), P, "Psi/(t*p) * B", REF_ZERO),
        ]
    units, pad = _units(per_stage, n, elems, cap)
    ref = REF_FSDP if cfg.fsdp else REF_ZERO
    return [
        _Row(
            group,
            "all_gather",
            n,
            2 * m * units,
            2 * m * (P + pad * B),
            "2m * Psi/(t*p) * B (forward + backward)",
            ref,
        ),
        _Row(
            group, "reduce_scatter", n, m * units, m * (G + pad * Bg), "m * Psi/(t*p) * B_grad", ref
        ),
    ]


def _units(
    per_stage: list[list[list[int]] | None], n: int, elems: int, cap: int
) -> tuple[float, int]:
    """(mean sharded units per rank, mean padding elements per rank) for FSDP/ZeRO-3.

    A unit is one block, or one embedding; each is padded to a multiple of the group size n
    before sharding, as FSDP's flat parameters are. Without shapes the parameters are cut
    into ``bucket_mb`` pieces and padding is ignored.
    """
    if any(us is None for us in per_stage):
        return float(ceil_div(elems * 2, cap)), 0
    counts, pads = [], []
    for us in per_stage:
        assert us is not None
        sizes = [sum(u) for u in us]
        counts.append(len(sizes))
        pads.append(sum(ceil_div(u, n) * n - u for u in sizes))
    return sum(counts) / len(counts), round(sum(pads) / len(pads))


def _rows(cfg: ModelConfig) -> list[_Row]:
    """All expected rows of a configuration (see module doc)."""
    rows: list[_Row] = []
    d, t, p, m, B = cfg.dp, cfg.tp, cfg.pp, cfg.micro_batches, cfg.dtype_bytes
    split_experts = cfg.ep > 1 and cfg.experts > 0
    dense = cfg.dense_params if split_experts else cfg.params_total
    rows += _dp_rows(cfg, "dp", d, round(dense / (t * p)), expert=False)
    if split_experts:
        rows += _dp_rows(
            cfg, "dp_expert", d // cfg.ep, round(cfg.expert_params / (t * p * cfg.ep)), True
        )
    layers_rank = (cfg.layers or 0) // p
    full = cfg.recompute == "full"
    per_layer = 4 + (2 if full else 0)
    if t > 1:
        act = cfg.act_bytes
        calls = per_layer * layers_rank * m
        extra = " (+2 full recompute)" if full else ""
        if cfg.sequence_parallel:
            for coll in ("all_gather", "reduce_scatter"):
                rows.append(
                    _Row(
                        "tp",
                        coll,
                        t,
                        calls,
                        calls * act,
                        f"4{extra} per layer per micro-batch * b*s*h*B",
                        REF_SP,
                    )
                )
        else:
            rows.append(
                _Row(
                    "tp",
                    "all_reduce",
                    t,
                    calls,
                    calls * act,
                    f"4{extra} per layer per micro-batch * b*s*h*B",
                    REF_TP,
                )
            )
    if p > 1:
        act = cfg.act_bytes
        split = t > 1 and (cfg.pp_scatter_gather or cfg.sequence_parallel)
        msg = act // t if split else act
        v = cfg.virtual_stages
        calls = 2 * m * (p * v - 1) / p
        f = "2m*(p*v-1)/p * b*s*h*B" + ("/t" if split else "")
        for coll in ("send", "recv"):
            rows.append(_Row("pp", coll, 2, calls, round(calls * msg), f, REF_PP))
    if cfg.ep > 1 and cfg.experts:
        assert cfg.hidden is not None
        tokens = cfg.tokens // (t if cfg.sequence_parallel else 1)
        msg = round(tokens * cfg.top_k * cfg.capacity_factor * cfg.hidden * B)
        calls = per_layer * cfg.moe_layers / p * m
        rows.append(
            _Row(
                "ep",
                "all_to_all",
                cfg.ep,
                calls,
                round(calls * msg),
                "4 per MoE layer per micro-batch * b*s*k*cf*h*B",
                REF_EP,
            )
        )
    return rows


def expected(config: ModelConfig) -> pl.DataFrame:
    """Expected communication per rank and optimizer step, one row per collective of a role.

    Columns and conventions in the module doc and docs/analytic-model.md. An unparallelised
    configuration (d = t = p = 1) gives an empty table with the same schema.
    """
    rows = _rows(config)
    data = {
        "role": [ROLE_OF_GROUP[r.group] for r in rows],
        "group": [r.group for r in rows],
        "collective": [r.collective for r in rows],
        "group_size": [r.group_size for r in rows],
        "calls_per_step": [float(r.calls) for r in rows],
        "message_bytes": [round(r.nbytes / r.calls) if r.calls else 0 for r in rows],
        "bytes_per_step": [int(r.nbytes) for r in rows],
        "wire_bytes_per_rank": [
            round(busbw_factor(r.collective, r.group_size) * r.nbytes) for r in rows
        ],
        "formula": [r.formula for r in rows],
        "reference": [r.reference for r in rows],
    }
    return pl.DataFrame(data, schema=EXPECTED_SCHEMA)


def bubble_fraction(config: ModelConfig) -> float:
    """Idle share of a pipelined step, (p-1)/(v*m + p-1); 0 without pipeline parallelism."""
    return pipeline_bubble(config.pp, config.micro_batches, config.virtual_stages)


__all__ = ["EXPECTED_SCHEMA", "ROLE_OF_GROUP", "bubble_fraction", "expected"]
