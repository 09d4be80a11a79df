"""Pieces of the HTML report's SVG charts, shared by its plots (html.py) and its timeline
(html_timeline.py): escaped text, legends, axis ticks.
"""

from __future__ import annotations

import html
import math
from typing import Any

from kineto_comm.render.fmt import fmt_ns


def esc(value: Any) -> str:
    """Any value as HTML text or attribute content (quotes escaped too)."""
    return html.escape("-" if value is None else str(value), quote=True)


def legend_html(items: list[tuple[str, str]]) -> str:
    """An HTML legend: coloured squares with labels."""
    spans = "".join(f'<span><i style="background:{c}"></i>{esc(t)}</span>' for t, c in items)
    return f'<div class="legend">{spans}</div>'


def ticks(max_value: float, n: int = 5) -> list[float]:
    """About `n` round tick values from 0 to max_value."""
    if max_value <= 0:
        return [0.0]
    raw = max_value / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(max_value / step) + 1)]


def tick_label(ns: float) -> str:
    """An escaped axis label: 0 at the origin, else a duration."""
    return "0" if ns == 0 else esc(fmt_ns(ns))
