"""The analytical communication model: formulas by hand, synthetic traces, causes, what-if."""

from __future__ import annotations

import json

import polars as pl
import pytest

from kineto_comm import analyze
from kineto_comm.analytic import (
    HardwareModel,
    ModelConfig,
    bubble_fraction,
    compare,
    expected,
    load_config,
    load_hardware,
    measured,
    render_comparison,
    render_model,
    what_if,
)
from kineto_comm.analytic.compare import comparison_findings
from kineto_comm.analytic.formulas import busbw_factor, pipeline_bubble
from kineto_comm.rank_store import RankStore
from kineto_comm.report import Report
from kineto_comm.synth import ModelConfig as SynthModel
from kineto_comm.synth import generate

# The synthetic generator's group roles (truth.json) in the process_groups vocabulary. Only
# the tests know this convention; compare() itself takes roles= or report.process_groups.
SYNTH_ROLES = {"dp": "data_parallel", "tp": "tensor_parallel", "pp": "pipeline", "world": "unknown"}


def config_from_truth(truth: dict) -> ModelConfig:
    """The ModelConfig of a synthetic job, from truth.json's model and parallelism sections."""
    m, par = truth["model"], truth["parallelism"]
    return ModelConfig(
        layers=m["layers"],
        hidden=m["hidden"],
        vocab=m["vocab"],
        seq=m["seq"],
        micro_batch=m["micro_batch"],
        micro_batches=m["micro_batches"],
        dtype=m["dtype"],
        bucket_mb=m["bucket_mb"],
        dp=par["dp"],
        tp=par["tp"],
        pp=par["pp"],
        fsdp="full_shard" if truth["layout"] == "fsdp" else None,
    )


def roles_from_truth(truth: dict) -> dict[str, str]:
    return {g["pg_name"]: SYNTH_ROLES[g["role"]] for g in truth["process_groups"]}


def row(table: pl.DataFrame, role: str, collective: str) -> dict:
    rows = table.filter((pl.col("role") == role) & (pl.col("collective") == collective))
    assert rows.height == 1, (role, collective, table)
    return rows.row(0, named=True)


# -- synthetic layouts: expected and measured agree ------------------------------------------


@pytest.mark.parametrize("layout", ["dp", "fsdp", "tp-dp", "pp-dp"])
def test_expected_matches_measured_on_synthetic_layouts(tmp_path, layout):
    truth = generate("baseline", tmp_path, ranks=8, layout=layout, steps=2)
    cfg = config_from_truth(truth)
    exp = expected(cfg)
    report = analyze(tmp_path, jobs=1)
    table = compare(exp, report, roles=roles_from_truth(truth))
    # Without a mapping the roles come from the report's process_groups table (fsdp groups
    # compare as data_parallel): the same comparison.
    assert report.process_groups.height > 0
    assert compare(exp, report).equals(table)
    assert table.height == exp.select("role", "collective").unique().height
    assert table["measured_bytes_per_step"].null_count() == 0
    assert (table["bytes_dev_pct"].abs() < 1.0).all(), table
    assert (table["message_dev_pct"].abs() < 1.0).all(), table
    assert not table["flagged"].any(), table["causes"].to_list()
    # ... and the per-role volumes equal the generator's own closed forms (truth.json).
    t = truth["expected"]
    if layout in ("dp", "tp-dp"):
        dp = row(exp, "data_parallel", "all_reduce")
        assert dp["bytes_per_step"] == t["dp_grad"]["bytes_per_step"]
        assert dp["calls_per_step"] == t["dp_grad"]["calls_per_step"]
        assert dp["wire_bytes_per_rank"] == t["dp_grad"]["wire_bytes_per_rank"]
    if layout == "tp-dp":
        assert (
            row(exp, "tensor_parallel", "all_reduce")["bytes_per_step"]
            == (t["tp"]["bytes_per_step"])
        )
    if layout == "fsdp":
        ag = row(exp, "data_parallel", "all_gather")
        rs = row(exp, "data_parallel", "reduce_scatter")
        assert ag["bytes_per_step"] == t["fsdp_allgather"]["bytes_per_step"]
        assert rs["bytes_per_step"] == t["fsdp_reduce_scatter"]["bytes_per_step"]
        zero3 = t["fsdp_reduce_scatter"]["zero3_wire_bytes_per_rank"]
        assert ag["wire_bytes_per_rank"] + rs["wire_bytes_per_rank"] == pytest.approx(zero3, 1e-9)
    if layout == "pp-dp":
        want = t["pp_p2p"]["bubble_fraction_formula"]
        assert bubble_fraction(cfg) == pytest.approx(want)
        assert row(exp, "pipeline", "send")["message_bytes"] == t["pp_p2p"]["bytes_per_call"]
        stages = [v["bytes_per_step"] for k, v in t.items() if k.startswith("dp_grad_stage")]
        # mean over all ranks = mean over stages (each stage has d ranks)
        assert row(exp, "data_parallel", "all_reduce")["bytes_per_step"] == sum(stages) // 4


