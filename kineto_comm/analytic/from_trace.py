"""A ModelConfig from the configuration a trace tells (the `inferred_config` table).

Why: `--model` needs a file nobody writes; the trace tells most of it
(kineto_comm.analysis.inferred_config). `config_from_inferred` fills the analytical model
with those values where they are enough, so expected-vs-measured (MODEL101) runs on every
report that allows it, and says in one line why not where they are not (one rank, sizes the
trace does not give, traffic the model cannot state from a trace: all-to-alls of unknown
routing, gloo's all-reduce standing in for FSDP's reduce-scatter).

What was inferred agrees with the trace by construction: the parameter count comes from the
gradient bytes, `bucket_mb` is set so the model issues the measured gradient calls per step
(the cap itself is only bounded, docs/tables.md), `activation_bytes` is the measured message
and `layers` the tensor-parallel all-reduces / (4 m) (Megatron's four per layer). What the
comparison can still find is what was not inferred: all-gathers beyond 2 m per unit, sends
beyond 2 m (p - 1) / p, gradient calls per micro-batch, a dtype the other roles do not share.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from .config import DTYPE_BYTES, ModelConfig

MIB = 1024 * 1024


def config_from_inferred(table: pl.DataFrame) -> tuple[ModelConfig | None, str]:
    """(ModelConfig, "") from the one-row `inferred_config` table, or (None, why not)."""
    if table.height == 0:
        return None, "no configuration inferred"
    r: dict[str, Any] = table.row(0, named=True)
    if r["world_size"] is None:
        return None, "the world size is not in the trace"
    if r["world_size"] < 2:
        return None, "one rank: no communication to compare"
    unknown = [k for k in ("dp", "tp", "pp", "ep") if r[k] is None]
    if unknown:
        why = (r.get("evidence") or {}).get(unknown[0])
        return None, f"{', '.join(unknown)} not told by the trace" + (f" ({why})" if why else "")
    if r["ep"] > 1:
        return None, "expert parallel: the routing (experts, top-k) is not in the trace"
    dp, tp, pp = r["dp"], r["tp"], r["pp"]
    if dp * tp * pp != r["world_size"]:
        return None, f"dp x tp x pp = {dp * tp * pp}, not the world size {r['world_size']}"
    m = r["micro_batches"] or 1
    keys: dict[str, Any] = {"dp": dp, "tp": tp, "pp": pp, "micro_batches": m}
    dtypes = [d for d in (r["activation_dtype"], r["grad_dtype"]) if d is not None]
    if any(d not in DTYPE_BYTES for d in dtypes):
        return None, f"dtype {dtypes} outside the model's (bf16, fp16, fp32, fp8)"
    if dtypes:
        keys["dtype"] = dtypes[0]
    if dp > 1:
        if r["params"] is None or not r["grad_calls_per_step"]:
            return None, "the gradient collectives' sizes are not in the trace"
        stage = r["shard_stage"] or 0
        if stage and r["grad_collective"] != "reduce_scatter":
            return None, (
                f"the sharded data-parallel group reduces with {r['grad_collective']} where the "
                "model reduce-scatters (gloo)"
            )
        keys["params"] = r["params"]
        keys["grad_dtype"] = r["grad_dtype"]
        if stage:
            keys["fsdp" if r["framework"] == "fsdp" else "zero"] = (
                r["sharding"] if r["framework"] == "fsdp" else stage
            )
        # The model cuts Psi/(t*p) * B into ceil(G / cap) calls (ZeRO-3/FSDP without shapes:
        # ceil(2 elems / cap) units): a cap just above G / calls issues the measured calls.
        elems = round(r["params"] / (tp * pp))
        units = stage == 3 or (stage == 2 and r["framework"] == "fsdp")  # expected._units
        width = 2 if units else DTYPE_BYTES[r["grad_dtype"]]
        per_mb = r["grad_calls_per_step"] / (m if stage >= 2 else 1)
        calls = max(1, round(per_mb))
        keys["bucket_mb"] = (math.ceil(elems * width / calls) + 1) / MIB
    else:
        # Sizes without a data-parallel group: params only shape what the model does not use.
        keys["params"] = r["params"] or 1
    if tp > 1 or pp > 1:
        if r["activation_bytes"] is None:
            return None, "the activations' size is not in the trace"
        keys["activation_bytes"] = r["activation_bytes"]
    if tp > 1:
        per_layer = (r["tp_calls_per_step"] or 0) * pp / (4 * m)
        if per_layer < 1 or per_layer != int(per_layer) or int(per_layer) % pp:
            return None, (
                f"{r['tp_calls_per_step']} tensor-parallel all-reduces per step: not 4 per "
                "layer and micro-batch"
            )
        keys["layers"] = int(per_layer)
    try:
        return ModelConfig(**keys), ""
    except ValueError as exc:
        return None, str(exc)


__all__ = ["config_from_inferred"]
