"""One clock-aligned timeline of a job's ranks, as a Chrome trace event file for Perfetto UI
and chrome://tracing (`kineto-comm report TRACES --format perfetto -o job.json.gz`).

Why: a performance engineer believes a finding once they see the late rank, on the same
clock as the ranks that waited for it. The report already has everything that view needs:
each rank's kernels and steps on the reference clock, each matched call's last rank and
every rank's wait, the findings and the critical path. This module only lays them out: a
process per rank, a track per stream (a call split into `wait for rank L` and `transfer`),
steps, findings and critical-path tracks, and a flow arrow from each late arrival to the
ranks that waited for it (vertical on an aligned clock).

Big jobs stay openable: `select` keeps the median, worst, best and straggler ranks and, past
`max_bytes`, the middle steps; the file is written rank by rank from the report's stores.
Times are exact (integer ns until written as microseconds with three decimals). The tracks,
the selection and the times in full: docs/timeline.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import polars as pl

from kineto_comm.lazy import collect
from kineto_comm.render.json_doc import counted, findings_of
from kineto_comm.render.output import open_output
from kineto_comm.report import Report

# In full: docs/timeline.md, "How it is built".

# The default ceiling on the uncompressed JSON (what the viewer holds): Perfetto UI in a
# browser tab opens about this much comfortably.
MAX_BYTES = 200_000_000
# Bytes of text per kernel (slice, wait/transfer children, arrows and launches included)
# when no sample can be measured: the most seen, 421 on tests/data/h100-nccl/tp-dp-8 (178 to
# 421 on the H100 captures, the gloo samples and a synthetic straggler job), rounded up.
BYTES_PER_KERNEL = 450
# `select` measures the text of one rank's middle step and plans with it times this margin.
MARGIN = 1.15
ALL = "all"  # --ranks all / --steps all: every rank, every step whatever the size
# Track ids (tid) of the tracks that are not a GPU stream.
STEPS_TID = 1_000_000_000
CRITICAL_TID = 1_000_000_001
FINDING_TID = 1_000_000_100  # + the finding's position
CPU_TID = 1_000_001_000  # + the thread's position among the rank's launching threads
OVERLAP_TID = 1_000_002_000  # + n: tracks of kernels that overlap others on their stream
MAX_FINDINGS = 50  # finding tracks per rank (the report ranks findings by saving)
KERNEL_COLUMNS = [
    "stream",
    "device",
    "name",
    "kind",
    "start_ns",
    "end_ns",
    "correlation",
    "launch_ns",
    "launch_tid",
    "step",
]


@dataclass(frozen=True)
class Selection:
    """What goes into the file: `ranks` (each with why it was chosen), `steps` (None: all),
    and what was left out, for the file's metadata."""

    ranks: list[int]
    why: dict[int, list[str]]
    steps: list[int] | None
    all_ranks: list[int]
    all_steps: list[int]
    notes: list[str] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        """The file's account of what it holds and what it leaves out."""
        kept = set(self.ranks)
        steps = self.all_steps if self.steps is None else self.steps
        return {
            "ranks_included": self.ranks,
            "ranks_left_out": [r for r in self.all_ranks if r not in kept],
            "why": {str(r): self.why.get(r, []) for r in self.ranks},
            "steps_included": steps,
            "steps_left_out": [s for s in self.all_steps if s not in set(steps)],
            "notes": self.notes,
        }


# ------------------------------------------------------------------ selection


def parse_numbers(spec: str | None) -> list[int] | str | None:
    """'0,3,8-11' -> [0, 3, 8, 9, 10, 11]; 'all' -> 'all'; None or '' -> None (the
    default choice). ValueError when bad."""
    if spec is None or not spec.strip():
        return None
    if spec.strip().lower() == "all":
        return ALL
    out: list[int] = []
    for piece in spec.split(","):
        piece = piece.strip()
        if not piece:
            continue
        lo, sep, hi = piece.partition("-")
        try:
            first, last = (int(lo), int(hi)) if sep and lo else (int(piece), int(piece))
        except ValueError:
            raise ValueError(
                f"expected numbers and ranges such as 0,3,8-11, got {spec!r}"
            ) from None
        if last < first:
            raise ValueError(f"empty range {piece!r} in {spec!r}")
        out.extend(range(first, last + 1))
    return sorted(set(out))


