"""The work a one-token decode step must do, and how close a measured step comes to the device's limits.

A decode step of ``B`` streams through a Llama-style model (Llama, Qwen2, SmolLM2) whose KV cache policy lets each
stream attend to ``n`` entries (the kept ones plus the new token) must at least::

    read   the weights once                         P_w * e        (every linear layer, the norms, lm_head)
           the embedding rows of the B tokens        B * d * e
           each stream's n cached keys and values    B * n * 2 * L * H_kv * d_h * e
    write  the new key and value                     B * 2 * L * H_kv * d_h * e
           the logits                                B * V * e      (+ one read by the loss, when it is timed)
    FLOPs  the matmuls                               2 * B * P_mm   (P_mm: the linear weights, lm_head included)
           attention over the n entries              4 * B * L * H * d_h * n   (q.k and p.v per query head)

(``e``: bytes per element of the run's dtype; ``d``: hidden size; ``L`` layers, ``H`` / ``H_kv`` query / KV
heads of ``d_h``; ``V`` the vocabulary.) Activations between the kernels, the cache's index metadata, norms'
and softmax's elementwise FLOPs are left out: they are what an implementation adds to the minimum, not part of
it. Given the measured step time, :func:`achieved` gives bytes/s and FLOP/s and their shares of the device's
nominal peaks (:data:`DEVICE_PEAKS`, from the vendors' datasheets) and of a copy bandwidth measured in the same
run (:func:`copy_bandwidth`), and the roofline floor ``max(bytes / bandwidth, FLOPs / FLOP rate)``.
"""
from __future__ import annotations

import torch

from kvlab.memory import kv_bytes_per_token, shape_of

__all__ = ["DEVICE_PEAKS", "PEAKS_SOURCE", "achieved", "copy_bandwidth", "decode_step_work", "device_peak",
           "llama_params"]

#: Nominal peaks per device name (``torch.cuda.get_device_name``): HBM bandwidth in bytes/s and dense FLOP/s per
#: math mode. The datasheets give the tensor-core rates with 2:4 sparsity; the dense rates here are half of them.
DEVICE_PEAKS = {
    "NVIDIA H200": dict(hbm=4.8e12, fp32=67e12, tf32=494.5e12, bf16=989.5e12, fp16=989.5e12),
    "NVIDIA H200 NVL": dict(hbm=4.8e12, fp32=60e12, tf32=417.5e12, bf16=835.5e12, fp16=835.5e12),
    "NVIDIA H100 80GB HBM3": dict(hbm=3.35e12, fp32=67e12, tf32=494.5e12, bf16=989.5e12, fp16=989.5e12),
    "NVIDIA H100 PCIe": dict(hbm=2.0e12, fp32=51e12, tf32=378e12, bf16=756.5e12, fp16=756.5e12),
    "NVIDIA A100-SXM4-80GB": dict(hbm=2.039e12, fp32=19.5e12, tf32=156e12, bf16=312e12, fp16=312e12),
}
PEAKS_SOURCE = ("NVIDIA datasheets (H200: nvidia.com/en-us/data-center/h200, SXM and NVL columns; H100: the H100 "
                "Tensor Core GPU datasheet, SXM and PCIe; A100: the A100 datasheet, 80GB SXM); HBM bandwidth nominal, "
                "tensor-core FLOP/s dense (half the datasheets' with-sparsity figures)")


def device_peak(name: str) -> dict | None:
    """The nominal peaks of the device called ``name`` (``dict(hbm=bytes/s, fp32=..., tf32=..., bf16=...,
    fp16=...)``), or None for a device not in :data:`DEVICE_PEAKS` (the caller says "unknown device")."""
    return DEVICE_PEAKS.get(name)


