"""The rules engine: find rules, select them, configure them, run them and rank the findings.

Rules come from four places (`kineto-comm rules` shows which):
    built-in  the top-level `rules/` folder, shipped as the package `kineto_comm_builtin_rules`
    plugin    installed distributions exposing the entry-point group `kineto_comm.rules`
    file      `--rules path.py|module|rules.toml` or config `rules = [...]`
    file      declarative TOML rules (`[[rule]]` with a Polars SQL `query` and a `message`)

Configuration comes from `--config FILE`, else the first `kineto-comm.toml` or
`pyproject.toml` with a `[tool.kineto-comm]` table found from the current directory upward.
Any problem (unknown code or option, a rule that does not load or raises) is a one-line
`RuleError`, a UsageError the CLI prints before exiting with status 2: never a silent skip.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

import polars as pl

from kineto_comm.errors import UsageError
from kineto_comm.findings import CLAIMED, Finding, Severity, rank_findings
from kineto_comm.rules_api import (
    Option,
    Rule,
    Tables,
    make_finding,
    mean_step_ns,
    replay_saving,
    saving_severity,
)
from kineto_comm.timings import begin

BUILTIN_PACKAGE = "kineto_comm_builtin_rules"
ENTRY_POINT_GROUP = "kineto_comm.rules"
CONFIG_FILE = "kineto-comm.toml"
CONFIG_KEYS = ("select", "ignore", "rules", "options", "rule", "ranks_per_host", "hardware")


class RuleError(UsageError):
    """A rule that cannot be loaded, configured or run; one line naming it (exit 2)."""


# ---------------------------------------------------------------- discovery


def _rules_in(obj: Any) -> list[Rule]:
    """Rules found in a module (its Rule globals, or RULES), a Rule, or a list of them."""
    if isinstance(obj, Rule):
        return [obj]
    if isinstance(obj, ModuleType):
        explicit = getattr(obj, "RULES", None)
        if explicit is not None:
            return _rules_in(list(explicit))
        return [v for v in vars(obj).values() if isinstance(v, Rule)]
    if isinstance(obj, (list, tuple)):
        out: list[Rule] = []
        for item in obj:
            out.extend(_rules_in(item))
        return out
    if callable(obj):
        return _rules_in(obj())
    raise TypeError(f"not a rule: {obj!r}")


def _builtin_package() -> ModuleType:
    """The built-in rules package: the checkout's top-level rules/ folder when running from a
    source tree (so edits there count), else the installed kineto_comm_builtin_rules."""
    root = Path(__file__).resolve().parents[1]
    folder = root / "rules"
    init = folder / "__init__.py"
    if not (init.is_file() and (root / "pyproject.toml").is_file()):
        try:
            return importlib.import_module(BUILTIN_PACKAGE)
        except ModuleNotFoundError:
            raise RuleError(
                f"built-in rules not found (no {BUILTIN_PACKAGE} and no {folder})"
            ) from None
    loaded = sys.modules.get(BUILTIN_PACKAGE)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "") == init:
        return loaded
    spec = importlib.util.spec_from_file_location(
        BUILTIN_PACKAGE, init, submodule_search_locations=[str(folder)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[BUILTIN_PACKAGE] = module
    spec.loader.exec_module(module)
    return module


def builtin_rules() -> list[Rule]:
    """Every rule of the built-in package (each module listed in its MODULES)."""
    pkg = _builtin_package()
    out: list[Rule] = []
    for name in pkg.MODULES:
        try:
            module = importlib.import_module(f"{BUILTIN_PACKAGE}.{name}")
        except Exception as exc:
            raise RuleError(f"built-in rule module {name}: failed to load: {_one(exc)}") from exc
        out.extend(
            replace(r, source="built-in", origin=f"rules/{name}.py") for r in _rules_in(module)
        )
    return out


def plugin_rules() -> list[Rule]:
    """Rules of installed plugins (entry-point group `kineto_comm.rules`)."""
    out: list[Rule] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            found = _rules_in(ep.load())
        except Exception as exc:
            raise RuleError(f"plugin {ep.name} ({ep.value}): failed to load: {_one(exc)}") from exc
        dist = getattr(getattr(ep, "dist", None), "name", None) or ep.value
        out.extend(replace(r, source="plugin", origin=str(dist)) for r in found)
    return out


def load_rules(spec: str | Path, base: Path | None = None) -> list[Rule]:
    """Rules from a Python file, a TOML file of declarative rules, or an importable module."""
    text = str(spec)
    path = Path(text)
    if base is not None and not path.is_absolute():
        path = base / path
    if text.endswith((".py", ".toml")) or path.exists():
        if not path.is_file():
            raise RuleError(f"rules file {text}: not found")
        if path.suffix == ".toml":
            return toml_rules(path)
        return _load_py(path)
    try:
        module = importlib.import_module(text)
        found = _rules_in(module)
    except Exception as exc:
        raise RuleError(f"rules module {text}: failed to load: {_one(exc)}") from exc
    return [replace(r, source="file", origin=text) for r in found]


def _load_py(path: Path) -> list[Rule]:
    """Import a rules file under a private module name and collect its rules."""
    name = "kineto_comm_user_rules_" + re.sub(r"\W", "_", str(path.resolve()))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        found = _rules_in(module)
    except Exception as exc:
        raise RuleError(f"rules file {path}: failed to load: {_one(exc)}") from exc
    if not found:
        raise RuleError(f"rules file {path}: defines no rule")
    return [replace(r, source="file", origin=str(path)) for r in found]


# ---------------------------------------------------------------- declarative (SQL) rules

SQL_DOC = """What it does: runs a Polars SQL query over the report tables; each row is a finding.

