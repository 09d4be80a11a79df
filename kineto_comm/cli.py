"""The `kineto-comm` command: a thin layer over `kineto_comm.analyze`.

Exit codes: 0 report produced, nothing at or above `--fail-on`; 1 findings at or above it (diff:
a gate exceeded); 2 nothing could be analysed (with `report --strict`: a file was left out),
or bad arguments. Problems are printed as one line `error: <file>:
<problem>`; never a Python traceback.

Heavy modules (Polars, numpy, the analysis) are imported inside the commands that need them:
`--help`, `--version` and every command's `--help` load none (tests/test_startup.py).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from kineto_comm import timings
from kineto_comm.errors import TraceError, UsageError, one_line
from kineto_comm.findings import Severity
from kineto_comm.timings import stage
from kineto_comm.version import __version__

# What an option's value is, in its help: words, not Python's type tags (<list[Path]>).
VALUE_NAMES = {"int": "N", "float": "NUMBER", "Path": "PATH"}


class Command(TyperCommand):
    """A command whose help names values as people read them (TEXT, PATH, N; nothing for
    a flag) and arguments by name (TRACES...), not by Python type tags (<list[Path]>)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Typer's rich help keeps a docstring's line breaks: one line per paragraph, wrapped
        # to the terminal's width.
        if self.help:
            self.help = "\n\n".join(" ".join(p.split()) for p in self.help.split("\n\n"))

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        for p in params:
            if p.metavar is not None:
                continue
            if isinstance(p, TyperArgument):
                # Its name shows in its own column; Typer prints its type tag whatever the
                # metavar, so this argument object prints none. Errors name it as the usage
                # line does ("Missing argument 'PATHS...'"), not by the empty metavar.
                p.metavar = ""
                p.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
                hint = f"'{_argument_name(p)}'"
                p.get_error_hint = lambda ctx=None, hint=hint: hint  # type: ignore[method-assign]
            elif getattr(p, "is_flag", False):
                p.metavar = ""  # a flag takes no value
            else:
                bare = p.bare_type()
                p.metavar = VALUE_NAMES.get(bare.removeprefix("list[").rstrip("]"), "TEXT")
            if getattr(p, "min", None) is not None or getattr(p, "max", None) is not None:
                # A bound in words at the end of the help ("(at least 1)"), not Typer's tag
                # beside the metavar ("N [x>=1]").
                words = f"({_range_words(p.min, p.max)})"
                if not (p.help or "").endswith(words):  # params are asked for more than once
                    p.help = f"{p.help or ''} {words}".strip()
                p._get_number_range_help_str = lambda: None  # type: ignore[method-assign]
        return params

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if isinstance(p, TyperArgument) and p.name:
                name = _argument_name(p)
                pieces.append(name if p.required else f"[{name}]")
        return pieces


def _argument_name(p: Any) -> str:
    """An argument as the usage line and errors name it: PATHS..., CODE."""
    return str(p.name).upper() + ("..." if p.nargs != 1 else "")


def _range_words(low: float | None, high: float | None) -> str:
    """An option's bounds as words: 'at least 1', 'at most 9', '1 to 9'."""
    if low is not None and high is not None:
        return f"{low} to {high}"
    return f"at least {low}" if low is not None else f"at most {high}"


class Group(TyperGroup):
    """The command list, whose own options (--help) show no type tag either."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        for p in params:
            if p.metavar is None and getattr(p, "is_flag", False):
                p.metavar = ""
        return params


app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find where communication costs distributed training time in Kineto traces.",
)


def _print_version(value: bool) -> None:
    if value:
        print(f"kineto-comm {__version__}")
        raise typer.Exit()


@app.callback()
def _main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Find where communication costs distributed training time in Kineto traces."""


def _fail(message: str) -> typer.Exit:
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(2)


def _choice(value: str, choices: Sequence[str], option: str) -> str:
    """`value` as one of `choices`, whatever its case (the one rule for every choice and
    rule code: case-insensitive); ValueError naming the option and the choices."""
    chosen = value.strip().lower()
    if chosen not in choices:
        raise ValueError(f"{option}: unknown value {value!r}; choose one of {', '.join(choices)}")
    return chosen


