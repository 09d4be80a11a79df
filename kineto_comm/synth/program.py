"""Per-rank step programs for the four parallel layouts (dp, fsdp, tp-dp, pp-dp).

A program is the list of operations one rank's Python threads issue in one training step:
compute ops (one CPU op launching one kernel on compute stream 7), collectives (c10d op ->
record_param_comms -> nccl:* annotation -> cudaLaunchKernelExC -> NCCL kernel on the process
group's stream), stream waits, and the end-of-step synchronisation. Forward ops run on the main
thread, backward ops (and the gradient collectives DDP/FSDP launch from autograd hooks) on the
autograd thread, as in real traces.

Per layer and micro-batch (T = b*s tokens, t = tensor-parallel degree):
forward  = layer norm, qkv GEMM 2T*h*3h/t, flash attention 4*b*s^2*h/t, proj GEMM 2T*h^2/t,
           [TP all-reduce of b*s*h], residual add, layer norm, fc1 GEMM 2T*h*4h/t, gelu,
           fc2 GEMM 2T*4h*h/t, [TP all-reduce], residual add;
backward = twice the GEMM FLOPs (dgrad + wgrad per weight), gradients ready in the order
           fc2, fc1, proj, qkv, with the two TP all-reduces after the fc1 and qkv dgrads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import kineto as K
from .config import (
    DTYPE_NCCL,
    Hardware,
    ModelConfig,
    buckets,
    ceil_div,
    comm_ns,
    gemm_ns,
    grad_tensor_elems,
    link_busbw,
    mem_ns,
    table_collective,
)
from .sim import (
    AUTOGRAD,
    MAIN,
    OP_COLL,
    OP_COMP,
    OP_CPU,
    OP_STEP_BEGIN,
    OP_STEP_END,
    OP_SYNC,
    OP_WAIT,
    CollSpec,
    KSpec,
)

GEMM_FWD = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"  # noqa: E501
GEMM_DGRAD = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"  # noqa: E501
GEMM_WGRAD = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"  # noqa: E501
FLASH_FWD = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)"  # noqa: E501
FLASH_BWD = "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, false, true, false, false, false, true, false, false>(pytorch_flash::Flash_bwd_params)"  # noqa: E501
LN_FWD = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)"  # noqa: E501
LN_BWD = "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, c10::BFloat16*, int)"  # noqa: E501
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)"  # noqa: E501
GELU_FWD = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)"  # noqa: E501
GELU_BWD = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, at::detail::Array<char*, 3> >(int, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, at::detail::Array<char*, 3>)"  # noqa: E501
EMB_FWD = "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16 const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)"  # noqa: E501
EMB_BWD = "void at::native::(anonymous namespace)::compute_grad_weight<c10::BFloat16, long>(long const*, long const*, c10::BFloat16 const*, long, long, long, long, float*)"  # noqa: E501
ADAMW = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<c10::BFloat16, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, double*, double*>(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<c10::BFloat16, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, double*, double*)"  # noqa: E501

SMS = 132
KERNELS: dict[str, KSpec] = {
    "ln": KSpec("aten::native_layer_norm", LN_FWD, K.launch_tail(30, 0, (4096, 1, 1), 128, SMS)),
    "gemm": KSpec("aten::addmm", GEMM_FWD, K.launch_tail(168, 213248, (132, 1, 1), 384, SMS)),
    "attn": KSpec(
        "aten::_flash_attention_forward", FLASH_FWD, K.launch_tail(255, 49152, (8, 16, 4), 128, SMS)
    ),
    "add": KSpec("aten::add", ADD, K.launch_tail(26, 0, (8192, 1, 1), 128, SMS)),
    "gelu": KSpec("aten::gelu", GELU_FWD, K.launch_tail(28, 0, (16384, 1, 1), 128, SMS)),
    "emb": KSpec("aten::embedding", EMB_FWD, K.launch_tail(40, 0, (1584, 1, 1), 128, SMS)),
    "dgrad": KSpec("aten::mm", GEMM_DGRAD, K.launch_tail(168, 213248, (132, 1, 1), 384, SMS)),
    "wgrad": KSpec("aten::mm", GEMM_WGRAD, K.launch_tail(168, 164864, (132, 1, 1), 256, SMS)),
    "attn_bwd": KSpec(
        "aten::_flash_attention_backward",
        FLASH_BWD,
        K.launch_tail(255, 98304, (8, 16, 4), 256, SMS),
    ),
    "ln_bwd": KSpec(
        "aten::native_layer_norm_backward", LN_BWD, K.launch_tail(32, 0, (4096, 1, 1), 128, SMS)
    ),
    "gelu_bwd": KSpec(
        "aten::gelu_backward", GELU_BWD, K.launch_tail(30, 0, (16384, 1, 1), 128, SMS)
    ),
    "emb_bwd": KSpec(
        "aten::embedding_dense_backward", EMB_BWD, K.launch_tail(38, 0, (1024, 1, 1), 128, SMS)
    ),
    "adamw": KSpec("aten::_fused_adamw_", ADAMW, K.launch_tail(48, 0, (1320, 1, 1), 512, SMS)),
}
KERNEL_LIST = list(KERNELS.values())
KIDX = {k: i for i, k in enumerate(KERNELS)}

COLL_NAMES = {
    # collective name in record_param_comms -> (c10d op, nccl annotation)
    "allreduce": ("c10d::allreduce_", "nccl:all_reduce"),
    "_allgather_base": ("c10d::_allgather_base_", "nccl:_all_gather_base"),
    "_reduce_scatter_base": ("c10d::_reduce_scatter_base_", "nccl:_reduce_scatter_base"),
    "send": ("c10d::send", "nccl:send"),
    "recv": ("c10d::recv_", "nccl:recv"),
}
NCCL_TAIL = K.launch_tail(96, 87568, (16, 1, 1), 544, SMS)
P2P_TAIL = K.launch_tail(80, 41216, (2, 1, 1), 320, SMS)


@dataclass
class Group:
    """A process group as torch creates it (name from the global counter, description, ranks)."""

    name: str
    desc: str
    ranks: list[int]
    role: str
    stream: int
    # Healthy (or, slow-link, slowed) bus bandwidth per canonical collective, GB/s.
    busbw: dict[str, float]
    # The collective most of its traffic is (truth.json's `busbw_gbps` is its figure).
    main: str = "all_reduce"

    @property
    def busbw_gbps(self) -> float:
        """The bus bandwidth of the group's main collective."""
        return self.busbw[self.main]

    def pg_config(self) -> dict[str, object]:
        """The distributedInfo.pg_config entry."""
        return {
            "pg_name": self.name,
            "pg_desc": self.desc,
            "backend_config": "cuda:nccl",
            "pg_size": len(self.ranks),
            "ranks": list(self.ranks),
        }


