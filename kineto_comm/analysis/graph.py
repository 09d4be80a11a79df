"""Walks over a graph of ranks (an edge per pair of ranks that share calls).

Used where one rank is placed from another, hop by hop: clock offsets along the tightest
links (kineto_comm.analysis.align) and pipeline stages along point-to-point peers
(kineto_comm.analysis.pipeline). The graphs have a node per rank, so they are walked in
Python: microseconds for thousands of ranks, where a Polars query per hop cost ~0.7-0.85
ms (bench/README.md, thirty-ninth session).
"""

from __future__ import annotations


def walk(links: dict[int, list[int]], starts: list[int]) -> list[tuple[int, int]]:
    """Breadth first from `starts` (all at once) over `links`: (rank, the rank it was
    reached from) for each rank not among the starts, nearest first."""
    seen = set(starts)
    frontier = list(starts)
    order: list[tuple[int, int]] = []
    while frontier:
        ahead = []
        for prev in frontier:
            for rank in links.get(prev, ()):
                if rank not in seen:
                    seen.add(rank)
                    order.append((rank, prev))
                    ahead.append(rank)
        frontier = ahead
    return order
