"""HANG101..HANG105: the ranks a hung job waits for, from Flight Recorder dumps.

The rules read the hang tables (`hang_roots`, `hang_mismatches`, `hang_world`; docs/hang.md),
which only `kineto-comm hang` (or `report` on a folder of FR dumps) produces: on Kineto
traces they are empty and the rules find nothing.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from kineto_comm.rules_api import Finding, Severity, Tables, make_finding, rule

_ROOTS = "hang_roots"


def _secs(ns: Any) -> str:
    return "an unknown time" if ns is None else f"{ns / 1e9:.1f} s"


def _where(r: dict[str, Any]) -> str:
    """What a root rank is stuck in, in words."""
    if r.get("stuck_op") is None:
        return "has nothing pending (it issued no further collective)"
    sizes = r.get("stuck_input_sizes") or "?"
    thread = f", thread {r['thread_name']}" if r.get("thread_name") else ""
    return (
        f"is stuck in {r['stuck_op']} #{r['stuck_seq']} of {r['stuck_group_desc']}"
        f" ({r['stuck_group']}; sizes {sizes}, {r.get('stuck_dtypes') or '?'}; state"
        f" {r['stuck_state']}{thread}) for {_secs(r.get('stuck_for_ns'))} before the dump"
    )


def _evidence(r: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "kind",
        "waited_by",
        "groups",
        "last_completed_group",
        "last_completed_seq",
        "stuck_group",
        "stuck_group_desc",
        "stuck_op",
        "stuck_seq",
        "stuck_state",
        "stuck_input_sizes",
        "stuck_dtypes",
        "stuck_for_ns",
        "thread_name",
        "frames",
    )
    return {k: r.get(k) for k in keep}


def _before(h: dict[str, Any] | None) -> str:
    """Whether a root rank was already late before the hang (`hang_history`, from Kineto
    traces of the same job), in words; empty without Kineto traces."""
    if h is None:
        return ""
    if not h.get("traced"):
        return " No Kineto trace of it lies beside the dumps."
    record = (
        f"last at {h['times_last']} of {h['instances']} collectives,"
        f" {100 * (h['late_share'] or 0):.0f}% of all lateness"
    )
    if h.get("is_straggler"):
        return f" Before the hang it was already a straggler in the Kineto traces ({record})."
    if h.get("most_late"):
        return (
            " Before the hang it was the most late rank in the Kineto traces, though not"
            f" consistently enough to be called a straggler ({record})."
        )
    return f" Before the hang it was not a straggler in the Kineto traces ({record})."


def _history(tables: Tables) -> dict[int, dict[str, Any]]:
    h = tables["hang_history"]
    return {r["rank"]: r for r in h.to_dicts()} if h.height else {}


def _root_findings(
    tables: Tables, code: str, kinds: tuple[str, ...], title: str, why: str, advice: tuple[str, ...]
) -> list[Finding]:
    roots = tables[_ROOTS]
    if roots.height == 0 or "kind" not in roots.columns:
        return []
    late = _history(tables)
    out = []
    for r in roots.filter(pl.col("kind").is_in(kinds)).to_dicts():
        before = _before(late.get(r["rank"]))
        evidence = _evidence(r)
        if r["rank"] in late:
            evidence["before_the_hang"] = {k: v for k, v in late[r["rank"]].items() if k != "rank"}
        waited = r.get("waited_by") or []
        by = f"; ranks {', '.join(map(str, waited))} wait for it" if waited else ""
        last = (
            f" It last completed #{r['last_completed_seq']} of {r['last_completed_group']}."
            if r.get("last_completed_seq") is not None
            else ""
        )
        groups = ", ".join(r.get("groups") or []) or "?"
        frames = f" Its stack: {r['frames'].splitlines()[0]}." if r.get("frames") else ""
        out.append(
            make_finding(
                code,
                Severity.error,
                f"rank {r['rank']}: {title}",
                f"Rank {r['rank']} {why} (groups {groups}{by}). It {_where(r)}.{last}{frames}"
                f"{before}",
                impact_ns_per_step=0,
                step_ns=0,
                ranks=[r["rank"]],
                process_group=r.get("stuck_group"),
                evidence=evidence,
                advice=advice,
            )
        )
    return out


@rule(
    code="HANG101",
    name="gpu-or-nccl-stopped",
    summary="A rank's peers completed a collective it never saw complete: its GPU or NCCL stopped.",
    tables=(_ROOTS, "hang_history"),
)
def gpu_or_nccl_stopped(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Names the ranks (Flight Recorder kind `device`) pending at a collective that another
    member of the same group had already completed: the collective ran, so the rank's host
    issued it, but its GPU or communicator never reported it done.

    Why is this bad?
    Every other rank soon waits for it, so the whole job hangs until the watchdog's timeout.

    How to fix:
    Check that host's kernel log (`dmesg`) for Xid errors and `nvidia-smi -q` for ECC or
    fallen-off-the-bus GPUs; rerun with NCCL_DEBUG=INFO; drain the node if it repeats.
    """
    return _root_findings(
        tables,
        "HANG101",
        ("device",),
        "GPU or NCCL stopped",
        "has not completed a collective its peers completed",
        (
            "Check that host's kernel log (dmesg) for Xid errors and nvidia-smi -q for ECC"
            " errors; rerun with NCCL_DEBUG=INFO; drain the node if it repeats.",
        ),
    )