@dataclass
class Plan:
    """Layout, degrees, process groups and scenario knobs shared by every rank's program."""

    layout: str
    world: int
    dp: int
    tp: int
    pp: int
    model: ModelConfig
    hw: Hardware
    groups: list[Group]
    bucket_bytes: int = 25 * 1024 * 1024
    split_buckets: bool = False
    exposed: bool = False
    straggler: int = -1
    delay_ns: int = 0
    # Compute kernels that run beside a collective of their rank run this much slower.
    interference: float = 0.0
    member: dict[int, dict[str, Group]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for g in self.groups:
            for r in g.ranks:
                self.member.setdefault(r, {})[g.role] = g

    def groups_of(self, rank: int) -> list[Group]:
        """Groups this rank belongs to, default pg first (as distributedInfo lists them)."""
        return [g for g in self.groups if rank in g.ranks]


P2P_STREAMS = {"send_next": 60, "recv_prev": 64, "send_prev": 68, "recv_next": 72}


class Builder:
    """Accumulates one rank's step program; numbers collective instances per channel."""

    def __init__(self, plan: Plan, rank: int, cache: dict) -> None:
        self.plan = plan
        self.rank = rank
        self.ops: list[tuple] = []
        self.count: dict[object, int] = {}
        self.cache = cache
        m = plan.model
        self.B = m.dtype_bytes
        self.hw = plan.hw

    # -- primitive ops ---------------------------------------------------------------------
    def comp(self, kind: str, gpu_ns: int, thread: int, tag: int = 0) -> None:
        """A CPU op launching one kernel on the compute stream."""
        self.ops.append((OP_COMP, KIDX[kind], gpu_ns, thread, tag))

    def gemm(self, kind: str, flops: float, thread: int, tag: int) -> None:
        """A compute-bound kernel."""
        self.comp(kind, gemm_ns(self.hw, flops), thread, tag)

    def mem(self, kind: str, nbytes: float, thread: int, tag: int) -> None:
        """A memory-bound kernel."""
        self.comp(kind, mem_ns(self.hw, nbytes), thread, tag)

    def coll(
        self,
        coll: str,
        nin: int,
        nout: int,
        group: Group,
        thread: int,
        peer: int = -1,
        stream: int = 0,
    ) -> tuple:
        """Issue a collective (or send/recv to global rank ``peer``); returns its instance key."""
        p2p = coll in ("send", "recv")
        chan: object
        if p2p:
            chan = ("p2p", self.rank, peer) if coll == "send" else ("p2p", peer, self.rank)
        else:
            chan = group.name
        idx = self.count.get(chan, 0)
        self.count[chan] = idx + 1
        key = (chan, idx)
        ck = (coll, nin, nout, group.name, peer, stream, self.rank if p2p else -1)
        spec = self.cache.get(ck)
        if spec is None:
            spec = self.cache[ck] = self._spec(coll, nin, nout, group, peer, stream)
        self.ops.append((OP_COLL, key, spec, thread))
        return key

    def wait(self, key: tuple, thread: int) -> None:
        """The compute stream waits for a collective instance (work.wait())."""
        self.ops.append((OP_WAIT, key, thread))

    def cpu(self, name: str, dur_ns: int, thread: int = MAIN, cat: str = "user_annotation") -> None:
        """A CPU-only range (data loading, zero_grad, ...)."""
        self.ops.append((OP_CPU, name, cat, dur_ns, thread))

    def _spec(
        self, coll: str, nin: int, nout: int, group: Group, peer: int, stream: int
    ) -> CollSpec:
        m = self.plan.model
        n = len(group.ranks)
        dt = DTYPE_NCCL[m.dtype]
        big = max(nin, nout) * self.B
        proto = "LL" if big < 64 * 1024 else ("LL128" if big < 4 * 1024 * 1024 else "SIMPLE")
        c10d, ann = COLL_NAMES[coll]
        p2p = coll in ("send", "recv")
        extra: dict[str, object] = {}
        args = "(ncclDevKernelArgsStorage<4096ul>)"
        if coll == "allreduce":
            kname = f"ncclDevKernel_AllReduce_Sum_{dt}_RING_{proto}{args}"
        elif coll == "_allgather_base":
            kname = f"ncclDevKernel_AllGather_RING_{proto}(ncclDevKernelArgsStorage<4096ul>)"
        elif coll == "_reduce_scatter_base":
            kname = (
                f"ncclDevKernel_ReduceScatter_Sum_{dt}_RING_{proto}"
                "(ncclDevKernelArgsStorage<4096ul>)"
            )
        else:
            kname = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
            ann = f"{ann} {self.rank}->{peer}" if coll == "send" else f"{ann} {self.rank}<-{peer}"
            extra = {"Dst Rank": peer} if coll == "send" else {"Src Rank": peer}
        ranks = group.ranks
        stride = ranks[1] - ranks[0] if n > 1 else 1
        meta = {
            "Collective name": coll,
            "In msg nelems": nin,
            "Out msg nelems": nout,
            "Group size": n,
            "dtype": m.dtype,
            "In split size": "[]",
            "Out split size": "[]",
            "Process Group Name": group.name,
            "Process Group Description": group.desc,
            "Process Group Ranks": K.format_ranks(ranks),
            "Global rank start": ranks[0],
            "Global rank stride": stride,
        }
        if p2p:
            dur = comm_ns(self.hw, coll, nin * self.B, 2, group.busbw[table_collective(coll)])
        else:
            dur = comm_ns(self.hw, coll, big, n, group.busbw[table_collective(coll)])
        return CollSpec(
            c10d_name=c10d,
            ann_name=ann,
            kernel_name=kname,
            kernel_tail=(P2P_TAIL if p2p else NCCL_TAIL) + ", " + K.coll_kernel_tail(meta),
            rpc_args=K.rpc_args(meta, extra),
            stream=stream or group.stream,
            dur_ns=dur,
            need=2 if p2p else n,
            seq_key=(group.name, p2p),
            role=f"{group.role}:{coll}",
        )

    # -- model pieces ----------------------------------------------------------------------
    def layer_fwd(self, thread: int, tag: int, tp: Group | None) -> None:
        """One transformer block forward for one micro-batch."""
        m = self.plan.model
        t = self.plan.tp
        T, h, B = m.tokens, m.hidden, self.B
        self.mem("ln", 2 * T * h * B, thread, tag)
        self.gemm("gemm", 2 * T * h * 3 * h / t, thread, tag)
        self.gemm("attn", 4 * m.micro_batch * m.seq * m.seq * h / t, thread, tag)
        self.gemm("gemm", 2 * T * h * h / t, thread, tag)
        if tp is not None:
            self.wait(self.coll("allreduce", T * h, T * h, tp, thread), thread)
        self.mem("add", 3 * T * h * B, thread, tag)
        self.mem("ln", 2 * T * h * B, thread, tag)
        self.gemm("gemm", 2 * T * h * 4 * h / t, thread, tag)
        self.mem("gelu", 2 * T * 4 * h * B / t, thread, tag)
        self.gemm("gemm", 2 * T * 4 * h * h / t, thread, tag)
        if tp is not None:
            self.wait(self.coll("allreduce", T * h, T * h, tp, thread), thread)
        self.mem("add", 3 * T * h * B, thread, tag)

    def layer_bwd(self, thread: int, tag: int, tp: Group | None, on_grad) -> None:
        """One transformer block backward; ``on_grad(nelems)`` after each weight gradient."""
        m = self.plan.model
        t = self.plan.tp
        T, h, B = m.tokens, m.hidden, self.B
        fc2, fc1, proj, qkv = grad_tensor_elems(m, t)
        self.gemm("dgrad", 2 * T * 4 * h * h / t, thread, tag)
        self.gemm("wgrad", 2 * T * 4 * h * h / t, thread, tag)
        on_grad(fc2)
        self.mem("gelu_bwd", 3 * T * 4 * h * B / t, thread, tag)
        self.gemm("dgrad", 2 * T * h * 4 * h / t, thread, tag)
        self.gemm("wgrad", 2 * T * h * 4 * h / t, thread, tag)
        on_grad(fc1)
        if tp is not None:
            self.wait(self.coll("allreduce", T * h, T * h, tp, thread), thread)
        self.mem("ln_bwd", 3 * T * h * B, thread, tag)
        self.gemm("dgrad", 2 * T * h * h / t, thread, tag)
        self.gemm("wgrad", 2 * T * h * h / t, thread, tag)
        on_grad(proj)
        self.gemm("attn_bwd", 8 * m.micro_batch * m.seq * m.seq * h / t, thread, tag)
        self.gemm("dgrad", 2 * T * h * 3 * h / t, thread, tag)
        self.gemm("wgrad", 2 * T * h * 3 * h / t, thread, tag)
        on_grad(qkv)
        if tp is not None:
            self.wait(self.coll("allreduce", T * h, T * h, tp, thread), thread)
        self.mem("ln_bwd", 3 * T * h * B, thread, tag)

    def emb_fwd(self, thread: int, tag: int) -> None:
        """Token embedding lookup."""
        m = self.plan.model
        self.mem("emb", 2 * m.tokens * m.hidden * self.B, thread, tag)

    def emb_bwd(self, thread: int, tag: int, on_grad) -> None:
        """Embedding backward (dense scatter-add); its gradient is the last one ready."""
        m = self.plan.model
        n = m.embedding_params // self.plan.tp
        self.mem("emb_bwd", (m.tokens * m.hidden + n) * self.B, thread, tag)
        on_grad(n)

    def step_prologue(self) -> None:
        """ProfilerStep start, the data loader (late on the straggler) and zero_grad."""
        self.ops.append((OP_STEP_BEGIN,))
        delay = self.plan.delay_ns if self.rank == self.plan.straggler else 0
        self.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 180_000 + delay)
        self.cpu("Optimizer.zero_grad#AdamW.zero_grad", 45_000)

    def step_epilogue(self, wait_key: tuple | None, params_local: int) -> None:
        """Wait for the gradient sync, optimizer kernel, loss.item() sync, ProfilerStep end."""
        if wait_key is not None:
            self.wait(wait_key, MAIN)
        self.cpu("Optimizer.step#AdamW.step", 30_000)
        self.mem("adamw", params_local * 16, MAIN, 0)
        self.ops.append((OP_SYNC,))
        self.ops.append((OP_STEP_END,))


