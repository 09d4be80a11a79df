"""Per-rank work off the main process: worker processes, the on-disk cache, a Dask cluster."""

from __future__ import annotations

import shutil
import sys

import pytest

from kineto_comm import analyze, per_rank

from .conftest import SAMPLES

TABLES = ("kernels", "collectives", "steps", "totals", "collective_instances", "stragglers")


def _same(a, b) -> None:
    for name in TABLES:
        assert getattr(a, name).equals(getattr(b, name)), name


def test_cache_reuses_tables_and_misses_on_changed_content(tmp_path, monkeypatch):
    traces = tmp_path / "traces"
    shutil.copytree(SAMPLES / "tp-2", traces)
    cache = tmp_path / "cache"
    first = analyze(traces, jobs=1, cache_dir=cache)
    entries = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert len(entries) == 2
    assert all((e / "kernels.parquet").exists() and (e / "meta.json").exists() for e in entries)

    def no_parsing(*args, **kwargs):
        raise AssertionError("parsed although cached")

    module = sys.modules["kineto_comm.analyze"]
    monkeypatch.setattr(module, "process_file", no_parsing)
    second = analyze(traces, jobs=1, cache_dir=cache)
    _same(first, second)
    assert second.ranks["file"].to_list() == first.ranks["file"].to_list()
    monkeypatch.undo()
    # A changed file is a miss (new content hash), and the other rank still hits.
    victim = sorted(traces.iterdir())[1]
    victim.write_bytes(victim.read_bytes() + b"\n")
    calls = []
    real = per_rank.process_file

    def counting(path, patterns=()):
        calls.append(path)
        return real(path, patterns)

    monkeypatch.setattr(module, "process_file", counting)
    analyze(traces, jobs=1, cache_dir=cache)
    assert calls == [str(victim)]


def test_dask_cluster_gives_the_same_report_as_local():
    distributed = pytest.importorskip("distributed")
    local = analyze(SAMPLES / "ddp-4", jobs=1)
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
    ) as cluster:
        remote = analyze(SAMPLES / "ddp-4", dask_scheduler=cluster.scheduler_address)
    _same(local, remote)
    assert remote.options["dask_scheduler"] is not None


def test_unreachable_dask_scheduler_is_a_usage_error():
    pytest.importorskip("distributed")
    from kineto_comm.errors import UsageError

    with pytest.raises(UsageError, match="Dask scheduler"):
        analyze(SAMPLES / "tp-2", dask_scheduler="tcp://127.0.0.1:1")