Why is this bad? {why}

How to fix: {fix}"""


def sql_rule(spec: Mapping[str, Any], origin: str) -> Rule:
    """A Rule from a declarative TOML table.

    Keys: code, name, summary, query (Polars SQL over the report tables), message (a
    str.format template over the row's columns; also the finding's title unless a `title`
    template is given), optional title, severity (info|warning|
    error, default warning), tables, why, fix, advice (list), options ({name = default}:
    usable in the query as {name}). Columns the query may return: impact_ns_per_step,
    rank or ranks, step, process_group.
    """
    where = f"{origin}: rule {spec.get('code', '?')}"
    for key in ("code", "name", "summary", "query", "message"):
        if key not in spec:
            raise RuleError(f"{where}: missing key {key!r}")
    severity = str(spec.get("severity", "warning"))
    if severity not in Severity.__members__:
        raise RuleError(f"{where}: severity must be info, warning or error, got {severity!r}")
    opts = tuple(
        Option(k, v, "declarative rule option") for k, v in dict(spec.get("options", {})).items()
    )
    query, template = str(spec["query"]), str(spec["message"])
    # Each row's finding is titled by its own message (unless a title template is given):
    # the summary, the same for every row, says what the rule is, not what this row found.
    title_t = str(spec.get("title", template))
    advice = tuple(str(a) for a in spec.get("advice", ()))
    tables_used = tuple(spec.get("tables", ())) or tuple(
        t for t in _table_names() if re.search(rf"\b{t}\b", query)
    )
    code = str(spec["code"])

    def check(tables: Tables, options: dict[str, Any]) -> list[Finding]:
        # Lazy tables: a query aggregating every call streams them (Tables.collect).
        ctx = pl.SQLContext({t: tables.lazy(t) for t in tables_used})
        result = tables.collect(ctx.execute(query.format(**options), eager=False))
        step_ns = mean_step_ns(tables)
        out = []
        for row in result.iter_rows(named=True):
            ranks = row.get("ranks", row.get("rank"))
            ranks = list(ranks) if isinstance(ranks, (list, tuple)) else [ranks]
            out.append(
                make_finding(
                    code,
                    Severity(severity),
                    title_t.format(**row, **options),
                    template.format(**row, **options),
                    impact_ns_per_step=float(row.get("impact_ns_per_step") or 0),
                    step_ns=step_ns,
                    ranks=[r for r in ranks if r is not None],
                    steps=[row["step"]] if row.get("step") is not None else [],
                    process_group=row.get("process_group"),
                    evidence={k: v for k, v in row.items() if _jsonable(v)},
                    advice=advice,
                )
            )
        return out

    try:
        return Rule(
            code=code,
            name=str(spec["name"]),
            summary=str(spec["summary"]),
            doc=SQL_DOC.format(
                why=spec.get("why", spec["summary"]), fix=spec.get("fix", "see advice")
            )
            + f"\n\nQuery:\n{query}",
            check=check,
            options=opts,
            tables=tables_used,
            source="file",
            origin=origin,
        )
    except ValueError as exc:
        raise RuleError(f"{where}: {exc}") from None


def toml_rules(path: Path) -> list[Rule]:
    """Declarative rules of a TOML file: `[[rule]]` tables (see sql_rule)."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RuleError(f"rules file {path}: {_one(exc)}") from None
    specs = doc.get("rule", [])
    if not specs:
        raise RuleError(f"rules file {path}: no [[rule]] table")
    return [sql_rule(s, str(path)) for s in specs]