class GradSync:
    """DDP reducer: buckets gradients as they become ready and all-reduces each full bucket.

    In the exposed variant every bucket is launched only after the whole backward pass.
    """

    def __init__(self, b: Builder, group: Group | None, thread: int) -> None:
        self.b = b
        self.group = group
        self.thread = thread
        self.acc: list[int] = []
        self.last: tuple | None = None
        self.enabled = True

    def __call__(self, nelems: int) -> None:
        if not self.enabled or self.group is None:
            return
        self.acc.append(nelems * self.b.B)
        if self.b.plan.exposed:
            return
        if self.b.plan.split_buckets:
            sizes = buckets(self.acc, self.b.plan.bucket_bytes, split=True)
            full = [s for s in sizes if s == self.b.plan.bucket_bytes]
            rest = sum(sizes) - sum(full)
            for s in full:
                self._issue(s)
            self.acc = [rest] if rest else []
        elif sum(self.acc) >= self.b.plan.bucket_bytes:
            self._issue(sum(self.acc))
            self.acc = []

    def _issue(self, nbytes: int) -> None:
        assert self.group is not None
        n = nbytes // self.b.B
        self.last = self.b.coll("allreduce", n, n, self.group, self.thread)

    def finish(self) -> tuple | None:
        """Flush the remaining (or, when exposed, all) buckets; returns the last instance."""
        if self.group is None:
            return None
        sizes = buckets(self.acc, self.b.plan.bucket_bytes, split=self.b.plan.split_buckets)
        for s in sizes:
            self._issue(s)
        self.acc = []
        return self.last


