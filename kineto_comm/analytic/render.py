"""Plain-text rendering of the analytical model (`kineto-comm model CONFIG`) and comparisons.

Sizes in decimal units (1 MB = 1e6 bytes, 1 GB = 1e9 bytes), times in ms, shares in percent.
"""

from __future__ import annotations

import polars as pl

from .config import HardwareModel, ModelConfig
from .expected import bubble_fraction, expected
from .whatif import what_if


def _bytes(n: float | None) -> str:
    """A size in decimal units."""
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{round(n)} B"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """Aligned plain-text table: first column left-aligned, the others right-aligned."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def _sweeps(cfg: ModelConfig) -> list[tuple[str, list[int]]]:
    """Default sweep points: seq x1/2..x4, hidden x1/2..x2, dp x1..x8 (where the batch allows)."""
    out: list[tuple[str, list[int]]] = []
    out.append(("seq", [max(1, cfg.seq // 2), cfg.seq, cfg.seq * 2, cfg.seq * 4]))
    if cfg.hidden is not None and cfg.layers is not None:
        hs = [h for h in (cfg.hidden // 2, cfg.hidden, cfg.hidden * 2) if h % cfg.tp == 0 and h]
        out.append(("hidden", hs))
    seqs = cfg.micro_batch * cfg.micro_batches * cfg.dp
    dps = [cfg.dp * k for k in (1, 2, 4, 8) if seqs % (cfg.dp * k) == 0]
    dps = [d for d in dps if d % cfg.ep == 0]
    if len(dps) > 1:
        out.append(("dp", dps))
    return out


def render_model(config: ModelConfig, hardware: HardwareModel | None = None) -> str:
    """What `kineto-comm model CONFIG` prints: sizes, expected communication, bubble, what-if."""
    cfg, hw = config, hardware or HardwareModel()
    parts = [
        "Analytical communication model (per rank and optimizer step; formulas: "
        "docs/analytic-model.md)",
        f"Psi = {cfg.params_total:,} parameters, {cfg.dtype} (B = {cfg.dtype_bytes}), "
        f"gradients {cfg.grad_dtype or cfg.dtype}; world = {cfg.world_size} GPUs "
        f"(d={cfg.dp}, t={cfg.tp}, p={cfg.pp}, ep={cfg.ep}, v={cfg.virtual_stages}); "
        f"b={cfg.micro_batch}, s={cfg.seq}, m={cfg.micro_batches}; ZeRO stage "
        f"{cfg.shard_stage}{' (FSDP ' + cfg.fsdp + ')' if cfg.fsdp else ''}, "
        f"sequence parallel {'on' if cfg.sequence_parallel else 'off'}, recompute {cfg.recompute}",
        "",
    ]
    exp = expected(cfg)
    rows = [
        [
            r["role"],
            r["collective"],
            str(r["group_size"]),
            f"{r['calls_per_step']:,.2f}".rstrip("0").rstrip("."),
            _bytes(r["message_bytes"]),
            _bytes(r["bytes_per_step"]),
            _bytes(r["wire_bytes_per_rank"]),
            r["formula"],
        ]
        for r in exp.iter_rows(named=True)
    ]
    heads = [
        "role",
        "collective",
        "group",
        "calls/step",
        "message",
        "bytes/step",
        "wire/rank",
        "formula",
    ]
    parts.append(_table(heads, rows) if rows else "(no communication: d = t = p = 1)")
    parts.append("")
    parts.append(
        f"Pipeline bubble: {100 * bubble_fraction(cfg):.1f}% of the step "
        f"((p-1)/(v*m+p-1) with p={cfg.pp}, m={cfg.micro_batches}, v={cfg.virtual_stages})"
    )
    parts.append("")
    parts.append(
        f"What-if (no overlap; {hw.gpu_tflops:g} TFLOP/s x MFU {hw.mfu:g}, bus bandwidth "
        f"{hw.intra_busbw_gbps:g} GB/s in a node / {hw.inter_busbw_gbps:g} GB/s across, "
        f"{hw.latency_us:g} us a call, {hw.gpus_per_node} GPUs a node):"
    )
    for key, values in _sweeps(cfg):
        sweep = what_if(cfg, key, values, hw)
        srows = [
            [
                f"{key}={r['value']}",
                f"{r['params'] / 1e9:.2f}B",
                str(r["world_size"]),
                f"{1e3 * r['compute_s']:,.1f}",
                f"{1e3 * r['comm_s']:,.1f}",
                f"{1e3 * r['comm_s_data_parallel']:,.1f}",
                f"{1e3 * r['comm_s_tensor_parallel']:,.1f}",
                f"{1e3 * r['comm_s_pipeline']:,.1f}",
                f"{100 * r['comm_share']:.1f}%",
            ]
            for r in sweep.iter_rows(named=True)
        ]
        heads = [
            "point",
            "params",
            "GPUs",
            "compute ms",
            "comm ms",
            "dp ms",
            "tp ms",
            "pp ms",
            "comm share",
        ]
        parts += ["", _table(heads, srows)]
    return "\n".join(parts) + "\n"


def render_comparison(table: pl.DataFrame) -> str:
    """The `compare` table as plain text, flagged rows marked with '!' and their causes below."""
    rows = []
    notes = []
    for r in table.iter_rows(named=True):
        mark = "!" if r["flagged"] else " "
        rows.append(
            [
                f"{mark} {r['role']}",
                r["collective"],
                f"{r['expected_calls_per_step'] or 0:,.1f}",
                f"{r['measured_calls_per_step'] or 0:,.1f}",
                _bytes(r["expected_bytes_per_step"]),
                _bytes(r["measured_bytes_per_step"]),
                _pct(r["bytes_dev_pct"]),
                _bytes(r["expected_message_bytes"]),
                _bytes(r["measured_message_bytes"]),
            ]
        )
        if r["flagged"] and r["causes"]:
            notes.append(f"! {r['role']} {r['collective']}: {r['causes']}")
    heads = [
        "role",
        "collective",
        "calls exp",
        "calls meas",
        "bytes exp",
        "bytes meas",
        "bytes dev",
        "msg exp",
        "msg meas",
    ]
    out = "Expected vs measured communication per rank and step\n" + _table(heads, rows)
    if notes:
        out += "\n\n" + "\n".join(notes)
    return out + "\n"


__all__ = ["render_comparison", "render_model"]