def _table_names() -> tuple[str, ...]:
    from kineto_comm.report import TABLE_NAMES

    return TABLE_NAMES


def _jsonable(v: Any) -> bool:
    return v is None or isinstance(v, (int, float, str, bool, list))


# ---------------------------------------------------------------- configuration


@dataclass
class Config:
    """Engine settings from a config file and the command line."""

    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    sql_rules: list[dict[str, Any]] = field(default_factory=list)
    # Ranks r // N share a host and its clock (the CLI's --ranks-per-host wins over it).
    ranks_per_host: int | None = None
    # The [hardware] section: overrides of the hardware table, `network`, `gpu_model`
    # (kineto_comm.analysis.hardware, docs/hardware.md).
    hardware: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def base(self) -> Path | None:
        """Directory relative rule paths are resolved against."""
        return self.path.parent if self.path else None


def find_config(start: Path | None = None) -> Path | None:
    """The first kineto-comm.toml, or pyproject.toml with [tool.kineto-comm], upward."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        own = folder / CONFIG_FILE
        if own.is_file():
            return own
        py = folder / "pyproject.toml"
        if py.is_file():
            try:
                doc = tomllib.loads(py.read_text(encoding="utf-8"))
            except (OSError, tomllib.TOMLDecodeError):
                continue
            if "kineto-comm" in doc.get("tool", {}):
                return py
    return None


def load_config(path: Path | None = None, search: bool = True) -> Config:
    """Read `path` (or the found config file). kineto-comm.toml may put the settings at top
    level or under [tool.kineto-comm]; pyproject.toml under [tool.kineto-comm]."""
    if path is None:
        path = find_config() if search else None
        if path is None:
            return Config()
    elif not path.is_file():
        raise RuleError(f"config file {path}: not found")
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RuleError(f"config file {path}: {_one(exc)}") from None
    section = doc.get("tool", {}).get("kineto-comm")
    if section is None:
        section = {} if path.name == "pyproject.toml" else doc
    unknown = sorted(set(section) - set(CONFIG_KEYS))
    if unknown:
        raise RuleError(
            f"config file {path}: unknown key(s) {', '.join(unknown)}; known: "
            + ", ".join(CONFIG_KEYS)
        )
    options = section.get("options", {})
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise RuleError(f"config file {path}: options must be tables [options.CODE]")
    per_host = section.get("ranks_per_host")
    if per_host is not None and (
        isinstance(per_host, bool) or not isinstance(per_host, int) or per_host < 1
    ):
        raise RuleError(f"config file {path}: ranks_per_host must be a whole number >= 1")
    hardware = section.get("hardware", {})
    if not isinstance(hardware, dict):
        raise RuleError(f"config file {path}: hardware must be a table [hardware]")
    return Config(
        ranks_per_host=per_host,
        hardware=hardware,
        select=_strs(section.get("select", []), path, "select"),
        ignore=_strs(section.get("ignore", []), path, "ignore"),
        rules=_strs(section.get("rules", []), path, "rules"),
        options={str(k): dict(v) for k, v in options.items()},
        sql_rules=list(section.get("rule", [])),
        path=path,
    )


def _strs(value: Any, path: Path, key: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RuleError(f"config file {path}: {key} must be a list of strings")
    return value


def parse_rule_option(text: str) -> tuple[str, str, Any]:
    """`CODE.option=value` (value read as a TOML value, else as a string)."""
    m = re.match(r"^\s*([\w-]+)\.(\w+)\s*=\s*(.*)$", text)
    if not m:
        raise RuleError(f"--rule-option {text!r}: expected CODE.option=value")
    key, opt, raw = m.groups()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, opt, value


# ---------------------------------------------------------------- registry and selection


class Registry:
    """Rules by code, in load order; duplicate codes or names are an error."""

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self.rules: dict[str, Rule] = {}
        for r in rules:
            self.add(r)

    def add(self, r: Rule) -> None:
        """Register one rule."""
        if r.code in self.rules:
            old = self.rules[r.code]
            raise RuleError(
                f"rule {r.code} ({r.source} {r.origin}) clashes with {old.code} "
                f"({old.source} {old.origin}): codes must be unique"
            )
        for other in self.rules.values():
            if other.name.lower() == r.name.lower():
                raise RuleError(f"rule {r.code}: name {r.name!r} already used by {other.code}")
        self.rules[r.code] = r

    def get(self, key: str) -> Rule:
        """A rule by code or name (both case-insensitive, as every choice is)."""
        for r in self.rules.values():
            if r.code == key.upper() or r.name.lower() == key.lower():
                return r
        raise RuleError(f"unknown rule {key!r}; `kineto-comm rules` lists them")

    def matching(self, selector: str) -> list[Rule]:
        """Rules a selector names: ALL, a code, a code prefix (COMM, COMM1) or a name."""
        s = selector.strip()
        if s.upper() == "ALL":
            return list(self.rules.values())
        by_name = [r for r in self.rules.values() if r.name.lower() == s.lower()]
        if by_name:
            return by_name
        return [r for r in self.rules.values() if r.code.startswith(s.upper()) and s]

    def select(self, select: Sequence[str] = (), ignore: Sequence[str] = ()) -> list[Rule]:
        """The selected rules (all when `select` is empty) minus the ignored ones."""
        for s in [*select, *ignore]:
            if not self.matching(s):
                raise RuleError(f"unknown rule or prefix {s!r} in --select/--ignore")
        chosen = {r.code for s in select for r in self.matching(s)} if select else set(self.rules)
        dropped = {r.code for s in ignore for r in self.matching(s)}
        return [r for c, r in self.rules.items() if c in chosen and c not in dropped]


def registry(
    extra_rules: Sequence[Rule | str | Path] = (), config: Config | None = None
) -> Registry:
    """Built-in, plugin, configured and extra rules, in that order."""
    reg = Registry(builtin_rules())
    for r in plugin_rules():
        reg.add(r)
    cfg = config or Config()
    for spec in cfg.rules:
        for r in load_rules(spec, cfg.base):
            reg.add(r)
    for spec in cfg.sql_rules:
        reg.add(sql_rule(spec, str(cfg.path or "config")))
    for item in extra_rules:
        for r in [item] if isinstance(item, Rule) else load_rules(item):
            reg.add(r)
    return reg


def resolve_options(
    reg: Registry, options: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per-code options merged over defaults, keyed by code; unknown rules or options fail."""
    out: dict[str, dict[str, Any]] = {c: r.defaults() for c, r in reg.rules.items()}
    for key, values in options.items():
        r = reg.get(key)
        known = {o.name: o for o in r.options}
        for name, value in values.items():
            if name not in known:
                raise RuleError(
                    f"rule {r.code} ({r.name}) has no option {name!r}; options: "
                    + (", ".join(known) or "none")
                )
            try:
                out[r.code][name] = known[name].coerce(value)
            except (TypeError, ValueError) as exc:
                raise RuleError(f"rule {r.code} option {name}: {exc}") from None
    return out


