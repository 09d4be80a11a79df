"""A small discrete-event simulator of CPU launch threads, CUDA streams and NCCL collectives.

Each rank runs a *program*: the ordered list of operations its Python thread issues in one step
(``Op*`` tuples built by :mod:`kineto_comm.synth.program`). The CPU never blocks on the GPU except
at an explicit ``SYNC``; kernels start at ``max(launch, stream tail, dependencies)``. A collective
instance (matched across ranks by channel and per-channel index) starts on each rank when that
rank arrives (its NCCL kernel becomes ready) and ends on all ranks at
``max(arrivals) + duration``, so the cross-rank timing is self-consistent by construction.

Ranks are advanced round-robin; a rank only pauses (in simulation order, never in simulated
time) when it needs the end of a collective that not every participant has reached yet. Events
are rendered to Kineto text as soon as their times are known; NCCL kernels once the step is done.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from . import kineto as K

OP_COMP, OP_COLL, OP_WAIT, OP_SYNC, OP_CPU, OP_STEP_BEGIN, OP_STEP_END = range(7)
MAIN, AUTOGRAD = 0, 1
COMPUTE_STREAM = 7


@dataclass(frozen=True)
class KSpec:
    """A compute kernel kind: the launching CPU op, the kernel name and its static args."""

    cpu_name: str
    kernel_name: str
    tail: str
    # CPU ops that launch nothing, written inside the launching op before its launch (see
    # kineto.host_ops): (name, args) each.
    helpers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class CollSpec:
    """One collective call site of one rank, with every string that does not vary per call."""

    c10d_name: str
    ann_name: str
    kernel_name: str
    kernel_tail: str
    rpc_args: str
    stream: int
    dur_ns: int
    need: int
    seq_key: tuple[str, bool]
    role: str


class Coll:
    """One collective instance shared by its participants."""

    __slots__ = ("need", "ready", "end", "dur")

    def __init__(self, need: int, dur: int) -> None:
        self.need = need
        self.ready: list[int] = []
        self.end = -1
        self.dur = dur

    def post(self, t: int) -> None:
        """A participant arrives at ``t``; the last arrival fixes the common end time."""
        self.ready.append(t)
        if len(self.ready) == self.need:
            self.end = max(self.ready) + self.dur


@dataclass
class RankState:
    """Per-rank simulation state and output buffers for the current step."""

    rank: int
    pid: int
    tids: tuple[int, int]
    device: int
    offset: int
    rng: random.Random
    cpu: int
    tails: dict[int, object] = field(default_factory=dict)
    ext: int = 1
    rf: int = 1
    ev: int = 0
    corr: int = 1
    seq: dict[tuple[str, bool], int] = field(default_factory=dict)
    pc: int = 0
    buf: list[str] = field(default_factory=list)
    deferred: list[tuple] = field(default_factory=list)
    step_begin: int = 0
    step_ids: tuple[int, int, int] = (0, 0, 0)
    # per-step records used by truth.json (true times, no clock offset)
    step_spans: list[tuple[int, int]] = field(default_factory=list)
    # per step, the device's first kernel start and last kernel end (the product's windows)
    dev_spans: list[tuple[int, int]] = field(default_factory=list)
    dev_lo: int = -1
    pipe: list[tuple[int, int]] = field(default_factory=list)
    streams: set[int] = field(default_factory=set)
    # The interference scenario: a compute kernel that runs while one of the rank's
    # collectives does is this much slower (0.4: 40%); the ns it added, per step.
    interference: float = 0.0
    injected: list[int] = field(default_factory=list)
    # A compute op's CPU jitter, drawn before the rank paused at it (the same draws after).
    held: tuple[int, int] | None = None


def _j(st: RankState, ns: int) -> int:
    """CPU-side duration with +-20% seeded jitter."""
    return int(ns * (0.8 + 0.4 * st.rng.random()))


def _ts(ns: int) -> tuple[int, int]:
    return divmod(ns, 1000)


def _beside_comm(st: RankState, k0: int, k1: int) -> bool | None:
    """Whether a collective of the rank's step runs during [k0, k1) on its device; None
    when that turns on a collective whose end is not known yet (the rank pauses)."""
    unknown = False
    for _spec, ready, inst, *_ in st.deferred:
        if ready >= k1:
            continue
        end = inst.end if inst.end >= 0 else max(inst.ready) + inst.dur  # at least this
        if end > k0:
            return True
        unknown |= inst.end < 0
    return None if unknown else False


def run_rank(
    st: RankState, prog: list[tuple], registry: dict, kspecs: list[KSpec], step: int
) -> bool:
    """Advance one rank through its program until it finishes or must wait; True if it moved."""
    moved = False
    buf = st.buf
    tails = st.tails
    pid = st.pid
    off = st.offset
    dev = st.device
    n = len(prog)
    while st.pc < n:
        op = prog[st.pc]
        code = op[0]
        if code == OP_COMP:
            _, kidx, gpu_ns, thread, tag = op
            ks = kspecs[kidx]
            tid = st.tids[thread]
            c0 = st.cpu
            if st.held is None:
                st.held = (_j(st, 18_000), _j(st, 6_000))
            cdur, ldur = st.held
            l0 = c0 + cdur // 3
            tail = tails.get(COMPUTE_STREAM, 0)
            k0 = max(l0 + 4_000, tail)  # type: ignore[call-overload]
            if st.interference:
                beside = _beside_comm(st, k0, k0 + gpu_ns)
                if beside is None:
                    return moved
                if beside:
                    extra = int(gpu_ns * st.interference)
                    gpu_ns += extra
                    st.injected[-1] += extra
            st.held = None
            ext, rf, ev, corr = st.ext, st.rf, st.ev, st.corr
            st.ext += 1
            st.rf += 1
            st.ev += 1
            st.corr += 1
            k1 = k0 + gpu_ns
            tails[COMPUTE_STREAM] = k1
            if st.dev_lo < 0 or k0 < st.dev_lo:
                st.dev_lo = k0
            if tag:
                st.pipe.append((k0, k1))
            a, b = _ts(c0 + off)
            c, d = _ts(cdur)
            buf.append(K.CPU_OP % ("cpu_op", ks.cpu_name, pid, tid, a, b, c, d, ext, rf, ev))
            if ks.helpers:  # one after the other, between the op's start and its launch
                slot = (l0 - c0) // (len(ks.helpers) + 1)
                c, d = _ts(slot * 3 // 4)
                for i, (name, args) in enumerate(ks.helpers, 1):
                    a, b = _ts(c0 + i * slot - slot // 2 + off)
                    buf.append(
                        K.SHAPED_OP % (name, pid, tid, a, b, c, d, st.ext, st.rf, args, st.ev)
                    )
                    st.ext += 1
                    st.rf += 1
                    st.ev += 1
            a, b = _ts(l0 + off)
            c, d = _ts(ldur)
            buf.append(K.RUNTIME % ("cudaLaunchKernel", pid, tid, a, b, c, d, ext, 211, corr))
            buf.append(K.FLOW_S % (corr, pid, tid, a, b))
            a, b = _ts(k0 + off)
            c, d = _ts(gpu_ns)
            buf.append(
                K.KERNEL
                % (
                    ks.kernel_name,
                    dev,
                    COMPUTE_STREAM,
                    a,
                    b,
                    c,
                    d,
                    ext,
                    dev,
                    COMPUTE_STREAM,
                    corr,
                    ks.tail,
                )
            )
            buf.append(K.FLOW_F % (corr, dev, COMPUTE_STREAM, a, b))
            st.cpu = c0 + cdur + _j(st, 4_000)
        elif code == OP_COLL:
            _, key, spec, thread = op
            prev = tails.get(spec.stream, 0)
            if isinstance(prev, Coll):
                if prev.end < 0:
                    return moved
                prev = prev.end
            inst = registry.get(key)
            if inst is None:
                inst = registry[key] = Coll(spec.need, spec.dur_ns)
            tid = st.tids[thread]
            t0 = st.cpu
            g = [
                _j(st, x)
                for x in (4_000, 3_000, 2_500, 3_200, 5_000, 8_000, 4_000, 2_000, 4_500, 4_000)
            ]
            t_rpc = t0 + g[0]
            t_er = t_rpc + g[1]
            t_sw = t_er + g[2]
            t_ann = t_sw + g[3]
            t_l = t_ann + g[4]
            l_end = t_l + g[5]
            ann_end = l_end + g[6]
            t_er2 = ann_end + g[7]
            rpc_end = t_er2 + g[8]
            end = rpc_end + g[9]
            ready = max(t_l + 4_000, prev, tails.get(COMPUTE_STREAM, 0))  # type: ignore[call-overload]
            inst.post(ready)
            if st.dev_lo < 0 or ready < st.dev_lo:
                st.dev_lo = ready
            tails[spec.stream] = inst
            st.streams.add(spec.stream)
            seq = st.seq.get(spec.seq_key, 0) + 1
            st.seq[spec.seq_key] = seq
            e_c10d, e_rpc, e_ann = st.ext, st.ext + 1, st.ext + 2
            st.ext += 3
            rf = st.rf
            st.rf += 3
            ev = st.ev
            st.ev += 3
            corr = st.corr
            st.corr += 4
            a, b = _ts(t0 + off)
            c, d = _ts(end - t0)
            buf.append(K.CPU_OP % ("cpu_op", spec.c10d_name, pid, tid, a, b, c, d, e_c10d, rf, ev))
            a, b = _ts(t_rpc + off)
            c, d = _ts(rpc_end - t_rpc)
            buf.append(K.RPC % (pid, tid, a, b, c, d, e_rpc, rf + 1, spec.rpc_args, ev + 1, seq))
            a, b = _ts(t_er + off)
            buf.append(K.RUNTIME % ("cudaEventRecord", pid, tid, a, b, 1, 480, e_rpc, 135, corr))
            a, b = _ts(t_sw + off)
            buf.append(
                K.RUNTIME % ("cudaStreamWaitEvent", pid, tid, a, b, 1, 210, e_rpc, 147, corr + 1)
            )
            a, b = _ts(t_ann + off)
            c, d = _ts(ann_end - t_ann)
            buf.append(
                K.CPU_OP
                % ("user_annotation", spec.ann_name, pid, tid, a, b, c, d, e_ann, rf + 2, ev + 2)
            )
            a, b = _ts(t_l + off)
            c, d = _ts(l_end - t_l)
            buf.append(
                K.RUNTIME % ("cudaLaunchKernelExC", pid, tid, a, b, c, d, e_rpc, 430, corr + 2)
            )
            buf.append(K.FLOW_S % (corr + 2, pid, tid, a, b))
            a, b = _ts(t_er2 + off)
            buf.append(
                K.RUNTIME % ("cudaEventRecord", pid, tid, a, b, 0, 870, e_rpc, 135, corr + 3)
            )
            st.deferred.append((spec, ready, inst, e_rpc, e_ann, corr + 2))
            st.cpu = end + _j(st, 3_000)
        elif code == OP_WAIT:
            _, key, thread = op
            inst = registry[key]
            if inst.end < 0:
                return moved
            tails[COMPUTE_STREAM] = max(tails.get(COMPUTE_STREAM, 0), inst.end)  # type: ignore[call-overload]
            tid = st.tids[thread]
            t0 = st.cpu + _j(st, 2_000)
            a, b = _ts(t0 + off)
            buf.append(
                K.RUNTIME
                % ("cudaStreamWaitEvent", pid, tid, a, b, 1, 350, st.ext - 1, 147, st.corr)
            )
            st.corr += 1
            st.cpu = t0 + _j(st, 3_000)
        elif code == OP_SYNC:
            last = st.cpu
            for v in tails.values():
                if isinstance(v, Coll):
                    if v.end < 0:
                        return moved
                    v = v.end
                if v > last:  # type: ignore[operator]
                    last = v  # type: ignore[assignment]
            t0 = st.cpu
            s0 = t0 + _j(st, 6_000)
            s1 = max(last, s0 + 2_000) + 1_500
            e = st.cpu + (s1 - t0) + _j(st, 4_000)
            a, b = _ts(t0 + off)
            c, d = _ts(e - t0)
            buf.append(
                K.CPU_OP
                % ("cpu_op", "aten::item", pid, st.tids[MAIN], a, b, c, d, st.ext, st.rf, st.ev)
            )
            a, b = _ts(s0 + off)
            c, d = _ts(s1 - s0)
            buf.append(
                K.RUNTIME
                % ("cudaStreamSynchronize", pid, st.tids[MAIN], a, b, c, d, st.ext, 131, st.corr)
            )
            st.ext += 1
            st.rf += 1
            st.ev += 1
            st.corr += 1
            st.cpu = e + _j(st, 2_000)
        elif code == OP_CPU:
            _, name, cat, dur, thread = op
            t0 = st.cpu
            a, b = _ts(t0 + off)
            c, d = _ts(dur)
            buf.append(
                K.CPU_OP % (cat, name, pid, st.tids[thread], a, b, c, d, st.ext, st.rf, st.ev)
            )
            st.ext += 1
            st.rf += 1
            st.ev += 1
            st.cpu = t0 + dur + _j(st, 2_000)
        elif code == OP_STEP_BEGIN:
            st.step_begin = st.cpu
            st.injected.append(0)
            st.step_ids = (st.ext, st.rf, st.ev)
            st.dev_lo = -1
            st.ext += 1
            st.rf += 1
            st.ev += 1
            st.cpu += _j(st, 5_000)
        elif code == OP_STEP_END:
            t0 = st.step_begin
            t1 = st.cpu
            a, b = _ts(t0 + off)
            c, d = _ts(t1 - t0)
            ext, rf, ev = st.step_ids
            buf.append(
                K.CPU_OP
                % (
                    "user_annotation",
                    f"ProfilerStep#{step}",
                    pid,
                    st.tids[MAIN],
                    a,
                    b,
                    c,
                    d,
                    ext,
                    rf,
                    ev,
                )
            )
            st.step_spans.append((t0, t1))
            # After the step's sync every kernel of the step has ended.
            ends = [v.end if isinstance(v, Coll) else v for v in tails.values()]
            st.dev_spans.append((st.dev_lo, max(ends, default=st.dev_lo)))  # type: ignore[type-var]
        st.pc += 1
        moved = True
    return moved


def flush_deferred(st: RankState) -> None:
    """Render the NCCL kernels (and their flow ends and GPU annotations) of the finished step."""
    buf = st.buf
    dev = st.device
    off = st.offset
    for spec, ready, inst, e_rpc, e_ann, corr in st.deferred:
        s = spec.stream
        a, b = _ts(ready + off)
        c, d = _ts(inst.end - ready)
        buf.append(
            K.KERNEL % (spec.kernel_name, dev, s, a, b, c, d, e_rpc, dev, s, corr, spec.kernel_tail)
        )
        buf.append(K.FLOW_F % (corr, dev, s, a, b))
        a, b = _ts(ready - 1 + off)
        c, d = _ts(inst.end - ready + 2)
        buf.append(K.GPU_ANN % (spec.ann_name, dev, s, a, b, c, d, e_ann))
    st.deferred.clear()


def run_step(
    states: list[RankState], progs: list[list[tuple]], kspecs: list[KSpec], step: int
) -> None:
    """Simulate one step on every rank to completion; raises if the programs deadlock."""
    registry: dict = {}
    for st in states:
        st.pc = 0
    pending = list(range(len(states)))
    while pending:
        moved = False
        still = []
        for r in pending:
            st = states[r]
            moved |= run_rank(st, progs[r], registry, kspecs, step)
            if st.pc < len(progs[r]):
                still.append(r)
        if still and not moved:
            raise RuntimeError(f"synthetic programs deadlocked in step {step} (ranks {still[:8]})")
        pending = still
    for st in states:
        flush_deferred(st)
