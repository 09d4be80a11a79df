"""The tiny transformer and the parallel layouts (ddp, fsdp, pp, pp-1f1b, pp-dp, tp, tp-dp, ep).

Why: each layout produces a distinct communication pattern in the trace: DDP
bucketed gradient all-reduces, FSDP all-gathers and reduce-scatters, pipeline
point-to-point sends/receives of activations and gradients, tensor-parallel
all-reduces inside every block's forward and backward, and both at once in tp-dp
(tensor parallel in pairs of neighbouring ranks, data parallel across the pairs, as
Megatron lays a job out: many small calls inside a pair, fewer across), pipelines across
data-parallel replicas in pp-dp (batched sends and receives within each pipeline, one exposed
gradient all-reduce per stage after the pipeline flush), Megatron-LM's own pipeline schedule
in pp-1f1b (one forward, one backward, each exchange with a neighbour one batched call), and
expert
parallelism in ep (tokens sent to the rank holding their expert and back with uneven
all_to_all_single calls: each rank sends and receives different amounts). Models are kept tiny
(hidden 64, sequence 32) so traces stay small and 4 ranks run on 2 CPU cores.

Only imported by workers (and argument checks); torch is imported inside functions
so that importing this module does not need torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from kineto_comm.capture.config import CaptureConfig, CaptureError
from kineto_comm.capture.truth import TRUTH

VOCAB = 256
HIDDEN = 64
HEADS = 4
FFN = 256
SEQ = 32
BATCH = 8
LAYERS = 2
LR = 1e-3
TP_PAIR = 2  # tensor-parallel degree of the tp-dp layout


def pp_depth(world: int) -> int:
    """Pipeline stages of the pp-dp layout: 4 where that leaves two data-parallel replicas
    or more, else 2 (as `kineto-comm synth` lays pp-dp out)."""
    return 4 if world % 4 == 0 and world >= 8 else 2


def check_layout_ranks(layout: str, ranks: int) -> str | None:
    """Return why ``layout`` cannot run on ``ranks`` ranks, or None if it can."""
    if layout in ("pp", "pp-1f1b") and not 2 <= ranks <= 8:
        return f"{layout} needs 2..8 ranks (one pipeline stage each), got {ranks}"
    if layout == "tp" and (HEADS % ranks or FFN % ranks):
        return f"tp needs ranks dividing heads={HEADS} and ffn={FFN}, got {ranks}"
    if layout == "ep" and not 2 <= ranks <= 8:
        return f"ep needs 2..8 ranks (one expert each), got {ranks}"
    if layout == "tp-dp" and (ranks % TP_PAIR or ranks < 2 * TP_PAIR):
        return f"tp-dp needs an even number of ranks, at least {2 * TP_PAIR}, got {ranks}"
    if layout == "pp-dp" and (ranks % 2 or ranks < 4):
        return f"pp-dp needs an even number of ranks, at least 4, got {ranks}"
    return None


def build_workload(cfg: CaptureConfig, rank: int, device: Any) -> Callable[[], None]:
    """Build this rank's model, optimizer and data; return one training iteration."""
    builders = {
        "ddp": _ddp,
        "fsdp": _fsdp,
        "pp": _pp,
        "pp-1f1b": _pp_1f1b,
        "pp-dp": _pp_dp,
        "tp": _tp,
        "tp-dp": _tp_dp,
        "ep": _ep,
    }
    return builders[cfg.layout](cfg, rank, device)


# --------------------------------------------------------------------------- model