# ---------------------------------------------------------------- running and ranking


@dataclass(frozen=True)
class RuleSet:
    """The rules one analysis runs, each with its resolved options.

    Built before any trace is read (`rule_set`), so that an unknown code, option or rules
    file fails at once instead of after a long analysis."""

    rules: tuple[Rule, ...]
    options: dict[str, dict[str, Any]]

    @property
    def codes(self) -> list[str]:
        """The codes of the rules that run, in load order."""
        return [r.code for r in self.rules]

    def run(self, report: Any) -> tuple[Finding, ...]:
        """Every rule on a Report (or a dict of tables); findings ranked (`rank_findings`),
        each saving settled against the step (`settle_saving`). A rule that raises or
        returns something other than findings is a RuleError."""
        tables = report if isinstance(report, Tables) else Tables(report)
        findings: list[Finding] = []
        step_ns: int | None = None
        for r in self.rules:
            done = begin(f"rules/{r.code}")  # the rule and its findings' replays
            try:
                result = r.check(tables, self.options[r.code])
                result = list(result or [])
                if not all(isinstance(f, Finding) for f in result):
                    raise TypeError("returned something that is not a Finding")
            except Exception as exc:
                raise RuleError(f"rule {r.code} ({r.name}) failed: {_one(exc)}") from exc
            if result and step_ns is None:
                step_ns = mean_step_ns(tables)
            try:
                settled = [settle_saving(f, r, tables, step_ns or 0) for f in result]
            except Exception as exc:
                raise RuleError(f"rule {r.code} ({r.name}): its edit failed: {_one(exc)}") from exc
            settled = [settle_severity(f, self.options[r.code]) for f in settled]
            findings.extend(
                f if f.rule and f.code == r.code else replace(f, code=r.code, rule=r.name)
                for f in settled
            )
            done()
        return rank_findings(findings)