@rule(
    code="HANG102",
    name="rank-stopped-issuing",
    summary="Others wait for a rank that has nothing pending: its Python thread stopped.",
    tables=(_ROOTS, "hang_history"),
)
def rank_stopped_issuing(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Names the ranks (kind `stopped`) that other ranks wait for in a collective or send/recv
    they never issued, while they themselves have nothing pending and wait for nobody.

    Why is this bad?
    The rank's training loop stopped before the collective: a Python thread holding the GIL,
    a dataloader or checkpoint stall, a deadlock in user code. Every rank waits for it.

    How to fix:
    At the next hang, dump that rank's stacks (`py-spy dump --pid`, or record FR stacks with
    TORCH_NCCL_TRACE_CPP_STACK / TORCH_FR_... settings) and look for what holds it.
    """
    return _root_findings(
        tables,
        "HANG102",
        ("stopped",),
        "stopped issuing work",
        "has nothing pending while others wait for a call it never made",
        (
            "Dump its Python stacks at the next hang (py-spy dump --pid PID) and look for a"
            " thread holding the GIL, a dataloader or checkpoint stall, or a lock.",
        ),
    )


@rule(
    code="HANG103",
    name="diverged-collective",
    summary="Ranks called a collective with another type, size or dtype: a diverged code path.",
    tables=(_ROOTS, "hang_mismatches"),
)
def diverged_collective(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    At each group's first incomplete collective, compares the members' calls as PyTorch's
    fr_trace does (type, input/output sizes, dtypes; all-to-all totals from format 2.4) and
    names the ranks whose call differs from the most common one.

    Why is this bad?
    NCCL matches calls by order only: mismatched calls hang or corrupt data.

    How to fix:
    Compare the ranks' stack frames for the call: a condition that differs by rank (data-
    dependent shapes, a skipped layer, an uneven last batch) sent them down another path.
    """
    odd = tables["hang_mismatches"]
    if odd.height == 0:
        return []
    out = []
    by = odd.group_by("process_group", "group_desc", "seq", "kind", "op", "expected", "found").agg(
        ranks=pl.col("rank").sort()
    )
    for r in by.sort("process_group", "seq", "kind").to_dicts():
        out.append(
            make_finding(
                "HANG103",
                Severity.error,
                f"{r['kind']} in {r['group_desc']} #{r['seq']}",
                f"Ranks {', '.join(map(str, r['ranks']))} called {r['op']} #{r['seq']} of"
                f" {r['group_desc']} ({r['process_group']}) with {r['found']} where the others"
                f" used {r['expected']}.",
                impact_ns_per_step=0,
                step_ns=0,
                ranks=r["ranks"],
                process_group=r["process_group"],
                evidence=dict(r),
                advice=(
                    "Compare the frames of this call on these ranks and the others: a"
                    " condition that differs by rank sent them down another code path.",
                ),
            )
        )
    return out


