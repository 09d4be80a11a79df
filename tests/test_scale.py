"""Per-rank work off the main process: worker processes, the on-disk cache, a Dask cluster."""

from __future__ import annotations

import dataclasses
import gzip
import os
import shutil
import subprocess
import sys
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from kineto_comm import analyze, budget, per_rank, workers
from kineto_comm import cache as kineto_cache
from kineto_comm.errors import UsageError
from kineto_comm.load import assemble, decode, scan
from kineto_comm.synth import generate

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

    def no_parsing(paths, piece_bytes=None):
        assert not paths, "parsed although cached"
        return []

    module = sys.modules["kineto_comm.workers"]
    monkeypatch.setattr(module, "decode_files", no_parsing)
    second = analyze(traces, jobs=1, cache_dir=cache)
    _same(first, second)
    assert second.ranks["file"].to_list() == first.ranks["file"].to_list()
    monkeypatch.undo()
    # A changed file is a miss (new content hash), and the other rank still hits.
    victim = sorted(traces.iterdir())[1]
    victim.write_bytes(victim.read_bytes() + b"\n")
    calls = []
    real = decode.decode_files

    def counting(paths, piece_bytes=None):
        calls.extend(paths)
        return real(paths, piece_bytes)

    monkeypatch.setattr(module, "decode_files", counting)
    analyze(traces, jobs=1, cache_dir=cache)
    assert calls == [str(victim)]
    # Other code (a changed decoder between two versions) misses on every file.
    calls.clear()
    monkeypatch.setattr(kineto_cache, "code_digest", lambda: "another tree")
    analyze(traces, jobs=1, cache_dir=cache)
    assert sorted(calls) == sorted(str(p) for p in traces.iterdir())


def test_a_cache_that_cannot_be_written_is_a_warning_not_a_silent_skip(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = blocker / "cache"  # under a file: no directory can be made there, even as root
    plain = analyze(SAMPLES / "tp-2", jobs=1)
    report = analyze(SAMPLES / "tp-2", jobs=1, cache_dir=cache)
    _same(plain, report)
    [warning] = [w for w in report.warnings if "cache" in w]
    assert str(cache) in warning and "nothing is cached" in warning
    assert report.options["cache_dir"] is None
    assert not any("cache" in w for w in plain.warnings)


@pytest.mark.slow
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


@pytest.mark.slow
def test_unreachable_dask_scheduler_is_a_usage_error():
    pytest.importorskip("distributed")
    from kineto_comm.errors import UsageError

    with pytest.raises(UsageError, match="Dask scheduler"):
        analyze(SAMPLES / "tp-2", dask_scheduler="tcp://127.0.0.1:1")


@pytest.mark.parametrize(
    ("text", "size"),
    [("8G", 8 << 30), ("512MiB", 512 << 20), ("1.5g", 3 << 29), ("4096", 4096), ("2 GB", 2 << 30)],
)
def test_memory_sizes_parse(text, size):
    assert budget.parse_size(text) == size


def test_memory_size_errors_are_usage_errors():
    with pytest.raises(UsageError):
        budget.parse_size("lots")


def test_plan_fits_workers_and_pieces_to_the_limit(tmp_path):
    files = []
    for i in range(4):
        path = tmp_path / f"rank-{i}.json"
        path.write_bytes(b" " * 1_000_000)
        files.append(path)
    roomy = budget.plan(files, 64 << 30, jobs=4)
    assert (roomy.jobs, roomy.piece_bytes, roomy.warnings) == (4, decode.PIECE_BYTES, ())
    assert roomy.batches == ((0,), (1,), (2,), (3,))  # one per worker
    assert budget.plan(files, 64 << 30, jobs=2).batches == ((0, 1), (2, 3))
    # Room for the parent and exactly two workers, each with one file at a time.
    need = budget.WORKER_BASE + int(budget.WORKER_SHARE * 1_000_000)
    parent = budget.PARENT_BASE + int(budget.PARENT_SHARE * 4_000_000)
    two = budget.plan(files, parent + 2 * need + 1, jobs=4)
    assert two.jobs == 2 and not two.warnings
    assert two.batches == ((0,), (1,), (2,), (3,))
    tight = budget.plan(files, 64 << 20, jobs=4)
    assert tight.jobs == 1 and tight.piece_bytes == budget.MIN_PIECE
    assert tight.warnings and "memory limit" in tight.warnings[0]
    assert tight.batches == ((0,), (1,), (2,), (3,))


def test_gzip_trailer_gives_the_uncompressed_size(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b"x" * 100_000))
    assert budget.uncompressed_size(path) == 100_000


