"""Kineto chrome-trace text, written the way libkineto's ChromeTraceLogger writes it.

Events are preformatted ``%``-templates (one key group per line, two-space indented, every event
followed by a comma, the final "Record Window End" instant closing the list) so that a trace can
be streamed to disk event by event without building JSON objects. Timestamps are integer
nanoseconds relative to ``baseTimeNanoseconds`` printed as microseconds with three decimals,
exactly like Kineto's ``"ts": {}.{:03}`` format.
"""

from __future__ import annotations

import json

# CUPTI callback ids of the runtime calls we emit (values as found in real traces).
CBID = {
    "cudaLaunchKernel": 211,
    "cudaLaunchKernelExC": 430,
    "cudaEventRecord": 135,
    "cudaStreamWaitEvent": 147,
    "cudaStreamSynchronize": 131,
}

CPU_OP = (
    '\n  {\n    "ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d,\n'
    '    "ts": %d.%03d, "dur": %d.%03d,\n    "args": {\n'
    '      "External id": %d,"Record function id": %d, "Ev Idx": %d\n    }\n  },'
)
SHAPED_OP = (
    '\n  {\n    "ph": "X", "cat": "cpu_op", "name": "%s", "pid": %d, "tid": %d,\n'
    '    "ts": %d.%03d, "dur": %d.%03d,\n    "args": {\n'
    '      "External id": %d,"Record function id": %d, %s, "Ev Idx": %d\n    }\n  },'
)
RPC = (
    '\n  {\n    "ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": %d, "tid": %d,\n'
    '    "ts": %d.%03d, "dur": %d.%03d,\n    "args": {\n'
    '      "External id": %d,"Record function id": %d, %s, "Ev Idx": %d, "Seq": %d\n    }\n  },'
)
RUNTIME = (
    '\n  {\n    "ph": "X", "cat": "cuda_runtime", "name": "%s", "pid": %d, "tid": %d,\n'
    '    "ts": %d.%03d, "dur": %d.%03d,\n    "args": {\n'
    '      "External id": %d,      "cbid": %d, "correlation": %d\n    }\n  },'
)
FLOW_S = (
    '\n  {\n    "ph": "s", "id": %d, "pid": %d, "tid": %d, "ts": %d.%03d,\n'
    '    "cat": "ac2g", "name": "ac2g"\n  },'
)
FLOW_F = (
    '\n  {\n    "ph": "f", "id": %d, "pid": %d, "tid": %d, "ts": %d.%03d,\n'
    '    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  },'
)
KERNEL = (
    '\n  {\n    "ph": "X", "cat": "kernel", "name": "%s", "pid": %d, "tid": %d,\n'
    '    "ts": %d.%03d, "dur": %d.%03d,\n    "args": {\n'
    '      "External id": %d,      "queued": 0, "device": %d, "context": 1,'
    '      "stream": %d, "correlation": %d,      %s\n    }\n  },'
)
GPU_ANN = (
    '\n  {\n    "ph": "X", "cat": "gpu_user_annotation", "name": "%s", "pid": %d, "tid": %d,\n'
    '    "ts": %d.%03d, "dur": %d.%03d,\n    "args": {\n      "External id": %d\n    }\n  },'
)
META = (
    '\n  {\n    "name": "%s", "ph": "M", "ts": %d.%03d, "pid": %s, "tid": %s,\n'
    '    "args": {\n      "%s": %s\n    }\n  },'
)


def launch_tail(regs: int, smem: int, grid: tuple[int, int, int], block: int, sms: int) -> str:
    """The static part of a kernel's args (launch configuration and occupancy estimates)."""
    blocks = grid[0] * grid[1] * grid[2]
    bps = blocks / sms
    warps = bps * block / 32
    occ = min(100, int(round(100 * min(warps, 64) / 64)))
    return (
        f'"registers per thread": {regs},      "shared memory": {smem},'
        f'      "blocks per SM": {bps:.6f},      "warps per SM": {warps:.6f},'
        f'      "grid": [{grid[0]}, {grid[1]}, {grid[2]}],      "block": [{block}, 1, 1],'
        f'      "est. achieved occupancy %": {occ}'
    )


