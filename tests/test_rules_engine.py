"""The rules engine: registry, selection, options, config files, custom rules (Python, TOML/SQL,
plugins), failures and the CLI commands. Uses small hand-made tables, no traces."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
from typer.testing import CliRunner

from kineto_comm import rules_engine
from kineto_comm.cli import app
from kineto_comm.findings import Severity
from kineto_comm.rules_api import Finding, Option, Rule, Tables, make_finding, rule
from kineto_comm.rules_engine import (
    RuleError,
    builtin_rules,
    explain,
    load_config,
    parse_rule_option,
    rank_findings,
    registry,
    run_rules,
)

BUILTIN = {
    "CAPT101",
    "COMM101",
    "COMM102",
    "COMM103",
    "COMM201",
    "COMM301",
    "NET101",
    "NET102",
    "MODEL101",
    "PIPE101",
    "SYNC101",
    "SYNC102",
    "SYNC103",
    "SYNC104",
    "SYNC105",
    "SYNC106",
    "HANG101",
    "HANG102",
    "HANG103",
    "HANG104",
    "HANG105",
}
DOC = "What it does: x.\nWhy is this bad? y.\nHow to fix: z."
STEPS = pl.DataFrame(
    {"rank": [0, 1], "step": [0, 0], "wall_ns": [1_000_000, 1_000_000]},
)

CUSTOM_RULE = '''
from kineto_comm.rules_api import Option, Severity, make_finding, mean_step_ns, rule

@rule(code="XMPL101", name="always-fires", summary="Fires once per rank.",
      tables=("steps",), options=(Option("impact", 1000, "Impact to report."),))
def always(tables, options):
    """What it does: fires. Why is this bad? test. How to fix: nothing."""
    steps = tables["steps"]
    return [
        make_finding(always, Severity.warning, f"rank {r}", "custom", ranks=[r],
                     impact_ns_per_step=options["impact"] * (r + 1),
                     step_ns=mean_step_ns(tables))
        for r in steps["rank"].unique().sort().to_list()
    ]
'''


def tables() -> dict[str, pl.DataFrame]:
    return {"steps": STEPS}


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_builtin_rules_are_complete_and_documented() -> None:
    rules = builtin_rules()
    assert {r.code for r in rules} == BUILTIN
    for r in rules:
        assert r.source == "built-in" and r.origin.startswith("rules/")
        assert r.family == r.code.rstrip("0123456789")
        text = explain(r)
        for section in ("What it does", "Why is this bad?", "How to fix", "Options"):
            assert section in text, (r.code, section)
        for o in r.options:
            assert o.description and o.name in text


def test_rule_metadata_is_validated() -> None:
    def fn(t, o):
        return []

    with pytest.raises(ValueError, match="capital letters"):
        Rule("comm1", "x", "s", DOC, fn)
    with pytest.raises(ValueError, match="kebab-case"):
        Rule("X1", "Bad_Name", "s", DOC, fn)
    with pytest.raises(ValueError, match="How to fix"):
        Rule("X1", "ok", "s", "What it does: a. Why is this bad? b.", fn)


def test_selection_by_code_prefix_and_name() -> None:
    reg = registry()
    assert [r.code for r in reg.select(["COMM101"])] == ["COMM101"]
    sync = {c for c in BUILTIN if c.startswith("SYNC")}
    assert len(sync) == 6
    assert {r.code for r in reg.select(["SYNC"])} == sync
    assert {r.code for r in reg.select(["COMM1"])} == {"COMM101", "COMM102", "COMM103"}
    assert [r.code for r in reg.select(["straggler"])] == ["SYNC101"]
    assert {
        r.code for r in reg.select([], ["CAPT", "COMM", "NET", "PIPE", "MODEL", "HANG"])
    } == sync
    assert {r.code for r in reg.select(["ALL"], ["pipeline-bubble"])} == BUILTIN - {"PIPE101"}
    with pytest.raises(RuleError, match="unknown rule or prefix 'NOPE9'"):
        reg.select(["NOPE9"])


def test_options_unknown_and_coerced() -> None:
    with pytest.raises(RuleError, match="COMM101 .* has no option 'bogus'"):
        run_rules(tables(), options={"COMM101": {"bogus": 1}})
    with pytest.raises(RuleError, match="unknown rule 'NOPE1'"):
        run_rules(tables(), options={"NOPE1": {"x": 1}})
    with pytest.raises(RuleError, match="warn_share"):
        run_rules(tables(), options={"COMM101": {"warn_share": "lots"}})
    assert Option("n", 1, "d").coerce("7") == 7
    assert Option("f", 0.5, "d").coerce(1) == 1.0
    assert Option("b", False, "d").coerce("true") is True
    assert parse_rule_option("NET101.link_busbw_gbps=100") == ("NET101", "link_busbw_gbps", 100)
    assert parse_rule_option("X1.name=abc") == ("X1", "name", "abc")
    with pytest.raises(RuleError, match="CODE.option=value"):
        parse_rule_option("nonsense")


def test_custom_python_rule_runs_ranked_with_options(tmp_path: Path) -> None:
    path = write(tmp_path / "my_rules.py", CUSTOM_RULE)
    found = run_rules(tables(), select=["XMPL"], extra_rules=[path])
    assert [(f.code, f.ranks, f.impact_ns_per_step) for f in found] == [
        ("XMPL101", (1,), 2000),
        ("XMPL101", (0,), 1000),
    ]
    assert found[0].rule == "always-fires" and found[0].step_share == 0.002
    found = run_rules(
        tables(), select=["always-fires"], extra_rules=[path], options={"XMPL101": {"impact": 5}}
    )
    assert [f.impact_ns_per_step for f in found] == [10, 5]
    reg = registry([path])
    assert reg.get("XMPL101").source == "file" and reg.get("XMPL101").origin == str(path)


def test_rule_that_raises_or_fails_to_load_is_an_error(tmp_path: Path) -> None:
    boom = write(
        tmp_path / "boom.py",
        '''
        from kineto_comm.rules_api import rule

        @rule(code="BOOM1", name="boom", summary="Raises.")
        def boom(tables, options):
            """What it does: a. Why is this bad? b. How to fix: c."""
            raise ZeroDivisionError("oops")
        ''',
    )
    with pytest.raises(RuleError, match=r"rule BOOM1 \(boom\) failed: ZeroDivisionError: oops"):
        run_rules(tables(), extra_rules=[boom])
    broken = write(tmp_path / "broken.py", "import not_a_module_xyz\n")
    with pytest.raises(RuleError, match="broken.py: failed to load: ModuleNotFoundError"):
        run_rules(tables(), extra_rules=[broken])
    with pytest.raises(RuleError, match="defines no rule"):
        run_rules(tables(), extra_rules=[write(tmp_path / "empty.py", "x = 1\n")])
    with pytest.raises(RuleError, match="clashes with COMM101"):
        registry([Rule("COMM101", "other-name", "s", DOC, lambda t, o: [])])


def test_declarative_sql_rule(tmp_path: Path) -> None:
    path = write(
        tmp_path / "rules.toml",
        """
        [[rule]]
        code = "SQL101"
        name = "long-steps"
        summary = "Steps longer than a limit."
        severity = "error"
        options = { limit_ns = 500000 }
        query = '''
          SELECT rank, step, wall_ns - {limit_ns} AS impact_ns_per_step
          FROM steps WHERE wall_ns > {limit_ns}
        '''
        message = "rank {rank} step {step} took {impact_ns_per_step} ns too long"
        advice = ["Make it shorter."]
        """,
    )
    found = run_rules(tables(), select=["SQL"], extra_rules=[path])
    assert [(f.code, f.ranks, f.impact_ns_per_step, f.severity) for f in found] == [
        ("SQL101", (0,), 500_000, Severity.error),
        ("SQL101", (1,), 500_000, Severity.error),
    ]
    assert found[0].message == "rank 0 step 0 took 500000 ns too long"
    assert found[0].advice == ("Make it shorter.",)
    none = run_rules(
        tables(), select=["SQL101"], extra_rules=[path], options={"SQL101": {"limit_ns": 2_000_000}}
    )
    assert none == ()
    bad = write(tmp_path / "bad.toml", '[[rule]]\ncode = "SQL102"\nname = "x"\n')
    with pytest.raises(RuleError, match="missing key 'summary'"):
        registry([bad])


def test_config_from_pyproject_upward_and_explicit(tmp_path: Path, monkeypatch) -> None:
    rules_py = write(tmp_path / "my_rules.py", CUSTOM_RULE)
    write(
        tmp_path / "pyproject.toml",
        f"""
        [project]
        name = "x"

        [tool.kineto-comm]
        select = ["XMPL"]
        rules = ["{rules_py.name}"]

        [tool.kineto-comm.options.XMPL101]
        impact = 7
        """,
    )
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    cfg = load_config()
    assert cfg.path == tmp_path / "pyproject.toml" and cfg.select == ["XMPL"]
    found = run_rules(tables(), config=cfg)
    assert [f.impact_ns_per_step for f in found] == [14, 7]
    # a kineto-comm.toml nearer to the working directory wins; settings may be top level
    write(sub / "kineto-comm.toml", 'select = ["COMM101"]\n')
    assert load_config().select == ["COMM101"]
    explicit = write(tmp_path / "other.toml", '[tool.kineto-comm]\nignore = ["NET"]\n')
    assert load_config(explicit).ignore == ["NET"]
    with pytest.raises(RuleError, match="unknown key"):
        load_config(write(tmp_path / "typo.toml", 'selct = ["X"]\n'))
    with pytest.raises(RuleError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_plugins_from_entry_points(monkeypatch) -> None:
    @rule(code="PLUG1", name="plugged", summary="From a plugin.")
    def plugged(t: Tables, o: dict) -> list[Finding]:
        """What it does: a. Why is this bad? b. How to fix: c."""
        return [make_finding(plugged, Severity.info, "p", "p", impact_ns_per_step=1, step_ns=0)]

    ep = SimpleNamespace(
        name="demo",
        value="demo_pkg.rules",
        load=lambda: [plugged],
        dist=SimpleNamespace(name="demo-pkg"),
    )
    monkeypatch.setattr(rules_engine, "entry_points", lambda group: [ep])
    reg = registry()
    assert reg.get("PLUG1").source == "plugin" and reg.get("PLUG1").origin == "demo-pkg"
    assert [f.code for f in run_rules(tables(), select=["PLUG"])] == ["PLUG1"]

    def fail() -> None:
        raise ImportError("no such thing")

    bad = SimpleNamespace(name="bad", value="bad_pkg:rules", load=fail)
    monkeypatch.setattr(rules_engine, "entry_points", lambda group: [bad])
    with pytest.raises(RuleError, match="plugin bad .* ImportError: no such thing"):
        registry()


def test_ranking_by_severity_then_impact() -> None:
    """A warning is never listed behind infos that save more (issue 53, point 6)."""

    def f(code: str, impact: int, sev: Severity) -> Finding:
        return Finding(code=code, severity=sev, title="", message="", impact_ns_per_step=impact)

    ranked = rank_findings(
        [f("A1", 10, Severity.info), f("B1", 50, Severity.info), f("C1", 10, Severity.error)]
    )
    assert [x.code for x in ranked] == ["C1", "B1", "A1"]


def test_cli_rules_explain_and_report_options(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # no config file above tmp
    runner = CliRunner()
    listed = runner.invoke(app, ["rules"])
    assert listed.exit_code == 0
    for code in BUILTIN:
        assert code in listed.output
    assert "built-in" in listed.output
    shown = runner.invoke(app, ["explain", "pipeline-bubble"])
    assert shown.exit_code == 0 and "PIPE101" in shown.output
    assert "target_micro_batches" in shown.output
    assert runner.invoke(app, ["explain", "NOPE1"]).exit_code != 0


def test_cli_custom_rule_fires_through_rules_option(tmp_path: Path) -> None:
    """A custom rule in a temporary directory fires through `report --rules` (acceptance)."""
    from tests.conftest import cpu, kernel, launch, write_trace

    rules_py = write(tmp_path / "mine.py", CUSTOM_RULE)
    traces = tmp_path / "traces"
    traces.mkdir()
    events = [
        cpu("ProfilerStep#0", 10.0, 500.0),
        launch(11.0, 1),
        kernel("gemm", 20.0, 100.0, corr=1),
    ]
    write_trace(traces / "rank-0.json", events, rank=0, world_size=1)
    runner = CliRunner()
    out = runner.invoke(
        app,
        [
            "report",
            str(traces),
            "--format",
            "json",
            "--rules",
            str(rules_py),
            "--select",
            "XMPL101",
            "--rule-option",
            "XMPL101.impact=42",
        ],
    )
    assert out.exit_code == 0, out.output
    assert '"code": "XMPL101"' in out.output and '"impact_ns_per_step": 42' in out.output
    text = runner.invoke(app, ["report", str(traces), "--rules", str(rules_py)])
    assert "What to do first" in text.output and "XMPL101" in text.output
    bad = runner.invoke(app, ["report", str(traces), "--select", "NOPE1"])
    assert bad.exit_code != 0


def test_cli_failing_rule_exits_2_with_one_line(tmp_path: Path) -> None:
    """Through the real entry point: exit 2 and one `error:` line naming the rule."""
    import subprocess
    import sys

    from tests.conftest import cpu, kernel, launch, write_trace

    boom = write(
        tmp_path / "boom.py",
        '''
        from kineto_comm.rules_api import rule

        @rule(code="BOOM1", name="boom", summary="Raises.")
        def boom(tables, options):
            """What it does: a. Why is this bad? b. How to fix: c."""
            return 1 / 0
        ''',
    )
    events = [
        cpu("ProfilerStep#0", 10.0, 500.0),
        launch(11.0, 1),
        kernel("gemm", 20.0, 100.0, corr=1),
    ]
    write_trace(tmp_path / "rank-0.json", events, rank=0, world_size=1)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "kineto_comm.cli",
            "report",
            str(tmp_path / "rank-0.json"),
            "--rules",
            str(boom),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: rule BOOM1 (boom) failed: ZeroDivisionError: division by zero"
    ]


def test_inline_sql_rule_and_options_by_name_in_config(tmp_path: Path) -> None:
    cfg_path = write(
        tmp_path / "kineto-comm.toml",
        """
        select = ["SQL201", "tensor-parallel-across-hosts"]

        [options.tensor-parallel-across-hosts]
        ranks_per_host = 4

        [[rule]]
        code = "SQL201"
        name = "any-step"
        summary = "One finding per step row."
        query = "SELECT rank, step, 5 AS impact_ns_per_step FROM steps"
        message = "rank {rank}"
        """,
    )
    cfg = load_config(cfg_path)
    found = run_rules(tables(), config=cfg)
    assert [(f.code, f.ranks, f.impact_ns_per_step) for f in found] == [
        ("SQL201", (0,), 5),
        ("SQL201", (1,), 5),
    ]
    resolved = rules_engine.resolve_options(registry(config=cfg), cfg.options)
    assert resolved["NET102"]["ranks_per_host"] == 4


def test_a_rules_run_reads_every_rank_s_kernels_once_per_shared_table(monkeypatch):
    """The kernels are read a rank batch at a time and are the costly input: the model of
    time (the blame every rule's replay reads, and the calls' exposure COMM101/102 read,
    from one pass) and the host timeline (SYNC102/103) are each built once per run,
    however many rules use them, and a new run builds them again."""
    from kineto_comm import analyze

    from .conftest import SAMPLES

    report = analyze(SAMPLES / "ddp-4", jobs=1)
    reads: list[str] = []
    original = Tables.rank_batches

    def counting(self, name, columns=(), ranks=None):
        reads.append(name)
        return original(self, name, columns, ranks)

    monkeypatch.setattr(Tables, "rank_batches", counting)
    run_rules(report, select=["COMM101", "COMM102", "SYNC102", "SYNC103"])
    assert reads.count("kernels") == 2, reads
    run_rules(report, select=["SYNC102", "SYNC103"])
    # The timeline again, and the blame only when a finding is replayed.
    assert reads.count("kernels") in (3, 4), reads

    tables = Tables({})
    built = []
    first = tables.once(("test", "x"), lambda: built.append(1) or pl.DataFrame({"a": [1]}))
    again = tables.once(("test", "x"), lambda: built.append(2) or pl.DataFrame())
    assert again is first and built == [1]


def test_custom_rules_are_first_class_in_rules_explain_and_text(tmp_path: Path, monkeypatch):
    """Issue 53, point 6: `rules --rules FILE` and `explain CODE --rules FILE` see a TOML
    rule as `report --rules FILE` does; each of its findings is titled by its own row's
    message; the text report's top list puts a warning before infos that save more."""
    from kineto_comm import analyze
    from kineto_comm.render.formats import render_text_str

    from .conftest import SAMPLES

    monkeypatch.chdir(tmp_path)  # no config file above
    toml = write(
        tmp_path / "steps.toml",
        """
        [[rule]]
        code = "SQL301"
        name = "every-step"
        summary = "One info per step row, saving a lot."
        severity = "info"
        query = "SELECT rank, step, 900000000 AS impact_ns_per_step FROM steps WHERE step >= 0"
        message = "rank {rank} step {step} looked at"
        """,
    )
    runner = CliRunner()
    listed = runner.invoke(app, ["rules", "--rules", str(toml)])
    assert listed.exit_code == 0 and "SQL301" in listed.output and "every-step" in listed.output
    assert "SQL301" not in runner.invoke(app, ["rules"]).output
    shown = runner.invoke(app, ["explain", "SQL301", "--rules", str(toml)])
    assert shown.exit_code == 0 and "One info per step row" in shown.output
    assert runner.invoke(app, ["explain", "SQL301"]).exit_code != 0

    report = analyze(SAMPLES / "ddp-4", jobs=1, rules=[toml])
    mine = [f for f in report.findings if f.code == "SQL301"]
    assert len(mine) > 5
    assert len({f.title for f in mine}) == len(mine)  # one title per row, not the summary
    assert mine[0].title == mine[0].message and mine[0].title.startswith("rank ")
    # The infos each save more than any warning; the warning still leads.
    warned = [f for f in report.findings if f.severity is not Severity.info]
    assert warned and max(f.impact_ns_per_step for f in warned) < 900_000_000
    assert report.findings[0].severity is not Severity.info
    top = render_text_str(report).split("`kineto-comm explain CODE`")[0]
    assert f"1. {report.findings[0].severity.value} {report.findings[0].code}" in top


