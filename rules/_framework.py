"""What the trace shows of the framework, as the built-in rules' advice reads it.

The `framework` table (docs/tables.md; kineto_comm.analysis.framework) is the one home of
the settings a job already uses: advice never names one of them again, nor one the
framework seen rejects (FSDP1 flags on an FSDP2 model, Megatron's p2p overlap outside the
interleaved schedule). These helpers read it; they never read annotations themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from kineto_comm.rules_api import Tables

# The schedule's name in advice, by the table's `schedule` row.
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B"}

# What cuts an optimizer's CPU time, by its class (torch.optim's have fused kernels).
_FUSED = (
    ": torch.optim.{0}(fused=True) (or foreach=True) launches a few kernels for all "
    "parameters instead of several per parameter"
)
OPTIMIZER_ADVICE = {name: _FUSED.format(name) for name in ("Adam", "AdamW", "SGD", "Adagrad")}
# The same where the trace's multi_tensor_apply kernels show foreach (or fused) in use.
FOREACH_IN_USE = (
    ": it runs foreach kernels already (multi_tensor_apply, in the trace); "
    "torch.optim.{0}(fused=True), where it is not on yet, launches fewer still"
)
OPTIMIZER_ADVICE["Shampoo"] = (
    ": compute its preconditioners less often (Distributed Shampoo's "
    "precondition_frequency) or spread them over the ranks (its distributed config)"
)


# FSDP2's (fully_shard's) own knobs, by what they hide: its parameter gathers, or its
# gradient reductions.
FSDP2_GATHER = (
    "FSDP2 (fully_shard, as the trace shows): prefetch the next blocks' parameters during "
    "the current block's compute (module.set_modules_to_forward_prefetch([...]) and "
    "set_modules_to_backward_prefetch([...])); reshard_after_forward=False (or an int) for "
    "the last blocks keeps their parameters gathered for the backward; fully_shard bigger "
    "units so fewer gathers run."
)
FSDP2_REDUCE = (
    "FSDP2 (fully_shard, as the trace shows): fully_shard each transformer block, so its "
    "gradients are reduce-scattered while the earlier blocks' backward runs; with gradient "
    "accumulation, model.set_requires_gradient_sync(False) on all but the last micro-batch."
)
TORCHREC_PIPELINED = (
    "torchrec: the sparse-feature all-to-all is already pipelined (TrainPipelineSparseDist's "
    "stages are in the trace: `## sparse_data_dist ##`); what stays exposed is the "
    "embedding exchange of the current batch: cut or balance its volume (below)."
)
# Roles whose advice names the wrapper that issues their calls.
_WRAPPED = ("data_parallel", "fsdp")


def fit_advice(
    tables: Tables, ranks: Sequence[int] | None, role: str, collective: str, lines: Sequence[str]
) -> tuple[str, ...]:
    """`lines` of advice for a (role, collective) fitted to the framework the trace shows on
    `ranks`: FSDP2's knobs (not FSDP1's flags) on an FSDP2 model and the reverse; no
    DeepSpeed or Megatron-LM line for the gradients of a job that wraps its model in
    PyTorch's DDP or FSDP; no TrainPipelineSparseDist where it runs. Unchanged where the
    trace shows no framework."""
    seen = set(markers(tables, "framework", ranks)["name"].to_list())
    out = list(lines)
    if not seen:
        return tuple(out)
    if "fsdp2" in seen and role == "fsdp":
        fsdp2 = FSDP2_GATHER if collective == "all_gather" else FSDP2_REDUCE
        out = [fsdp2] + [line for line in out if not line.startswith(("FSDP:", "FSDP2:"))]
    elif "fsdp1" in seen:
        out = [line for line in out if not line.startswith("FSDP2:")]
    if role in _WRAPPED and seen & {"fsdp1", "fsdp2", "ddp"}:
        out = [line for line in out if not line.startswith(("DeepSpeed", "Megatron-LM"))]
    if "torchrec_pipeline" in seen:
        out = [TORCHREC_PIPELINED if "TrainPipelineSparseDist" in line else line for line in out]
    return tuple(out)


def markers(tables: Tables, kind: str, ranks: Sequence[int] | None = None) -> pl.DataFrame:
    """The framework table's rows of one kind (of `ranks` when given)."""
    table = tables["framework"]
    if table.height == 0 or "kind" not in table.columns:
        return pl.DataFrame(
            schema={"rank": pl.Int64, "name": pl.String, "within": pl.String, "count": pl.Int64}
            | {"ns_per_step": pl.Int64}
        )
    rows = table.filter(pl.col("kind") == kind)
    if ranks is not None:
        rows = rows.filter(pl.col("rank").is_in(list(ranks)))
    return rows


def uses(tables: Tables, kind: str, name: str, ranks: Sequence[int] | None = None) -> bool:
    """Whether the trace shows `name` of `kind` in use (on any of `ranks` when given)."""
    return bool((markers(tables, kind, ranks)["name"] == name).any())