FORMATS_HELP = (
    "text, json, markdown, sarif, junit, github, html, or perfetto (a clock-aligned timeline"
    " for Perfetto UI / chrome://tracing; gzip when the -o name ends in .gz)."
)

# The rule options `report` and `diff` share: a diff of trace folders runs the same rules,
# with the same config and options, as `report` does on each.
SelectOption = Annotated[
    list[str] | None,
    typer.Option("--select", help="Rules to run: codes, prefixes or names (repeatable, a,b)."),
]
IgnoreOption = Annotated[
    list[str] | None,
    typer.Option("--ignore", help="Rules to skip: codes, prefixes or names (repeatable)."),
]
RulesOption = Annotated[
    list[str] | None,
    typer.Option("--rules", help="Custom rules: a .py or .toml file, or a module (repeatable)."),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", help="Config file (default: kineto-comm.toml / pyproject.toml)."),
]
RuleOptionOption = Annotated[
    list[str] | None,
    typer.Option("--rule-option", help="Rule option CODE.name=value (repeatable)."),
]


def _rule_args(
    select: list[str] | None,
    ignore: list[str] | None,
    rules: list[str] | None,
    config: Path | None,
    rule_option: list[str] | None,
) -> dict[str, Any]:
    """The rule options of the command line as analyze()'s keyword arguments."""
    from kineto_comm.rules_engine import parse_rule_options

    return {
        "select": select or (),
        "ignore": ignore or (),
        "rules": rules or (),
        "config": config,
        "rule_options": parse_rule_options(rule_option),
    }