# -- a real-scale configuration, figures worked out by hand ----------------------------------

# GPT 1.3B: Psi = 1.3e9 (stated), h = 2048, L = 24, V = 51200, bf16 (B = 2); b = 4, s = 2048,
# m = 8 micro-batches; d = 8, t = 2, p = 2 (32 GPUs).
REAL = dict(
    params=1_300_000_000, layers=24, hidden=2048, vocab=51200, seq=2048, micro_batch=4,
    micro_batches=8, dtype="bf16", dp=8, tp=2, pp=2,
)  # fmt: skip


def test_hand_checked_real_scale_config():
    cfg = ModelConfig(**REAL)
    exp = expected(cfg)
    # DP: each rank holds Psi/(t*p) = 325e6 parameters; gradients 325e6 x 2 B = 650,000,000 B
    # all-reduced once per step; on the wire 2(d-1)/d = 1.75 x -> 1,137,500,000 B.
    dp = row(exp, "data_parallel", "all_reduce")
    assert dp["bytes_per_step"] == 650_000_000
    assert dp["wire_bytes_per_rank"] == 1_137_500_000
    assert dp["group_size"] == 8
    # TP: b*s*h*B = 4 x 2048 x 2048 x 2 = 33,554,432 B per all-reduce; 4 per layer and
    # micro-batch over L/p = 12 layers and m = 8: 384 calls, 12,884,901,888 B; bus factor
    # 2(t-1)/t = 1 -> the same on the wire.
    tp = row(exp, "tensor_parallel", "all_reduce")
    assert tp["message_bytes"] == 33_554_432
    assert tp["calls_per_step"] == 384
    assert tp["bytes_per_step"] == 12_884_901_888
    assert tp["wire_bytes_per_rank"] == 12_884_901_888
    # PP: one boundary, 2m = 16 sends and 16 receives across it, i.e. 2m(p-1)/p = 8 per rank;
    # scatter/gather sends b*s*h*B/t = 16,777,216 B -> 134,217,728 B per rank and direction.
    for coll in ("send", "recv"):
        pp = row(exp, "pipeline", coll)
        assert pp["message_bytes"] == 16_777_216
        assert pp["calls_per_step"] == 8
        assert pp["bytes_per_step"] == 134_217_728
    # Bubble (p-1)/(m+p-1) = 1/9.
    assert bubble_fraction(cfg) == pytest.approx(1 / 9)
    # Without scatter/gather the p2p message is the full b*s*h*B.
    plain = row(expected(cfg.replace(pp_scatter_gather=False)), "pipeline", "send")
    assert plain["message_bytes"] == 33_554_432