def schedule(tables: Tables, ranks: Sequence[int] | None = None) -> str | None:
    """The pipeline schedule seen on `ranks` (gpipe, 1f1b, interleaved), None if unknown."""
    names = markers(tables, "schedule", ranks)["name"].unique().to_list()
    return names[0] if len(names) == 1 else None


def p2p_together(tables: Tables, ranks: Sequence[int] | None = None) -> bool:
    """Whether sends and receives are already issued together (batch_isend_irecv, isend and
    irecv in flight at once) on `ranks`."""
    return markers(tables, "p2p", ranks).height > 0


_PASS = r"(?i)^## (forward|backward)( |:|##)"


def _pass_word(name: str) -> str:
    """ "forward" or "backward", the pass a `## forward ##`-style phase name marks."""
    return "backward" if "backward" in name.lower() else "forward"


def cpu_holders(
    tables: Tables,
    ranks: Sequence[int],
    step_ns: float,
    min_share: float = 0.05,
    passes: bool = False,
) -> list[str]:
    """Sentences naming what holds the CPU of `ranks` in a step: the optimizer steps, the
    copies that blocked the thread (with the phase around them), the largest CPU phase
    that is neither the forward nor the backward and, with `passes` (a launch-bound step),
    the forward and backward phases themselves, each from `min_share` of the step
    (`step_ns`), largest first; the mean over the ranks that show it."""
    if step_ns <= 0:
        return []
    out: list[tuple[float, str]] = []

    def mean(rows: pl.DataFrame, by: str) -> pl.DataFrame:
        return (
            rows.group_by(by)
            .agg(ns=pl.col("ns_per_step").mean(), count=pl.col("count").sum())
            .filter(pl.col("ns") >= min_share * step_ns)
            .sort("ns", descending=True)
        )

    foreach = uses(tables, "in_use", "foreach", ranks)
    for name, ns, _ in mean(markers(tables, "optimizer", ranks), "name").iter_rows():
        advice = OPTIMIZER_ADVICE.get(name, "")
        if foreach and advice == _FUSED.format(name):
            advice = FOREACH_IN_USE.format(name)
        out.append(
            (
                ns,
                f"the optimizer step ({name}.step) holds the CPU {ns / 1e6:.2f} ms per step "
                f"({ns / step_ns:.0%} of the step)" + advice,
            )
        )
    copies = markers(tables, "blocking_copy", ranks).with_columns(what=pl.struct("name", "within"))
    for what, ns, _ in mean(copies, "what").iter_rows():
        within = what["within"]
        where = "" if within in (None, "-") else f" in `{within}`"
        out.append(
            (
                ns,
                f"a copy ({what['name']}){where} blocks the CPU {ns / 1e6:.2f} ms per step "
                f"({ns / step_ns:.0%}) until the device catches up (.item(), .cpu(), "
                ".to() of a device tensor): copy into pinned memory with non_blocking=True "
                "and read it later, or drop the sync",
            )
        )
    phases = markers(tables, "phase", ranks).filter(
        ~pl.col("name").str.contains(_PASS)
        & ~pl.col("name").str.contains(r"(?i)^## optimizer( |:|##)")
        & ~pl.col("name").str.starts_with("Optimizer.")
    )
    # A phase that only wraps a blocking copy named above is that copy.
    named = copies.filter(pl.col("ns_per_step") >= min_share * step_ns)["within"].to_list()
    top = mean(phases.filter(~pl.col("name").is_in(named)), "name").head(1)
    for name, ns, _ in top.iter_rows():
        out.append((ns, f"`{name}` holds the CPU {ns / 1e6:.2f} ms per step ({ns / step_ns:.0%})"))
    if passes:
        # Where the forward and backward launch most of the step's kernels, they hold the CPU
        # longest (hta nccl_parser_config: 103 ms each against the optimizer's 15 ms).
        marked = markers(tables, "phase", ranks).filter(pl.col("name").str.contains(_PASS))
        rows = mean(marked, "name").rows()
        if rows:
            each = [
                f"the {_pass_word(name)} (`{name}`) {ns / 1e6:.2f} ms per step ({ns / step_ns:.0%})"
                for name, ns, _ in rows
            ]
            out.append(
                (
                    rows[0][1],
                    " and ".join(each)
                    + (" hold" if len(rows) > 1 else " holds")
                    + " the CPU launching kernels: fewer, fused kernels"
                    + (
                        ""
                        if uses(tables, "in_use", "inductor", ranks)
                        or uses(tables, "in_use", "torch_compile", ranks)
                        else " (torch.compile)"
                    )
                    + " or one graph launch (below) shorten "
                    + ("them" if len(rows) > 1 else "it"),
                )
            )
    return [text for _, text in sorted(out, key=lambda x: -x[0])]
