"""The HTML report's colours: one colour per category, the same in every chart.

Why: a reader learns a colour once. Red meant exposed communication in the step-time bars
and waiting for the last rank in the timelines; now each colour has one meaning wherever it
is drawn (step-time bars, pipeline chart, message-size histograms, timelines, heat map).
"""

from __future__ import annotations

COLORS = {
    # What the device ran.
    "compute": "#4e79a7",  # blue: a compute kernel runs
    "communication": "#f28e2b",  # orange: a communication kernel (any)
    "exposed": "#f28e2b",  # orange: communication with no compute running
    "overlap": "#ffbe7d",  # light orange: communication hidden behind compute
    "memory": "#b07aa1",  # purple: a memcpy or memset
    "idle": "#d3d3d3",  # grey: nothing runs
    # What the ranks did across each other.
    "wait": "#d62728",  # red: inside a collective, waiting for the group's last rank
    "critical": "#111111",  # black: the critical path
    "window": "#fff3cd",  # pale yellow: a finding's window
}
# A kernel kind (kernels.kind) -> its colour's key.
KIND = {"compute": "compute", "communication": "communication", "memcpy": "memory"}
KIND["memset"] = "memory"