def rank_scores(report: Report) -> dict[int, float]:
    """Each rank's mean step time (its device windows of the job's complete steps, as the
    report's per-rank table takes them; the whole span where it has no steps): how the
    median, worst and best ranks are chosen."""
    steps = report.rank_steps
    scores: dict[int, float] = {}
    if steps.height:
        means = collect(
            steps.lazy(["rank", "step", "wall_ns"])
            .filter(counted(report))
            .group_by("rank")
            .agg(pl.col("wall_ns").mean()),
            steps.height,
        )
        scores = {int(r): float(w) for r, w in means.iter_rows() if w is not None}
    for r, start, end in report.totals.select("rank", "start_ns", "end_ns").iter_rows():
        if r not in scores and start is not None and end is not None:
            scores[int(r)] = float(end - start)
    return scores


def default_ranks(report: Report) -> dict[int, list[str]]:
    """The ranks shown by default, each with why: the median rank (by mean step time), the
    worst and best of each process group, every straggler."""
    scores = rank_scores(report)
    why: dict[int, list[str]] = {}
    ranked = sorted(scores, key=lambda r: (scores[r], r))
    if ranked:
        why.setdefault(ranked[len(ranked) // 2], []).append("median step time")
    groups = report.process_groups
    if groups.height and "ranks" in groups.columns:
        for pg, members, role in groups.select("process_group", "ranks", "role").iter_rows():
            inside = [r for r in (members or []) if r in scores]
            if len(inside) < 2:
                continue
            worst = max(inside, key=lambda r: (scores[r], -r))
            best = min(inside, key=lambda r: (scores[r], r))
            why.setdefault(worst, []).append(f"slowest of group {pg} ({role})")
            why.setdefault(best, []).append(f"fastest of group {pg} ({role})")
    if report.stragglers.height and "is_straggler" in report.stragglers.columns:
        for r in report.stragglers.filter(pl.col("is_straggler"))["rank"]:
            why.setdefault(int(r), []).append("straggler")
    if not why:  # no steps, no groups: every rank
        why = {int(r): ["only rank(s)"] for r in report.ranks["rank"]}
    return dict(sorted(why.items()))


def _kernels_per_step(report: Report, ranks: list[int]) -> dict[int, int]:
    """Kernel rows per step over `ranks` (read a batch of those ranks at a time)."""
    counts: dict[int, int] = {}
    for batch in report.rank_kernels.batches(ranks, ["step"]):
        for step, n in batch.group_by("step").len().iter_rows():
            counts[int(step)] = counts.get(int(step), 0) + int(n)
    return counts


def select(
    report: Report,
    ranks: Iterable[int] | str | None = None,
    steps: Iterable[int] | str | None = None,
    max_bytes: int = MAX_BYTES,
) -> Selection:
    """The ranks and steps to write: those asked for ('all': every one), else every rank
    and every step when their estimated text fits under `max_bytes` (kernel counts times
    the bytes per kernel of a sample, `_bytes_per_kernel`); beyond it the default ranks
    (`default_ranks`), and the middle steps when all of theirs would not fit either.
    ValueError naming what the job has when a rank or step asked for is not in it: a
    timeline of nothing is a mistake in the question, not an answer."""
    all_ranks = sorted(int(r) for r in report.ranks["rank"])
    notes: list[str] = []
    if ranks == ALL:
        ranks = all_ranks
    if ranks is None:
        # Every rank's kernels (the store's row count, nothing read) at the first rank's
        # bytes per kernel.
        first = _kernels_per_step(report, all_ranks[:1]) if all_ranks else {}
        per_kernel = _bytes_per_kernel(report, all_ranks[:1], sorted(s for s in first if s >= 0))
        total = int(report.rank_kernels.height * per_kernel)
        labels = default_ranks(report)
        if total <= max_bytes:
            why = {r: labels.get(r, []) for r in all_ranks}
            if steps is None:
                every = sorted(s for s in _kernels_per_step(report, all_ranks) if s >= 0)
                return Selection(all_ranks, why, None, all_ranks, every, notes)
        else:
            why = labels
            if len(why) < len(all_ranks):
                notes.append(
                    f"all {len(all_ranks)} ranks would be about {total / 1e6:.0f} MB, above"
                    f" {max_bytes / 1e6:.0f} MB: kept the median rank, each group's slowest"
                    " and fastest and every straggler (--ranks to choose)"
                )
    else:
        asked = sorted(set(ranks))  # type: ignore[arg-type]
        missing = [r for r in asked if r not in set(all_ranks)]
        if missing:
            raise ValueError(
                f"--ranks: {_numbers(missing, 'rank')} not in the job, which has"
                f" {_numbers(all_ranks, 'rank')}"
            )
        why = {r: ["asked for"] for r in asked}
    chosen = sorted(why)
    per_step = _kernels_per_step(report, chosen) if chosen else {}
    all_steps = sorted(s for s in per_step if s >= 0)
    if steps == ALL:
        return Selection(chosen, why, None, all_ranks, all_steps, notes)
    if steps is not None:
        wanted = sorted(set(steps))  # type: ignore[arg-type]
        missing = [s for s in wanted if s not in set(all_steps)]
        if missing:
            has = _numbers(all_steps, "step") if all_steps else "no steps"
            raise ValueError(
                f"--steps: {_numbers(missing, 'step')} not in the trace of the ranks shown,"
                f" which has {has}"
            )
        return Selection(chosen, why, wanted, all_ranks, all_steps, notes)
    per_kernel = _bytes_per_kernel(report, chosen, all_steps)
    total = int(sum(per_step.values()) * per_kernel)
    if total <= max_bytes or len(all_steps) <= 1:
        if total > max_bytes:
            notes.append(f"estimated {total / 1e6:.0f} MB, above {max_bytes / 1e6:.0f} MB")
        return Selection(chosen, why, None, all_ranks, all_steps, notes)
    # The middle step, then its neighbours, while the estimate stays under the ceiling.
    mid = len(all_steps) // 2
    kept = [all_steps[mid]]
    size = per_step[all_steps[mid]] * per_kernel
    lo, hi = mid - 1, mid + 1
    while lo >= 0 or hi < len(all_steps):
        for i in (hi, lo):
            if 0 <= i < len(all_steps):
                extra = per_step[all_steps[i]] * per_kernel
                if size + extra > max_bytes:
                    lo, hi = -1, len(all_steps)
                    break
                kept.append(all_steps[i])
                size += extra
        else:
            lo, hi = lo - 1, hi + 1
    notes.append(
        f"all steps would be about {total / 1e6:.0f} MB: kept the {len(kept)} middle step(s)"
        f" under {max_bytes / 1e6:.0f} MB (--steps to choose)"
    )
    return Selection(chosen, why, sorted(kept), all_ranks, all_steps, notes)


def _numbers(values: list[int], what: str) -> str:
    """'rank 9', 'ranks 0-3', 'steps 1-2, 5': numbers as compact ranges, with their noun."""
    spans: list[list[int]] = []
    for v in sorted(values):
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"{what}{'s' if len(values) != 1 else ''} {text}"


def _bytes_per_kernel(report: Report, ranks: list[int], steps: list[int]) -> float:
    """Bytes of text per kernel, measured on the first chosen rank's middle step (written
    as it would be, then let go), times MARGIN; BYTES_PER_KERNEL without such a step.
    Kernel names and the share of communication differ enough between jobs (178 to 421
    bytes a kernel) that a constant would overshoot the ceiling or cut steps for nothing."""
    if not ranks or not steps:
        return BYTES_PER_KERNEL
    rank, step = ranks[0], steps[len(steps) // 2]
    sample = Selection([rank], {rank: []}, [step], [rank], [step])
    kernels = report.rank_kernels.frame([rank], ["rank", "step"])
    n = kernels.filter(pl.col("step") == step).height if kernels.height else 0
    if n == 0:
        return BYTES_PER_KERNEL
    text = sum(len(e.encode()) + 2 for e in _rank_events(report, _plan(report, sample), rank))
    return text / n * MARGIN


# ------------------------------------------------------------------ text of events


def _us(ns: pl.Expr) -> pl.Expr:
    """Integer nanoseconds as exact microseconds text with three decimals ('-1.250')."""
    a = ns.abs()
    return pl.concat_str(
        pl.when(ns < 0).then(pl.lit("-")).otherwise(pl.lit("")),
        (a // 1000).cast(pl.String),
        pl.lit("."),
        (a % 1000).cast(pl.String).str.zfill(3),
    )


def _quoted(text: pl.Expr) -> pl.Expr:
    """A text column as JSON string literals (quotes, backslashes, control characters
    escaped; non-ASCII kept as UTF-8, which JSON allows)."""
    escaped = text.fill_null("").str.replace_all("\\", "\\\\", literal=True)
    escaped = escaped.str.replace_all('"', '\\"', literal=True)
    escaped = escaped.str.replace_all("\n", "\\n", literal=True)
    escaped = escaped.str.replace_all("\r", "\\r", literal=True)
    escaped = escaped.str.replace_all("\t", "\\t", literal=True)
    # Other control characters (rare in trace strings): each as \u00XX.
    escaped = escaped.map_batches(_control_escaped, return_dtype=pl.String)
    return pl.concat_str(pl.lit('"'), escaped, pl.lit('"'))


def _control_escaped(values: pl.Series) -> pl.Series:
    """`values` with the control characters JSON forbids written as \\u00XX."""
    if not values.str.contains(r"[\x00-\x1f]").any():
        return values
    return values.map_elements(
        lambda s: "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 else c for c in s),
        return_dtype=pl.String,
    )


def _event(
    ph: str, tid: pl.Expr, ts: pl.Expr, name: pl.Expr, cat: str, extra: list[pl.Expr]
) -> pl.Expr:
    """One event's JSON text (`extra`: pieces of text after ts, each starting with a
    comma): pid is filled in later (`{PID}`), so that one expression serves every rank."""
    return pl.concat_str(
        pl.lit(f'{{"ph":"{ph}","cat":"{cat}","pid":{{PID}},"tid":'),
        tid.cast(pl.String),
        pl.lit(',"ts":'),
        _us(ts),
        pl.lit(',"name":'),
        name,
        *extra,
        pl.lit("}"),
    )


def _arg(key: str, value: pl.Expr, text: bool = False) -> pl.Expr:
    """`"key":value` for the args object (null when the value is null)."""
    shown = _quoted(value.cast(pl.String)) if text else value.cast(pl.String)
    return pl.concat_str(pl.lit(f'"{key}":'), shown.fill_null("null"))


def _args(*pieces: pl.Expr) -> pl.Expr:
    """`,"args":{...}` from `_arg` pieces."""
    return pl.concat_str(
        pl.lit(',"args":{'), pl.concat_str(list(pieces), separator=","), pl.lit("}")
    )


def _slices(frame: pl.DataFrame, cat: str, extra: list[pl.Expr], order: int) -> pl.DataFrame:
    """Complete slices (`ph` X) of `frame` (tid, start_ns, end_ns, label), with the keys
    that sort a track's events: by start, longer slices (parents) first, then `order`."""
    dur = (pl.col("end_ns") - pl.col("start_ns")).clip(lower_bound=0)
    return frame.select(
        tid=pl.col("tid").cast(pl.Int64),
        ts_ns=pl.col("start_ns"),
        neg_dur=-dur,
        order=pl.lit(order, pl.Int64),
        json=_event(
            "X",
            pl.col("tid"),
            pl.col("start_ns") - pl.col("_base"),
            _quoted(pl.col("label")),
            cat,
            [pl.lit(',"dur":'), _us(dur), *extra],
        ),
    )


def _points(
    frame: pl.DataFrame, ph: str, cat: str, extra: list[pl.Expr], order: int
) -> pl.DataFrame:
    """Events at one time (instants, flow ends) of `frame` (tid, at_ns, label)."""
    return frame.select(
        tid=pl.col("tid").cast(pl.Int64),
        ts_ns=pl.col("at_ns"),
        neg_dur=pl.lit(0, pl.Int64),
        order=pl.lit(order, pl.Int64),
        json=_event(
            ph,
            pl.col("tid"),
            pl.col("at_ns") - pl.col("_base"),
            _quoted(pl.col("label")),
            cat,
            extra,
        ),
    )


# ------------------------------------------------------------------ the document


@dataclass(frozen=True)
class _Plan:
    """What every rank's events need from the whole job (small tables only)."""

    base_ns: int
    selection: Selection
    arrows: pl.DataFrame  # instance, waiter, last_rank, flow id: arrows between selected ranks
    instances: pl.DataFrame  # instance, process_group, collective, bytes, last_rank, ranks_seen
    step_windows: dict[int, list[tuple[int, int, int]]]  # rank -> (step, start, end)
    findings: list[Any]
    critical: pl.DataFrame | None
    roles: dict[int, list[str]]
    hosts: dict[int, str]
    flows_left_out: int
    width: int  # flow ids: instance x width + waiting rank


def _plan(report: Report, selection: Selection) -> _Plan:
    ranks = selection.ranks
    inst = report.collective_instances
    keep = ["instance", "process_group", "collective", "bytes", "last_rank", "ranks_seen"]
    inst = inst.select(keep) if inst.height else pl.DataFrame(schema={c: pl.Int64 for c in keep})
    if report.rank_waits.height and ranks:
        waits = report.rank_waits.frame(
            ranks, ["instance", "rank", "start_ns", "end_ns", "wait_ns"]
        )
        waits = waits.unique(["rank", "start_ns", "end_ns"], keep="first", maintain_order=True)
        # Only the calls whose kernel is in the file (its step chosen: a call near a step's
        # edge can be in different steps on different ranks): an arrow needs both ends.
        calls = report.rank_collectives.frame(ranks, ["rank", "start_ns", "end_ns", "step"])
        if selection.steps is not None:
            calls = calls.filter(pl.col("step").is_in(selection.steps))
        waits = waits.join(
            calls.select("rank", "start_ns", "end_ns"),
            on=["rank", "start_ns", "end_ns"],
            how="semi",
        )
    else:
        waits = pl.DataFrame(schema={"instance": pl.Int64, "rank": pl.Int64, "wait_ns": pl.Int64})
    present = waits.select("instance", last_rank=pl.col("rank"))
    width = max(report.ranks["rank"].max() or 0, 0) + 1  # type: ignore[operator]
    waited = (
        waits.join(inst.select("instance", "last_rank", "ranks_seen"), on="instance", how="inner")
        .filter(
            (pl.col("ranks_seen") > 1)
            & (pl.col("rank") != pl.col("last_rank"))
            & (pl.col("wait_ns") > 0)
        )
        .select("instance", waiter=pl.col("rank"), last_rank=pl.col("last_rank"))
    )
    arrows = waited.join(present, on=["instance", "last_rank"], how="semi").with_columns(
        flow=pl.col("instance") * width + pl.col("waiter")
    )
    steps = report.rank_steps.frame(ranks, ["rank", "step", "start_ns", "end_ns", "cpu_start_ns"])
    windows: dict[int, list[tuple[int, int, int]]] = {}
    for r, s, a, b, _ in steps.iter_rows():
        windows.setdefault(int(r), []).append((int(s), int(a), int(b)))
    starts = report.totals.filter(pl.col("rank").is_in(ranks))["start_ns"].drop_nulls().to_list()
    starts += steps["cpu_start_ns"].drop_nulls().to_list() if steps.height else []
    base = (min(starts) // 1000) * 1000 if starts else 0
    roles: dict[int, list[str]] = {}
    groups = report.process_groups
    if groups.height and "ranks" in groups.columns:
        for pg, members, role in groups.select("process_group", "ranks", "role").iter_rows():
            for r in members or []:
                roles.setdefault(int(r), []).append(f"{role} {pg}")
    hosts = {}
    if report.offsets.height and "host" in report.offsets.columns:
        hosts = {int(r): h for r, h in report.offsets.select("rank", "host").iter_rows() if h}
    for r, h in report.ranks.select("rank", "host_name").iter_rows():
        if h:
            hosts[int(r)] = h
    critical = getattr(report, "critical_path", None)
    if not isinstance(critical, pl.DataFrame) or critical.height == 0:
        critical = None
    return _Plan(
        base_ns=int(base),
        selection=selection,
        arrows=arrows,
        instances=inst,
        step_windows=windows,
        findings=findings_of(report)[:MAX_FINDINGS],
        critical=critical,
        roles=roles,
        hosts=hosts,
        flows_left_out=waited.height - arrows.height,
        width=int(width),
    )


def _meta(pid: int, tid: int | None, name: str, args: dict[str, Any]) -> str:
    """A metadata event (`ph` M): process or thread name, sort index, labels."""
    event: dict[str, Any] = {"ph": "M", "pid": pid, "name": name, "args": args}
    if tid is not None:
        event["tid"] = tid
    return json.dumps(event, ensure_ascii=False)


def _rank_events(report: Report, plan: _Plan, rank: int) -> Iterator[str]:
    """Rank `rank`'s events: metadata first (an event each), then each track's events in
    time order (one piece of text, events separated by ',\\n')."""
    sel = plan.selection
    label = f"rank {rank}"
    if rank in plan.hosts:
        label += f" · {plan.hosts[rank]}"
    if plan.roles.get(rank):
        label += " · " + ", ".join(plan.roles[rank])
    yield _meta(rank, None, "process_name", {"name": label})
    yield _meta(rank, None, "process_sort_index", {"sort_index": rank})
    yield _meta(rank, None, "process_labels", {"labels": ", ".join(sel.why.get(rank, []))})
    kernels = report.rank_kernels.frame([rank], ["rank", *KERNEL_COLUMNS])
    if sel.steps is not None and kernels.height:
        kernels = kernels.filter(pl.col("step").is_in(sel.steps))
    windows = [w for w in plan.step_windows.get(rank, []) if sel.steps is None or w[0] in sel.steps]
    frames: list[pl.DataFrame] = []
    names: dict[int, str] = {}
    order: dict[int, int] = {}  # sort index of the overlap tracks: beside their stream
    if kernels.height:
        frames += _kernel_frames(report, plan, rank, kernels, names, order)
    if windows:
        steps = pl.DataFrame(
            {
                "tid": [STEPS_TID] * len(windows),
                "start_ns": [w[1] for w in windows],
                "end_ns": [w[2] for w in windows],
                "label": [f"step {w[0]}" for w in windows],
                "step": [w[0] for w in windows],
            },
            schema_overrides={"start_ns": pl.Int64, "end_ns": pl.Int64},
        ).with_columns(_base=pl.lit(plan.base_ns, pl.Int64))
        frames.append(_slices(steps, "step", [_args(_arg("step", pl.col("step")))], 0))
        names[STEPS_TID] = "steps (device window)"
    frames += _finding_frames(plan, rank, kernels, windows, names)
    if plan.critical is not None and "rank" in plan.critical.columns:
        crit = plan.critical.filter(pl.col("rank") == rank)
        if sel.steps is not None and "step" in crit.columns:
            crit = crit.filter(pl.col("step").is_in(sel.steps))
        if crit.height:
            crit = crit.select(
                tid=pl.lit(CRITICAL_TID, pl.Int64),
                start_ns=pl.col("start_ns"),
                end_ns=pl.col("end_ns"),
                label=pl.col("name").cast(pl.String)
                if "name" in crit.columns
                else pl.lit("critical path"),
                _base=pl.lit(plan.base_ns, pl.Int64),
            )
            frames.append(_slices(crit, "critical_path", [], 0))
            names[CRITICAL_TID] = "critical path"
    for tid, name in sorted(names.items()):
        yield _meta(rank, tid, "thread_name", {"name": name})
        # Steps, the critical path and findings above the streams, CPU threads below.
        index = _sort_index(tid, order)
        yield _meta(rank, tid, "thread_sort_index", {"sort_index": index})
    if not frames:
        return
    events = pl.concat(frames).sort("tid", "ts_ns", "neg_dur", "order", maintain_order=True)
    # Every event of the rank as one piece of text (a Python string per event costs more
    # than writing them), its pid filled in.
    text = events.select(pl.col("json").str.join(",\n"))["json"][0]
    yield text.replace("{PID}", str(rank))


def _sort_index(tid: int, order: dict[int, int]) -> int:
    """Where a track sits in its process: steps, the critical path and the findings first,
    then the streams by id (each followed by its overlap tracks), the CPU threads last."""
    if tid in order:
        return order[tid]
    if STEPS_TID <= tid < CPU_TID:
        return tid - STEPS_TID
    if CPU_TID <= tid < OVERLAP_TID:
        return 1_500_000_000 + tid - CPU_TID
    return 1000 + tid * 8


def _kernel_frames(
    report: Report,
    plan: _Plan,
    rank: int,
    kernels: pl.DataFrame,
    names: dict[int, str],
    order: dict[int, int],
) -> list[pl.DataFrame]:
    """The GPU streams' slices (kernels; wait and transfer inside matched calls), the flow
    ends and starts of the arrows, and the CPU threads' launches of communication."""
    base = pl.lit(plan.base_ns, pl.Int64)
    kernels = _tracks(kernels.with_columns(_base=base), names, order)
    frames = [
        _slices(
            kernels.with_columns(label=pl.col("name")),
            "kernel",
            [
                _args(
                    _arg("device", pl.col("device")),
                    _arg("stream", pl.col("stream")),
                    _arg("correlation", pl.col("correlation")),
                    _arg("kind", pl.col("kind"), text=True),
                    _arg("step", pl.col("step")),
                )
            ],
            0,
        )
    ]
    comm = kernels.filter(pl.col("kind") == "communication")
    if comm.height == 0:
        return frames
    waits = report.rank_waits.frame([rank], ["instance", "start_ns", "end_ns", "wait_ns"])
    if waits.height:
        waits = waits.unique(["start_ns", "end_ns"], keep="first", maintain_order=True)
        calls = comm.join(waits, on=["start_ns", "end_ns"], how="inner").join(
            plan.instances, on="instance", how="left"
        )
    else:
        calls = pl.DataFrame()
    places = [c for c in ("phase", "module") if c in report.rank_collectives.columns]
    if calls.height and places:
        # Where each call was issued (kineto_comm.analysis.attribution).
        placed = report.rank_collectives.frame([rank], ["start_ns", "end_ns", *places])
        placed = placed.select("start_ns", "end_ns", *places).unique(
            ["start_ns", "end_ns"], keep="first", maintain_order=True
        )
        calls = calls.join(placed, on=["start_ns", "end_ns"], how="left", maintain_order="left")
    if calls.height:
        calls = calls.with_columns(
            cut_ns=pl.min_horizontal(
                pl.col("start_ns") + pl.col("wait_ns").clip(lower_bound=0), pl.col("end_ns")
            )
        )
        info = [
            _arg("instance", pl.col("instance")),
            _arg("collective", pl.col("collective"), text=True),
            _arg("process_group", pl.col("process_group"), text=True),
            _arg("bytes", pl.col("bytes")),
            _arg("last_rank", pl.col("last_rank")),
            *[_arg(c, pl.col(c), text=True) for c in places],
        ]
        waited = calls.filter(
            (pl.col("wait_ns") > 0) & (pl.col("ranks_seen") > 1) & (pl.col("last_rank") != rank)
        ).with_columns(
            end_ns=pl.col("cut_ns"),
            label=pl.concat_str(pl.lit("wait for rank "), pl.col("last_rank").cast(pl.String)),
        )
        frames.append(
            _slices(
                waited,
                "comm_wait",
                [pl.lit(',"cname":"terrible"'), _args(*info, _arg("wait_ns", pl.col("wait_ns")))],
                1,
            )
        )
        moved = calls.with_columns(start_ns=pl.col("cut_ns"), label=pl.lit("transfer"))
        frames.append(_slices(moved, "comm_transfer", [pl.lit(',"cname":"good"'), _args(*info)], 2))
        # Arrow ends: where this rank's wait ends (the transfer starts).
        ends = waited.join(
            plan.arrows.filter(pl.col("waiter") == rank).select("instance", "flow"),
            on="instance",
            how="inner",
        ).with_columns(at_ns=pl.col("cut_ns"))
        flow_end = [
            pl.lit(',"bp":"e","id":'),
            pl.col("flow").cast(pl.String),
        ]
        frames.append(
            _points(
                ends.with_columns(
                    label=pl.concat_str(
                        pl.lit("waited for rank "), pl.col("last_rank").cast(pl.String)
                    )
                ),
                "f",
                "wait_flow",
                flow_end,
                4,
            )
        )
        # Arrow starts: this rank arrived last; one arrow to each selected rank that waited.
        starts = (
            calls.filter(pl.col("last_rank") == rank)
            .join(
                plan.arrows.filter(pl.col("last_rank") == rank).select(
                    "instance", "flow", "waiter"
                ),
                on="instance",
                how="inner",
            )
            .with_columns(at_ns=pl.col("start_ns"))
        )
        frames.append(
            _points(
                starts.with_columns(
                    label=pl.concat_str(pl.lit("waited for rank "), pl.lit(str(rank)))
                ),
                "s",
                "wait_flow",
                [pl.lit(',"id":'), pl.col("flow").cast(pl.String)],
                3,
            )
        )
    launched = comm.filter(pl.col("launch_ns").is_not_null() & pl.col("launch_tid").is_not_null())
    if launched.height:
        threads = sorted(launched["launch_tid"].unique().to_list())
        tids = {t: CPU_TID + i for i, t in enumerate(threads)}
        for t, tid in tids.items():
            names[tid] = f"CPU thread {t} (launches communication)"
        launched = launched.with_columns(
            tid=pl.col("launch_tid").replace_strict(tids, return_dtype=pl.Int64),
            at_ns=pl.col("launch_ns"),
            label=pl.concat_str(pl.lit("launch "), pl.col("name")),
        )
        frames.append(
            _points(
                launched,
                "i",
                "launch",
                [pl.lit(',"s":"t"'), _args(_arg("kernel_stream", pl.col("stream")))],
                5,
            )
        )
    return frames


def _track_name(device: int | None, stream: int, lane: int) -> str:
    """A kernel track's name: the GPU stream, or the host thread of a CPU-only trace's
    spans (gloo), with the overlap lane when there is one."""
    where = (
        f"host thread {stream}" if device is None or device < 0 else f"GPU {device} stream {stream}"
    )
    return where if lane == 0 else f"{where} (overlapping {lane})"


def _tracks(kernels: pl.DataFrame, names: dict[int, str], order: dict[int, int]) -> pl.DataFrame:
    """`kernels` with `tid`: the stream, or, for a kernel that starts before an earlier one
    on its stream ends, an overlap track of that stream (`OVERLAP_TID` + n), so that no two
    slices of a track overlap without nesting (viewers draw such pairs wrong). GPU streams
    seldom have any; a CPU-only trace's host spans (gloo's asynchronous send and recv on
    one thread) do. Kernels are put on the first overlap track that is free, in start
    order; only those that clash are placed one by one."""
    kernels = kernels.sort("stream", "start_ns", "end_ns", maintain_order=True)
    reach = pl.col("end_ns").cum_max().shift(1).over("stream")
    kernels = kernels.with_columns(_clash=(pl.col("start_ns") < reach).fill_null(False))
    devices = dict(kernels.select("stream", "device").unique("stream").iter_rows())
    for stream in sorted(devices):
        names[int(stream)] = _track_name(devices[stream], int(stream), 0)
    clashing = kernels.filter(pl.col("_clash"))
    if clashing.height == 0:
        return kernels.with_columns(tid=pl.col("stream")).drop("_clash")
    lanes: dict[int, list[int]] = {}  # stream -> each overlap lane's last end
    tids: dict[tuple[int, int], int] = {}
    chosen = []
    for stream, start, end in clashing.select("stream", "start_ns", "end_ns").iter_rows():
        ends = lanes.setdefault(stream, [])
        lane = next((i for i, e in enumerate(ends) if e <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
            tids[(stream, lane + 1)] = OVERLAP_TID + len(tids)
            names[tids[(stream, lane + 1)]] = _track_name(devices[stream], stream, lane + 1)
            order[tids[(stream, lane + 1)]] = 1000 + stream * 8 + min(lane + 1, 7)
        else:
            ends[lane] = end
        chosen.append(tids[(stream, lane + 1)])
    moved = pl.Series("tid", chosen, dtype=pl.Int64)
    at = kernels.with_row_index("_i").filter(pl.col("_clash"))["_i"]
    tid = kernels["stream"].cast(pl.Int64).scatter(at, moved)
    return kernels.with_columns(tid=tid).drop("_clash")


def _finding_frames(
    plan: _Plan,
    rank: int,
    kernels: pl.DataFrame,
    windows: list[tuple[int, int, int]],
    names: dict[int, str],
) -> list[pl.DataFrame]:
    """A track per finding that concerns `rank`: its window (Finding.window_ns), else the
    windows of its steps on this rank, else the rank's whole span."""
    rows: list[dict[str, Any]] = []
    span = None
    if windows:
        span = (min(w[1] for w in windows), max(w[2] for w in windows))
    elif kernels.height:
        span = (int(kernels["start_ns"].min()), int(kernels["end_ns"].max()))  # type: ignore[arg-type]
    for i, f in enumerate(plan.findings):
        if f.ranks and rank not in f.ranks:
            continue
        label = f"{f.code} {f.title}"
        if f.window_ns:
            parts = [tuple(f.window_ns)]
        elif f.steps:
            parts = [(a, b) for s, a, b in windows if s in set(f.steps)]
        else:
            parts = [span] if span else []
        tid = FINDING_TID + i
        for a, b in parts:
            rows.append(
                {
                    "tid": tid,
                    "start_ns": int(a),
                    "end_ns": int(b),
                    "label": label,
                    "severity": f.severity.value,
                    "message": f.message,
                    "saving_ns": int(f.impact_ns_per_step),
                }
            )
        if parts:
            names[tid] = f"finding {i + 1}: {f.code} {f.title}"
    if not rows:
        return []
    frame = pl.DataFrame(rows, schema_overrides={"start_ns": pl.Int64, "end_ns": pl.Int64})
    frame = frame.with_columns(_base=pl.lit(plan.base_ns, pl.Int64))
    args = _args(
        _arg("severity", pl.col("severity"), text=True),
        _arg("message", pl.col("message"), text=True),
        _arg("saving_ns_per_step", pl.col("saving_ns")),
    )
    return [_slices(frame, "finding", [pl.lit(',"cname":"bad"'), args], 0)]


def timeline_pieces(report: Report, selection: Selection | None = None) -> Iterator[str]:
    """The Chrome trace JSON document, in pieces (one rank's events at a time)."""
    selection = selection or select(report)
    plan = _plan(report, selection)
    other = {
        "tool": "kineto-comm",
        "clock": "every timestamp on the reference clock: the report's offsets applied"
        " (docs/tables.md offsets)",
        "offsets_ns": {
            str(r): o
            for r, o in report.offsets.select("rank", "offset_ns").iter_rows()
            if r in set(selection.ranks)
        }
        if report.offsets.height
        else {},
        **selection.metadata(),
        "flow_id_width": plan.width,
        "flow_id": "instance x flow_id_width + the waiting rank",
        "flows_left_out": plan.flows_left_out,
        "flows_left_out_why": "the call's kernel on the rank that arrived last is not in the"
        " file (that rank, or that step on it, left out)",
        "critical_path": "included" if plan.critical is not None else "none in this report",
    }
    yield '{"displayTimeUnit":"ns",\n'
    yield f'"baseTimeNanoseconds":{plan.base_ns},\n'
    yield '"otherData":' + json.dumps(other, ensure_ascii=False) + ",\n"
    yield '"traceEvents":[\n'
    first = True
    for rank in selection.ranks:
        chunk: list[str] = []
        for text in _rank_events(report, plan, rank):
            chunk.append(text)
        if chunk:
            yield ("" if first else ",\n") + ",\n".join(chunk)
            first = False
    yield "\n]}\n"


def write_timeline(
    report: Report,
    out: Path | IO[str],
    selection: Selection | None = None,
) -> Selection:
    """Write the timeline to `out` (a path: gzip when its name ends in .gz; or a text
    stream) and return what it holds."""
    selection = selection or select(report)
    if isinstance(out, Path):
        # Level 3: within a few percent of level 6's size at a third of its time.
        with open_output(out, compresslevel=3) as stream:
            for piece in timeline_pieces(report, selection):
                stream.write(piece)
    else:
        for piece in timeline_pieces(report, selection):
            out.write(piece)
    return selection