def _modules() -> dict[str, Any]:
    """Define the nn.Module classes (needs torch, so built on first use)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        """Causal self-attention over ``heads`` local heads (all heads unless TP-split)."""

        def __init__(self, heads: int, tp: Any = None) -> None:
            super().__init__()
            self.heads, self.tp = heads, tp
            self.qkv = nn.Linear(HIDDEN, 3 * heads * (HIDDEN // HEADS))  # column-parallel
            self.out = nn.Linear(heads * (HIDDEN // HEADS), HIDDEN, bias=tp is None)  # row-par.
            if tp is not None:
                self.out_bias = nn.Parameter(torch.zeros(HIDDEN))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            if self.tp is not None:
                x = self.tp.copy(x)
            q, k, v = self.qkv(x).view(b, s, 3, self.heads, HIDDEN // HEADS).unbind(2)
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            y = self.out(y.transpose(1, 2).reshape(b, s, -1))
            if self.tp is not None:
                y = self.tp.reduce(y) + self.out_bias
            return y

    class MLP(nn.Module):
        """Two-layer GELU MLP; fc1 column-parallel and fc2 row-parallel under TP."""

        def __init__(self, ffn: int, tp: Any = None) -> None:
            super().__init__()
            self.tp = tp
            self.fc1 = nn.Linear(HIDDEN, ffn)
            self.fc2 = nn.Linear(ffn, HIDDEN, bias=tp is None)
            if tp is not None:
                self.fc2_bias = nn.Parameter(torch.zeros(HIDDEN))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.tp is not None:
                x = self.tp.copy(x)
            y = self.fc2(F.gelu(self.fc1(x)))
            if self.tp is not None:
                y = self.tp.reduce(y) + self.fc2_bias
            return y

    class Block(nn.Module):
        """Pre-norm transformer block."""

        def __init__(self, tp: Any = None, tp_size: int = 1) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
            self.attn = Attention(HEADS // tp_size, tp)
            self.mlp = MLP(FFN // tp_size, tp)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class Embed(nn.Module):
        """Token + learned position embedding."""

        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(VOCAB, HIDDEN)
            self.pos = nn.Parameter(torch.zeros(SEQ, HIDDEN))

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return self.tok(idx) + self.pos

    class Head(nn.Module):
        """Final norm and vocabulary projection."""

        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(HIDDEN)
            self.proj = nn.Linear(HIDDEN, VOCAB)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(self.ln(x))

    class TinyTransformer(nn.Module):
        """Embedding, ``layers`` blocks, head: a ~0.1M-parameter causal LM."""

        def __init__(self, layers: int = LAYERS, tp: Any = None, tp_size: int = 1) -> None:
            super().__init__()
            self.embed = Embed()
            self.blocks = nn.ModuleList(Block(tp, tp_size) for _ in range(layers))
            self.head = Head()

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.embed(idx)
            for blk in self.blocks:
                x = blk(x)
            return self.head(x)

    return {"Block": Block, "Embed": Embed, "Head": Head, "TinyTransformer": TinyTransformer}


def _batch(seed: int, batch: int, device: Any) -> tuple[Any, Any]:
    """Synthetic next-token data: random tokens, targets are the inputs shifted by one."""
    import torch

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (batch, SEQ + 1), generator=g)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def _lm_loss(logits: Any, targets: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def _simple_step(model: Any, cfg: CaptureConfig, rank: int, device: Any) -> Callable[[], None]:
    """A plain data-parallel iteration: forward, loss, backward, AdamW step."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = _batch(cfg.seed * 1000 + rank, BATCH, device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        _lm_loss(model(x), y).backward()
        opt.step()

    return step


# --------------------------------------------------------------------------- ddp / fsdp