def build_dp_like(plan: Plan, rank: int, cache: dict) -> list[tuple]:
    """dp and tp-dp: m micro-batches forward+backward, DDP all-reduce on the last one."""
    b = Builder(plan, rank, cache)
    m = plan.model
    groups = plan.member[rank]
    tp = groups.get("tp")
    dp = groups.get("dp")
    b.step_prologue()
    sync = GradSync(b, dp, AUTOGRAD)
    for mb in range(m.micro_batches):
        b.emb_fwd(MAIN, 0)
        for _ in range(m.layers):
            b.layer_fwd(MAIN, 0, tp)
        sync.enabled = mb == m.micro_batches - 1
        for _ in range(m.layers):
            b.layer_bwd(AUTOGRAD, 0, tp, sync)
        b.emb_bwd(AUTOGRAD, 0, sync)
    last = sync.finish()
    b.step_epilogue(last, m.params // plan.tp)
    return b.ops


def build_fsdp(plan: Plan, rank: int, cache: dict) -> list[tuple]:
    """fsdp (ZeRO-3): per unit all-gather in forward and backward, reduce-scatter of gradients.

    Units are the embedding and each block. Baseline prefetches the next unit's all-gather
    and reduce-scatters each unit right after its backward; the exposed variant issues every
    reduce-scatter after the backward pass.
    """
    b = Builder(plan, rank, cache)
    m = plan.model
    g = plan.member[rank]["dp"]
    d = len(g.ranks)
    units = [m.embedding_params] + [m.layer_params] * m.layers
    shard = [ceil_div(u, d) for u in units]
    b.step_prologue()
    last: tuple | None = None
    for _ in range(m.micro_batches):
        ag = {0: b.coll("_allgather_base", shard[0], shard[0] * d, g, MAIN)}
        for i in range(len(units)):
            if i + 1 < len(units):
                ag[i + 1] = b.coll("_allgather_base", shard[i + 1], shard[i + 1] * d, g, MAIN)
            b.wait(ag[i], MAIN)
            if i == 0:
                b.emb_fwd(MAIN, 0)
            else:
                b.layer_fwd(MAIN, 0, None)
        n = len(units)
        agb = {n - 1: b.coll("_allgather_base", shard[-1], shard[-1] * d, g, AUTOGRAD)}
        pending_rs: list[int] = []
        for i in reversed(range(n)):
            if i - 1 >= 0:
                agb[i - 1] = b.coll("_allgather_base", shard[i - 1], shard[i - 1] * d, g, AUTOGRAD)
            b.wait(agb[i], AUTOGRAD)
            if i == 0:
                b.emb_bwd(AUTOGRAD, 0, lambda _n: None)
            else:
                b.layer_bwd(AUTOGRAD, 0, None, lambda _n: None)
            if plan.exposed:
                pending_rs.append(i)
            else:
                last = b.coll("_reduce_scatter_base", shard[i] * d, shard[i], g, AUTOGRAD)
        for i in pending_rs:
            last = b.coll("_reduce_scatter_base", shard[i] * d, shard[i], g, AUTOGRAD)
    b.step_epilogue(last, sum(shard))
    return b.ops


def build_pp(plan: Plan, rank: int, cache: dict) -> list[tuple]:
    """pp-dp: non-interleaved 1F1B over p stages, send/recv of b*s*h activations/gradients.

    Stage s runs min(p-s-1, m) warm-up forwards, then alternates one forward and one backward,
    then drains the remaining backwards. Stage 0 also holds the embedding. The stage's
    gradients are all-reduced in its data-parallel group during the last micro-batch's
    backward (DDP no_sync on the earlier ones), or after it in the exposed variant.
    """
    b = Builder(plan, rank, cache)
    m = plan.model
    p = plan.pp
    groups = plan.member[rank]
    pg = groups["pp"]
    dp = groups["dp"]
    stage = pg.ranks.index(rank)
    prev_r = pg.ranks[stage - 1] if stage > 0 else -1
    next_r = pg.ranks[stage + 1] if stage < p - 1 else -1
    lps = m.layers // p
    act = m.tokens * m.hidden
    nmb = m.micro_batches
    sync = GradSync(b, dp, AUTOGRAD)

    def fwd(j: int) -> None:
        if prev_r >= 0:
            k = b.coll("recv", act, act, pg, MAIN, peer=prev_r, stream=P2P_STREAMS["recv_prev"])
            b.wait(k, MAIN)
        if stage == 0:
            b.emb_fwd(MAIN, 1)
        for _ in range(lps):
            b.layer_fwd(MAIN, 1, None)
        if next_r >= 0:
            b.coll("send", act, act, pg, MAIN, peer=next_r, stream=P2P_STREAMS["send_next"])

    def bwd(j: int) -> None:
        if next_r >= 0:
            k = b.coll("recv", act, act, pg, AUTOGRAD, peer=next_r, stream=P2P_STREAMS["recv_next"])
            b.wait(k, AUTOGRAD)
        sync.enabled = j == nmb - 1
        for _ in range(lps):
            b.layer_bwd(AUTOGRAD, 1, None, sync)
        if stage == 0:
            b.emb_bwd(AUTOGRAD, 1, sync)
        if prev_r >= 0:
            b.coll("send", act, act, pg, AUTOGRAD, peer=prev_r, stream=P2P_STREAMS["send_prev"])

    b.step_prologue()
    warm = min(p - stage - 1, nmb)
    for j in range(warm):
        fwd(j)
    for i in range(nmb - warm):
        fwd(warm + i)
        bwd(i)
    for i in range(nmb - warm, nmb):
        bwd(i)
    last = sync.finish()
    b.step_epilogue(last, stage_params(m, p, stage))
    return b.ops


def stage_params(m: ModelConfig, p: int, stage: int) -> int:
    """Parameters held by pipeline stage ``stage``: L/p blocks, plus the embedding on stage 0."""
    return (m.layers // p) * m.layer_params + (m.embedding_params if stage == 0 else 0)


BUILDERS = {"dp": build_dp_like, "tp-dp": build_dp_like, "fsdp": build_fsdp, "pp-dp": build_pp}


def make_groups(
    layout: str, world: int, tp: int, pp: int, hw: Hardware, per_host: int | None = None
) -> list[Group]:
    """Process groups in torch creation order: default pg "0", then new_group() calls.

    torch names groups from a global counter incremented on every rank for every new_group call,
    so rank r's TP group is "1 + r//t" even though it only belongs to one of them. Each
    group's healthy bus bandwidth is its link's (config.link_busbw; hosts of `per_host`
    ranks, default hw.gpus_per_host).
    """
    per_host = per_host or hw.gpus_per_host
    groups = [
        Group(
            "0",
            "default_pg",
            list(range(world)),
            "dp" if layout in ("dp", "fsdp") else "world",
            20,
            link_busbw(hw, list(range(world)), per_host),
            "all_gather" if layout == "fsdp" else "all_reduce",
        )
    ]
    stream = 24

    def add(desc: str, members: list[list[int]], role: str, on_stream: int) -> None:
        """One group per member list, named "1", "2", ... after those already made."""
        for ranks in members:
            busbw = link_busbw(hw, ranks, per_host)
            main = "send_recv" if role == "pp" else "all_reduce"
            groups.append(Group(str(len(groups)), desc, ranks, role, on_stream, busbw, main))

    if layout == "tp-dp":
        d = world // tp
        add(
            "TENSOR_MODEL_PARALLEL_GROUP",
            [list(range(k * tp, (k + 1) * tp)) for k in range(d)],
            "tp",
            stream,
        )
        add("DATA_PARALLEL_GROUP", [list(range(j, world, tp)) for j in range(tp)], "dp", stream + 4)
    elif layout == "pp-dp":
        d = world // pp
        add(
            "DATA_PARALLEL_GROUP",
            [list(range(s * d, (s + 1) * d)) for s in range(pp)],
            "dp",
            stream,
        )
        add(
            "PIPELINE_MODEL_PARALLEL_GROUP",
            [list(range(j, world, d)) for j in range(d)],
            "pp",
            stream + 4,
        )
    return groups
