"""generate(): write a synthetic multi-rank Kineto job plus its ground truth (see package doc)."""

from __future__ import annotations

import gzip as _gzip
import io
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import kineto as K
from .config import Hardware, ModelConfig, buckets, ceil_div, grad_tensor_elems, pipeline_bubble
from .program import BUILDERS, KERNEL_LIST, Plan, make_groups, stage_params
from .sim import AUTOGRAD, COMPUTE_STREAM, MAIN, RankState, run_step

SCENARIOS = (
    "baseline",
    "exposed-allreduce",
    "straggler",
    "bubble",
    "small-messages",
    "slow-link",
    "clock-skew",
    "interference",
)
LAYOUTS = ("dp", "fsdp", "tp-dp", "pp-dp")

TP_DEGREE = 2
STRAGGLER_DELAY_NS = 2_000_000
SLOW_LINK_FACTOR = 5.0
SMALL_BUCKET_BYTES = 48 * 1024
# The interference scenario: compute kernels beside communication run 40% slower.
INTERFERENCE_SLOWDOWN = 0.4
BUBBLE_MICRO_BATCHES = 2
BASE_TIME_NS = 1_720_000_000_000_000_000
START_NS = 3_000_000_000
NCCL_VERSION = "2.21.5"
MEASURED_STEPS = 3  # steps used for the bubble fraction and the problem's impact


def _degrees(layout: str, world: int) -> tuple[int, int, int]:
    """(dp, tp, pp) for a layout, or ValueError when the world size cannot be split."""
    if world < 2:
        raise ValueError(f"ranks must be >= 2 for a distributed job, got {world}")
    if layout in ("dp", "fsdp"):
        return world, 1, 1
    if layout == "tp-dp":
        if world % TP_DEGREE or world // TP_DEGREE < 2:
            raise ValueError(
                f"layout tp-dp needs ranks divisible by the tensor-parallel degree {TP_DEGREE} "
                f"with at least 2 data-parallel replicas (ranks >= {2 * TP_DEGREE}), got {world}"
            )
        return world // TP_DEGREE, TP_DEGREE, 1
    # pp-dp: 4 stages when that leaves >= 2 replicas, else 2.
    pp = 4 if world % 4 == 0 and world // 4 >= 2 else 2
    if world % pp or world // pp < 2:
        raise ValueError(
            f"layout pp-dp needs ranks divisible by the pipeline depth (2 or 4) with at least "
            f"2 data-parallel replicas per stage (ranks >= 4, even), got {world}"
        )
    return world // pp, 1, pp


def _model_for(layout: str, pp: int, model: ModelConfig | None) -> ModelConfig:
    m = model or ModelConfig()
    if layout == "pp-dp":
        if m.layers % pp:
            raise ValueError(f"model.layers={m.layers} must be divisible by the {pp} stages")
        if m.micro_batches == 1:  # a pipeline needs micro-batches: 1F1B with m = 4p
            m = replace(m, micro_batches=4 * pp)
    return m