def test_ranks_per_host_from_the_config_file(tmp_path: Path) -> None:
    """The config file's ranks_per_host groups the hosts (hence the clocks) as
    --ranks-per-host does; the argument wins over it; a bad value is one usage error."""
    from kineto_comm import analyze
    from kineto_comm.errors import UsageError

    from .conftest import SAMPLES

    cfg = tmp_path / "kineto-comm.toml"
    cfg.write_text("ranks_per_host = 1\n")
    report = analyze(SAMPLES / "tp-2", jobs=1, config=cfg, ignore=["ALL"])
    assert set(report.offsets["host_source"]) == {"ranks_per_host"}
    assert report.offsets["host"].n_unique() == 2
    report = analyze(SAMPLES / "tp-2", jobs=1, config=cfg, ranks_per_host=2, ignore=["ALL"])
    assert report.offsets["host"].n_unique() == 1
    cfg.write_text("ranks_per_host = 0\n")
    with pytest.raises(UsageError, match="ranks_per_host must be a whole number"):
        analyze(SAMPLES / "tp-2", jobs=1, config=cfg)


DOCS_SQL_RULE = """
[[rule]]
code = "SQL101"
name = "long-steps"
summary = "Steps longer than a limit."
options = { limit_ns = 1000000 }
query = '''
  SELECT rank, step, wall_ns - {limit_ns} AS impact_ns_per_step
  FROM steps WHERE wall_ns > {limit_ns}
'''
message = "rank {rank} step {step} is {impact_ns_per_step} ns over budget"
"""

