"""Closed-form building blocks shared by the analytical model and the synthetic generator.

Pure functions of integers, no Polars: the bus-bandwidth factors of nccl-tests, DDP-style
gradient bucketing, the per-layer weight tensors of a GPT block and the 1F1B pipeline bubble.
Keeping them in one place means `kineto_comm.synth` (which simulates traces from them) and
`kineto_comm.analytic` (which predicts what a trace should contain) cannot drift apart.
"""

from __future__ import annotations

# nccl-tests bus-bandwidth factors (doc/PERFORMANCE.md of nccl-tests): bytes a rank puts on
# the wire per byte of message, for a group of n ranks.
_FACTOR_ALL_REDUCE = ("all_reduce",)
_FACTOR_N_MINUS_1 = ("all_gather", "reduce_scatter", "all_to_all")
_FACTOR_ONE = ("send", "recv", "send_recv", "broadcast", "reduce")


def busbw_factor(collective: str, n: int) -> float:
    """The nccl-tests bus-bandwidth factor of a canonical collective on ``n`` ranks.

    all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; point-to-point,
    broadcast and reduce 1. Multiplying a message size by it gives the bytes each rank sends
    (the "wire" volume of Rabenseifner / ring algorithms). ValueError for other names.
    """
    if n < 1:
        raise ValueError(f"group size must be >= 1, got {n}")
    if collective in _FACTOR_ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if collective in _FACTOR_N_MINUS_1:
        return (n - 1) / n
    if collective in _FACTOR_ONE:
        return 1.0
    raise ValueError(f"no bus bandwidth factor for collective {collective!r}")


def ceil_div(a: int, b: int) -> int:
    """Integer ceiling division."""
    return -(-a // b)


def buckets(tensor_bytes: list[int], cap: int, split: bool = False) -> list[int]:
    """DDP-style bucketing of gradient tensors, given in the order their gradients become ready.

    A bucket is closed as soon as it holds >= ``cap`` bytes (a tensor never straddles two
    buckets), the remainder forms the last bucket. With ``split`` a tensor larger than ``cap``
    is cut into ``cap``-sized pieces (used for the small-messages scenario). Returns the bucket
    sizes in bytes; their sum always equals ``sum(tensor_bytes)``.
    """
    out: list[int] = []
    acc = 0
    for nbytes in tensor_bytes:
        if split:
            while acc + nbytes >= cap:
                take = cap - acc
                out.append(cap)
                nbytes -= take
                acc = 0
            acc += nbytes
        else:
            acc += nbytes
            if acc >= cap:
                out.append(acc)
                acc = 0
    if acc:
        out.append(acc)
    return out


def block_grad_elems(hidden: int, tp: int = 1) -> list[int]:
    """Weight tensors of one GPT block in backward (gradient-ready) order, divided by ``tp``.

    fc2 4h^2, fc1 4h^2, attention projection h^2, fused qkv 3h^2 (biases and layer norms are
    left out: they are O(h), under 0.1% of a block for h >= 1024). Sum: 12h^2/tp.
    """
    h2 = hidden * hidden
    return [4 * h2 // tp, 4 * h2 // tp, h2 // tp, 3 * h2 // tp]


def pipeline_bubble(p: int, m: int, v: int = 1) -> float:
    """Idle share of a pipelined step: (p-1)/(v*m + p-1) (Narayanan et al. 2021, sec. 2.2).

    1F1B (v = 1) gives (p-1)/(m+p-1). With v interleaved model chunks per stage the bubble
    *time* is divided by v ((p-1)/v chunk-passes against m ideal ones), so the idle share of the
    step becomes (p-1)/(v*m + p-1). p = 1 gives 0.
    """
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"pipeline_bubble needs p, m, v >= 1, got p={p}, m={m}, v={v}")
    return (p - 1) / (v * m + p - 1)


__all__ = [
    "block_grad_elems",
    "buckets",
    "busbw_factor",
    "ceil_div",
    "pipeline_bubble",
]