def _offsets(
    world: int, per_host: int, rng: random.Random, skew: bool, spread: tuple[int, int]
) -> dict[int, int]:
    """Per-rank clock offset (ns): one offset per host, host 0 (rank 0) keeps the true clock;
    the others, with `skew`, a random sign times a size drawn from `spread`."""
    hosts = ceil_div(world, per_host)
    host_off = [0] * hosts
    if skew:
        for h in range(1, hosts):
            host_off[h] = rng.choice((-1, 1)) * rng.randint(*spread)
    return {r: host_off[r // per_host] for r in range(world)}


class _Job:
    """One simulated job: plan, rank states and (optionally) the open output files."""

    def __init__(
        self, plan: Plan, seed: int, offsets: dict[int, int], per_host: int, host_ops: int = 0
    ) -> None:
        self.plan = plan
        m = plan.model
        helpers = K.host_ops(host_ops, m.micro_batch, m.seq, m.hidden)
        self.kspecs = [replace(ks, helpers=helpers) for ks in KERNEL_LIST]
        cache: dict = {}
        builder = BUILDERS[plan.layout]
        self.progs = [builder(plan, r, cache) for r in range(plan.world)]
        self.states = []
        for r in range(plan.world):
            pid = 100_000 + 113 * r
            self.states.append(
                RankState(
                    rank=r,
                    pid=pid,
                    tids=(pid, pid + 35),
                    device=r % per_host,
                    offset=offsets[r],
                    rng=random.Random(seed * 1_000_003 + r),
                    cpu=START_NS,
                    interference=plan.interference,
                )
            )
        self.pipe_marks: list[list[int]] = [[] for _ in range(plan.world)]

    def step(self, k: int) -> None:
        """Simulate step k; pipeline compute intervals are kept for the first few steps only."""
        run_step(self.states, self.progs, self.kspecs, k)
        for st, marks in zip(self.states, self.pipe_marks, strict=True):
            if k < MEASURED_STEPS:
                marks.append(len(st.pipe))
            else:
                del st.pipe[marks[-1] :]

    def step_times(self) -> list[int]:
        """The job's time of each complete step, as the product defines a step (docs/tables.md,
        "The model of time"): the longest rank's device window, a window running from the
        step's first kernel to the next step's first kernel (the last step's, to its last
        kernel); complete steps are all but the last when there are several. Not the span
        from the first rank's begin to the last rank's end: ranks that start and end a step
        at different times (pipeline stages, a rank held by its slow group) overlap
        consecutive steps, which costs no throughput; the window is the period."""
        n = len(self.states[0].dev_spans)

        def window(st: RankState, k: int) -> int:
            lo, hi = st.dev_spans[k]
            return (st.dev_spans[k + 1][0] if k + 1 < n else hi) - lo

        return [max(window(st, k) for st in self.states) for k in range(max(1, n - 1))]

    def bubble_fraction(self) -> float:
        """Mean idle fraction of the compute stream inside each pipeline window.

        The window of a pipeline group in a step runs from its first forward kernel to its last
        backward kernel; a stage's idle fraction is 1 - busy/window.
        """
        if self.plan.pp < 2:
            return 0.0
        fracs = []
        pp_groups = [g for g in self.plan.groups if g.role == "pp"]
        nsteps = len(self.pipe_marks[0])
        for k in range(nsteps):
            for g in pp_groups:
                ivs = []
                for r in g.ranks:
                    lo = self.pipe_marks[r][k - 1] if k else 0
                    ivs.append(self.states[r].pipe[lo : self.pipe_marks[r][k]])
                t0 = min(iv[0][0] for iv in ivs)
                t1 = max(iv[-1][1] for iv in ivs)
                for iv in ivs:
                    busy = sum(b - a for a, b in iv)
                    fracs.append(1.0 - busy / (t1 - t0))
        return sum(fracs) / len(fracs)


def _expected(plan: Plan) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Message sizes and call counts per step from the closed-form formulas (see module doc)."""
    m = plan.model
    B = m.dtype_bytes
    L, h, t, p, d = m.layers, m.hidden, plan.tp, plan.pp, plan.dp
    cap, split = plan.bucket_bytes, plan.split_buckets
    exp: dict[str, Any] = {}
    per_rank: dict[str, list[dict[str, Any]]] = {str(r): [] for r in range(plan.world)}

    def add(
        role: str,
        coll: str,
        group_role: str,
        calls: int,
        nbytes: int,
        formula: str,
        ranks: list[int] | None = None,
        **kw: Any,
    ) -> None:
        entry = {
            "collective": coll,
            "group_role": group_role,
            "calls_per_step": calls,
            "bytes_per_step": nbytes,
            "formula": formula,
            **kw,
        }
        exp[role] = entry
        for g in plan.groups:
            if g.role != group_role:
                continue
            for r in g.ranks:
                if ranks is None or r in ranks:
                    per_rank[str(r)].append(
                        {
                            "role": role,
                            "collective": coll,
                            "pg_name": g.name,
                            "calls_per_step": calls,
                            "bytes_per_step": nbytes,
                        }
                    )

    if plan.layout in ("dp", "tp-dp"):
        tensors = [e * B for _ in range(L) for e in grad_tensor_elems(m, t)]
        tensors.append(m.embedding_params // t * B)
        sizes = buckets(tensors, cap, split)
        add(
            "dp_grad",
            "allreduce",
            "dp",
            len(sizes),
            m.params // t * B,
            "Psi/t*B",
            group_size=d,
            bucket_bytes=cap,
            max_message_bytes=max(sizes),
            wire_bytes_per_rank=round(2 * (d - 1) / d * (m.params // t) * B),
        )
    if plan.layout == "tp-dp":
        n = 4 * L * m.micro_batches
        add(
            "tp",
            "allreduce",
            "tp",
            n,
            n * m.tokens * h * B,
            "4*L*m * b*s*h*B",
            group_size=t,
            bytes_per_call=m.tokens * h * B,
        )
    if plan.layout == "fsdp":
        units = [m.embedding_params] + [m.layer_params] * L
        full = sum(ceil_div(u, d) * d for u in units) * B
        mb = m.micro_batches
        add(
            "fsdp_allgather",
            "_allgather_base",
            "dp",
            2 * len(units) * mb,
            2 * full * mb,
            "2*Psi*B (forward and backward, Out msg = full unit)",
            group_size=d,
            wire_bytes_per_rank=round(2 * mb * full * (d - 1) / d),
        )
        add(
            "fsdp_reduce_scatter",
            "_reduce_scatter_base",
            "dp",
            len(units) * mb,
            full * mb,
            "Psi*B (In msg = full unit)",
            group_size=d,
            wire_bytes_per_rank=round(mb * full * (d - 1) / d),
            zero3_wire_bytes_per_rank=round(3 * mb * full * (d - 1) / d),
        )
    if plan.layout == "pp-dp":
        act = m.tokens * h * B
        mb = m.micro_batches
        exp["pp_p2p"] = {
            "collective": "send/recv",
            "group_role": "pp",
            "bytes_per_call": act,
            "calls_per_step_per_link_direction": mb,
            "formula": "m * b*s*h*B per direction",
            "bubble_fraction_formula": pipeline_bubble(p, mb),
        }
        for g in plan.groups:
            if g.role == "pp":
                for s, r in enumerate(g.ranks):
                    links = (s > 0) + (s < p - 1)
                    for coll in ("send", "recv"):
                        per_rank[str(r)].append(
                            {
                                "role": "pp_p2p",
                                "collective": coll,
                                "pg_name": g.name,
                                "calls_per_step": links * mb,
                                "bytes_per_step": links * mb * act,
                            }
                        )
        for s in range(p):
            tensors = [e * B for _ in range(L // p) for e in grad_tensor_elems(m, 1)]
            if s == 0:
                tensors.append(m.embedding_params * B)
            sizes = buckets(tensors, cap, split)
            ranks = list(range(s * d, (s + 1) * d))
            add(
                f"dp_grad_stage{s}",
                "allreduce",
                "dp",
                len(sizes),
                stage_params(m, p, s) * B,
                "(L/p*12h^2 [+ V*h on stage 0]) * B",
                ranks=ranks,
                group_size=d,
                max_message_bytes=max(sizes),
            )
    return exp, per_rank


def _open(path: Path, gz: bool) -> io.BufferedIOBase:
    raw = open(path, "wb", buffering=1 << 20)  # noqa: SIM115 - closed by _close
    if gz:
        return _gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=3, mtime=0)
    return raw


def generate(
    scenario: str,
    out_dir: str | Path,
    *,
    ranks: int = 8,
    layout: str = "dp",
    seed: int = 0,
    size_mb: float | None = None,
    steps: int = 3,
    gzip: bool = False,
    model: ModelConfig | None = None,
    hardware: Hardware | None = None,
    host_ops: int = 0,
    single_gpu_hosts: bool = False,
) -> dict:
    """Write one trace per rank (rank-{r}.pt.trace.json[.gz]) plus truth.json into out_dir.

    ``size_mb`` (uncompressed MB per rank file) overrides ``steps``: the number of steps is
    chosen after the first one so each file comes out at about that size. ``model`` and
    ``hardware`` override the defaults (tests use a tiny model). ``host_ops`` CPU ops that
    launch nothing (with record_shapes arguments) are written inside every compute kernel's
    launching op, as real traces have them (kineto.host_ops); they change no ground truth,
    only how many events and bytes there are per kernel. ``single_gpu_hosts``: one GPU per
    host, so every rank is on device 0 and no header names a host (what the traces of such a
    job look like); with clock-skew, the hosts' clocks are 0.5-1.5 ms apart. Returns the
    truth dict.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if size_mb is not None and size_mb <= 0:
        raise ValueError(f"size_mb must be > 0, got {size_mb}")
    if host_ops < 0:
        raise ValueError(f"host_ops must be >= 0, got {host_ops}")
    requested_layout = layout
    if scenario == "bubble":
        layout = "pp-dp"  # a pipeline bubble only exists with a pipeline
    if scenario == "small-messages" and layout == "fsdp":
        raise ValueError("small-messages models tiny DDP buckets: use layout dp, tp-dp or pp-dp")
    world = int(ranks)
    d, t, p = _degrees(layout, world)
    hw = hardware or Hardware()
    base_model = _model_for(layout, p, model)
    rng = random.Random(f"kineto-comm-synth/{seed}")
    per_host = 1 if single_gpu_hosts else hw.gpus_per_host
    if scenario == "clock-skew" and world <= per_host:
        per_host = max(1, world // 2)  # a skew needs at least two hosts
    spread = (500_000, 1_500_000) if single_gpu_hosts else (20_000, 400_000)
    offsets = _offsets(world, per_host, rng, scenario == "clock-skew", spread)

    def plan_for(problem: bool) -> Plan:
        groups = make_groups(layout, world, t, p, hw, per_host)
        kw: dict[str, Any] = {}
        m = base_model
        if problem:
            if scenario == "exposed-allreduce":
                kw["exposed"] = True
            elif scenario == "straggler":
                kw["straggler"] = straggler
                kw["delay_ns"] = STRAGGLER_DELAY_NS
            elif scenario == "small-messages":
                kw["bucket_bytes"] = SMALL_BUCKET_BYTES
                kw["split_buckets"] = True
            elif scenario == "interference":
                kw["interference"] = INTERFERENCE_SLOWDOWN
            elif scenario == "slow-link":
                for g in groups:
                    if g.name == slow_pg:
                        g.busbw = {c: v / SLOW_LINK_FACTOR for c, v in g.busbw.items()}
            elif scenario == "bubble":
                nmb = min(BUBBLE_MICRO_BATCHES, m.micro_batches)
                tokens = m.micro_batch * m.micro_batches
                m = replace(m, micro_batches=nmb, micro_batch=max(1, tokens // nmb))
        kw.setdefault("bucket_bytes", int(m.bucket_mb * 1024 * 1024))
        return Plan(
            layout=layout, world=world, dp=d, tp=t, pp=p, model=m, hw=hw, groups=groups, **kw
        )

    # A straggler in a later pipeline stage hides in the warm-up bubble, and a slow DP group of
    # a stage that finishes early hides in its cool-down: pick where the problem shows.
    straggler = rng.randrange(d if layout == "pp-dp" else world) if scenario == "straggler" else -1
    slow_role = "pp" if layout == "pp-dp" else "dp"
    cands = [g.name for g in make_groups(layout, world, t, p, hw, per_host) if g.role == slow_role]
    slow_pg = rng.choice(cands) if scenario == "slow-link" else ""

    plan = plan_for(True)
    job = _Job(plan, seed, offsets, per_host, host_ops)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    suffix = ".pt.trace.json.gz" if gzip else ".pt.trace.json"
    names = [f"rank-{r}{suffix}" for r in range(world)]
    files = [_open(out / n, gzip) for n in names]
    try:
        for r, f in enumerate(files):
            dist = {
                "backend": "nccl",
                "rank": r,
                "world_size": world,
                "pg_count": len(plan.groups),
                "pg_config": [g.pg_config() for g in plan.groups_of(r)],
                "nccl_version": NCCL_VERSION,
            }
            # Links at the caller's figure: a device the hardware table does not know.
            name = None if hw.busbw_gbps is None else K.CUSTOM_GPU
            f.write(K.header(dist, per_host, name).encode())
        written = [0] * world
        k = 0
        total = steps
        while k < total:
            job.step(k)
            for r, (st, f) in enumerate(zip(job.states, files, strict=True)):
                data = "".join(st.buf).encode()
                st.buf.clear()
                written[r] += len(data)
                f.write(data)
            if k == 0 and size_mb is not None:
                target = size_mb * 1e6 - 4_000 - 1_500 * per_host
                total = max(1, round(target / max(written[0], 1)))
            k += 1
        for st, f, name in zip(job.states, files, names, strict=True):
            f.write(_footer(st, job, name, per_host).encode())
    finally:
        for f in files:
            f.close()

    truth = _truth(
        scenario,
        requested_layout,
        plan,
        job,
        seed,
        total,
        offsets,
        per_host,
        straggler,
        slow_pg,
        plan_for,
        names,
    )
    (out / "truth.json").write_text(json.dumps(truth, indent=2, sort_keys=False) + "\n")
    return truth


def _footer(st: RankState, job: _Job, name: str, per_host: int) -> str:
    """Metadata events, profiler span and the closing instant, as Kineto ends a trace."""
    t0 = START_NS + st.offset - 200_000
    end = max(s[1] for s in st.step_spans) + st.offset + 100_000
    parts = [
        K.meta_event("process_name", t0, st.pid, 0, "name", "python3.11"),
        K.meta_event("process_labels", t0, st.pid, 0, "labels", "CPU"),
        K.meta_event("process_sort_index", t0, st.pid, 0, "sort_index", st.pid),
    ]
    for dev in range(per_host):
        parts += [
            K.meta_event("process_name", t0, dev, 0, "name", "python3.11"),
            K.meta_event("process_labels", t0, dev, 0, "labels", f"GPU {dev}"),
            K.meta_event("process_sort_index", t0, dev, 0, "sort_index", 16777216 + dev),
        ]
    for s in sorted(st.streams | {COMPUTE_STREAM}):
        parts += [
            K.meta_event("thread_name", t0, st.device, s, "name", f"stream {s} "),
            K.meta_event("thread_sort_index", t0, st.device, s, "sort_index", s),
        ]
    for tid, label in ((st.tids[MAIN], "pt_main_thread"), (st.tids[AUTOGRAD], "pt_autograd_0")):
        parts += [
            K.meta_event("thread_name", t0, st.pid, tid, "name", f"thread {tid} ({label})"),
            K.meta_event("thread_sort_index", t0, st.pid, tid, "sort_index", tid),
        ]
    parts.append(K.span_events(t0, end - t0))
    parts.append(K.footer(end, name, BASE_TIME_NS))
    return "".join(parts)


def _truth(
    scenario: str,
    requested_layout: str,
    plan: Plan,
    job: _Job,
    seed: int,
    steps: int,
    offsets: dict[int, int],
    per_host: int,
    straggler: int,
    slow_pg: str,
    plan_for,
    names: list[str],
) -> dict[str, Any]:
    """Assemble truth.json: configuration, formulas, measured step times and the problems."""
    times = job.step_times()
    step_ns = sum(times) // len(times)
    fixed_ns = step_ns
    fixed_bubble = job.bubble_fraction()
    if scenario not in ("baseline", "clock-skew"):
        # Re-simulate the first few steps without the problem and compare like with like.
        n = min(len(times), MEASURED_STEPS)
        fixed = _Job(plan_for(False), seed, {r: 0 for r in offsets}, per_host)
        # One step more than compared when the job has several: a window ends at the next
        # step's first kernel.
        for k in range(n + 1 if steps > 1 else n):
            fixed.step(k)
            for st in fixed.states:
                st.buf.clear()
        fixed_ns = sum(fixed.step_times()[:n]) // n
        step_ns_cmp = sum(times[:n]) // n
        fixed_bubble = fixed.bubble_fraction()
        impact = max(0, step_ns_cmp - fixed_ns)
    else:
        impact = 0
    all_ranks = list(range(plan.world))
    step_ids = list(range(steps))
    problems: list[dict[str, Any]] = []
    if scenario == "exposed-allreduce":
        problems.append(
            {
                "kind": "exposed_comm",
                "ranks": all_ranks,
                "steps": step_ids,
                "impact_ns_per_step": impact,
                "collective": "_reduce_scatter_base" if plan.layout == "fsdp" else "allreduce",
            }
        )
    elif scenario == "straggler":
        problems.append(
            {
                "kind": "straggler",
                "ranks": [straggler],
                "steps": step_ids,
                "impact_ns_per_step": impact,
                "delay_ns": plan.delay_ns,
            }
        )
    elif scenario == "bubble":
        bf = job.bubble_fraction()
        problems.append(
            {
                "kind": "pipeline_bubble",
                "ranks": all_ranks,
                "steps": step_ids,
                "impact_ns_per_step": impact,
                "bubble_fraction": round(bf, 6),
                "baseline_bubble_fraction": round(fixed_bubble, 6),
                "expected_bubble_fraction": round(
                    pipeline_bubble(plan.pp, plan.model.micro_batches), 6
                ),
                "micro_batches": plan.model.micro_batches,
                "stages": plan.pp,
            }
        )
    elif scenario == "small-messages":
        problems.append(
            {
                "kind": "small_messages",
                "ranks": all_ranks,
                "steps": step_ids,
                "impact_ns_per_step": impact,
                "max_message_bytes": plan.bucket_bytes,
            }
        )
    elif scenario == "slow-link":
        g = next(g for g in plan.groups if g.name == slow_pg)
        problems.append(
            {
                "kind": "slow_link",
                "ranks": list(g.ranks),
                "steps": step_ids,
                "impact_ns_per_step": impact,
                "pg_name": g.name,
                "busbw_gbps": g.busbw_gbps,
                "slowdown": SLOW_LINK_FACTOR,
            }
        )
    elif scenario == "interference":
        # What the slowed kernels added per step on each rank (all profiled steps).
        extra = {st.rank: sum(st.injected) // max(1, len(st.injected)) for st in job.states}
        problems.append(
            {
                "kind": "interference",
                "ranks": [r for r, v in extra.items() if v > 0],
                "steps": step_ids,
                "impact_ns_per_step": impact,
                "slowdown": plan.interference,
                "extra_ns_per_step": {str(r): v for r, v in extra.items()},
            }
        )
    elif scenario == "clock-skew":
        problems.append(
            {
                "kind": "clock_skew",
                "ranks": [r for r, o in offsets.items() if o],
                "steps": step_ids,
                "impact_ns_per_step": 0,
                "offsets_ns": {str(r): o for r, o in offsets.items()},
            }
        )
    expected, per_rank = _expected(plan)
    truth: dict[str, Any] = {
        "generator": "kineto_comm.synth",
        "scenario": scenario,
        "layout": plan.layout,
        "requested_layout": requested_layout,
        "world_size": plan.world,
        "seed": seed,
        "steps": steps,
        "profiler_steps": [f"ProfilerStep#{k}" for k in step_ids],
        "parallelism": {"dp": plan.dp, "tp": plan.tp, "pp": plan.pp},
        "ranks_per_host": per_host,
        "clock_offsets_ns": {str(r): o for r, o in offsets.items()},
        "model": plan.model.to_dict(),
        "hardware": plan.hw.to_dict(),
        "process_groups": [
            {
                **g.pg_config(),
                "role": g.role,
                "stream": g.stream,
                "busbw_gbps": g.busbw_gbps,
                "busbw_by_collective": dict(g.busbw),
            }
            for g in plan.groups
        ],
        "compute_stream": COMPUTE_STREAM,
        "expected": expected,
        "expected_per_rank": per_rank,
        "step_time_ns": step_ns,
        "fixed_step_time_ns": fixed_ns,
        "problems": problems,
        "files": names,
        "base_time_ns": BASE_TIME_NS,
    }
    if plan.pp > 1:
        truth["measured_bubble_fraction"] = round(job.bubble_fraction(), 6)
    return truth
