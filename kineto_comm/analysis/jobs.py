"""Which rank files are one job: cross-rank numbers between files of different jobs are
meaningless (on three HTA files of three jobs, a skew of 172 billion ms; on gloo ranks 0-1
and H100 ranks 2-3 of two runs, an H100 rank charged with waits for a gloo rank).

Files of one job share a backend and a world size (a file that does not say is taken to be
of the job most files name), and their time ranges overlap: the ranks of a job are profiled
over the same steps, so every rank's activity overlaps some other's (allowing for clock
offsets of up to MAX_OFFSET_NS between hosts). Where the files make several jobs, the one
decision (`split_jobs`) is that one job is analysed, the one of most ranks (then of the
lowest rank), and the others' files are left out with the reason: then no table, finding
or replay can compare ranks of two jobs. Files whose process-group configs give one group
name different ranks are said to be so too: PyTorch names groups in the order every rank
creates them, so one name is one group in a job (unless groups were created locally, by
their members only: hence a warning, not a refusal).
"""

from __future__ import annotations

import datetime as dt

import polars as pl

# Hosts' clocks differ by milliseconds at most (NTP); more than this between two ranks'
# activity is not one job.
MAX_OFFSET_NS = 1_000_000_000

# What tells jobs apart, as the warning names it.
# The columns that tell jobs apart before time ranges do.
_SIGNED = ("backend", "world_size")
_TRAITS = {"backend": "backend", "device": "device", "world_size": "world size"}


def split_jobs(files: pl.DataFrame) -> pl.DataFrame:
    """`files` (rank, backend, device, world_size, start_ns, end_ns: one row per rank file,
    its own clock) with `job`: 0 for the job analysed (most ranks, then the lowest rank),
    1, 2, ... for the others in the same order. Backend and world size tell jobs apart
    (a missing one is the most common value's), then time ranges that do not overlap."""
    if files.height == 0:
        return files.with_columns(job=pl.lit(0, dtype=pl.Int64))
    # One plan (issue 81): a missing backend or world size is the most common value's.
    said = (pl.col(n).drop_nulls().mode().sort().first() for n in _SIGNED)
    sign = [pl.col(n).fill_null(v).alias(f"_{n}") for n, v in zip(_SIGNED, said, strict=True)]
    signed = files.lazy().with_row_index("_row").with_columns(sign)
    keys = ["_backend", "_world_size"]
    # Within a signature, files in start order: a new job where one starts after every
    # earlier one has ended (plus the largest clock offset). Files without times join the
    # first run.
    reach = pl.col("end_ns").cum_max().shift(1).over(keys, order_by="start_ns") + MAX_OFFSET_NS
    runs = signed.with_columns(
        _run=(pl.col("start_ns") > reach).fill_null(False).cum_sum().over(keys, order_by="start_ns")
    )
    jobs = (
        runs.group_by(*keys, "_run")
        .agg(_size=pl.len(), _low=pl.col("rank").min())
        .sort(["_size", "_low"], descending=[True, False])
        .with_row_index("job")
        .with_columns(pl.col("job").cast(pl.Int64))
    )
    return (
        runs.join(jobs, on=[*keys, "_run"], how="left")
        .sort("_row")
        .drop("_row", "_run", "_size", "_low", *keys)
        .collect()
    )


def jobs_warning(files: pl.DataFrame) -> list[str]:
    """One line when `files` (split_jobs' output) hold several jobs: each job's ranks and
    traits (backend, device, world size, time range), what tells them apart, and that only
    job 0 is analysed (none: one job)."""
    if files.height == 0 or files["job"].n_unique() == 1:
        return []
    per = (
        files.group_by("job")
        .agg(
            pl.col("rank").sort(),
            *[pl.col(n).drop_nulls().unique().sort().cast(pl.String) for n in _TRAITS],
            pl.col("start_ns").min(),
            pl.col("end_ns").max(),
        )
        .sort("job")
        .to_dicts()
    )
    differ = [
        word for name, word in _TRAITS.items() if len({tuple(j[name]) for j in per if j[name]}) > 1
    ]
    spans = sorted((j["start_ns"], j["end_ns"]) for j in per if j["start_ns"] is not None)
    if any(b[0] > a[1] + MAX_OFFSET_NS for a, b in zip(spans, spans[1:], strict=False)):
        differ.append("time range")

    def described(job: dict) -> str:
        traits = [f"{word} {'/'.join(job[name])}" for name, word in _TRAITS.items() if job[name]]
        traits.append(_when(job["start_ns"], job["end_ns"]))
        return f"ranks {rank_ranges(job['rank'])} ({', '.join(traits)})"

    left = "; ".join(described(j) for j in per[1:])
    return [
        f"files of {len(per)} jobs (they differ in {', '.join(differ) or 'time range'}):"
        f" analysed {described(per[0])}; left out {left}. No table or finding compares"
        " files of different jobs: analyse each job's files on their own"
    ]


def _when(start: int | None, end: int | None) -> str:
    """A file's time range: UTC wall-clock where its clock is the epoch's, else ns."""
    if start is None or end is None:
        return "no events"
    if start < 10**18:  # before 2001: not a wall clock
        return f"{start}-{end} ns"
    t0 = dt.datetime.fromtimestamp(start / 1e9, dt.UTC)
    return f"{t0:%Y-%m-%d %H:%M:%S} UTC for {(end - start) / 1e9:.3g} s"


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def missing_ranks(ranks: pl.DataFrame) -> list[str]:
    """One line when the files analysed (`ranks`: rank, world_size) are fewer than the
    world size they state: which ranks are present, which are missing, and that every
    cross-rank figure covers the present ones only (none: every rank is here, or no file
    states a world size)."""
    world = ranks.get_column("world_size").max() if ranks.height else None
    if world is None:
        return []
    present = set(ranks.get_column("rank").to_list())
    missing = sorted(set(range(int(world))) - present)  # type: ignore[arg-type]
    if not missing:
        return []
    here = sorted(r for r in present if r < world)  # type: ignore[operator]
    return [
        f"{len(here)} of {world} ranks present (world_size {world}): ranks {rank_ranges(here)};"
        f" missing ranks {rank_ranges(missing)}. Cross-rank figures (waits, skews, stragglers,"
        " the step time and its critical rank, the findings' ranks) cover the present"
        " ranks only"
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