def test_hand_checked_variants_of_the_real_config():
    cfg = ModelConfig(**REAL)
    # Interleaved v = 2: bubble time / v -> (p-1)/(v*m+p-1) = 1/17; p*v-1 = 3 chunk
    # boundaries x 2m = 48 sends over p = 2 ranks -> 24 per rank (v = 2 ... 3x the 8 above).
    inter = cfg.replace(virtual_stages=2)
    assert bubble_fraction(inter) == pytest.approx(1 / 17)
    assert row(expected(inter), "pipeline", "send")["calls_per_step"] == 24
    # Full recompute: 6 TP all-reduces per layer and micro-batch -> 6 x 12 x 8 = 576.
    rc = row(expected(cfg.replace(recompute="full")), "tensor_parallel", "all_reduce")
    assert rc["calls_per_step"] == 576
    assert rc["bytes_per_step"] == 576 * 33_554_432
    # Sequence parallel: each all-reduce becomes reduce-scatter + all-gather of the same
    # 33,554,432 B buffer; wire (t-1)/t x 2 = the all-reduce's 12,884,901,888 B.
    sp = expected(cfg.replace(sequence_parallel=True))
    ag, rs = row(sp, "tensor_parallel", "all_gather"), row(sp, "tensor_parallel", "reduce_scatter")
    assert ag["calls_per_step"] == rs["calls_per_step"] == 384
    assert ag["message_bytes"] == 33_554_432
    assert ag["wire_bytes_per_rank"] + rs["wire_bytes_per_rank"] == 12_884_901_888
    # fp32 gradients: the DP volume doubles to 1,300,000,000 B.
    fp32 = row(expected(cfg.replace(grad_dtype="fp32")), "data_parallel", "all_reduce")
    assert fp32["bytes_per_step"] == 1_300_000_000


def test_hand_checked_zero_stages_on_1p3b():
    # Psi from the shapes: 12 x 24 x 2048^2 + 51200 x 2048 = 1,207,959,552 + 104,857,600
    # = 1,312,817,152; d = 8 divides every unit (block 50,331,648, embedding 104,857,600).
    base = ModelConfig(layers=24, hidden=2048, vocab=51200, dp=8)
    psi_b = 1_312_817_152 * 2
    assert base.params_total == 1_312_817_152
    # DDP: 2(d-1)/d x Psi x B = 1.75 x 2,625,634,304 = 4,594,860,032 wire bytes.
    ddp = expected(base)
    assert ddp["wire_bytes_per_rank"].sum() == 4_594_860_032
    # ZeRO-1/2: reduce-scatter Psi*B + all-gather Psi*B: same 2(d-1)/d volume.
    for stage in (1, 2):
        z = expected(base.replace(zero=stage))
        assert sorted(z["collective"]) == ["all_gather", "reduce_scatter"]
        assert z["bytes_per_step"].to_list() == [psi_b, psi_b]
        assert z["wire_bytes_per_rank"].sum() == 4_594_860_032
    # ZeRO-3 / FSDP full_shard: all-gather forward + backward, reduce-scatter: 3(d-1)/d x Psi x B
    # = 2.625 x 2,625,634,304 = 6,892,290,048; one call per unit (24 blocks + embedding).
    for cfg in (base.replace(zero=3), base.replace(fsdp="full_shard")):
        z3 = expected(cfg)
        assert z3["wire_bytes_per_rank"].sum() == 6_892_290_048
        assert row(z3, "data_parallel", "all_gather")["calls_per_step"] == 50
        assert row(z3, "data_parallel", "reduce_scatter")["calls_per_step"] == 25
    # Micro-batches: ZeRO-3 gathers and reduces on each of them; DDP syncs once per step.
    assert expected(base.replace(zero=3, micro_batches=4))["bytes_per_step"].sum() == 12 * psi_b
    assert expected(base.replace(micro_batches=4))["bytes_per_step"].sum() == psi_b
    # No parallelism, no communication.
    assert expected(ModelConfig(params=10**9)).height == 0


def test_formulas_busbw_and_bubble():
    assert busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert busbw_factor("all_gather", 8) == pytest.approx(0.875)
    assert busbw_factor("send", 2) == 1.0
    with pytest.raises(ValueError, match="barrier"):
        busbw_factor("barrier", 8)
    assert pipeline_bubble(4, 16) == pytest.approx(3 / 19)
    assert pipeline_bubble(1, 4) == 0.0