def test_a_small_memory_limit_gives_the_same_report(tmp_path):
    # 1 MiB pieces (the smallest) against the default 16 MiB: every table identical.
    job = tmp_path / "job"
    generate("baseline", job, ranks=2, layout="dp", size_mb=4, seed=1)
    free = analyze(job, jobs=1)
    tight = analyze(job, jobs=2, memory_limit="64M")
    assert tight.options["piece_bytes"] == budget.MIN_PIECE and tight.options["jobs"] == 1
    assert any("memory limit" in w for w in tight.warnings)
    _same(free, tight)


@pytest.fixture(params=["threads", "processes"])
def concurrency(request, monkeypatch):
    """Run jobs > 1 as threads of this process (small jobs) or as worker processes."""
    if request.param == "processes":
        monkeypatch.setattr(budget, "THREADS_BELOW", -1)
    return request.param


def test_three_workers_give_the_same_report_as_one_process(concurrency):
    alone = analyze(SAMPLES / "ddp-4", jobs=1)
    shared = analyze(SAMPLES / "ddp-4", jobs=3)
    assert shared.ranks["rank"].to_list() == [0, 1, 2, 3]
    assert shared.ranks["file"].to_list() == alone.ranks["file"].to_list()
    _same(alone, shared)


def test_workers_share_the_files_and_report_progress(tmp_path, concurrency):
    traces = tmp_path / "traces"
    shutil.copytree(SAMPLES / "ddp-4", traces)
    (traces / "rank-9.json").write_text("not json")
    seen = []
    report = analyze(traces, jobs=2, progress=lambda done, total: seen.append((done, total)))
    assert report.ranks.height == 4
    assert [e[0] for e in report.errors] == [str(traces / "rank-9.json")]
    # Counted in files, as each batch of files is done.
    assert seen == sorted(seen) and seen[-1] == (5, 5) and len(seen) == 2


