"""Capture real Flight Recorder dumps of a 4-rank gloo job (torch 2.13, CPU) with one
injected hang, and write them with the truth.

    TORCH_FR_BUFFER_SIZE=64 python3 capture_gloo_hang.py [OUT]   # both faults, 4 ranks each

Each rank runs 4 rounds of an all_reduce on the world group and one on its pair group
(ranks 0-1, 2-3), then 3 more world all_reduces, where the fault is: `skip`: rank 2 skips
the second of them, so its next call pairs with the others' second, and the others wait in
their third for a call rank 2 never makes (it has nothing left to issue: it stops, as a
rank whose thread stopped issuing work does); `size`: rank 2 calls the second with 8
elements where the others use 4. The process group's timeout is 5 s; when a rank's collective
times out (or fails) it writes its FR buffer, pickle (`FAULT/pickle/_dump_N`, as the NCCL
watchdog names it) and JSON (`FAULT/json/_dump_N.json`, `_dump_fr_trace_json`). Rank 2 writes
its dump after the others have timed out. `FAULT/truth.json`: the root rank and the fault.
"""

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

FAULTY = 2
WORLD = 4


def dump(out: Path, rank: int) -> None:
    (out / "pickle" / f"_dump_{rank}").write_bytes(_dump_fr_trace())
    (out / "json" / f"_dump_{rank}.json").write_bytes(_dump_fr_trace_json())


def launch(root: Path) -> None:
    """Both faults, each a 4-rank job of processes on this host."""
    for port, fault in enumerate(("skip", "size"), start=29650):
        out = root / fault
        for sub in ("pickle", "json"):
            (out / sub).mkdir(parents=True, exist_ok=True)
        procs = [
            subprocess.Popen([sys.executable, __file__, fault, str(out), str(r), str(port)])
            for r in range(WORLD)
        ]
        for p in procs:
            p.wait(timeout=120)
        truth = {"fault": fault, "roots": [FAULTY], "torch": torch.__version__}
        (out / "truth.json").write_text(json.dumps(truth) + "\n")


def main() -> None:
    if len(sys.argv) < 3:
        launch(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent))
        return
    fault, out, rank, port = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=5),
    )
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    pair = pairs[rank // 2]
    t = torch.ones(4)
    me = rank == FAULTY
    try:
        for _ in range(4):
            dist.all_reduce(t)
            dist.all_reduce(t, group=pair)
        for i in range(1, 4):
            if fault == "skip" and me and i == 2:
                continue
            x = torch.ones(8 if (fault == "size" and me and i == 2) else 4)
            dist.all_reduce(x)
    except Exception as exc:  # the timeout (or gloo's error) ends the wait
        print(f"rank {rank}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
    if me:
        time.sleep(8)  # the others time out first (as they would waiting for it)
    dump(out, rank)
    os._exit(0)


if __name__ == "__main__":
    main()