def test_expert_parallel_all_to_all():
    # 8 experts over ep = 4, top-2, every block MoE: 4 all-to-alls per layer per micro-batch
    # of b*s*k*h*B = 1 x 1024 x 2 x 1024 x 2 = 4,194,304 B; 4 layers, m = 1 -> 16 calls.
    cfg = ModelConfig(layers=4, hidden=1024, vocab=1000, seq=1024, dp=8, ep=4, experts=8, top_k=2)
    exp = expected(cfg)
    a2a = row(exp, "expert", "all_to_all")
    assert a2a["message_bytes"] == 4_194_304
    assert a2a["calls_per_step"] == 16
    # Expert gradients are reduced in the expert-data-parallel group of d/ep = 2 ranks:
    # 4 layers x 8 experts x 8h^2 / ep = 67,108,864 params -> 134,217,728 B.
    dpe = exp.filter(pl.col("group") == "dp_expert").row(0, named=True)
    assert dpe["group_size"] == 2 and dpe["bytes_per_step"] == 134_217_728


# -- configuration: TOML and validation ------------------------------------------------------


def test_load_config_from_toml(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(
        "[model]\nparams = 1.3e9\nlayers = 24\nhidden = 2048\nvocab = 51200\nseq = 2048\n"
        'micro_batch = 4\nmicro_batches = 8\ndtype = "bf16"\ndp = 8\ntp = 2\npp = 2\n'
        "[hardware]\nmfu = 0.5\n"
    )
    cfg = load_config(path)
    assert cfg == ModelConfig(**REAL)
    assert load_hardware(path) == HardwareModel(mfu=0.5)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[model]\nparams = 1e9\nhiden = 10\n", "model.hiden"),
        ("[model]\nparams = 1e9\ntp = 0\n", "model.tp"),
        ("[model]\nparams = 1e9\ndtype = 'int4'\n", "model.dtype"),
        ("[model]\nparams = 1e9\nzero = 4\n", "model.zero"),
        ("[model]\nparams = 1e9\nfsdp = 'hybrid'\n", "model.fsdp"),
        ("[model]\nparams = 1e9\nzero = 1\nfsdp = 'full_shard'\n", "model.zero"),
        ("[model]\nlayers = 2\nhidden = 8\n", "model.vocab"),
        ("[model]\nparams = 1e9\ntp = 2\n", "model.hidden"),
        ("[model]\nlayers = 6\nhidden = 8\nvocab = 4\npp = 4\n", "model.layers"),
        ("[model]\nparams = 1e9\nsequence_parallel = 'yes'\n", "model.sequence_parallel"),
        ("[model]\nparams = 1e9\nrecompute = 'some'\n", "model.recompute"),
        ("[model]\nparams = 1e9\nbucket_mb = -1\n", "model.bucket_mb"),
        ("[other]\nx = 1\n", "no [model] table"),
        ("[model\n", "invalid TOML"),
    ],
)
def test_invalid_config_names_the_key(tmp_path, text, key):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=key.replace("[", r"\[")) as err:
        load_config(path)
    assert "\n" not in str(err.value)


def test_invalid_keyword_arguments():
    with pytest.raises(ValueError, match=r"model\.micro_batch "):
        ModelConfig(params=10**9, micro_batch=0)
    with pytest.raises(ValueError, match=r"model\.ep"):
        ModelConfig(layers=2, hidden=8, vocab=4, dp=4, ep=3, experts=6)
    with pytest.raises(ValueError, match="hardware.mfu"):
        HardwareModel(mfu=1.5)


# -- compare: causes of deviations -----------------------------------------------------------


def fake_report(calls: list[tuple[int, int, str, str, int, str]], ranks: int, pg=None) -> Report:
    """A Report holding only collectives (rank, step, process_group, collective, bytes, dtype)."""
    coll = pl.DataFrame(
        calls,
        schema=["rank", "step", "process_group", "collective", "bytes", "dtype"],
        orient="row",
    )
    steps = coll.select("rank", "step").unique()
    return Report(
        ranks=pl.DataFrame({"rank": list(range(ranks))}),
        rank_collectives=RankStore.from_frame(coll),
        rank_steps=RankStore.from_frame(steps),
        totals=pl.DataFrame(),
        process_groups=pg if pg is not None else pl.DataFrame(),
    )


TP_CFG = ModelConfig(layers=2, hidden=1024, vocab=1000, seq=512, tp=2)  # 8 TP calls of 1 MiB
TP_MSG = 512 * 1024 * 2


