"""Capture the `launch-eager/` and `launch-graph/` traces of this folder (README.md).

The same small forward pass (a stack of 256-wide linear layers and ReLUs, a batch of 32:
kernels of a few microseconds, launch-bound in eager mode) run eagerly, then replayed
from a CUDA graph, 10 passes per step, a synchronisation at each step's end. The graph
launches every kernel of a pass at once: the step the device reaches when the CPU never
holds it back, the ground truth for SYNC106's saving on the eager trace.

    python capture_graphs.py OUT_DIR        # needs torch with CUDA; ~30 seconds

Only torch is needed (the device image has no kineto-comm install).
"""

from __future__ import annotations

import sys
from pathlib import Path

from capture_contention import _export  # this folder's other capture script

LAYERS = 20
WIDTH = 256
BATCH = 32
PASSES = 10  # forward passes per step
STEPS = 3  # recorded steps (after one skipped and one warm-up step)


def main(root: Path) -> None:
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers).cuda().eval()
    x = torch.randn(BATCH, WIDTH, device="cuda")

    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            model(x)
    torch.cuda.synchronize()

    def eager() -> None:
        model(x)

    for name, run in (("launch-eager", eager), ("launch-graph", graph.replay)):
        with torch.no_grad():
            for _ in range(3):
                run()
            torch.cuda.synchronize()
            with profile(
                activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                schedule=schedule(wait=1, warmup=1, active=STEPS, repeat=1),
                record_shapes=True,
            ) as prof:
                for _ in range(STEPS + 2):
                    for _ in range(PASSES):
                        run()
                    torch.cuda.synchronize()
                    prof.step()
        out = root / name
        out.mkdir(parents=True, exist_ok=True)
        _export(prof, out / "rank-0.pt.trace.json.gz")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
