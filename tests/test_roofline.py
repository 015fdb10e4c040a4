"""The decode step's work model (kvlab.kernels.roofline) against counts done by hand, and its place in
``bench eval streams``' record."""
from types import SimpleNamespace

import pytest
import torch

from kvlab.kernels.roofline import achieved, copy_bandwidth, decode_step_work, device_peak, llama_params


def _tiny(**over):
    cfg = dict(model_type="llama", vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=1, head_dim=4, max_position_embeddings=64,
               tie_word_embeddings=True)
    return SimpleNamespace(**dict(cfg, **over))


def test_tiny_llama_step_counted_by_hand():
    # per layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192, MLP 3 x 8 x 16 = 384; 2 layers + lm_head 10 x 8 = 1232
    # norms (2 x 2 + 1) x 8 = 40; tied embedding counted once
    assert llama_params(_tiny()) == dict(matmul=1232, other=40, total=1272, norms=40, head=80)
    w = decode_step_work(_tiny(), batch=3, entries=5, dtype=torch.float32)
    # bytes: weights 1272 x 4; 3 embedding rows of 8 x 4; K/V per token 2 x 2 layers x 1 head x 4 x 4 B = 64:
    # read 3 x 5 x 64, written 3 x 64; logits 3 x 10 x 4, written and read by the loss
    assert (w["weight_bytes"], w["embed_bytes"], w["kv_read_bytes"], w["kv_write_bytes"], w["logits_bytes"]) == (
        5088, 96, 960, 192, 240)
    assert w["bytes"] == 6576
    # FLOPs: 2 x 3 x 1232 matmuls; attention 4 x 3 streams x 2 layers x 2 heads x 4 x 5 entries
    assert (w["matmul_flops"], w["attention_flops"], w["flops"]) == (7392, 960, 8352)
    assert w["intensity"] == pytest.approx(8352 / 6576)
    w16 = decode_step_work(_tiny(), batch=3, entries=5, dtype=torch.bfloat16, loss_read=False)
    assert w16["bytes"] == (6576 - 120) // 2 and w16["flops"] == 8352


def test_untied_qwen2_counts_its_biases_and_reads_embedding_rows_only():
    cfg = _tiny(model_type="qwen2", tie_word_embeddings=False)
    p = llama_params(cfg)
    # q/k/v biases 8 + 4 + 4 per layer; the untied embedding table (80) is a parameter read only by rows
    assert p["matmul"] == 1232 + 2 * 16 and p["total"] == 1232 + 32 + 40 + 80
    w = decode_step_work(cfg, batch=1, entries=1, dtype=torch.float32)
    assert w["weight_bytes"] == (1232 + 32 + 40) * 4 and w["embed_bytes"] == 8 * 4


def test_smollm2_shape_at_the_benchmarks_configuration():
    from kvlab.experiments.bench.eval import SMOLLM2_SHAPE

    cfg = SimpleNamespace(model_type="llama", **SMOLLM2_SHAPE)
    assert llama_params(cfg)["total"] == 134_515_008  # SmolLM2-135M's published parameter count
    w = decode_step_work(cfg, batch=256, entries=325, dtype=torch.float32)  # StreamingLLM(4, 324) + the new token
    assert w["kv_read_bytes"] == 256 * 325 * 2 * 30 * 3 * 64 * 4  # 3.83 GB
    assert w["bytes"] == 4_484_965_632 and w["flops"] == 74_604_478_464


def test_achieved_shares_and_an_unknown_device():
    w = dict(bytes=4.8e9, flops=6.7e10, dtype="float32")
    a = achieved(w, 2e-3, "NVIDIA H200", copy_Bps=4.0e12)
    assert a["bw_share"] == pytest.approx(0.5) and a["copy_share"] == pytest.approx(0.6)
    mode = a["math_mode"]
    assert a["flop_share"] == pytest.approx(6.7e10 / 2e-3 / device_peak("NVIDIA H200")[mode])
    assert a["floor_ms"] == pytest.approx(max(1.0, 6.7e10 / device_peak("NVIDIA H200")[mode] * 1e3))
    unknown = achieved(w, 2e-3, "Some Accelerator")
    assert unknown["peak"] == "unknown device" and unknown["bw_share"] is None and "copy_share" not in unknown
    with pytest.raises(ValueError):
        achieved(w, 0.0, "NVIDIA H200")
    with pytest.raises(ValueError):
        decode_step_work(_tiny(), batch=0, entries=5)
    assert copy_bandwidth("cpu") is None


def test_streams_record_and_table_carry_the_work_model():
    from kvlab.experiments.bench import eval as bench

    meta = dict(device_name="NVIDIA H200", copy_GBps=4000.0)
    policy = SimpleNamespace(budget=4)
    model = SimpleNamespace(config=_tiny())
    engine = dict(kernel="triton", dtype="float32", policy="streamingllm", batch=3, step_ms=1.0)
    generate = dict(kernel="generate", dtype="float32", policy="streamingllm", batch=3, step_ms=2.0)
    for row in (engine, generate):
        bench._add_work(row, model, policy, torch.float32, meta)
    assert "work" not in generate
    assert engine["work"]["entries"] == 5 and engine["work"]["bytes"] == 6576
    assert engine["work"]["bw_share"] == pytest.approx(6576 / 1e-3 / 4.8e12)
    assert "of the NVIDIA H200's 4.80 TB/s" in bench._work_line(engine)
    md = bench._work_md(dict(rows=[engine, generate], copy_GBps=4000.0))
    assert "### Work model of one step" in md and "| triton |" in md and "generate" not in md.split("\n")[-1]