def test_compare_flags_recompute_collectives():
    # 12 all-reduces per step instead of 4 x 2 layers = 8: ratio 1.5 -> recompute.
    calls = [(r, 0, "1", "all_reduce", TP_MSG, "bfloat16") for r in range(2) for _ in range(12)]
    table = compare(expected(TP_CFG), fake_report(calls, 2), roles={"1": "tp"})
    tp = row(table, "tensor_parallel", "all_reduce")
    assert tp["flagged"] and tp["bytes_dev_pct"] == pytest.approx(50.0)
    assert "recompute" in tp["causes"]
    # ... and the model agrees once recompute is in the config.
    ok = compare(expected(TP_CFG.replace(recompute="full")), fake_report(calls, 2), {"1": "tp"})
    assert not ok["flagged"].any()


def test_compare_flags_fp32_gradients_and_bucket_size():
    cfg = ModelConfig(params=100_000_000, dp=2)  # 200 MB of bf16 gradients, 25 MiB buckets
    want = row(expected(cfg), "data_parallel", "all_reduce")
    assert want["calls_per_step"] == 8  # ceil(200e6 / 26,214,400)
    fp32 = [(r, 0, "0", "all_reduce", 50_000_000, "float32") for r in range(2) for _ in range(8)]
    t = row(
        compare(expected(cfg), fake_report(fp32, 2), {"0": "dp"}), "data_parallel", "all_reduce"
    )
    assert t["bytes_dev_pct"] == pytest.approx(100.0) and "fp32" in t["causes"]
    # Same bytes in 4 calls of 50 MB: the bucket size differs, not the volume.
    big = [(r, 0, "0", "all_reduce", 50_000_000, "bfloat16") for r in range(2) for _ in range(4)]
    t = row(compare(expected(cfg), fake_report(big, 2), {"0": "dp"}), "data_parallel", "all_reduce")
    assert abs(t["bytes_dev_pct"]) < 1 and t["calls_dev_pct"] == pytest.approx(-50.0)
    assert t["flagged"] and "bucket size differs" in t["causes"]


def test_compare_flags_duplicate_all_gather_missing_and_unexpected_rows():
    cfg = ModelConfig(layers=2, hidden=1024, vocab=1024, dp=2, fsdp="full_shard")
    exp = expected(cfg)
    ag = row(exp, "data_parallel", "all_gather")  # 2 passes x 3 units
    unit = 12 * 1024 * 1024 * 2
    calls = []
    for r in range(2):  # three gathers of each block instead of two, no reduce-scatter at all
        calls += [(r, 0, "0", "all_gather", unit, "bfloat16")] * 6
        calls += [(r, 0, "0", "all_gather", 1024 * 1024 * 2, "bfloat16")] * 2
        calls += [(r, 0, "0", "broadcast", 4, "int64")]
    pg = pl.DataFrame({"process_group": ["0"], "role": ["fsdp"]})  # the process_groups table
    table = compare(exp, fake_report(calls, 2, pg=pg))
    got = row(table, "data_parallel", "all_gather")
    assert got["measured_calls_per_step"] == 8 and ag["calls_per_step"] == 6
    assert "duplicate all-gather" in got["causes"]
    assert "missing from the trace" in row(table, "data_parallel", "reduce_scatter")["causes"]
    assert "not in the model" in row(table, "data_parallel", "broadcast")["causes"]
    findings = comparison_findings(table)
    assert {f.code for f in findings} == {"model_deviation"} and len(findings) == 3
    text = render_comparison(table)
    assert "! data_parallel" in text and "duplicate all-gather" in text


def test_measured_averages_over_ranks_and_steps_and_unknown_roles():
    calls = [(0, s, "7", "all_reduce", 1000, "bfloat16") for s in (0, 1) for _ in range(3)]
    calls += [(1, 0, "7", "all_reduce", 1000, "bfloat16")]
    got = measured(fake_report(calls, 2)).row(0, named=True)
    # rank 0: 3 calls/step over 2 steps, rank 1: 1 call in 1 step -> (3 + 1) / 2 ranks
    assert got["role"] == "unknown"
    assert got["calls_per_step"] == pytest.approx(2.0)
    assert got["bytes_per_step"] == pytest.approx(2000.0)
    with pytest.raises(ValueError, match="roles"):
        measured(fake_report(calls, 2), roles={"7": "sideways"})


