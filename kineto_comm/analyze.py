"""`analyze(paths) -> Report`: the one entry point the CLI, the tests and users' scripts call.

Files are found and decoded per rank (in worker processes when there are several), ranks
are assigned, and the per-rank tables are merged. A file that cannot be used becomes an
entry in `Report.errors` and the other ranks are still analysed. Then, as in `kineto-comm
report`, the model comparison is added (`model=`) and the rules run (the same selection,
config file and options), so a script gets the findings the CLI prints.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from kineto_comm import budget, cache, report
from kineto_comm.analysis.crossrank import cross_rank
from kineto_comm.analysis.jobs import (
    conflicting_groups,
    jobs_warning,
    missing_ranks,
    rank_ranges,
    split_jobs,
)
from kineto_comm.analysis.match import ranks_in_several_groups, ungrouped_warning
from kineto_comm.errors import UsageError
from kineto_comm.findings import parse_severity
from kineto_comm.load.decode import empty_trace
from kineto_comm.load.discover import RankClaim, assign_ranks, discover
from kineto_comm.model.names import check_comm_patterns
from kineto_comm.model.steps import one_step_warning
from kineto_comm.per_rank import SPILLED, TABLES, RankTables, spill, tabulate
from kineto_comm.rank_store import Part, RankStore, SpillFolder
from kineto_comm.render.json_doc import document, render_json
from kineto_comm.timings import begin, stage
from kineto_comm.workers import (
    DIED,
    Outcome,
    Settings,
    run_here,
    run_local,
    run_threads,
    unpack,
    work_packed,
)


class Report(report.Report):
    """What `analyze()` returns (`kineto_comm.Report`): report.Report's tables, errors and
    findings, and their JSON document. Renderers and rules read report.Report, below them;
    the document's methods live up here, so that report.py never imports a renderer."""

    def to_dict(self, fail_on: str = "error") -> dict[str, Any]:
        """The JSON document `kineto-comm report --format json` writes, as Python objects
        (docs/json.md; field names are stable). `fail_on` sets the summary's verdict."""
        return document(self, parse_severity(fail_on))

    def to_json(self, fail_on: str = "error") -> str:
        """The text `kineto-comm report --format json` writes (to_dict() as strict JSON)."""
        return render_json(self, parse_severity(fail_on))


# Rows per contiguous chunk of a merged per-rank table (steps, totals): see _contiguous.
CHUNK_ROWS = 1_000_000


def _run(
    files: list[Path],
    plan: budget.Plan,
    settings: Settings,
    dask_scheduler: str | None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Outcome]:
    """Per-rank work, batch by batch (budget.batches): in this process (one thread, or
    several for a small job), with local worker processes, or on a Dask cluster."""
    names = [str(f) for f in files]
    batches = [list(b) for b in plan.batches]
    if dask_scheduler:
        return _run_dask(names, batches, settings, dask_scheduler)
    if plan.jobs > 1 and len(batches) > 1:
        runner = run_threads if plan.threads else run_local
        return runner(names, batches, plan.jobs, settings, progress)
    return run_here(names, batches, settings, progress)


def _run_dask(
    names: list[str], batches: list[list[int]], settings: Settings, address: str
) -> list[Outcome]:
    """Send per-rank work to an existing Dask cluster (files must be on shared storage).
    The workers may not see this machine's disk: kernels to keep in files are written here."""
    try:
        from distributed import Client
    except ImportError as exc:
        raise UsageError(
            "--dask-scheduler needs the 'distributed' package: pip install 'kineto-comm[dask]'"
        ) from exc
    try:
        client = Client(address, timeout="30s")
    except OSError as exc:
        raise UsageError(f"cannot reach the Dask scheduler at {address} ({exc})") from exc
    results: list[Outcome] = [("error", DIED)] * len(names)
    with client:
        remote = replace(settings, spill_dir=None)
        paths = [[names[i] for i in batch] for batch in batches]
        futures = client.map(work_packed, paths, [remote] * len(paths), pure=False)
        for batch, future in zip(batches, futures, strict=True):
            # One batch at a time: never all ranks' IPC bytes at once.
            outcomes = unpack(future.result())
            future.release()
            for i, (status, payload) in zip(batch, outcomes, strict=True):
                if status == "ok" and settings.spill_dir is not None:
                    payload = spill(payload, settings.spill_dir)
                results[i] = (status, payload)
        return results


def _spill_folder() -> SpillFolder | None:
    try:
        return SpillFolder()
    except OSError:  # no writable temporary folder: kernels stay in memory
        return None