EDIT_RULE = '''
import polars as pl

from kineto_comm.rules_api import Edit, Severity, make_finding, mean_step_ns, rule

@rule(code="XEDT101", name="hide-every-transfer", summary="Claims ten steps, gives an edit.")
def hide(tables, options):
    """What it does: hides transfers. Why is this bad? test. How to fix: overlap."""
    step = mean_step_ns(tables)
    edit = Edit("hide every transfer", pl.col("category") == "transfer")
    return [make_finding(hide, Severity.warning, "transfers", "hide them",
                         impact_ns_per_step=10 * step, step_ns=step, edit=edit,
                         evidence={"saving_method": "my own guess"})]
'''


def test_custom_savings_are_replayed_or_capped_at_the_step(tmp_path: Path, monkeypatch) -> None:
    """Issue 75, item 4: the docs' TOML rule (a 1 ms budget) on sample_traces/ddp-4 claimed
    up to 124% of the step and the overlap note added the claims up to 11 steps. A custom
    saving no edit backs is capped at the step and said to be the rule's own claim; a
    custom rule's edit is replayed like a built-in's, whatever number it gives; the joint
    line's sum is of the replayed savings only, the claims named apart."""
    from kineto_comm import analyze
    from kineto_comm.render.formats import render_text_str
    from kineto_comm.rules_api import replay_saving

    from .conftest import SAMPLES

    monkeypatch.chdir(tmp_path)  # no config file above
    toml = write(tmp_path / "steps.toml", DOCS_SQL_RULE)
    py = write(tmp_path / "edit_rule.py", EDIT_RULE)
    report = analyze(SAMPLES / "ddp-4", jobs=1, rules=[toml, py])
    step = report.savings["step_ns"]
    sql = [f for f in report.findings if f.code == "SQL101"]
    over = [f for f in sql if f.evidence["impact_ns_per_step"] > step]
    assert sql and over  # the trace has steps whose claim is more than the job's step
    for f in sql:
        own = f.evidence["impact_ns_per_step"]  # the query's row, as the rule gave it
        assert f.claimed and f.edit is None
        assert f.impact_ns_per_step == min(own, step) and f.step_share <= 1
        assert f.evidence.get("claimed_ns_per_step") == (own if own > step else None)
    # Every finding, built-in or custom, saves at most the step.
    assert all(0 <= f.impact_ns_per_step <= step for f in report.findings)

    (mine,) = [f for f in report.findings if f.code == "XEDT101"]
    assert mine.impact_ns_per_step == replay_saving(Tables(report), mine.edit) < step
    assert mine.evidence["claimed_ns_per_step"] == 10 * step and not mine.claimed
    assert mine.evidence["saving_method"] == "replay: hide every transfer"

    s = report.savings
    replayed = [f for f in report.findings if f.edit is not None]
    assert s["claimed"] == len(sql) and s["replayed"] == len(replayed) >= 1
    assert s["sum_of_savings_ns"] == sum(f.impact_ns_per_step for f in replayed)
    assert mine.impact_ns_per_step <= s["joint_saving_ns"] <= step
    assert report.to_dict()["summary"]["sum_of_savings_ns"] == s["sum_of_savings_ns"]

    text = render_text_str(report).split("`kineto-comm explain CODE`")[0]
    # Each numbered item (wrapped at words to the output's width) as one line.
    items = [" ".join(item.split()) for item in re.split(r"\n\d+\. ", text)[1:]]
    sql_items = [item for item in items if " SQL101 " in item]
    assert sql_items
    for item in sql_items:
        assert "claimed by the rule (not replayed" in item
    joint = " ".join(text[text.index("All fixes together") :].split())
    assert f"not in it: {len(sql)} findings whose saving is the rule's own claim" in joint
    claims_added = sum(f.evidence["impact_ns_per_step"] for f in sql) + s["sum_of_savings_ns"]
    assert f"{claims_added / 1e6:,.2f} ms" not in joint  # the old note: 11 steps' worth
    if s["overlapping"]:
        assert "overlap" in joint and f"add up to {s['sum_of_savings_ns'] / 1e6:,.2f} ms" in joint

    # Claims alone: nothing is replayed, the JSON summary does not call them overlapping.
    only = analyze(SAMPLES / "ddp-4", jobs=1, rules=[toml], select=["SQL101"])
    assert only.savings["replayed"] == 0 and only.savings["claimed"] == len(only.findings)
    summary = only.to_dict()["summary"]
    assert summary["sum_of_savings_ns"] == 0 and summary["savings_overlap"] is False
    assert "No fix is replayed" in render_text_str(only)