def host_ops(count: int, batch: int, seq: int, hidden: int) -> tuple[tuple[str, str], ...]:
    """`count` CPU ops that launch nothing (the view and metadata ops around a linear layer's
    GEMM, repeated as needed), each with the arguments torch.profiler(record_shapes=True)
    writes: (name, args) each. Real traces carry several such ops per kernel (the 8-rank DDP
    capture on H100 of bench/README.md: 7.6 CPU ops per kernel, 62% of its bytes)."""
    x, w = [batch, seq, hidden], [hidden, hidden]
    t = batch * seq
    ops = [
        (
            "aten::view",
            ["", ""],
            ["c10::BFloat16", "int[]"],
            [[seq * hidden, hidden, 1], []],
            [x, [2]],
        ),
        ("aten::t", [""], ["c10::BFloat16"], [[hidden, 1]], [w]),
        (
            "aten::transpose",
            ["", "0", "1"],
            ["c10::BFloat16", "Scalar", "Scalar"],
            [[hidden, 1], [], []],
            [w, [], []],
        ),
        (
            "aten::as_strided",
            ["", "", "", ""],
            ["c10::BFloat16", "int[]", "int[]", ""],
            [[hidden, 1], [], [], []],
            [w, [2], [2], []],
        ),
        (
            "aten::empty",
            ["", "", "", "", "", ""],
            ["int[]", "ScalarType", "", "Device", "Scalar", ""],
            [[], [], [], [], [], []],
            [[2], [], [], [], [], []],
        ),
        (
            "aten::reshape",
            ["", ""],
            ["c10::BFloat16", "int[]"],
            [[hidden, 1], []],
            [[t, hidden], [3]],
        ),
        (
            "aten::_unsafe_view",
            ["", ""],
            ["c10::BFloat16", "int[]"],
            [[hidden, 1], []],
            [[t, hidden], [3]],
        ),
    ]
    out = []
    for i in range(count):
        name, concrete, types, strides, dims = ops[i % len(ops)]
        args = (
            f'"Concrete Inputs": {json.dumps(concrete)}, "Input type": {json.dumps(types)}, '
            f'"Input Strides": {json.dumps(strides)}, "Input Dims": {json.dumps(dims)}'
        )
        out.append((name, args))
    return tuple(out)


def coll_kernel_tail(meta: dict[str, object]) -> str:
    """Collective fields Kineto copies from record_param_comms onto the NCCL kernel."""
    keys = (
        "Collective name",
        "In msg nelems",
        "Out msg nelems",
        "Group size",
        "dtype",
        "In split size",
        "Out split size",
        "Process Group Name",
        "Process Group Description",
        "Process Group Ranks",
    )
    return ", ".join(f'"{k}": {json.dumps(meta[k])}' for k in keys)


def rpc_args(meta: dict[str, object], extra: dict[str, object] | None = None) -> str:
    """record_param_comms args (without ids), in the hash order the real trace shows."""
    keys = (
        "Process Group Name",
        "Global rank stride",
        "Out msg nelems",
        "Process Group Ranks",
        "Group size",
        "Global rank start",
        "In msg nelems",
        "In split size",
        "Out split size",
        "dtype",
        "Process Group Description",
        "Collective name",
    )
    parts = [f'"{k}": {json.dumps(meta[k])}' for k in keys]
    for k, v in (extra or {}).items():
        parts.append(f'"{k}": {json.dumps(v)}')
    return ", ".join(parts)


def format_ranks(ranks: list[int], truncate: int = 30) -> str:
    """torch's format_list: "[0, 1, 2]", truncated to the first 30 entries plus ", ..."."""
    if len(ranks) > truncate:
        return "[" + ", ".join(str(r) for r in ranks[:truncate]) + ", ...]"
    return "[" + ", ".join(str(r) for r in ranks) + "]"