def _ddp(cfg: CaptureConfig, rank: int, device: Any) -> Callable[[], None]:
    """DistributedDataParallel with ``bucket_cap_mb`` gradient buckets."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(cfg.seed)
    model = _modules()["TinyTransformer"]().to(device)
    ids = [device.index] if device.type == "cuda" else None
    ddp = DDP(model, device_ids=ids, bucket_cap_mb=cfg.bucket_cap_mb)
    if cfg.with_stack:  # the truth of which module each bucket's all-reduce carries
        ddp.register_comm_hook(None, TRUTH.ddp_hook(ddp))
    return _simple_step(ddp, cfg, rank, device)


def _fsdp(cfg: CaptureConfig, rank: int, device: Any) -> Callable[[], None]:
    """FSDP2 ``fully_shard`` per block and at the root (all-gather / reduce-scatter)."""
    import torch

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError as exc:
        raise CaptureError(f"fsdp: this torch has no FSDP2 fully_shard ({exc})") from exc
    # FSDP2 warns that the root returns a view (the head's 3-D linear); nothing here
    # modifies it in place, so the warning does not apply.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
    torch.manual_seed(cfg.seed)
    model = _modules()["TinyTransformer"]().to(device)
    try:
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
    except Exception as exc:
        raise CaptureError(f"fsdp: fully_shard failed on backend {cfg.backend}: {exc}") from exc
    return _simple_step(model, cfg, rank, device)


# --------------------------------------------------------------------------- tp


def _tp(cfg: CaptureConfig, rank: int, device: Any) -> Callable[[], None]:
    """Megatron tensor parallelism: heads and FFN columns split across all ranks."""
    import torch.distributed as dist

    model = _tp_model(cfg, rank, dist.get_world_size(), None, device)
    return _simple_step(model, cfg, 0, device)  # same data on every TP rank


def _tp_dp(cfg: CaptureConfig, rank: int, device: Any) -> Callable[[], None]:
    """Tensor parallel in pairs of neighbouring ranks (0-1, 2-3, ...), data parallel across
    the pairs: DDP over the ranks with the same place in their pair (0, 2, 4, ... and
    1, 3, 5, ...), whose gradient all-reduces are the only calls between pairs."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    world = dist.get_world_size()
    # Every rank creates every group, in the same order (torch.distributed requires it).
    pairs = [dist.new_group(list(range(s, s + TP_PAIR))) for s in range(0, world, TP_PAIR)]
    across = [dist.new_group(list(range(t, world, TP_PAIR))) for t in range(TP_PAIR)]
    model = _tp_model(cfg, rank % TP_PAIR, TP_PAIR, pairs[rank // TP_PAIR], device)
    ids = [device.index] if device.type == "cuda" else None
    ddp = DDP(
        model,
        device_ids=ids,
        process_group=across[rank % TP_PAIR],
        bucket_cap_mb=cfg.bucket_cap_mb,
    )
    if cfg.with_stack:  # the truth of which module each bucket's all-reduce carries
        ddp.register_comm_hook(across[rank % TP_PAIR], TRUTH.ddp_hook(ddp))
    return _simple_step(ddp, cfg, rank // TP_PAIR, device)  # one batch per pair


def _tp_model(cfg: CaptureConfig, tp_rank: int, tp_size: int, group: Any, device: Any) -> Any:
    """The tiny transformer with heads and FFN columns split over a tensor-parallel group
    (`group`, None for all ranks) of `tp_size` ranks, this one `tp_rank` of them.

    ``copy`` (f) is identity forward / all-reduce backward before each column-parallel
    linear; ``reduce`` (g) is all-reduce forward / identity backward after each
    row-parallel linear. Embedding, norms and head are replicated, and every rank of the
    group sees the same batch, so replicated gradients stay identical without extra sync.
    """
    import torch
    import torch.distributed as dist

    class _CopyToTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.module = TRUTH.here()  # its backward's all-reduce is this module's
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            grad = grad.contiguous()
            with TRUTH.module(ctx.module):
                dist.all_reduce(grad, group=group)
            return grad

    class _ReduceFromTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            x = x.contiguous()
            dist.all_reduce(x, group=group)
            return x

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad

    class TP:
        copy = staticmethod(_CopyToTP.apply)
        reduce = staticmethod(_ReduceFromTP.apply)

    torch.manual_seed(cfg.seed)  # replicated parts identical on every rank
    model = _modules()["TinyTransformer"](tp=TP(), tp_size=tp_size)
    torch.manual_seed(cfg.seed + 1 + tp_rank)  # each rank's shards differ
    for blk in model.blocks:
        for m in (blk.attn.qkv, blk.attn.out, blk.mlp.fc1, blk.mlp.fc2):
            m.reset_parameters()
    return model.to(device)


# --------------------------------------------------------------------------- pp


def _pp(cfg: CaptureConfig, rank: int, device: Any) -> Callable[[], None]:
    """GPipe pipeline: stage ``rank`` of ``world``, over the default group."""
    import torch.distributed as dist

    return _pipeline(cfg, list(range(dist.get_world_size())), rank, None, None, device)


def _pp_1f1b(cfg: CaptureConfig, rank: int, device: Any) -> Callable[[], None]:
    """Megatron-LM's pipeline schedule (1F1B, batched point-to-point): stage ``rank`` of
    ``world``, over the default group."""
    import torch.distributed as dist

    ranks = list(range(dist.get_world_size()))
    return _pipeline(cfg, ranks, rank, None, None, device, batched=True, one_f_one_b=True)


def _pp_dp(cfg: CaptureConfig, rank: int, device: Any) -> Callable[[], None]:
    """Pipeline parallel across data-parallel replicas, in Megatron's rank order (pipeline
    outermost): ``pp_depth(world)`` stages of ``dp`` ranks each, stage ``rank // dp``;
    each replica's pipeline is the ranks with the same place in their stage (0, dp, 2 dp, ...),
    each stage's data-parallel group its ``dp`` neighbouring ranks. The pipelines' sends and
    receives go over their own groups, batched as Megatron-LM batches them
    (``batch_isend_irecv``: a micro-batch's send with the next one's receive); after the
    pipeline flush each stage all-reduces its gradients in its data-parallel group in one
    flattened call, as Megatron does without overlapped gradient reduction, so the
    all-reduce is exposed."""
    import torch.distributed as dist

    world = dist.get_world_size()
    depth = pp_depth(world)
    dp = world // depth
    # Every rank creates every group, in the same order (torch.distributed requires it).
    pipes = [dist.new_group(list(range(d, world, dp))) for d in range(dp)]
    stages = [dist.new_group(list(range(s * dp, (s + 1) * dp))) for s in range(depth)]
    pipe_ranks = list(range(rank % dp, world, dp))
    return _pipeline(
        cfg,
        pipe_ranks,
        rank // dp,
        pipes[rank % dp],
        stages[rank // dp],
        device,
        seed=rank % dp,
        batched=True,
    )


def _pipeline(
    cfg: CaptureConfig,
    pipe_ranks: list[int],
    stage_index: int,
    pipe_group: Any,
    dp_group: Any,
    device: Any,
    seed: int = 0,
    batched: bool = False,
    one_f_one_b: bool = False,
) -> Callable[[], None]:
    """A pipeline over the global ranks ``pipe_ranks``, this rank stage ``stage_index``: a
    slice of the blocks (stage 0 also the embedding, the last stage the head and loss).

    GPipe: all micro-batches go forward (activations to the next stage, from the previous
    one), then all go backward in the same order (gradients flow the other way): each
    micro-batch's send goes with the next one's receive. ``one_f_one_b``: Megatron-LM's
    schedule instead (forward_backward_pipelining_without_interleaving): p - s - 1 warm-up
    forwards, then one forward and one backward each in turn, exchanging with the same
    neighbour both ways (send_forward_recv_backward, send_backward_recv_forward), then the
    remaining backwards. Each exchange is one ``batch_isend_irecv`` when ``batched``, else an
    ``isend`` and a ``recv``. With a ``dp_group`` the stage's gradients are then all-reduced
    there (averaged), in one call over their flattened concatenation; ``seed`` picks the
    replica's data.
    """
    import torch
    import torch.distributed as dist
    from torch import nn

    world = len(pipe_ranks)
    stage_i = stage_index
    mods = _modules()
    layers = max(LAYERS, world)
    torch.manual_seed(cfg.seed)
    full = mods["TinyTransformer"](layers=layers)
    per = [layers // world + (1 if s < layers % world else 0) for s in range(world)]
    start = sum(per[:stage_i])
    parts: list[nn.Module] = []
    if stage_i == 0:
        parts.append(full.embed)
    parts.extend(full.blocks[start : start + per[stage_i]])
    if stage_i == world - 1:
        parts.append(full.head)
    stage = nn.Sequential(*parts).to(device)
    params = list(stage.parameters())
    opt = torch.optim.AdamW(params, lr=LR)

    mb = cfg.micro_batches
    x_all, y_all = _batch(cfg.seed + 7919 * seed, 2 * mb, device)
    xs, ys = x_all.chunk(mb), y_all.chunk(mb)
    act_shape = (xs[0].shape[0], SEQ, HIDDEN)
    first, last = stage_i == 0, stage_i == world - 1
    prev_r = pipe_ranks[stage_i - 1] if not first else -1
    next_r = pipe_ranks[stage_i + 1] if not last else -1

    def reduce_gradients() -> None:
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=dp_group)
        flat /= dist.get_world_size(dp_group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    pending: list[Any] = []

    def exchange(
        send: tuple[Any, int] | None,
        recv: tuple[Any, int] | None,
        phases: tuple[str, str] = ("forward", "forward"),
    ) -> None:
        """Send a tensor to a peer and receive one from a peer: batched, one
        ``batch_isend_irecv`` waited on at once (Megatron-LM's batched p2p, one kernel for
        both on NCCL); else an ``isend`` waited on at the step's end and a blocking ``recv``.
        `phases`: the phase the send and the receive serve (the capture's truth)."""
        if batched:
            ops = []
            if send:
                ops.append(dist.P2POp(dist.isend, send[0], send[1], pipe_group))
                ops[-1].truth_phase = phases[0]
            if recv:
                ops.append(dist.P2POp(dist.irecv, recv[0], recv[1], pipe_group))
                ops[-1].truth_phase = phases[1]
            for work in dist.batch_isend_irecv(ops) if ops else []:
                work.wait()
            return
        if send:
            with TRUTH.phase(phases[0]):
                pending.append(dist.isend(send[0], dst=send[1], group=pipe_group))
        if recv:
            with TRUTH.phase(phases[1]):
                dist.recv(recv[0], src=recv[1], group=pipe_group)

    def finish() -> None:
        for work in pending:
            work.wait()
        pending.clear()
        if dp_group is not None:
            with TRUTH.phase("backward"):  # the gradients' reduction, after the flush
                reduce_gradients()
        opt.step()

    def step_1f1b() -> None:
        opt.zero_grad(set_to_none=True)
        inputs = list(xs) if first else [torch.empty(act_shape, device=device) for _ in xs]
        grads = [None if last else torch.empty(act_shape, device=device) for _ in xs]
        outputs: list[Any] = [None] * mb

        def forward(i: int) -> Any:
            if not first:
                inputs[i].requires_grad_()
            out = stage(inputs[i])
            outputs[i] = _lm_loss(out, ys[i]) / mb if last else out
            return None if last else (out.detach().contiguous(), next_r)

        def backward(i: int) -> Any:
            outputs[i].backward(grads[i])
            return None if first else (inputs[i].grad.contiguous(), prev_r)

        warmup = min(world - stage_i - 1, mb)
        fwd, bwd = "forward", "backward"
        for i in range(warmup):
            exchange(None, None if first else (inputs[i], prev_r))
            exchange(forward(i), None)
        if warmup < mb:
            exchange(None, None if first else (inputs[warmup], prev_r))
        for j in range(mb - warmup):  # steady state: forward warmup + j, backward j
            sent = forward(warmup + j)
            exchange(sent, None if last else (grads[j], next_r), (fwd, bwd))
            back = backward(j)
            more = warmup + j + 1 < mb
            exchange(
                back, None if first or not more else (inputs[warmup + j + 1], prev_r), (bwd, fwd)
            )
        for j in range(mb - warmup, mb):  # cool-down
            exchange(None, None if last else (grads[j], next_r), (bwd, bwd))
            exchange(backward(j), None, (bwd, bwd))
        finish()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        inputs = list(xs) if first else [torch.empty(act_shape, device=device) for _ in xs]
        grads = [None if last else torch.empty(act_shape, device=device) for _ in xs]
        outputs: list[Any] = []
        exchange(None, None if first else (inputs[0], prev_r))
        for i in range(mb):  # forward of every micro-batch
            if not first:
                inputs[i].requires_grad_()
            out = stage(inputs[i])
            outputs.append(_lm_loss(out, ys[i]) / mb if last else out)
            exchange(
                None if last else (out.detach().contiguous(), next_r),
                None if first or i + 1 == mb else (inputs[i + 1], prev_r),
            )
        exchange(None, None if last else (grads[0], next_r), ("backward", "backward"))
        for i in range(mb):  # backward of every micro-batch, same order
            outputs[i].backward(grads[i])
            exchange(
                None if first else (inputs[i].grad.contiguous(), prev_r),
                None if last or i + 1 == mb else (grads[i + 1], next_r),
                ("backward", "backward"),
            )
        finish()

    return step_1f1b if one_f_one_b else step


# --------------------------------------------------------------------------- ep


def ep_tokens(world: int) -> list[list[int]]:
    """Tokens rank `src` routes to the expert on rank `dst` each step ([src][dst]): uneven
    on purpose (rank r sends 4 * (1 + (r + 2 * dst) % world) tokens to dst), so what a rank
    sends differs from what it receives, as in a real mixture-of-experts router. The
    capture's ground truth: a test compares the trace's sizes with it."""
    return [[4 * (1 + (src + 2 * dst) % world) for dst in range(world)] for src in range(world)]


def _ep(cfg: CaptureConfig, rank: int, device: Any) -> Callable[[], None]:
    """Expert parallelism: each rank embeds its tokens, sends each to the rank holding its
    expert (all_to_all_single with uneven splits, ep_tokens), runs its expert MLP on what
    it received, and sends the results back (the reverse split); backward repeats both
    exchanges in reverse. Four uneven all-to-alls a step, nothing else communicated."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.nn.functional import all_to_all_single

    world = dist.get_world_size()
    tokens = ep_tokens(world)
    send = tokens[rank]  # tokens this rank sends to each expert
    recv = [tokens[src][rank] for src in range(world)]  # tokens its expert gets from each
    torch.manual_seed(cfg.seed + rank)
    embed = nn.Embedding(VOCAB, HIDDEN).to(device)
    expert = nn.Sequential(nn.Linear(HIDDEN, FFN), nn.GELU(), nn.Linear(FFN, HIDDEN)).to(device)
    params = [*embed.parameters(), *expert.parameters()]
    opt = torch.optim.AdamW(params, lr=LR)
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    idx = torch.randint(0, VOCAB, (sum(send),), generator=gen).to(device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with TRUTH.phase("forward"):  # the dispatch and combine of the forward
            x = embed(idx)
            routed = torch.empty(sum(recv), HIDDEN, device=device)
            routed = all_to_all_single(routed, x, recv, send)
            y = expert(routed)
            back = torch.empty(sum(send), HIDDEN, device=device)
            back = all_to_all_single(back, y, send, recv)
        (back - x).pow(2).mean().backward()
        opt.step()

    return step