@app.command(cls=Command)
def report(
    paths: Annotated[
        list[Path], typer.Argument(help="Trace files or directories (one file per rank).")
    ],
    format: Annotated[str, typer.Option("--format", "-f", help=FORMATS_HELP)] = "text",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here, not stdout.")
    ] = None,
    also: Annotated[
        list[str] | None,
        typer.Option("--also", help="Also write FORMAT=FILE from the same analysis (repeatable)."),
    ] = None,
    fail_on: Annotated[
        str,
        typer.Option(
            "--fail-on", help="Exit 1 on findings at or above: info, warning, error or never."
        ),
    ] = "error",
    exit_zero: Annotated[
        bool, typer.Option("--exit-zero", help="Exit 0 whatever the findings (2 on errors).")
    ] = False,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Exit 2 when any trace file was left out (unreadable, a duplicate rank,"
            " another job); the report is still written.",
        ),
    ] = False,
    comm_pattern: Annotated[
        list[str] | None,
        typer.Option(
            "--comm-pattern",
            help="Extra regex for communication kernel names (repeatable): 'dispatch|combine'.",
        ),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option("--jobs", "-j", help="Rank files analysed at once (threads or processes)."),
    ] = None,
    no_align: Annotated[
        bool, typer.Option("--no-align", help="Keep each trace's clock (no offset estimation).")
    ] = False,
    ranks_per_host: Annotated[
        int | None,
        typer.Option(
            "--ranks-per-host",
            min=1,
            help="Ranks r // N share a host and its clock (default: from the traces; 1: a"
            " clock per rank).",
        ),
    ] = None,
    cache: Annotated[
        Path | None,
        typer.Option("--cache", help="Keep parsed per-rank tables here and reuse them."),
    ] = None,
    dask_scheduler: Annotated[
        str | None,
        typer.Option(
            "--dask-scheduler",
            envvar="KINETO_COMM_DASK_SCHEDULER",
            help="Run per-rank work on this Dask scheduler (traces on shared storage).",
        ),
    ] = None,
    memory_limit: Annotated[
        str | None,
        typer.Option(
            "--memory-limit",
            envvar="KINETO_COMM_MEMORY_LIMIT",
            help="Memory the analysis may use, e.g. 8G (default: 3/4 of available memory).",
        ),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option("--model", help="Model config (TOML): compare with the analytical model."),
    ] = None,
    network: Annotated[
        str | None,
        typer.Option(
            "--network",
            help="The link between hosts, e.g. 400G-IB, 200G-RoCE (docs/hardware.md): what"
            " groups across hosts should reach (default: the config's [hardware] network).",
        ),
    ] = None,
    timeline_ranks: Annotated[
        str | None,
        typer.Option(
            "--ranks",
            help="perfetto: ranks to include, e.g. 0,3,8-11 or all (default: every rank"
            " under about 200 MB, else the median rank, each group's slowest and fastest,"
            " every straggler).",
        ),
    ] = None,
    timeline_steps: Annotated[
        str | None,
        typer.Option(
            "--steps",
            help="perfetto: steps to include, e.g. 5-7 (default: all, or the middle ones"
            " under about 200 MB).",
        ),
    ] = None,
    select: SelectOption = None,
    ignore: IgnoreOption = None,
    rules: RulesOption = None,
    config: ConfigOption = None,
    rule_option: RuleOptionOption = None,
) -> None:
    """Analyse traces: where each rank's time went, what communication costs, what to change."""
    timings.since_start("command line")
    from kineto_comm.load.discover import find_dumps

    if find_dumps(list(paths)):  # Flight Recorder dumps: the hang report (kineto-comm hang)
        _hang_report(paths, format, output, fail_on, exit_zero, select, ignore, rule_option)
    with stage("imports"):
        from kineto_comm.analyze import analyze
        from kineto_comm.render.formats import (
            EXPORTS,
            FORMATS,
            exit_code,
            parse_also,
            parse_fail_on,
            write,
        )
        from kineto_comm.render.perfetto import parse_numbers

    try:
        # never: no finding fails the run (as --exit-zero); the formats still mark errors.
        fails_at = parse_fail_on(fail_on, "--fail-on")
        severity = fails_at or Severity.error
        exit_zero = exit_zero or fails_at is None
        extra = [parse_also(item) for item in also or ()]
        format = _choice(format, (*FORMATS, *EXPORTS), "--format")
        shown_ranks = parse_numbers(timeline_ranks)
        shown_steps = parse_numbers(timeline_steps)
        exported = format in EXPORTS or any(fmt in EXPORTS for fmt, _ in extra)
        if (timeline_ranks or timeline_steps) and not exported:
            raise ValueError(
                "--ranks and --steps choose what --format perfetto (or --also"
                " perfetto=FILE) shows; no perfetto output was asked for"
            )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    result = analyze(
        paths,
        comm_patterns=tuple(comm_pattern or ()),
        jobs=jobs,
        align=not no_align,
        ranks_per_host=ranks_per_host,
        cache_dir=cache,
        dask_scheduler=dask_scheduler,
        progress=_progress_bar() if sys.stderr.isatty() else None,
        memory_limit=memory_limit,
        model=model,
        network=network,
        **_rule_args(select, ignore, rules, config, rule_option),
    )
    with stage("imports"):
        from kineto_comm.render.perfetto import select as choose
        from kineto_comm.render.perfetto import write_timeline
        from kineto_comm.report import problem_lines

    # Warnings and unusable files on stderr, once, whatever the format: stdout holds only
    # the report (the text report printed here leaves them out; a file keeps them).
    for line in problem_lines(result):
        print(line, file=sys.stderr)
    if result.ranks.height == 0:
        if not result.errors:
            print("error: no trace files found", file=sys.stderr)
        raise typer.Exit(2)

    try:  # before anything is written: ranks or steps the job lacks are a usage error
        shown = choose(result, shown_ranks, shown_steps) if exported else None
    except ValueError as exc:
        raise _fail(str(exc)) from None

    def export(out: Path | Any) -> None:
        """The perfetto timeline of the ranks and steps asked for (render.perfetto)."""
        write_timeline(result, out, shown)

    with stage("render"):
        for fmt, path in extra:
            if fmt in EXPORTS:
                export(path)
            else:
                write(result, fmt, path, fail_on=severity)
        if format in EXPORTS:
            export(output or sys.stdout)
        elif format == "text" and output is None:
            from kineto_comm.render.text import render_text

            render_text(result, out=sys.stdout, problems=False)
        else:
            write(result, format, output or sys.stdout, fail_on=severity)
    if strict and result.errors:  # a file left out is an input error under --strict
        raise typer.Exit(2)
    raise typer.Exit(exit_code(result, severity, exit_zero))