@rule(
    code="HANG104",
    name="rank-without-dump",
    summary="A rank of the job left no Flight Recorder dump.",
    tables=(_ROOTS, "hang_world"),
)
def rank_without_dump(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Lists the ranks that the process groups name but that left no dump; an error where other
    ranks wait for them, a warning otherwise.

    Why is this bad?
    A rank that did not dump often is the one that failed (process killed, host down), and
    without its dump the analysis cannot tell what it was doing.

    How to fix:
    Check that rank's process and host logs; make sure every rank writes its dump
    (TORCH_NCCL_DUMP_ON_TIMEOUT=1, a shared TORCH_FR_DUMP_TEMP_FILE folder).
    """
    world = tables["hang_world"]
    if world.height == 0:
        return []
    missing = world.filter(~pl.col("has_dump"))["rank"].to_list()
    if not missing:
        return []
    roots = tables[_ROOTS]
    waited = roots.filter(pl.col("kind") == "no_dump") if roots.height else roots
    out = []
    for r in waited.to_dicts():
        by = ", ".join(map(str, r.get("waited_by") or []))
        out.append(
            make_finding(
                "HANG104",
                Severity.error,
                f"rank {r['rank']}: no dump, and others wait for it",
                f"Rank {r['rank']} left no Flight Recorder dump; ranks {by} wait for it in"
                f" {', '.join(r.get('groups') or [])}.",
                impact_ns_per_step=0,
                step_ns=0,
                ranks=[r["rank"]],
                evidence=_evidence(r),
                advice=(
                    "Check that rank's process and host logs (killed, out of memory, host down).",
                ),
            )
        )
    rest = sorted(set(missing) - {r["rank"] for r in waited.to_dicts()})
    if rest:
        out.append(
            make_finding(
                "HANG104",
                Severity.warning,
                f"{len(rest)} rank(s) left no dump",
                f"Ranks {', '.join(map(str, rest))} left no Flight Recorder dump; nobody"
                " is seen waiting for them, but what they did is unknown.",
                impact_ns_per_step=0,
                step_ns=0,
                ranks=rest,
                advice=(
                    "Make every rank write its dump (TORCH_NCCL_DUMP_ON_TIMEOUT=1 and a"
                    " shared dump folder).",
                ),
            )
        )
    return out


@rule(
    code="HANG105",
    name="wait-cycle",
    summary="Ranks wait for each other, or for ranks only blocked in posted operations.",
    tables=(_ROOTS, "hang_history"),
)
def wait_cycle(tables: Tables, options: dict[str, Any]) -> list[Finding]:
    """What it does:
    Where no rank stopped on its own (no GPU stop, stopped rank, missing dump or diverged
    call), names the ranks everything waits for: those blocked in operations every peer
    posted (kind `blocked`), or the ranks of a cycle of waits (kind `deadlock`).

    Why is this bad?
    A cycle is a deadlock in the program's order of collectives; a rank blocked in posted
    operations points at the network or NCCL itself.

    How to fix:
    Compare the order of collectives and send/recv on the named ranks (their stacks); for
    blocked operations, rerun with NCCL_DEBUG=INFO and check the fabric.
    """
    return _root_findings(
        tables,
        "HANG105",
        ("deadlock", "blocked"),
        "waited for in a cycle or a posted operation",
        "is waited for, and is itself only blocked",
        (
            "Compare the order of collectives and send/recv on these ranks; rerun with"
            " NCCL_DEBUG=INFO and check the network if every peer posted the operation.",
        ),
    )