def settle_saving(f: Finding, r: Rule, tables: Tables, step_ns: int) -> Finding:
    """A finding's saving as the report states it: never more than the step.

    A built-in rule's saving is its edit's replay already. A custom rule's edit is replayed
    here like a built-in's (its own number, where it differs, kept in the evidence as
    `claimed_ns_per_step`). A saving no edit backs is the rule's own claim: capped at the
    step (the claim kept as `claimed_ns_per_step` when over it) and marked
    `saving_method` "claimed by the rule", which every format says."""
    own = int(f.impact_ns_per_step)
    evidence = dict(f.evidence)
    if f.edit is not None and r.source != "built-in":
        saving = replay_saving(tables, f.edit)
        evidence["saving_method"] = f"replay: {f.edit.name}"
        if own != saving:
            evidence["claimed_ns_per_step"] = own
    elif f.edit is None and own > 0:
        saving = min(own, step_ns) if step_ns > 0 else own
        method = str(evidence.get("saving_method") or "")
        # The rule's own words for its method follow the mark, never a "replay" it did not run.
        evidence["saving_method"] = (
            f"{CLAIMED}: {method}"
            if method and not method.startswith(("replay", CLAIMED))
            else CLAIMED
        )
        if saving < own:
            evidence["claimed_ns_per_step"] = own
    else:
        saving = own
    if step_ns > 0:
        saving = min(saving, step_ns)
    if saving == own and evidence == f.evidence:
        return f
    share = round(saving / step_ns, 4) if step_ns > 0 else f.step_share
    return replace(f, impact_ns_per_step=saving, step_share=share, evidence=evidence)