def _tables_or_errors(
    files: list[Path], outcome: list[Outcome], errors: list[tuple[str, str]]
) -> list[RankTables]:
    """The tables of the files that were analysed; the others' problems go to `errors`.
    `outcome` is emptied: from here on only the returned list refers to the tables."""
    results: list[RankTables] = []
    for file, (status, payload) in zip(files, outcome, strict=True):
        if status == "ok":
            results.append(payload)
        else:
            errors.append((str(file), payload))
    outcome.clear()
    return results


def _contiguous(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The frames stacked into one table of a few contiguous chunks; `frames` is emptied.

    A table left in per-rank chunks is copied whole by every later operation that needs it
    contiguous (a window, a multi-column sort), and that copy stays with its result (+0.16
    GiB in the rules at 64 x 250 MB). Copying the whole table at once would hold it twice:
    the steps table of 4096 ranks of 950 steps is 0.44 GiB. So ranks are stacked about
    CHUNK_ROWS rows at a time, and each group's per-rank frames are let go once copied
    (1.19 -> 1.14 GiB at 4096 ranks). Only a table above CHUNK_ROWS rows keeps more than one
    chunk, and so pays the later copies again."""
    if not frames:
        return pl.DataFrame()
    chunks, group, held = [], [], 0
    for i, frame in enumerate(frames):
        group.append(frame)
        held += frame.height
        frames[i] = None  # type: ignore[call-overload]
        if held >= CHUNK_ROWS or i == len(frames) - 1:
            chunks.append(pl.concat(group, how="vertical_relaxed", rechunk=True))
            group, held = [], 0
    frames.clear()
    if len(chunks) == 1:
        return chunks[0]
    return pl.concat(chunks, how="vertical_relaxed", rechunk=False)


def _part(r: RankTables, name: str, frame: pl.DataFrame) -> Part:
    """Rank `r`'s rows of table `name`: the file a worker wrote them to, else `frame`."""
    if name in r.files:
        path, layout = r.files[name], r.meta.get("layouts", {}).get(name)
        return Part(r.meta["rows"][name], path=path, rank=r.rank, held=r.held, layout=layout)
    return Part(rows=frame.height, frame=frame, rank=r.rank)


def _store(kept: list[RankTables], name: str, frames: list[pl.DataFrame], folder: Any) -> RankStore:
    """Every rank's rows of table `name` (`frames`: each kept file's, emptied here): one
    contiguous frame, or, where a rank's rows are in a file (a big job), one part per rank."""
    if not any(name in r.files for r in kept):
        return RankStore.from_frame(_contiguous(frames))
    parts = [_part(r, name, f) for r, f in zip(kept, frames, strict=True)]
    frames.clear()
    return RankStore(parts, folder=folder)


def analyze(
    paths: str | Path | list[str | Path],
    *,
    comm_patterns: tuple[str, ...] | list[str] = (),
    jobs: int | None = None,
    align: bool = True,
    ranks_per_host: int | None = None,
    cache_dir: str | Path | None = None,
    dask_scheduler: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    memory_limit: int | str | None = None,
    model: str | Path | None = None,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    rules: Sequence[Any] = (),
    rule_options: Mapping[str, Mapping[str, Any]] | None = None,
    config: str | Path | None = None,
    network: str | None = None,
) -> Report:
    """Analyse the trace files under `paths` (files or directories).

    comm_patterns: extra regular expressions for kernel names that are communication
        (e.g. DeepEP `dispatch|combine`), added to the NCCL/RCCL defaults.
    jobs: batches of rank files analysed at once (default: the number of cores, at most
        one per file; 1 runs everything in this process): threads of this process for a
        small job, else worker processes (kineto_comm.workers, budget.THREADS_BELOW,
        budget.batches).
    align: estimate per-rank clock offsets from matched collectives and put all times on
        rank 0's clock (docs/tables.md `offsets`); False keeps each trace's own clock.
    ranks_per_host: ranks r // ranks_per_host share a host and its clock (one offset per
        host); default: read from the traces (host names, device ids); 1: a clock per rank.
    cache_dir: keep per-rank tables there (Parquet, keyed by file content and tool version)
        and reuse them on the next run.
    dask_scheduler: address of a Dask distributed scheduler to run the per-rank work on
        (default: $KINETO_COMM_DASK_SCHEDULER; trace paths must be readable by the workers).
    progress: called as progress(files_done, files_total) while rank files are analysed.
    memory_limit: bytes (or text such as "8G") the local analysis may use (default:
        $KINETO_COMM_MEMORY_LIMIT, else three quarters of the available memory). It caps
        the workers running at once and the size of the pieces each trace is decoded in
        (see kineto_comm.budget); results do not depend on it.
    model: a model config (TOML with a [model] table, docs/analytic-model.md): fills
        `model_comparison` (expected vs measured communication) before the rules run.
    select, ignore: rules to run / skip by code, prefix or name, added to the config
        file's (default: every rule; `ignore=["ALL"]` runs none). docs/rules.md.
    rules: custom rules: .py or .toml files, importable module names, or Rule objects.
    rule_options: {code or name: {option: value}}, over the config file's options.
    config: the config file (default: the first kineto-comm.toml, or pyproject.toml with
        [tool.kineto-comm], from the current directory upward, as the CLI reads it).
    network: the link between hosts, a name of the hardware table (`400G-IB`, ...;
        docs/hardware.md), over the config's `[hardware] network`: what a group across
        hosts should reach. Without one, only groups inside a host have an expectation.

    The rules, their options and the model are read before any trace, so a mistake in
    them is a UsageError at once. The findings, ranked, are `Report.findings`.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    with stage("rules setup"):
        checks, cfg = _rule_set(select, ignore, rules, rule_options, config)
    ranks_per_host = ranks_per_host if ranks_per_host is not None else cfg.ranks_per_host
    hw_table, network, gpu_model = _hardware(cfg.hardware, network, cfg.path)
    model_config = _model(model)
    patterns = tuple(comm_patterns)
    check_comm_patterns(patterns)
    dask_scheduler = dask_scheduler or os.environ.get("KINETO_COMM_DASK_SCHEDULER") or None
    finding = begin("discover")
    files, missing = discover(list(paths))
    errors: list[tuple[str, str]] = [(e.file, e.problem) for e in missing]
    if jobs is not None and jobs < 1:
        raise UsageError(f"jobs must be at least 1 (got {jobs})")
    workers = jobs if jobs is not None else min(os.cpu_count() or 1, len(files))
    stated = memory_limit if memory_limit is not None else os.environ.get(budget.ENV)
    limit = budget.parse_size(stated) if isinstance(stated, str) else stated
    if limit is not None and limit <= 0:
        raise UsageError(f"memory limit must be more than 0 bytes (got {stated!r})")
    budgeted = budget.plan(files, budget.default_limit() if limit is None else limit, workers)
    workers = budgeted.jobs
    finding()
    cache_arg = None if cache_dir is None else str(cache_dir)
    notes = list(budgeted.warnings)
    if cache_dir is not None and (why := cache.unwritable(Path(cache_dir))):
        notes.append(f"cache {cache_dir} cannot be written ({why}): nothing is cached")
        cache_arg = None
    folder = _spill_folder() if budgeted.spill else None
    settings = Settings(
        patterns, cache_arg, budgeted.piece_bytes, None if folder is None else str(folder.path)
    )
    with stage("per-rank"):
        outcome = _run(files, budgeted, settings, dask_scheduler, progress)
    merging = begin("merge")
    results = _tables_or_errors(files, outcome, errors)
    assignment = assign_ranks([RankClaim(r.file, r.rank, r.world_size) for r in results])
    errors.extend((e.file, e.problem) for e in assignment.rejected)
    kept = [r.with_rank(assignment.ranks[r.file]) for r in results if r.file in assignment.ranks]
    # Files of several jobs: one is analysed, the others' files are left out (the one
    # decision that keeps every table, finding and replay inside a job: analysis.jobs).
    kept, apart = _one_job(kept, errors)
    warnings = notes + [w for r in kept for w in r.warnings]
    warnings += apart or assignment.warnings
    # The ranks table and the merged ones are in rank order (then each rank's own order):
    # matching reads the calls in that order and need not sort a copy of them all (the
    # parent's largest transient).
    kept.sort(key=lambda r: r.rank)
    ranks = pl.DataFrame(
        [
            {
                "rank": r.rank,
                "world_size": r.world_size,
                "file": r.file,
                "rank_source": assignment.sources[r.file],
                "device": (r.meta.get("devices") or [None])[0],
                "host_name": r.meta.get("host_name"),
                "backend": r.meta.get("backend"),
                "timeline": r.meta.get("timeline"),
                "bytes": r.meta.get("bytes"),
                "pg_rank_sets": r.meta.get("pg_rank_sets"),
            }
            for r in kept
        ],
        schema={
            "rank": pl.Int64,
            "world_size": pl.Int64,
            "file": pl.String,
            "rank_source": pl.String,
            "device": pl.String,
            "host_name": pl.String,
            "backend": pl.String,
            "timeline": pl.String,
            "bytes": pl.Int64,
            "pg_rank_sets": pl.Int64,
        },
    )
    # The per-rank tables become merged ones: only `merged` refers to them from here on.
    # Kernels, calls and steps become stores: one merged frame, or the files of a big
    # job's ranks.
    small = [name for name in TABLES if name != "kernels"]
    meta = {r.rank: r.meta for r in kept}
    # With no usable file, the tables of a trace without events: every table of the Report
    # keeps its columns (docs/tables.md), so a script reading one finds no rows, not a
    # missing column.
    kept = kept or tabulate([empty_trace()])
    pieces = {name: [getattr(r, name) for r in kept] for name in small}
    results.clear()
    kept = [replace(r, **{name: pl.DataFrame() for name in small}) for r in kept]
    merged: dict[str, Any] = {
        name: _contiguous(pieces[name]) for name in small if name not in SPILLED
    }
    merged["ranks"] = ranks
    merged["kernels"] = RankStore([_part(r, "kernels", r.kernels) for r in kept], folder=folder)
    merged["collectives"] = _store(kept, "collectives", pieces["collectives"], folder)
    merged["steps"] = _store(kept, "steps", pieces["steps"], folder)
    spilled = folder if merged["collectives"].spilled else None
    groups = conflicting_groups({r.rank: r.meta.get("groups") or {} for r in kept})
    warnings += missing_ranks(ranks) + groups + one_step_warning(merged["steps"])
    several = ranks_in_several_groups(ranks)
    merging()
    crossing = begin("cross-rank")
    merged.update(
        cross_rank(
            merged,
            align=align,
            folder=spilled,
            ranks_per_host=ranks_per_host,
            ungrouped=several,
        )
    )
    warnings += ungrouped_warning(merged["collective_instances"])
    crossing()
    merged["rank_kernels"] = merged.pop("kernels")
    merged["rank_collectives"] = merged.pop("collectives")
    merged["rank_steps"] = merged.pop("steps")
    merged["rank_waits"] = merged.pop("collective_waits", RankStore())
    from kineto_comm.analysis.hardware import hardware_tables

    merged.update(
        hardware_tables(
            {r: m.get("device_props") or [] for r, m in meta.items()},
            merged["rank_collectives"],
            merged["offsets"],
            merged["collective_instances"],
            hw_table,
            network,
            gpu_model,
        )
    )
    report = Report(
        errors=tuple(errors),
        warnings=tuple(warnings),
        options={
            "comm_patterns": list(patterns),
            "jobs": workers,
            "memory_limit": budgeted.limit,
            "piece_bytes": budgeted.piece_bytes,
            "align": align,
            "ranks_per_host": ranks_per_host,
            "cache_dir": cache_arg,
            "dask_scheduler": dask_scheduler,
            "rules_run": checks.codes,
            "network": network,
        },
        meta=meta,
        **merged,
    )
    if report.ranks.height == 0:  # nothing analysed: nothing to compare or check
        return report
    from kineto_comm.analysis.framework import P2P_COLUMNS, framework_table
    from kineto_comm.rules_engine import step_model
    from kineto_comm.tables import Tables

    framing = begin("framework")
    calls = report.rank_collectives
    p2p = calls.lazy(list(P2P_COLUMNS)) if calls.height and calls.columns else None
    used = framework_table(meta, p2p, report.pipeline)
    report = replace(report, framework=used)
    framing()
    report = _with_model(report, model_config)

    # One Tables for the rules and the model of time: the blame is built once.
    with stage("rules"):
        tables = Tables(report)
        findings = checks.run(tables)
    with stage("model of time"):
        model_tables = step_model(tables, findings, checks.codes)
    return replace(report, findings=findings, **model_tables)


def _one_job(
    kept: list[RankTables], errors: list[tuple[str, str]]
) -> tuple[list[RankTables], list[str]]:
    """The files of the job analysed (analysis.jobs.split_jobs) and the warning that names
    the jobs (none: one job). Each other job's file is an entry in `errors`: it was not
    analysed, so `kineto-comm report --strict` fails on it as on an unreadable file."""
    rows = []
    for r in kept:
        span = r.totals if r.totals.height else None  # its columns read as they are: no query
        device = (r.meta.get("devices") or [None])[0]
        rows.append(
            {
                "rank": r.rank,
                "backend": r.meta.get("backend"),
                "device": device or ("host" if r.meta.get("timeline") == "host" else None),
                "world_size": r.world_size,
                "start_ns": None if span is None else span["start_ns"].min(),
                "end_ns": None if span is None else span["end_ns"].max(),
            }
        )
    schema = {"rank": pl.Int64, "backend": pl.String, "device": pl.String}
    schema |= {"world_size": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64}
    files = split_jobs(pl.DataFrame(rows, schema=schema))
    said = jobs_warning(files)
    if not said:
        return kept, []
    job = dict(zip(files["rank"].to_list(), files["job"].to_list(), strict=True))
    first = rank_ranges(files.filter(pl.col("job") == 0)["rank"].to_list())
    for r in kept:
        if job[r.rank] != 0:
            errors.append((r.file, f"rank {r.rank}: another job than ranks {first}; left out"))
    return [r for r in kept if job[r.rank] == 0], said


def _rule_set(
    select: Sequence[str],
    ignore: Sequence[str],
    rules: Sequence[Any],
    options: Mapping[str, Mapping[str, Any]] | None,
    config: str | Path | None,
) -> tuple[Any, Any]:
    """The rules analyze() runs (kineto_comm.rules_engine.RuleSet) and the config (its
    ranks_per_host and [hardware] section), from the config file (given, or found upward
    from the current directory) and the arguments."""
    from kineto_comm.rules_engine import load_config, rule_set

    cfg = load_config(None if config is None else Path(config))
    checks = rule_set(select=select, ignore=ignore, options=options, extra_rules=rules, config=cfg)
    return checks, cfg


def _hardware(
    section: Mapping[str, Any], network: str | None, path: Path | None = None
) -> tuple[dict[str, Any], str | None, str | None]:
    """The hardware table with the config's [hardware] overrides (`path`: the config file),
    the network (the argument, else the config's) and the config's gpu_model; UsageError
    naming the file and key, or the name, that is wrong."""
    from kineto_comm.analysis.hardware import CONFIG_KEYS, load_table

    where = f"config file {path}: " if path is not None else "config: "
    unknown = sorted(set(section) - set(CONFIG_KEYS))
    if unknown:
        raise UsageError(
            f"{where}[hardware]: unknown key(s) {', '.join(unknown)}; known: "
            + ", ".join(CONFIG_KEYS)
        )
    stated = section.get("network")
    if stated is not None and not isinstance(stated, str):
        raise UsageError(f"{where}[hardware] network must be a name such as '400G-IB'")
    # [hardware.gpu.KEY] and [hardware.networks.NAME]: the table's entries, overridden.
    overrides = {"gpu": section.get("gpu", {}), "network": section.get("networks", {})}
    try:
        table = load_table(overrides)
    except ValueError as exc:
        raise UsageError(f"{where}{exc}") from None
    network = network if network is not None else stated
    if network is not None and network not in table["network"]:
        raise UsageError(
            f"network {network!r}: not in the hardware table; known: " + ", ".join(table["network"])
        )
    model = section.get("gpu_model")
    if model is not None and model not in table["gpu"]:
        raise UsageError(
            f"{where}[hardware] gpu_model {model!r}: not in the hardware table; known: "
            + ", ".join(table["gpu"])
        )
    return table, network, model


def _with_model(report: Report, model_config: tuple[Any, Any] | None) -> Report:
    """The report with its inferred configuration, and `model_comparison` from the `model=`
    file (which replaces the inferred configuration entirely) or else from the inferred one
    where it is enough (analytic.config_from_inferred); `options["model_note"]` says why
    the model did not run where it did not."""
    from kineto_comm.analysis.inferred_config import CALL_COLUMNS, inferred_config
    from kineto_comm.analytic import config_from_inferred, with_model

    calls = report.rank_collectives
    world = report.ranks["world_size"].max()
    table = inferred_config(
        report.process_groups,
        calls.lazy(list(CALL_COLUMNS)) if calls.height and calls.columns else None,
        report.pipeline,
        report.framework,
        None if world is None else int(world),  # type: ignore[arg-type]
        calls.height,
    )
    report = replace(report, inferred_config=table)
    if model_config is not None:
        return with_model(report, *model_config)
    config, why = config_from_inferred(table)
    if config is None:
        return replace(report, options={**report.options, "model_note": why})
    return with_model(report, config, source="inferred")


def _model(path: str | Path | None) -> tuple[Any, Any] | None:
    """(ModelConfig, HardwareModel) from the `model=` file; UsageError when unusable."""
    if path is None:
        return None
    from kineto_comm.analytic import load_model

    try:
        return load_model(path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
