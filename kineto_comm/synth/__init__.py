"""Synthetic multi-rank PyTorch Profiler (Kineto) traces with known ground truth.

``generate(scenario, out_dir, ranks=8, layout="dp", seed=0, size_mb=None, steps=3, gzip=False,
host_ops=0)`` simulates one training job and writes ``rank-{r}.pt.trace.json[.gz]`` per rank plus
``truth.json``. The traces follow the layout current Kineto writes (checked against the real
HTA ``nccl_data`` trace): ``schemaVersion``, ``deviceProperties``, ``distributedInfo`` (backend,
rank, world_size, pg_count, pg_config, nccl_version), ``traceEvents``, ``traceName``,
``displayTimeUnit`` and ``baseTimeNanoseconds``; ``ts``/``dur`` are microseconds with three
decimals relative to the base time. Per rank: ``ProfilerStep#k`` user annotations,
``cpu_op`` + ``cudaLaunchKernel`` + ``kernel`` triples joined by ``ac2g`` flows, and per
collective ``c10d::*`` -> ``record_param_comms`` (full collective args plus ``Seq``, and
``Src Rank``/``Dst Rank`` for send/recv) -> ``nccl:*`` annotation -> ``cudaLaunchKernelExC`` ->
``ncclDevKernel_*`` on the process group's stream carrying the same collective args.
With ``host_ops=n`` each compute op also holds n CPU ops that launch nothing (views,
``aten::empty``) with the ``Input Dims`` / ``Input type`` / ``Input Strides`` / ``Concrete
Inputs`` arguments of ``record_shapes=True``: real captures carry ~7 per kernel, which puts the
kernels per MB of JSON where theirs are (the bench jobs use 7; tests keep files small with 0).
Note: HTA treats every ``*.json`` in a folder as a trace, so point it at the rank files only.

Layouts (Psi = 12*L*h^2 + V*h parameters, B = 2 bytes for bf16, T = b*s tokens):

* ``dp``     DDP: all-reduce of Psi*B per step in 25 MB buckets, launched from the autograd
  thread as gradients become ready, so it overlaps backward compute.
* ``fsdp``   ZeRO-3: per unit (embedding, each block) ``_allgather_base`` in forward and again
  in backward (prefetched one unit ahead), ``_reduce_scatter_base`` after each unit's backward:
  3*(d-1)/d*Psi*B on the wire per rank and step.
* ``tp-dp``  tensor parallel t=2 inside DP groups: 2 all-reduces of b*s*h*B per layer and
  micro-batch in forward and 2 in backward (TP group), DP all-reduce of Psi/t*B.
* ``pp-dp``  p=4 stages (2 when ranks < 8) with 1F1B over m=4p micro-batches, send/recv of
  b*s*h*B activations forward and gradients backward (``ncclDevKernel_SendRecv``), DP
  all-reduce of each stage's parameters; the idle warm-up/cool-down gives the
  (p-1)/(m+p-1) bubble.

Durations: compute kernels FLOPs / 300 TFLOP/s, memory-bound kernels bytes / 2 TB/s; a
collective of n ranks takes latency (12 us) + factor * bytes / busbw (100 GB/s) with the
nccl-tests factors 2(n-1)/n (all-reduce), (n-1)/n (all-gather, reduce-scatter), 1 (send/recv).
Each rank's NCCL kernel starts when that rank arrives; the instance ends on all ranks at
max(arrival) + duration.

Scenarios (one injected problem each):

* ``baseline``           healthy, gradient communication overlapped.
* ``exposed-allreduce``  gradient all-reduces (fsdp: reduce-scatters) launched after backward.
* ``straggler``          one seeded rank's data loader is 2 ms late every step.
* ``bubble``             pipeline (forces pp-dp) with only 2 micro-batches, same tokens.
* ``small-messages``     DDP buckets of 48 KiB: thousands of latency-bound all-reduces per step.
* ``slow-link``          one seeded data-parallel group at 1/5 of the bus bandwidth.
* ``clock-skew``         per-host clock offsets (8 ranks per host, 2 hosts when ranks <= 8;
  host of rank 0 has offset 0, others +-20..400 us) added to every timestamp of the rank.

truth.json fields: ``scenario``, ``layout`` (and ``requested_layout``), ``world_size``,
``seed``, ``steps`` and ``profiler_steps``, ``parallelism`` {dp, tp, pp}, ``ranks_per_host``,
``clock_offsets_ns`` {rank: ns}, ``model`` (config and Psi), ``hardware``, ``process_groups``
(pg_config plus role, stream and busbw), ``compute_stream``, ``expected`` (per role: collective,
calls_per_step, bytes_per_step and the formula; bytes count the full buffer: all-reduce and
send/recv nelems*B, all-gather Out, reduce-scatter In), ``expected_per_rank`` (the same per rank
and pg_name), ``step_time_ns`` (measured), ``fixed_step_time_ns`` (the same job without the
problem), both with the product's definition of a step (docs/tables.md, "The model of time": a
step lasts as long as the longest rank's device window, from the step's first kernel to the
next step's first kernel; the mean over the complete steps, all but the last when there are
several), ``problems`` (list of {kind, ranks, steps, impact_ns_per_step, ...} with ``delay_ns``
for straggler, ``bubble_fraction`` for pipeline_bubble, ``pg_name`` for slow_link,
``offsets_ns`` for clock_skew; kinds exposed_comm, straggler, pipeline_bubble, small_messages,
slow_link, clock_skew) and ``measured_bubble_fraction`` for pipelines. ``impact_ns_per_step``
is the step time that fixing the problem recovers: the measured step time minus that of the
same job simulated without the problem (0 for clock skew). Output is byte-identical for the
same arguments.
"""

from .config import Hardware, ModelConfig
from .generate import LAYOUTS, SCENARIOS, generate

__all__ = ["LAYOUTS", "SCENARIOS", "Hardware", "ModelConfig", "generate"]
