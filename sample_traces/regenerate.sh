#!/usr/bin/env bash
# Regenerate the shipped real captures (CPU-only, gloo). Needs torch==2.13.0.
# Timings differ on every run; event names, counts and shapes do not.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf sample_traces/ddp-4 sample_traces/pp-4 sample_traces/tp-2 sample_traces/fsdp-2 sample_traces/ep-4
python -m kineto_comm.capture --layout ddp --ranks 4 --steps 3 --bucket-cap-mb 0.1 \
    --backend gloo --seed 0 --out sample_traces/ddp-4
python -m kineto_comm.capture --layout pp --ranks 4 --steps 3 --micro-batches 4 \
    --backend gloo --seed 0 --out sample_traces/pp-4
python -m kineto_comm.capture --layout tp --ranks 2 --steps 3 \
    --backend gloo --seed 0 --out sample_traces/tp-2
python -m kineto_comm.capture --layout fsdp --ranks 2 --steps 3 \
    --backend gloo --seed 0 --out sample_traces/fsdp-2
python -m kineto_comm.capture --layout ep --ranks 4 --steps 3 \
    --backend gloo --seed 0 --out sample_traces/ep-4