def _cfg(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def llama_params(config) -> dict:
    """Parameter counts of a Llama-style decoder from its config: ``matmul`` (every linear weight, lm_head
    included, biases of q/k/v when the config has them), ``other`` (norms; the embedding table when lm_head is
    not tied to it: read only by rows) and ``total`` (what ``sum(p.numel())`` gives)."""
    c = _cfg(config)
    d, layers, heads, kv = c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads
    hd = getattr(c, "head_dim", None) or d // heads
    ff = c.intermediate_size
    attention = d * heads * hd + 2 * d * kv * hd + heads * hd * d  # q, k, v, o
    mlp = 3 * d * ff  # gate, up, down
    qwen2 = getattr(c, "model_type", "") == "qwen2"  # q/k/v biases always, none on o
    llama_bias = bool(getattr(c, "attention_bias", False)) and not qwen2  # Llama's flag: q, k, v and o
    bias = (heads * hd + 2 * kv * hd) * (qwen2 or llama_bias) + d * llama_bias
    bias += (2 * ff + d) * bool(getattr(c, "mlp_bias", False))
    head = c.vocab_size * d
    matmul = layers * (attention + mlp + bias) + head
    norms = (2 * layers + 1) * d
    embedding = 0 if getattr(c, "tie_word_embeddings", False) else c.vocab_size * d
    return dict(matmul=matmul, other=norms + embedding, total=matmul + norms + embedding, norms=norms, head=head)


def decode_step_work(config, batch: int, entries: int, dtype: torch.dtype = torch.float32, *,
                     loss_read: bool = True) -> dict:
    """The minimum bytes and FLOPs of one one-token decode step of ``batch`` streams, each attending to ``entries``
    cache entries (its kept entries plus the new token), weights, cache and logits in ``dtype`` (module docstring).

    ``loss_read``: count one read of the logits by the loss (the eval loop's cross entropy is timed with the step).
    Returns bytes per part (``weight_bytes``, ``embed_bytes``, ``kv_read_bytes``, ``kv_write_bytes``,
    ``logits_bytes``), ``bytes``, ``matmul_flops``, ``attention_flops``, ``flops`` and ``intensity`` (FLOP/byte).
    """
    if batch < 1 or entries < 1:
        raise ValueError(f"batch and entries must be >= 1, got batch={batch}, entries={entries}")
    c = _cfg(config)
    e = torch.empty((), dtype=dtype).element_size()
    shape = shape_of(c)
    params = llama_params(c)
    per_token = kv_bytes_per_token(shape, dtype)  # 2 * L * H_kv * d_h * e
    resident = params["matmul"] + params["norms"]  # the embedding table, when untied, is read only by rows
    work = dict(batch=batch, entries=entries, dtype=str(dtype).replace("torch.", ""), element_bytes=e,
                params=params["total"], weight_bytes=resident * e, embed_bytes=batch * c.hidden_size * e,
                kv_read_bytes=batch * entries * per_token, kv_write_bytes=batch * per_token,
                logits_bytes=batch * c.vocab_size * e * (2 if loss_read else 1),
                matmul_flops=2 * batch * params["matmul"],
                attention_flops=4 * batch * shape.layers * shape.heads * shape.head_dim * entries)
    work["bytes"] = sum(work[k] for k in ("weight_bytes", "embed_bytes", "kv_read_bytes", "kv_write_bytes",
                                          "logits_bytes"))
    work["flops"] = work["matmul_flops"] + work["attention_flops"]
    work["intensity"] = work["flops"] / work["bytes"]
    return work


def _math_mode(dtype_name: str) -> str:
    if dtype_name == "float32":
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    return {"bfloat16": "bf16", "float16": "fp16"}.get(dtype_name, "fp32")


def achieved(work: dict, step_s: float, device_name: str, copy_Bps: float | None = None) -> dict:
    """What a step of ``step_s`` seconds doing ``work`` (:func:`decode_step_work`) reaches: bytes/s and FLOP/s,
    their shares of ``device_name``'s peaks (None and ``peak="unknown device"`` when it has none in
    :data:`DEVICE_PEAKS`) and of ``copy_Bps`` (a measured copy bandwidth, when given), and the roofline floor."""
    if step_s <= 0:
        raise ValueError(f"step_s must be > 0, got {step_s}")
    out = dict(step_ms=step_s * 1e3, Bps=work["bytes"] / step_s, flops_per_s=work["flops"] / step_s,
               device=device_name)
    peak = device_peak(device_name)
    if peak is None:
        out.update(peak="unknown device", bw_share=None, flop_share=None, floor_ms=None, floor_share=None, bound=None)
    else:
        mode = _math_mode(work["dtype"])
        mem_s, math_s = work["bytes"] / peak["hbm"], work["flops"] / peak[mode]
        out.update(peak=device_name, peak_Bps=peak["hbm"], peak_flops=peak[mode], math_mode=mode,
                   bw_share=out["Bps"] / peak["hbm"], flop_share=out["flops_per_s"] / peak[mode],
                   floor_ms=max(mem_s, math_s) * 1e3, bound="memory" if mem_s >= math_s else "compute")
        out["floor_share"] = out["floor_ms"] / out["step_ms"]
    if copy_Bps:
        out.update(copy_Bps=copy_Bps, copy_share=out["Bps"] / copy_Bps, copy_floor_ms=work["bytes"] / copy_Bps * 1e3)
    return out


def copy_bandwidth(device, nbytes: int = 2**30, reps: int = 20) -> float | None:
    """Measured device-to-device copy bandwidth in bytes/s (bytes read + written, median of ``reps`` copies of
    ``nbytes / 2`` bytes, after a warm-up); None off CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    x = torch.empty(nbytes // 2, dtype=torch.uint8, device=device).fill_(1)
    y = torch.empty_like(x)
    y.copy_(x)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y.copy_(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del x, y
    torch.cuda.empty_cache()
    return 2 * (nbytes // 2) / sorted(times)[len(times) // 2]
