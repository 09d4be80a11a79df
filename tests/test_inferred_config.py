"""The configuration inferred from real captures equals the capture command's, and the
analytical model (MODEL101) runs on it without `--model`; `--model` still wins."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import polars as pl
import pytest

import kineto_comm
from kineto_comm.analytic import ModelConfig, expected, load_config, with_model
from kineto_comm.capture.__main__ import build_parser
from kineto_comm.capture.workloads import FFN, HIDDEN, TP_PAIR, VOCAB, pp_depth
from kineto_comm.rules_api import Tables
from kineto_comm.rules_engine import rule_set

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
# The capture folders with several ranks, and the README whose command lines made them.
FOLDERS = {
    "h100-nccl": ["ddp-4", "ddp-8", "ep-4", "fsdp-2", "fsdp-4", "pp-4", "pp-4-sync", "tp-2"]
    + ["tp-dp-8"],
    "h200-nccl": ["pp-dp-4", "pp-dp-8"],
    "gloo": ["tp-dp-4", "pp-1f1b-4", "ddp-stack-2"],
    "sample_traces": ["ddp-4", "pp-4", "tp-2", "fsdp-2", "ep-4"],
}
# The largest parameter tensor of the capture's model (embedding, or an FFN weight), fp32:
# a full DDP bucket holds the cap and less than one more tensor.
LARGEST_GRAD = max(VOCAB * HIDDEN, HIDDEN * FFN) * 4


def _base(suite: str) -> Path:
    return ROOT / "sample_traces" if suite == "sample_traces" else DATA / suite


def _command(suite: str, name: str):
    """The capture command of folder `name`, read from its README and parsed by the capture
    module's own parser (its defaults: bucket_cap_mb 25, micro_batches 4)."""
    for line in (_base(suite) / "README.md").read_text().splitlines():
        if "capture" not in line or "--out" not in line:
            continue
        words = shlex.split(line.strip(), comments=True)
        out = words[words.index("--out") + 1]
        if Path(out).name != name:
            continue
        at = next(i for i, w in enumerate(words) if w.endswith("capture"))
        args = words[at + 1 :]
        if not args[0].startswith("--"):  # `kineto-comm capture LAYOUT ...`
            args = ["--layout", args[0], *args[1:]]
        return build_parser().parse_args(args)
    raise AssertionError(f"no capture command for {name} in {suite}/README.md")