# -- what-if and rendering -------------------------------------------------------------------


def test_what_if_time_model_hand_checked():
    cfg = ModelConfig(**REAL)
    hw = HardwareModel()
    one = what_if(cfg, "seq", [2048], hw).row(0, named=True)
    # compute: 6 x 1.3e9 x (4 x 2048 x 8 tokens) / (t*p = 4) = 1.277952e14 FLOP per GPU at
    # 989e12 x 0.4 FLOP/s -> 0.32304 s.
    assert one["compute_s"] == pytest.approx(6 * 1.3e9 * 65536 / 4 / (989e12 * 0.4))
    # DP spans t*d = 16 ranks > 8 per node: 1,137,500,000 wire B at 45 GB/s + latency.
    calls = row(expected(cfg), "data_parallel", "all_reduce")["calls_per_step"]
    assert one["comm_s_data_parallel"] == pytest.approx(1.1375e9 / 45e9 + calls * 10e-6)
    # TP inside a node: 12,884,901,888 B at 360 GB/s + 384 calls x 10 us.
    assert one["comm_s_tensor_parallel"] == pytest.approx(12_884_901_888 / 360e9 + 384e-5)


def test_what_if_sweeps_show_the_communication_share():
    cfg = ModelConfig(**REAL)
    # More GPUs at a fixed global batch: compute per GPU halves, DP traffic does not.
    dp = what_if(cfg, "dp", [8, 16, 32])
    assert dp["world_size"].to_list() == [32, 64, 128]
    assert dp["tokens_per_step"].n_unique() == 1
    assert dp["comm_share"].is_sorted() and dp["comm_share"][2] > dp["comm_share"][0] + 0.1
    # Longer sequences: TP traffic grows linearly with s, DP traffic stays.
    seq = what_if(cfg, "seq", [1024, 2048, 4096])
    assert seq["comm_s_data_parallel"].n_unique() == 1
    tp = seq["comm_s_tensor_parallel"].to_list()
    assert tp[2] - tp[1] == pytest.approx(2 * (tp[1] - tp[0]))
    # Model size with a stated Psi scales Psi with the shapes: h x2 -> ~x3.7 here.
    hid = what_if(cfg, "hidden", [2048, 4096])
    assert hid["params"][0] == 1_300_000_000
    assert hid["params"][1] / hid["params"][0] == pytest.approx(
        (12 * 24 * 4096**2 + 51200 * 4096) / (12 * 24 * 2048**2 + 51200 * 2048)
    )
    with pytest.raises(ValueError, match="cannot vary"):
        what_if(cfg, "colour", [1])
    with pytest.raises(ValueError, match="does not divide"):
        what_if(cfg, "dp", [7])


def test_render_model_prints_sizes_bubble_and_sweeps():
    text = render_model(ModelConfig(**REAL))
    assert "650.00 MB" in text  # DP gradients per rank and step
    assert "33.55 MB" in text  # TP message
    assert "11.1% of the step" in text
    assert "dp=32" in text and "seq=8192" in text and "comm share" in text


def test_synthetic_compare_renders_clean(tmp_path):
    truth = generate(
        "baseline",
        tmp_path,
        ranks=4,
        layout="dp",
        steps=2,
        model=SynthModel(layers=2, hidden=256, seq=128, vocab=512, dtype="Float", bucket_mb=1),
    )
    report = analyze(tmp_path, jobs=1)
    cfg = config_from_truth(truth)
    assert json.dumps(truth["model"])  # truth carries the model config used
    table = compare(expected(cfg), report, roles=roles_from_truth(truth))
    assert cfg.dtype == "float32" and not table["flagged"].any()
    # Claiming bf16 for an fp32 job: half the expected bytes, the trace says float32.
    wrong = compare(expected(cfg.replace(dtype="bf16")), report, roles_from_truth(truth))
    t = row(wrong, "data_parallel", "all_reduce")
    assert t["bytes_dev_pct"] == pytest.approx(100.0, abs=0.5) and "fp32" in t["causes"]