H100 = {
    "name": "NVIDIA H100 80GB HBM3",
    "totalGlobalMem": 85031714816,
    "computeMajor": 9,
    "computeMinor": 0,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "numSms": 132,
    "regsPerMultiprocessor": 65536,
    "sharedMemPerBlockOptin": 232448,
    "sharedMemPerMultiprocessor": 233472,
}


# The device name of a job whose links run at a figure of the caller's (Hardware.busbw_gbps)
# rather than the hardware table's: no entry matches it, so nothing is expected of its links.
CUSTOM_GPU = "kineto-comm synthetic GPU"


def header(dist_info: dict[str, object], n_devices: int, name: str | None = None) -> str:
    """Everything before the first event: schema, devices (an H100's properties, named
    `name` when given), distributedInfo, "traceEvents": [."""
    g = H100 if name is None else {**H100, "name": name}
    devs = []
    for i in range(n_devices):
        devs.append(
            "    {\n"
            f'      "id": {i}, "name": "{g["name"]}", "totalGlobalMem": {g["totalGlobalMem"]},\n'
            f'      "computeMajor": {g["computeMajor"]}, "computeMinor": {g["computeMinor"]},\n'
            f'      "maxThreadsPerBlock": {g["maxThreadsPerBlock"]}, '
            f'"maxThreadsPerMultiprocessor": {g["maxThreadsPerMultiprocessor"]},\n'
            f'      "regsPerBlock": {g["regsPerBlock"]}, "warpSize": {g["warpSize"]},\n'
            f'      "sharedMemPerBlock": {g["sharedMemPerBlock"]}, "numSms": {g["numSms"]}\n'
            f'    , "regsPerMultiprocessor": {g["regsPerMultiprocessor"]}, '
            f'"sharedMemPerBlockOptin": {g["sharedMemPerBlockOptin"]}, '
            f'"sharedMemPerMultiprocessor": {g["sharedMemPerMultiprocessor"]}\n'
            "    }"
        )
    return (
        '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n'
        + ",\n".join(devs)
        + "\n  ],\n"
        + '  "distributedInfo": '
        + json.dumps(dist_info)
        + ',\n  "traceEvents": ['
    )


def footer(end_ns: int, trace_name: str, base_ns: int) -> str:
    """The closing instant event and the trailing top-level keys."""
    return (
        '\n  {\n    "name": "Record Window End", "ph": "i", "s": "g",\n'
        f'    "pid": "", "tid": "", "ts": {end_ns // 1000}.{end_ns % 1000:03d}\n  }}\n  ],\n'
        f'  "traceName": {json.dumps(trace_name)},\n  "displayTimeUnit": "ms",\n'
        f'  "baseTimeNanoseconds": {base_ns}\n}}\n'
    )


def meta_event(
    name: str, ts_ns: int, pid: int | str, tid: int | str, key: str, value: object
) -> str:
    """One ``ph: M`` metadata event."""
    pid_s = json.dumps(pid)
    tid_s = json.dumps(tid)
    return META % (name, ts_ns // 1000, ts_ns % 1000, pid_s, tid_s, key, json.dumps(value))


def span_events(start_ns: int, dur_ns: int) -> str:
    """The profiler's own span ("PyTorch Profiler (0)") and iteration-start instant."""
    return (
        '\n  {\n    "ph": "X", "cat": "Trace", '
        f'"ts": {start_ns // 1000}.{start_ns % 1000:03d}, '
        f'"dur": {dur_ns // 1000}.{dur_ns % 1000:03d},\n'
        '    "pid": "Spans", "tid": "PyTorch Profiler",\n    "name": "PyTorch Profiler (0)",\n'
        '    "args": {\n      "Op count": 0\n    }\n  },'
        + meta_event("process_sort_index", start_ns, "Spans", 0, "sort_index", 536870912)
        + '\n  {\n    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",\n'
        '    "pid": "Traces", "tid": "Trace PyTorch Profiler", '
        f'"ts": {start_ns // 1000}.{start_ns % 1000:03d}\n  }},'
    )