def _truth(cmd) -> dict[str, int]:
    """dp, tp, pp of the capture's layout (kineto_comm.capture.workloads)."""
    n, layout = cmd.ranks, cmd.layout
    if layout in ("ddp", "fsdp"):
        return {"dp": n, "tp": 1, "pp": 1}
    if layout == "tp":
        return {"dp": 1, "tp": n, "pp": 1}
    if layout == "tp-dp":
        return {"dp": n // TP_PAIR, "tp": TP_PAIR, "pp": 1}
    if layout in ("pp", "pp-1f1b"):
        return {"dp": 1, "tp": 1, "pp": n}
    if layout == "pp-dp":
        return {"dp": n // pp_depth(n), "tp": 1, "pp": pp_depth(n)}
    return {}  # ep: the trace does not say what its all-to-all is for


CASES = [(suite, name) for suite, names in FOLDERS.items() for name in names]
_reports: dict[tuple[str, str], kineto_comm.Report] = {}


def _report(suite: str, name: str) -> kineto_comm.Report:
    if (suite, name) not in _reports:
        _reports[(suite, name)] = kineto_comm.analyze(
            _base(suite) / name, select=["MODEL101"], jobs=1
        )
    return _reports[(suite, name)]


@pytest.mark.parametrize(("suite", "name"), CASES, ids=[f"{s}/{n}" for s, n in CASES])
def test_the_inferred_configuration_is_the_capture_commands(suite: str, name: str) -> None:
    cmd = _command(suite, name)
    report = _report(suite, name)
    row = report.inferred_config.row(0, named=True)
    assert row["world_size"] == cmd.ranks
    truth = _truth(cmd)
    if not truth:  # ep: sizes it cannot tell stay null, and the model does not run
        assert row["ep"] is None
        assert report.model_comparison.height == 0
        assert "ep" in report.options["model_note"]
        return
    assert {k: row[k] for k in truth} == truth
    for key in truth:
        assert row["evidence"][key]
    if cmd.layout.startswith("pp"):
        assert row["micro_batches"] == cmd.micro_batches
        assert row["schedule"] == ("1f1b" if cmd.layout == "pp-1f1b" else "gpipe")
    else:
        assert row["micro_batches"] is None
    if cmd.layout == "fsdp":
        assert (row["framework"], row["sharding"]) == ("fsdp", "full_shard")
    if cmd.layout in ("ddp", "tp-dp", "pp-dp"):
        cap = cmd.bucket_cap_mb * 1024 * 1024  # torch DDP: bucket_bytes_cap
        assert row["grad_dtype"] == "float32"
        if row["ddp_buckets"] > 1:
            # Every full bucket reached the cap and holds less than one tensor more.
            assert cap <= row["ddp_bucket_bytes"] < cap + LARGEST_GRAD
        else:  # one bucket: every gradient fit under the cap; the cap is not told
            assert row["ddp_bucket_bytes"] is None
            assert row["grad_bytes_per_step"] <= cap


def test_buckets_and_parameters_are_the_readmes() -> None:
    """sample_traces/README.md: `ddp-4` | ... | 4 buckets a step: 33216, 33216, 33408,
    35328 floats (the last the step's leftover)."""
    text = (ROOT / "sample_traces" / "README.md").read_text()
    floats = [int(x) for x in re.search(r"4 buckets a step: ([\d, ]+) floats", text)[1].split(",")]
    row = _report("sample_traces", "ddp-4").inferred_config.row(0, named=True)
    assert row["ddp_buckets"] == len(floats)
    assert row["ddp_bucket_bytes"] == 4 * min(floats[:-1])
    assert row["grad_bytes_per_step"] == 4 * sum(floats)
    assert row["params"] == sum(floats)
    # The same model sharded by FSDP, and cut into pipeline stages (h200-nccl/README.md:
    # "68,416 floats on stage 0 (embedding and one block), 49,984 on a middle stage, 66,752
    # on the last"): the same parameter count, and pp-dp-8's four stages in full.
    assert _report("h100-nccl", "fsdp-2").inferred_config["params"][0] == sum(floats)
    assert _report("h200-nccl", "pp-dp-8").inferred_config["params"][0] == (
        68_416 + 2 * 49_984 + 66_752
    )


@pytest.mark.parametrize(("suite", "name"), CASES, ids=[f"{s}/{n}" for s, n in CASES])
def test_the_model_runs_without_a_model_file(suite: str, name: str) -> None:
    """Wherever the configuration can be inferred: expected vs measured has rows, agrees on
    what was inferred (no MODEL101 finding on these plain captures), and says why not
    elsewhere (ep: routing unknown; gloo FSDP: all_reduce for the reduce-scatter)."""
    cmd = _command(suite, name)
    report = _report(suite, name)
    if cmd.layout == "ep" or (cmd.layout == "fsdp" and cmd.backend == "gloo"):
        assert report.model_comparison.height == 0
        assert report.options["model_note"]
        return
    table = report.model_comparison
    assert table.height > 0
    assert set(table["model_source"]) == {"inferred"}
    assert not [f for f in report.findings if f.code == "MODEL101"]


def test_model101_on_an_inferred_configuration_is_info_and_only_excess() -> None:
    """A configuration half the size of what the trace moves: stated in a file it is a
    warning; inferred, the same excess is info; and less than inferred is no finding."""
    report = _report("h100-nccl", "ddp-4")

    run = rule_set(select=["MODEL101"]).run
    row = report.inferred_config.row(0, named=True)
    small = ModelConfig(params=row["params"] // 2, dp=4, dtype="fp32", bucket_mb=0.07)
    stated = run(Tables(with_model(report, small)))
    inferred = run(Tables(with_model(report, small, source="inferred")))
    assert [f.severity.value for f in stated] == ["warning"]
    assert [f.severity.value for f in inferred] == ["info"]
    assert inferred[0].impact_ns_per_step > 0
    large = ModelConfig(params=row["params"] * 2, dp=4, dtype="fp32")
    assert run(Tables(with_model(report, large)))  # stated: the trace moves too little
    assert not run(Tables(with_model(report, large, source="inferred")))


def test_a_model_file_wins(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text("[model]\nparams = 1000000\ndp = 4\ndtype = 'fp32'\n")
    report = kineto_comm.analyze(DATA / "h100-nccl" / "ddp-4", model=path, jobs=1)
    table = report.model_comparison
    assert set(table["model_source"]) == {"file"}
    assert report.options["model"]["params"] == 1_000_000
    want = expected(load_config(path)).filter(pl.col("collective") == "all_reduce")
    got = table.filter(pl.col("collective") == "all_reduce")["expected_bytes_per_step"][0]
    assert got == want["bytes_per_step"][0]
    # The inferred configuration is still in the report, untouched by the file.
    assert report.inferred_config.equals(_report("h100-nccl", "ddp-4").inferred_config)