def settle_severity(f: Finding, options: Mapping[str, Any]) -> Finding:
    """A finding's severity as the report states it: never worse than its saving's share of
    the step earns on its rule's ladder (rules_api.saving_severity: the rule's warn_share,
    error_share and info_share options), info where the saving is below the ladder. A
    fix that buys nothing is no error, whatever share of the step its cause shows (that
    share is evidence, in the finding's text). Findings that claim no step time (no edit,
    no saving: a hang, a configuration), and those of a rule with no ladder of shares (a
    custom rule's declared severity), keep their rule's severity."""
    if f.edit is None and int(f.impact_ns_per_step) <= 0:
        return f
    if not any(k in options for k in ("warn_share", "error_share", "info_share")):
        return f
    earned = saving_severity(float(f.step_share or 0.0), options) or Severity.info
    if f.severity.level <= earned.level:
        return f
    return replace(f, severity=earned)


def _graph_loader(tables: Tables) -> Any:
    """A depgraph Loader over the report's tables: the dependency graph and step windows of
    the ranks asked for, their kernels and waits read a few ranks at a time (a big job keeps
    them in files per rank): only the ranks the critical path reaches are read."""
    from kineto_comm.analysis import depgraph

    kcols = ("rank", "stream", "kind", "name", "start_ns", "end_ns", "launch_ns")
    # The stream waits the trace records (kernels.waits_for, named by correlation).
    if tables.has("kernels", "correlation", "waits_for"):
        kcols += ("correlation", "waits_for")
    wcols = ("instance", "rank", "start_ns", "wait_ns")
    icols = ["instance", "key_kind", "last_rank", "last_start_ns"]
    scols = ["rank", "step", "start_ns", "end_ns"]
    has_waits = tables.has("collective_waits", *wcols)
    instances = (
        tables.collect(tables.lazy("collective_instances", icols))
        if has_waits and tables.has("collective_instances", *icols)
        else None
    )
    has_kernels = tables.has("kernels", "rank", "start_ns", "end_ns")

    def load(ranks: list[int]) -> tuple[dict[int, Any], pl.DataFrame]:
        windows = pl.concat(
            [b for b in tables.rank_batches("steps", scols, ranks) if b.width == len(scols)]
            or [pl.DataFrame(schema={c: pl.Int64 for c in scols})],
            how="vertical_relaxed",
        )
        kernels = (
            [b for b in tables.rank_batches("kernels", kcols, ranks) if b.height]
            if has_kernels
            else []
        )
        if not kernels:
            return {}, windows
        waits = None
        if has_waits and instances is not None:
            waits = pl.concat(
                list(tables.rank_batches("collective_waits", wcols, ranks)),
                how="vertical_relaxed",
            )
        nodes = depgraph.rank_nodes(pl.concat(kernels, how="vertical_relaxed"), waits, instances)
        return nodes, windows

    return load


def step_model(
    report: Any, findings: Sequence[Finding] = (), rules_run: Sequence[str] | None = None
) -> dict[str, Any]:
    """The model of time of a Report (or Tables) with its findings: `step_times` (per
    step; `critical_path` the ranks of its critical path's hops), `critical_path` and
    `critical_path_kernels` (each step's critical path as hops on its ranks and kernel by
    kernel: kineto_comm.analysis.depgraph), `step_blame` (the critical rank's blame rows of
    each step, summing to its `step_ns`), `blame_accounts` (the median step's largest
    costs and the findings that take them out, `rules_run` the codes of the rules that ran:
    kineto_comm.analysis.reconcile) and `savings`: the job's `step_ns`,
    `joint_saving_ns` (every finding's fix replayed together: never more than the step),
    `sum_of_savings_ns` (the replayed findings' savings added up), `overlapping` (the sum is
    more than the joint saving: the fixes claim some of the same time), how many findings
    were `replayed` (carry an edit) and how many savings are `claimed` by their rules
    (no edit: `settle_saving`), which the joint saving and the sum leave out; and
    `attribution`, where the calls' exposure, waits and bubbles come from
    (kineto_comm.analysis.attribution)."""
    from kineto_comm.analysis import depgraph, derived, model_of_time, reconcile, steptime

    tables = report if isinstance(report, Tables) else Tables(report)
    times = model_of_time.step_times(tables)
    blame = model_of_time.blame_frame(tables)
    step_ns = steptime.job_step_ns(times)
    edits = [f.edit for f in findings if f.edit is not None]
    joint = replay_saving(tables, *edits)
    total = sum(int(f.impact_ns_per_step) for f in findings if f.edit is not None)
    kernels_path = depgraph.critical_walk(times, _graph_loader(tables))
    path = depgraph.segments(kernels_path)
    times = depgraph.chains(times, path)
    critical = steptime.critical_blame(blame, times)
    accounts = reconcile.blame_accounts(
        critical,
        times,
        findings,
        lambda *e: replay_saving(tables, *e),
        tables["pipeline"] if tables.has("pipeline") else None,
        rules_run,
    )
    return {
        "step_times": times,
        "critical_path": path,
        "critical_path_kernels": kernels_path,
        "step_blame": critical,
        "blame_accounts": accounts,
        "attribution": derived.read(tables, "attribution"),
        "savings": {
            "step_ns": step_ns,
            "joint_saving_ns": joint,
            "sum_of_savings_ns": total,
            "overlapping": total > joint,
            "replayed": len(edits),
            "claimed": sum(1 for f in findings if f.claimed),
            "findings": len(findings),
        },
    }