def test_a_script_without_a_main_guard_still_gets_every_rank(tmp_path):
    # Spawned workers re-import such a script and fail before taking any batch; here the
    # kernels go to files, so this process would only have merged.
    script = tmp_path / "check.py"
    script.write_text(
        "from kineto_comm import analyze, budget\n"
        "budget.THREADS_BELOW = -1\n"
        "budget.SPILL_ABOVE = 0\n"
        f"report = analyze({str(SAMPLES / 'ddp-4')!r}, jobs=2)\n"
        "print(report.ranks.height, len(report.errors))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SAMPLES.parent)}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["4", "0"]
    # Each worker says why it stopped, in one line, with no traceback.
    assert "Traceback" not in done.stderr
    assert 'outside `if __name__ == "__main__":`' in done.stderr


def test_a_worker_that_dies_costs_only_the_batch_it_was_on():
    receive, send = get_context("spawn").Pipe(duplex=False)
    send.send(("start", 0, None))
    send.send(("done", 0, (["bad file", "worse file"], per_rank.to_wire([]))))
    send.send(("start", 2, None))
    send.close()  # gone without a word about batch 2
    results = workers._Results(["a", "b", "c", "d", "e"], [[0, 1], [2], [3, 4]], None)
    workers._collect([receive], results)
    assert results.all() == [
        ("error", "bad file"),
        ("error", "worse file"),
        ("error", workers.DIED),  # batch 1 never started: no outcome came for it
        ("error", workers.DIED),
        ("error", workers.DIED),
    ]


@pytest.mark.parametrize("seed", range(40))
def test_batches_cover_the_files_in_order_within_the_cap(seed):
    import random

    rng = random.Random(seed)
    cap = budget.BATCH_BYTES
    sizes = [
        rng.choice([0, 1 << 10, 3 << 20, 10 << 20, 40 << 20, 300 << 20])
        for _ in range(rng.randint(0, 60))
    ]
    jobs = rng.randint(1, 8)
    got = budget.batches(sizes, jobs)
    assert [i for b in got for i in b] == list(range(len(sizes)))
    assert all(b for b in got)
    for b in got:
        held = [sizes[i] for i in b]
        # A batch holds at most about `cap` (the last file may cross it), or one big file.
        assert len(b) == 1 or (sum(held[:-1]) < cap and all(2 * s < cap for s in held))
    # Files of one size: at least one batch per worker, where there are enough files.
    same = budget.batches([rng.randint(1, cap)] * len(sizes), jobs)
    assert len(same) >= min(jobs, len(sizes))
    assert budget.batches(sizes, jobs, cap=0) == tuple((i,) for i in range(len(sizes)))


def test_equal_small_files_make_one_batch_per_worker():
    assert budget.batches([10 << 20] * 8, 2) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert [len(b) for b in budget.batches([5 << 20] * 7, 2)] == [3, 4]
    many = budget.batches([10 << 20] * 256, 2)
    assert {len(b) for b in many} <= {6, 7} and 36 <= len(many) <= 44
    assert all(len(b) == 1 for b in budget.batches([50 << 20] * 8, 2))


def _batch_inputs():
    """Real traces of every kind: old and new schemas, AMD, MTIA, CPU-only, gloo host
    timelines, world size 1, with and without step markers."""
    from .conftest import H100_TRACES, all_shared_traces

    files = all_shared_traces() + H100_TRACES
    files += sorted((SAMPLES / "pp-4").iterdir()) + sorted((SAMPLES / "tp-2").iterdir())
    return [f for f in files if f.name.endswith((".json", ".gz"))]


@pytest.mark.slow
def test_files_modelled_together_get_the_tables_they_get_alone():
    raws = []
    for f in _batch_inputs():
        try:
            raws.append(decode.decode_file(f))
        except Exception:  # files with nothing usable: reported elsewhere
            continue
    assert len(raws) > 30
    assert {r.gpu.height > 0 for r in raws} == {True, False}  # device and host timelines
    together = per_rank.tabulate(list(raws))
    alone = [per_rank.tabulate([raw])[0] for raw in raws]
    assert len(together) == len(alone) == len(raws)
    for a, b in zip(together, alone, strict=True):
        assert a.header() == b.header(), a.file
        for name in per_rank.TABLES:
            assert getattr(a, name).equals(getattr(b, name)), (a.file, name)
    assert sum(t.collectives.height for t in together) > 0


def _edge_traces(folder) -> list:
    """Files a batch must keep apart: B/E pairs on the thread ids of another file's pairs,
    kernels without device/stream args (their host coordinates stand in) beside kernels
    with them, a header listing devices but no device activity (read again with its host
    table), gloo annotations (sizes read from the bytes), and a file with nothing usable."""
    from .conftest import cpu, kernel, launch, write_trace

    def pairs(at: float) -> list:
        return [
            {"ph": "B", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 5, "ts": at},
            {"ph": "B", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 5, "ts": at + 2},
            {"ph": "E", "cat": "cpu_op", "pid": 1, "tid": 5, "ts": at + 5},
            {"ph": "E", "cat": "cpu_op", "pid": 1, "tid": 5, "ts": at + 20},
        ]

    bare = {"ph": "X", "cat": "kernel", "name": "k", "pid": 3, "tid": 9, "ts": 4, "dur": 2}
    gloo = cpu("gloo:all_reduce", 1, 5, **{"Input Dims": [[4, 4]], "Input type": ["float"]})
    files = [
        write_trace(folder / "pairs-a.json", pairs(10)),
        write_trace(folder / "pairs-b.json", pairs(11), rank=1),  # nested in time
        write_trace(folder / "bare.json", [bare, {**bare, "args": {}}, launch(1, 1)]),
        write_trace(folder / "args.json", [kernel("k", 1, 2, corr=1), launch(0, 1)]),
        write_trace(
            folder / "listed.json",
            [cpu("aten::mm", 1, 2), gloo],
            deviceProperties=[{"id": 0, "name": "G"}],
        ),
        write_trace(folder / "gloo.json", [cpu("aten::mm", 1, 2), gloo]),
    ]
    (folder / "bad.json").write_bytes(b"hello world")
    return [*files, folder / "bad.json"]


def _launches(folder) -> Any:
    """Kernels and the runtime calls that launched them, every way the first call with a
    kernel's correlation can be found: after the kernel in the file, a second call with the
    same correlation (the first counts), a call without a time before one with it (it does
    not count), no call, no correlation."""
    from .conftest import kernel, launch, write_trace

    untimed = {**launch(0, 7, tid=103), "ts": None}
    return write_trace(
        folder / "launches.json",
        [
            kernel("a", 10, 1, corr=5),
            launch(2, 5),
            launch(3, 6, tid=101),
            launch(4, 6, tid=102),
            kernel("b", 11, 1, corr=6),
            untimed,
            launch(9, 7, tid=104),
            kernel("c", 12, 1, corr=7),
            kernel("d", 13, 1, corr=8),
            kernel("e", 14, 1),
        ],
    )


def _launch_pairs(folder) -> Any:
    """A launch written as a B/E pair before a complete call with the same correlation:
    pairing puts it after that call, which is then the first (the scanner's link would
    take the pair)."""
    from .conftest import kernel, launch, write_trace

    begin = {**launch(1, 9, tid=105), "ph": "B"}
    del begin["dur"]
    end = {"ph": "E", "cat": "cuda_runtime", "pid": 1, "tid": 105, "ts": 2}
    return write_trace(
        folder / "launch-pairs.json", [begin, end, launch(3, 9, tid=106), kernel("f", 5, 1, corr=9)]
    )


def test_kernels_get_the_first_timed_runtime_call_with_their_correlation(tmp_path, monkeypatch):
    """The scanner's links (whole files) and the join (msgspec's path) agree, and find what
    the trace says; a file with a B/E launch is joined instead, in a batch too."""
    joined = []
    real = assemble._join_launches

    def spy(gpu: pl.DataFrame, runtime: pl.DataFrame) -> pl.DataFrame:
        joined.append(gpu.height)
        return real(gpu, runtime)

    monkeypatch.setattr(assemble, "_join_launches", spy)
    files = [_launches(tmp_path), *sorted((SAMPLES / "tp-2").iterdir())]
    with monkeypatch.context() as m:
        m.setattr(scan, "_scanner", None)
        pure = {f: decode.decode_file(f).gpu for f in [*files, _launch_pairs(tmp_path)]}
    for batch, linked in ((files, True), ([*files, _launch_pairs(tmp_path)], False)):
        joined.clear()
        together = decode.decode_files(batch)
        assert (not joined) == linked
        for f, got in zip(batch, together, strict=True):
            assert got.gpu.equals(pure[f]), f
            assert got.gpu.equals(decode.decode_file(f).gpu), f
    got = together[0].gpu.select("name", "launch_ns", "launch_tid").rows()
    assert got == [
        ("a", 2000, "100"),
        ("b", 3000, "101"),
        ("c", 9000, "104"),
        ("d", None, None),
        ("e", None, None),
    ]
    assert together[-1].gpu.select("launch_ns", "launch_tid").row(0) == (3000, "106")


@pytest.mark.slow
@pytest.mark.parametrize("piece", [None, 1 << 20])
def test_files_decoded_together_get_the_tables_they_get_alone(tmp_path, piece, monkeypatch):
    files = [*_batch_inputs()[:12], *_edge_traces(tmp_path), *_batch_inputs()[12:]]
    built = []
    batch = decode._scanned_batch

    def counting(pending):
        built.extend(p.about.name for p in pending)
        return batch(pending)

    monkeypatch.setattr(decode, "_scanned_batch", counting)
    together = decode.decode_files(files, piece)
    assert len(together) == len(files)
    assert len(built) > 25  # most files were built in the batch
    if piece:
        assert len(built) < len(files) - 8  # the bigger ones were read in pieces
    for f, got in zip(files, together, strict=True):
        try:
            alone = decode.decode_file(f, piece)
        except Exception as exc:
            assert type(got) is type(exc) and str(got) == str(exc), f
            continue
        assert isinstance(got, decode.RawTrace), (f, got)
        for field in dataclasses.fields(decode.RawTrace):
            a, b = getattr(got, field.name), getattr(alone, field.name)
            assert a.equals(b) if hasattr(a, "equals") else a == b, (f, field.name)
    paired = {str(f): r for f, r in zip(files, together, strict=True)}
    assert paired[str(tmp_path / "pairs-b.json")].host["name"].to_list() == ["inner", "outer"]
    assert paired[str(tmp_path / "listed.json")].host.height == 1  # read again: aten::mm
    dims = paired[str(tmp_path / "gloo.json")].ops["input_dims"].to_list()  # raw JSON text
    assert [d.split() for d in dims] == [["[", "[", "4,", "4", "]", "]"]]
    assert isinstance(paired[str(tmp_path / "bad.json")], decode.TraceError)


def test_a_batch_that_cannot_be_built_is_decoded_file_by_file(monkeypatch):
    files = sorted((SAMPLES / "ddp-4").iterdir())
    good = decode.decode_files(files)

    def broken(pending):
        raise RuntimeError("boom")

    monkeypatch.setattr(decode, "_scanned_batch", broken)
    again = decode.decode_files(files)
    for a, b in zip(good, again, strict=True):
        assert a.ops.height > 0
        for role in ("gpu", "ops", "host", "threads"):
            assert getattr(a, role).equals(getattr(b, role)), role


def test_a_file_that_breaks_a_batch_costs_only_itself(monkeypatch):
    files = [str(f) for f in sorted((SAMPLES / "ddp-4").iterdir())]
    good = workers.work(files, workers.Settings())
    victim = files[2]
    model = per_rank._model

    def fragile(raws, patterns):
        if any(r.file == victim for r in raws):
            raise RuntimeError("boom")
        return model(raws, patterns)

    monkeypatch.setattr(per_rank, "_model", fragile)
    got = workers.work(files, workers.Settings())
    assert got[2] == ("error", "internal error while analysing (RuntimeError: boom)")
    for i in (0, 1, 3):
        assert got[i][0] == "ok"
        for name in per_rank.TABLES:
            assert getattr(got[i][1], name).equals(getattr(good[i][1], name))


@pytest.fixture(scope="module")
def spill_jobs(tmp_path_factory):
    """A pipeline job (bubbles read kernels) and one with clock skew (kernels are shifted)."""
    root = tmp_path_factory.mktemp("spill")
    generate("bubble", root / "bubble", ranks=8, seed=0, steps=2)
    generate("clock-skew", root / "skew", ranks=4, seed=3)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("scenario", ["bubble", "skew", "pp-4", "ddp-4"])
def test_tables_kept_in_files_give_the_same_report(spill_jobs, scenario, jobs, monkeypatch):
    """Above budget.SPILL_ABOVE the kernels and calls live in one Arrow file per rank (the
    keyed calls and waits in one per batch) and everything that needs them reads a few ranks
    at a time: tables, findings and every rendered format must not change (batches of one
    rank each here, the most splitting there can be)."""
    from kineto_comm import rank_store
    from kineto_comm.render.formats import FORMATS, render
    from kineto_comm.rules_api import Tables
    from kineto_comm.rules_engine import builtin_rules, run_rules

    folder = SAMPLES / scenario if "-" in scenario else spill_jobs / scenario  # real or synth
    monkeypatch.setattr(budget, "THREADS_BELOW", -1)  # jobs=2: worker processes write files
    monkeypatch.setattr(sys.modules["kineto_comm.analyze"], "CHUNK_ROWS", 1)  # steps in chunks
    memory = analyze(folder, jobs=jobs)
    assert not memory.rank_kernels.spilled and not memory.rank_steps.spilled
    assert memory.steps.n_chunks() == memory.ranks.height > 1
    monkeypatch.setattr(budget, "SPILL_ABOVE", 0)
    monkeypatch.setattr(rank_store, "BATCH_ROWS", 1)
    monkeypatch.setattr(rank_store, "SLICE_ROWS", 1)  # rules fold over views of one rank
    files = analyze(folder, jobs=jobs)
    assert files.rank_kernels.spilled and files.options["jobs"] == jobs
    assert files.rank_collectives.spilled and files.rank_waits.spilled
    assert files.rank_steps.spilled
    # The workers' files hold the ranks the traces claim, the final ones: one scan each.
    for store in (files.rank_kernels, files.rank_collectives, files.rank_steps):
        assert len(store._runs()) == 1
    assert files.kernels.height > 0 and files.kernels.equals(memory.kernels)
    for name in ("collectives", "steps", "totals", "offsets", "collective_instances"):
        assert files.table(name).equals(memory.table(name)), name
    for name in ("collective_waits", "stragglers", "message_sizes", "message_size_summary"):
        assert files.table(name).equals(memory.table(name)), name
    for name in ("process_groups", "pipeline", "storms"):
        assert files.table(name).equals(memory.table(name)), name
    # The critical path reads the ranks it reaches from their files (analysis.depgraph).
    for name in ("step_times", "critical_path", "critical_path_kernels"):
        assert files.table(name).equals(memory.table(name)), name
    # No built-in rule or renderer assembles every rank's rows of a per-rank table: they
    # aggregate them lazily or read a few ranks at a time (docs/scale.md step 4).
    whole = rank_store.RankStore.frame

    def some_ranks(self, ranks=None, columns=None):
        assert ranks is not None, "every rank's rows assembled"
        return whole(self, ranks, columns)

    monkeypatch.setattr(rank_store.RankStore, "frame", some_ranks)
    # Thresholds at zero: every rule that can say something does (rules reading kernels too).
    zero = {
        r.code: {o.name: 0 for o in r.options if o.name.endswith(("_share", "min_gap_ns"))}
        for r in builtin_rules()
    }
    assert len(list(Tables(files).rank_slices())) == files.ranks.height
    found = run_rules(files, options=zero)
    assert [f.to_dict() for f in found] == [f.to_dict() for f in run_rules(memory, options=zero)]
    if scenario == "skew":
        assert (files.offsets["offset_ns"] != 0).any()
    elif scenario == "bubble":
        assert files.pipeline.height > 0
        assert {"COMM101", "PIPE101", "SYNC102"} <= {f.code for f in found}
    files, memory = (dataclasses.replace(r, findings=found) for r in (files, memory))
    for fmt in FORMATS:  # every renderer, the HTML pipeline timeline included
        assert render(files, fmt) == render(memory, fmt), fmt


@pytest.mark.slow
@pytest.mark.parametrize("named", [True, False])
def test_files_of_traces_without_a_rank_hold_the_rank_in_their_name(tmp_path, named, monkeypatch):
    """Traces without distributedInfo get their rank from the file name, else the file
    order: a worker writes the rank in the name into its files (then one scan reads them
    all), else a placeholder relabelled as rows are read; the tables are the same as in
    memory either way."""
    import gzip
    import json

    for i, path in enumerate(sorted((SAMPLES / "ddp-4").iterdir())):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        del doc["distributedInfo"]
        (tmp_path / (f"rank{i}.json" if named else f"{'abcd'[i]}.json")).write_text(json.dumps(doc))
    memory = analyze(tmp_path, jobs=1)
    monkeypatch.setattr(budget, "SPILL_ABOVE", 0)
    files = analyze(tmp_path, jobs=1)
    source = "file name" if named else "file order"
    assert files.ranks["rank_source"].to_list() == [source] * 4
    assert len(files.rank_collectives._runs()) == (1 if named else 4)
    assert files.collectives.height > 0 and files.collectives.equals(memory.collectives)
    assert files.kernels.equals(memory.kernels) and files.steps.equals(memory.steps)
    for name in ("collective_instances", "stragglers", "offsets"):
        assert files.table(name).equals(memory.table(name)), name


def test_kernel_files_go_with_the_report(tmp_path, monkeypatch):
    import gc

    monkeypatch.setattr(budget, "SPILL_ABOVE", 0)
    report = analyze(SAMPLES / "tp-2", jobs=1)
    folder = report.rank_kernels._folder.path
    # Kernels, calls and steps: a file per rank; waits: one per batch (the keyed calls are
    # gone).
    assert len(list(folder.glob("*.arrow"))) == 3 * 2 + len(report.rank_waits._parts)
    same = dataclasses.replace(report, findings=())  # shares the files
    del report
    gc.collect()
    assert folder.exists() and same.kernels.height
    del same
    gc.collect()
    assert not folder.exists()


LEAVE_FOLDER = """
import os, sys
from kineto_comm import analyze, budget
budget.SPILL_ABOVE = 0  # the kernels go to a spill folder under TMPDIR
report = analyze(sys.argv[1], jobs=1)
print(report.rank_kernels._folder.path, flush=True)
os._exit(0)  # no finalizers: the folder stays, as after a kill
"""


def test_a_killed_runs_folder_is_removed_by_the_next_run(tmp_path, monkeypatch):
    """A run that dies without cleaning up leaves its spill folder (GBs on a big job); the
    next run that needs one removes it. Folders of live processes, of other hosts (a shared
    temporary folder) and without an owner record are left alone."""
    import socket
    import tempfile

    from kineto_comm import rank_store

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", LEAVE_FOLDER, str(SAMPLES / "tp-2")],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    left = Path(run.stdout.strip())
    assert left.parent == tmp_path and any(left.glob("*.arrow"))
    # A live process's folder (a run going on beside this one), another host's, one without
    # an owner record, and one whose pid is now another process's (start time differs).
    live = rank_store.SpillFolder(tmp_path)
    host = socket.gethostname()
    others = {}
    for name, owner in {
        "other-host": f"{host}-elsewhere\n1\n-\n",
        "no-owner": None,
        "pid-reused": f"{host}\n{os.getpid()}\n1\n",
    }.items():
        folder = Path(tempfile.mkdtemp(prefix=rank_store.SPILL_PREFIX, dir=tmp_path))
        if owner is not None:
            (folder / "owner").write_text(owner)
        others[name] = folder
    started = rank_store._started(os.getpid())
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(budget, "SPILL_ABOVE", 0)
    report = analyze(SAMPLES / "tp-2", jobs=1)
    assert report.rank_kernels.spilled
    assert not left.exists()
    assert live.path.exists() and others["other-host"].exists() and others["no-owner"].exists()
    # Linux gives the start time: the pid's process is not the one that wrote the record.
    assert others["pid-reused"].exists() == (started == "-")


def test_batches_hold_whole_ranks_on_their_clock():
    import polars as pl

    from kineto_comm.rank_store import Part, RankStore

    frame = analyze(SAMPLES / "ddp-4", jobs=1, align=False).kernels
    parts = [Part(rows=g.height, frame=g) for _, g in frame.group_by("rank", maintain_order=True)]
    offsets = pl.DataFrame({"rank": [0, 1, 2, 3], "offset_ns": [0, 5, None, -7]})
    store = RankStore(parts).with_offsets(offsets)
    rows = frame.height // 3
    batches = list(store.batches(rows=rows))
    assert 1 < len(batches) < 4
    seen = [set(b["rank"].unique()) for b in batches]
    assert all(not (a & b) for i, a in enumerate(seen) for b in seen[i + 1 :])
    assert all(b.height >= rows for b in batches[:-1])
    shift = pl.col("rank").replace_strict([1, 3], [5, -7], default=0)
    expect = frame.with_columns(pl.col(c) - shift for c in ("start_ns", "end_ns", "launch_ns"))
    assert pl.concat(batches).equals(expect)
    assert store.frame([3, 1]).equals(expect.filter(pl.col("rank").is_in([1, 3])))
    assert store.height == frame.height


def test_files_read_in_one_scan_keep_each_rows_final_rank(tmp_path):
    """Consecutive rank files of one layout are read by one scan where their rows hold their
    final ranks, or distinct provisional ones (relabelled as read); files whose rows hold
    the same provisional rank or an unknown one, files of another layout (a column of nulls
    only) and in-memory parts are read on their own. Every way gives each row its final
    rank, in the store's order."""
    import polars as pl

    from kineto_comm.frames import write_frame
    from kineto_comm.rank_store import TIME_COLUMNS, Part, RankStore, _groups, layout

    steps = analyze(SAMPLES / "ddp-4", jobs=1, align=False).steps
    source = [g for _, g in steps.group_by("rank", maintain_order=True)]
    # (final rank, rank the rows hold, `held` as told to the part, where the rows are)
    plan = [(0, 0, 0, "file"), (1, 1, 1, "file"), (8, 8, 8, "nulls"), (2, 2, None, "memory")]
    plan += [(3, 7, 7, "file"), (4, 0, 0, "file"), (5, -1, -1, "file"), (6, -1, -1, "file")]
    plan += [(7, 99, None, "file")]
    parts, expect = [], []
    for i, (final, holds, held, where) in enumerate(plan):
        rows = source[i % 4].with_columns(rank=pl.lit(holds, dtype=pl.Int64))
        if where == "nulls":
            rows = rows.with_columns(wall_ns=pl.lit(None))
        expect.append(rows.with_columns(rank=pl.lit(final, dtype=pl.Int64)))
        if where == "memory":
            parts.append(Part(rows=rows.height, frame=rows, rank=final))
            continue
        path = tmp_path / f"{i}.arrow"
        write_frame(rows, path)
        shape = layout(path)
        parts.append(Part(rows.height, path=str(path), rank=final, held=held, layout=shape))
    assert parts[2].layout != parts[1].layout == parts[4].layout
    store = RankStore(parts)
    assert [len(run) for run in store._runs()] == [2, 1, 1, 3, 1, 1]
    whole = pl.concat(expect, how="vertical_relaxed")
    assert store.lazy().collect().equals(whole)
    assert store.frame().equals(whole)
    assert store.lazy(["step", "wall_ns"]).collect().equals(whole.select("step", "wall_ns"))
    offsets = pl.DataFrame({"rank": list(range(9)), "offset_ns": [3 * r for r in range(9)]})
    moved = whole.with_columns(pl.col("start_ns", "end_ns") - 3 * pl.col("rank"))
    got = store.with_offsets(offsets).lazy(["rank", "start_ns", "end_ns"]).collect()
    assert got.equals(moved.select("rank", "start_ns", "end_ns"))
    view = store.restricted(3, 5)
    assert view.lazy().collect().equals(whole.filter(pl.col("rank").is_between(3, 5)))
    # batches() reads those runs with one read each, cut at `rows` rows; offsets, a window
    # and a choice of ranks apply to what each read gives.
    assert [len(g) for g in _groups(store._parts, 2**62)] == [2, 1, 1, 3, 1, 1]
    assert [len(g) for g in _groups(store._parts, 1)] == [1] * len(plan)
    two = [len(g) for g in _groups(store._parts, parts[4].rows + 1)]
    assert two == [2, 1, 1, 2, 1, 1, 1]
    times = [c for c in TIME_COLUMNS if c in whole.columns]
    assert {"cpu_start_ns", "compute_start_ns", "compute_end_ns"} <= set(times)
    on_clock = whole.with_columns(pl.col(times) - 3 * pl.col("rank"))
    for rows in (1, parts[4].rows + 1, 2**62):
        got = pl.concat(store.with_offsets(offsets).batches(rows=rows), how="vertical_relaxed")
        assert got.equals(on_clock)
    assert view.frame().equals(whole.filter(pl.col("rank").is_between(3, 5)))
    picked = store.frame([6, 4, 0], ["step", "start_ns"])
    assert picked.equals(whole.filter(pl.col("rank").is_in([0, 4, 6])).select(picked.columns))


def test_per_window_folds_whole_ranks_on_their_clock():
    """An aggregation a window of ranks at a time gives what one query over every rank
    gives, each rank in exactly one window, offsets applied."""
    import polars as pl

    from kineto_comm.rank_store import Part, RankStore

    steps = analyze(SAMPLES / "ddp-4", jobs=1, align=False).steps
    parts = [
        Part(rows=g.height, frame=g, rank=r)
        for (r,), g in steps.group_by("rank", maintain_order=True)
    ]
    offsets = pl.DataFrame({"rank": [0, 1, 2, 3], "offset_ns": [0, 5, None, -7]})
    store = RankStore(parts).with_offsets(offsets)
    seen: list[int] = []

    def first_starts(view: RankStore) -> pl.LazyFrame:
        seen.append(view.height)
        return view.lazy(["rank", "start_ns"]).group_by("rank").agg(pl.col("start_ns").min())

    got = store.per_window(first_starts, rows=steps.height // 3).sort("rank")
    assert len(seen) > 1 and sum(seen) == steps.height
    shift = pl.col("rank").replace_strict([1, 3], [5, -7], default=0)
    moved = steps.with_columns(pl.col("start_ns") - shift)
    expect = moved.group_by("rank").agg(pl.col("start_ns").min()).sort("rank")
    assert got.equals(expect) and got.height == 4


def test_plan_runs_small_jobs_in_threads_and_keeps_big_jobs_kernels_in_files(tmp_path, monkeypatch):
    small, big = tmp_path / "small.json", tmp_path / "big.json"
    small.write_bytes(b" " * 1000)
    with open(big, "wb") as fh:  # sparse: the size without the disk
        fh.truncate(budget.SPILL_ABOVE + 1)
    few = budget.plan([small, small], 64 << 30, jobs=2)
    assert few.threads and not few.spill
    # Spilled, the parent keeps only the collectives' share: a second worker fits a limit
    # that holds one next to a parent with every kernel.
    need = budget.WORKER_BASE + int(budget.WORKER_SHARE * (budget.SPILL_ABOVE + 1))
    parent = budget.PARENT_BASE + int(budget.SPILLED_SHARE * (budget.SPILL_ABOVE + 1001))
    many = budget.plan([big, small], parent + 2 * need, jobs=2)
    assert not many.threads and many.spill and many.jobs == 2
    monkeypatch.setattr(budget, "SPILL_ABOVE", 1 << 40)
    kept = budget.plan([big, small], parent + 2 * need, jobs=2)
    assert not kept.spill and kept.jobs == 1
    # Below SPILL_ABOVE, a limit that cannot hold every rank's tables beside one worker
    # keeps them in files too.
    merged = budget.PARENT_BASE + int(budget.PARENT_SHARE * (big.stat().st_size + 1000))
    assert budget.plan([big, small], merged + need, jobs=2).spill is False
    assert budget.plan([big, small], merged + need - 1, jobs=2).spill is True


@pytest.mark.parametrize("keys", [[0, 0, 2, 2, 2, 3], [2, 0, 3, 0, 2, 2]])
def test_split_gives_each_values_rows_in_order_whether_or_not_they_come_in_runs(keys):
    """Keys in runs (a batch's tables, file by file) come back as slices, others by
    partition: either way each value's rows in the table's order, an empty frame for a value
    without rows, and the key dropped when asked."""
    from kineto_comm.lazy import split

    frame = pl.DataFrame({"k": keys, "v": range(len(keys))})
    parts = split(frame, "k", 5)
    for value, part in enumerate(parts):
        assert part["v"].to_list() == [i for i, k in enumerate(keys) if k == value]
        assert part.columns == ["k", "v"]
    assert [p.columns for p in split(frame, "k", 5, keep_key=False)] == [["v"]] * 5
    assert frame.height == len(keys) and frame.columns == ["k", "v"]  # left as it was