@app.command(cls=Command)
def diff(
    baseline: Annotated[
        Path, typer.Argument(help="Baseline: trace directory or saved JSON report.")
    ],
    new: Annotated[Path, typer.Argument(help="New run: trace directory or saved JSON report.")],
    max_regression: Annotated[
        str,
        typer.Option(
            "--max-regression",
            help="Fail if step time grows by more than this percentage (5 or 5%).",
        ),
    ] = "5%",
    max_exposed_regression: Annotated[
        str | None,
        typer.Option(
            "--max-exposed-regression",
            help="Fail if exposed communication grows by more than this percentage of the step.",
        ),
    ] = None,
    max_busbw_drop: Annotated[
        str | None,
        typer.Option(
            "--max-busbw-drop",
            help="Fail if a collective's bus bandwidth drops by more than this percentage.",
        ),
    ] = None,
    fail_on_new: Annotated[
        str,
        typer.Option(
            "--fail-on-new", help="Fail on new findings at or above: info, warning, error or never."
        ),
    ] = "never",
    format: Annotated[str, typer.Option("--format", "-f", help="text or json.")] = "text",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here, not stdout.")
    ] = None,
    exit_zero: Annotated[
        bool, typer.Option("--exit-zero", help="Exit 0 whatever the gates say (2 on errors).")
    ] = False,
    jobs: Annotated[
        int | None,
        typer.Option("--jobs", "-j", help="Rank files analysed at once (trace directories)."),
    ] = None,
    select: SelectOption = None,
    ignore: IgnoreOption = None,
    rules: RulesOption = None,
    config: ConfigOption = None,
    rule_option: RuleOptionOption = None,
) -> None:
    """Compare two runs (trace directories or saved JSON reports); exit 1 on regressions.

    Trace directories are analysed as `report` would (the same rules, config and rule
    options), so they give the verdict their saved JSON reports give."""
    from kineto_comm.diff import diff as run_diff
    from kineto_comm.diff import parse_percent, render_diff_json, render_diff_text
    from kineto_comm.render.formats import open_output, parse_fail_on

    try:
        format = _choice(format, ("text", "json"), "--format")
        # Checked here to name the option; the library reads the same values the same way.
        for option, value in (
            ("--max-regression", max_regression),
            ("--max-exposed-regression", max_exposed_regression),
            ("--max-busbw-drop", max_busbw_drop),
        ):
            parse_percent(value, option)
        parse_fail_on(fail_on_new, "--fail-on-new")
        result = run_diff(
            baseline,
            new,
            max_regression=max_regression,
            max_exposed_regression=max_exposed_regression,
            max_busbw_drop=max_busbw_drop,
            fail_on_new=fail_on_new,
            jobs=jobs,
            analysis=_rule_args(select, ignore, rules, config, rule_option),
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    text = render_diff_json(result) if format == "json" else render_diff_text(result)
    if output:
        with open_output(output) as stream:
            stream.write(text)
    else:
        sys.stdout.write(text)
    raise typer.Exit(0 if exit_zero or not result.failed else 1)


@app.command(cls=Command)
def model(
    config: Annotated[Path, typer.Argument(help=r"Model config (TOML with a \[model] table).")],
) -> None:
    """Expected communication of a configuration, the pipeline bubble, and a what-if sweep."""
    from kineto_comm.analytic import load_model, render_model

    try:
        model_config, hardware = load_model(config)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    print(render_model(model_config, hardware))


def _progress_bar() -> Any:
    """A callback drawing a progress bar on stderr while rank files are analysed."""
    from rich.console import Console
    from rich.progress import Progress

    bar = Progress(transient=True, console=Console(stderr=True))
    task = None

    def update(done: int, total: int) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("analysing rank files", total=total)
        bar.update(task, completed=done)
        if done >= total:
            bar.stop()

    return update


@app.command(cls=Command)
def synth(
    scenario: Annotated[
        str,
        typer.Argument(
            help="baseline, exposed-allreduce, straggler, bubble, small-messages, slow-link, "
            "clock-skew or interference"
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="Directory to write rank traces and truth.json.")
    ],
    ranks: Annotated[int, typer.Option("--ranks", help="World size.")] = 8,
    layout: Annotated[str, typer.Option("--layout", help="dp, fsdp, tp-dp or pp-dp.")] = "dp",
    seed: Annotated[int, typer.Option("--seed", help="Random seed (same seed, same traces).")] = 0,
    size_mb: Annotated[
        float | None, typer.Option("--size-mb", help="Approximate MB per rank file.")
    ] = None,
    steps: Annotated[int, typer.Option("--steps", help="Profiled training steps.")] = 3,
    gzip: Annotated[
        bool, typer.Option("--gzip/--no-gzip", help="Write .json.gz instead of .json.")
    ] = False,
    host_ops: Annotated[
        int,
        typer.Option(
            "--host-ops",
            help="CPU ops without kernels (record_shapes views) per compute kernel; real"
            " captures have ~7.",
        ),
    ] = 0,
    single_gpu_hosts: Annotated[
        bool,
        typer.Option(
            "--single-gpu-hosts",
            help="One GPU per host: every rank on device 0, no host name in the traces"
            " (clock-skew: clocks 0.5-1.5 ms apart).",
        ),
    ] = False,
) -> None:
    """Write a synthetic multi-rank job with one known problem and its truth.json."""
    from kineto_comm.synth import generate

    scenario, layout = scenario.strip().lower(), layout.strip().lower()  # any case
    try:
        truth = generate(
            scenario,
            out,
            ranks=ranks,
            layout=layout,
            seed=seed,
            size_mb=size_mb,
            steps=steps,
            gzip=gzip,
            host_ops=host_ops,
            single_gpu_hosts=single_gpu_hosts,
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    # The layout written, which a scenario may change (bubble needs pipeline stages).
    wrote, par = truth["layout"], truth["parallelism"]
    shape = " x ".join(f"{k} {v}" for k, v in par.items() if v > 1) or "1 rank"
    moved = f"; asked for {layout}" if wrote != layout else ""
    print(
        f"wrote {scenario} ({wrote}: {shape}{moved}, {truth['world_size']} ranks) to {out}",
        file=sys.stderr,
    )


@app.command(cls=Command)
def capture(
    layout: Annotated[str, typer.Argument(help="ddp, fsdp, pp, pp-1f1b, pp-dp, tp, tp-dp or ep.")],
    out: Annotated[Path, typer.Option("--out", help="Directory for the rank traces.")],
    ranks: Annotated[int, typer.Option("--ranks", help="World size (processes).")] = 2,
    steps: Annotated[int, typer.Option("--steps", help="Profiled training steps.")] = 3,
    backend: Annotated[
        str | None, typer.Option("--backend", help="gloo or nccl (default: nccl with GPUs).")
    ] = None,
    bucket_cap_mb: Annotated[
        float, typer.Option("--bucket-cap-mb", help="DDP gradient bucket size in MB.")
    ] = 25.0,
    micro_batches: Annotated[
        int, typer.Option("--micro-batches", help="Pipeline micro-batches per step (pp).")
    ] = 4,
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the model and data.")] = 0,
    with_stack: Annotated[
        bool,
        typer.Option(
            "--with-stack",
            help="Record Python call stacks and modules too (python_function events), and"
            " beside each trace which phase and module issued each call (truth-rank-N.json).",
        ),
    ] = False,
) -> None:
    """Run a tiny transformer training job under torch.profiler and save one trace per rank."""
    try:
        from kineto_comm.capture import capture as run_capture

        files = run_capture(
            layout.strip().lower(),
            out,
            ranks=ranks,
            steps=steps,
            backend=backend.strip().lower() if backend else None,
            bucket_cap_mb=bucket_cap_mb,
            micro_batches=micro_batches,
            seed=seed,
            with_stack=with_stack,
        )
    except ImportError as exc:
        raise _fail(f"capture needs torch: pip install 'kineto-comm[capture]' ({exc})") from None
    except (ValueError, RuntimeError) as exc:
        raise _fail(str(exc).splitlines()[0]) from None
    for f in files:
        print(f)


@app.command("rules", cls=Command)
def rules_command(rules: RulesOption = None, config: ConfigOption = None) -> None:
    """List every rule: code, name, family and source (built-in, plugin or file)."""
    from kineto_comm.rules_engine import list_rules

    print(list_rules(_registry(rules, config)))


@app.command(cls=Command)
def explain(
    code: Annotated[str, typer.Argument(help="A rule code or name, e.g. COMM101.")],
    rules: RulesOption = None,
    config: ConfigOption = None,
) -> None:
    """Print a rule's documentation and options."""
    from kineto_comm.rules_engine import explain as explain_rule

    print(explain_rule(_registry(rules, config).get(code)))


def _registry(rules: list[str] | None, config: Path | None) -> Any:
    """Every rule `report` would know with the same --rules and --config: built-in,
    plugins, the config file's (given, or found upward) and the --rules files."""
    from kineto_comm.rules_engine import load_config, registry

    return registry(rules or (), load_config(config))


# --- kineto-comm hang: Flight Recorder dumps of a hung job (kineto_comm.hang) ---


def _hang_report(
    paths: list[Path],
    format: str,
    output: Path | None,
    fail_on: str,
    exit_zero: bool,
    select: list[str] | None,
    ignore: list[str] | None,
    rule_option: list[str] | None,
) -> None:
    """Print the hang report of the FR dumps under `paths`; exit 2 when none could be
    read, 1 on findings at or above `fail_on`, else 0."""
    from kineto_comm.hang import analyze_hang, exit_code
    from kineto_comm.render.formats import parse_severity
    from kineto_comm.render.hang import HANG_FORMATS, render_hang
    from kineto_comm.rules_engine import parse_rule_options

    try:
        severity = parse_severity(fail_on)
        if format not in HANG_FORMATS:
            raise ValueError(
                f"unknown format {format!r} for a hang report; choose one of "
                + ", ".join(HANG_FORMATS)
            )
        result = analyze_hang(
            paths,
            select=select or (),
            ignore=ignore or (),
            rule_options=parse_rule_options(rule_option),
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    for file, problem in result.errors:
        print(f"error: {file}: {problem}", file=sys.stderr)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if result.analysed == 0:
        if not result.errors:
            print("error: no Flight Recorder dumps found", file=sys.stderr)
        raise typer.Exit(2)
    text = render_hang(result, format, severity)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    raise typer.Exit(exit_code(result, severity, exit_zero))


@app.command(cls=Command)
def hang(
    paths: Annotated[
        list[Path], typer.Argument(help="Flight Recorder dumps, or folders of them (one per rank).")
    ],
    format: Annotated[
        str,
        typer.Option("--format", "-f", help="text, json, markdown, github, sarif, junit or html."),
    ] = "text",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here, not stdout.")
    ] = None,
    fail_on: Annotated[
        str, typer.Option("--fail-on", help="Exit 1 on findings at or above: info, warning, error.")
    ] = "error",
    exit_zero: Annotated[
        bool, typer.Option("--exit-zero", help="Exit 0 whatever the findings (2 on errors).")
    ] = False,
    select: SelectOption = None,
    ignore: IgnoreOption = None,
    rule_option: RuleOptionOption = None,
) -> None:
    """Name the rank(s) a hung job waits for, from PyTorch Flight Recorder dumps."""
    _hang_report(paths, format, output, fail_on, exit_zero, select, ignore, rule_option)


def _usage_error(exc: Exception) -> bool:
    """Print the command line's own usage error (Click's, vendored by newer Typer) as one
    line naming the command; help asked for by giving no arguments is printed whole."""
    if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
        return False
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        print(ctx.get_help())
        return True
    where = ctx.command_path if ctx is not None else "kineto-comm"
    print(
        f"error: {where}: {one_line(exc.format_message())} (see '{where} --help')", file=sys.stderr
    )
    return True


def main() -> None:
    """Console entry point: no tracebacks, one line per problem, exit 2 on errors."""
    if sys.stdout is sys.__stdout__ and hasattr(signal, "SIGPIPE"):
        # A reader that closes the pipe early (`report | head`) ends the process as it ends
        # cat or git (status 141), not with exit 1, which means "findings" here.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except (TraceError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as exc:  # a file or directory it was told to write or read
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:  # never show a traceback to users
        if _usage_error(exc):
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        print(
            f"error: {one_line(f'internal error ({type(exc).__name__}: {exc})')}", file=sys.stderr
        )
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