def rule_set(
    *,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    options: Mapping[str, Mapping[str, Any]] | None = None,
    extra_rules: Sequence[Rule | str | Path] = (),
    config: Config | None = None,
) -> RuleSet:
    """The selected rules and their options: select/ignore add to the config's; options (by
    code or name) override the config's. Unknown codes, options or rule files: RuleError."""
    cfg = config or Config()
    reg = registry(extra_rules, cfg)
    merged: dict[str, dict[str, Any]] = {k: dict(v) for k, v in cfg.options.items()}
    for key, values in (options or {}).items():
        merged.setdefault(key, {}).update(values)
    resolved = resolve_options(reg, merged)
    chosen = reg.select([*cfg.select, *_split(select)], [*cfg.ignore, *_split(ignore)])
    return RuleSet(tuple(chosen), {r.code: resolved[r.code] for r in chosen})


def run_rules(
    report: Any,
    *,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    options: Mapping[str, Mapping[str, Any]] | None = None,
    extra_rules: Sequence[Rule | str | Path] = (),
    config: Config | None = None,
) -> tuple[Finding, ...]:
    """Run the selected rules (`rule_set`) on a Report or a dict of tables; ranked findings."""
    chosen = rule_set(
        select=select, ignore=ignore, options=options, extra_rules=extra_rules, config=config
    )
    return chosen.run(report)


def explain(r: Rule) -> str:
    """The documentation `kineto-comm explain CODE` prints."""
    lines = [f"{r.code} {r.name} ({r.family}, {r.source}: {r.origin})", "", r.summary, "", r.doc]
    lines += ["", "Tables: " + (", ".join(r.tables) or "-"), ""]
    if r.options:
        lines.append("Options (--rule-option CODE.name=value, or [options.CODE] in config):")
        for o in r.options:
            lines.append(f"  {o.name} = {o.default!r}: {o.description}")
    else:
        lines.append("Options: none")
    return "\n".join(lines)


def _one(exc: BaseException) -> str:
    """An exception as one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _split(values: Sequence[str] | None) -> list[str]:
    """Repeatable CLI values that may also be comma-separated."""
    return [v.strip() for item in values or () for v in item.split(",") if v.strip()]


def parse_rule_options(texts: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    """The CLI's repeatable `--rule-option CODE.name=value` as {code: {name: value}}."""
    options: dict[str, dict[str, Any]] = {}
    for text in texts or ():
        key, name, value = parse_rule_option(text)
        options.setdefault(key, {})[name] = value
    return options


def list_rules(reg: Registry) -> str:
    """The table `kineto-comm rules` prints: code, name, family, source, summary."""
    rows = [("code", "name", "family", "source", "summary")]
    rows += [(r.code, r.name, r.family, r.source, r.summary) for r in reg.rules.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
        for row in rows
    )
