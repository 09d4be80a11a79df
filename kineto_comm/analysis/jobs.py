"""Whether the rank files can be one job: cross-rank numbers between files of different jobs
are meaningless (on three HTA files of three jobs, a skew of 172 billion ms).

Files whose time ranges do not overlap cannot be ranks of one job: the ranks of a job are
profiled over the same steps, so every rank's activity overlaps some other's (allowing for
clock offsets of up to MAX_OFFSET_NS between hosts). Files claiming different world sizes
are already reported by the rank assignment (kineto_comm.load.discover). Files whose
process-group configs give one group name different ranks are said to be so too: PyTorch
names groups in the order every rank creates them, so one name is one group in a job
(unless groups were created locally, by their members only: hence a warning, not a refusal).
"""

from __future__ import annotations

import polars as pl

# Hosts' clocks differ by milliseconds at most (NTP); more than this between two ranks'
# activity is not one job.
MAX_OFFSET_NS = 1_000_000_000


def separate_jobs(totals: pl.DataFrame) -> list[str]:
    """One line per problem that says the files cannot be one job (none: they can).
    `totals`: rank, start_ns, end_ns (one row per rank, its own clock)."""
    spans = totals.select("rank", "start_ns", "end_ns").drop_nulls().sort("start_ns", "rank")
    if spans.height < 2:
        return []
    reach = pl.col("end_ns").cum_max().shift(1) + MAX_OFFSET_NS
    runs = spans.with_columns(job=(pl.col("start_ns") > reach).fill_null(False).cum_sum())
    if runs["job"].n_unique() == 1:
        return []
    sets = (
        runs.group_by("job", maintain_order=True)
        .agg(pl.col("rank").sort())
        .get_column("rank")
        .to_list()
    )
    shown = "; ".join(", ".join(map(str, ranks)) for ranks in sets)
    return [
        f"files cannot be one job: the time ranges of {len(sets)} sets of ranks do not overlap"
        f" (ranks {shown}); no cross-rank analysis (skews, waits, stragglers, offsets)"
    ]


def conflicting_groups(digests: dict[int, dict[str, int]]) -> list[str]:
    """One line per process-group name whose config lists different ranks in different
    files (`digests`: rank -> pg_name -> digest of its ranks, per_rank.group_digests)."""
    seen: dict[str, dict[int, list[int]]] = {}
    for rank in sorted(digests):
        for name, digest in digests[rank].items():
            seen.setdefault(name, {}).setdefault(digest, []).append(rank)
    out = []
    for name in sorted(seen):
        variants = seen[name]
        if len(variants) < 2:
            continue
        firsts = sorted(ranks[0] for ranks in variants.values())
        out.append(
            f"process group {name!r} lists different ranks in the files of ranks "
            f"{', '.join(map(str, firsts))} ({len(variants)} versions): the files may come "
            "from different jobs, or the groups were named per rank"
        )
    return out
