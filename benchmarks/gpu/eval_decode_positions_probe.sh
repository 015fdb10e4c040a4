#!/usr/bin/env bash
# Why the bounded policies replay slower than Full: the same policies with positions="original"
# (no re-rotation of kept keys each step) beside positions="cache"; static engine, bf16, 512 tokens.
export PYTHONPATH=$PWD
"${PY:-python}" - <<'PY'
import torch, kvlab
from kvlab.experiments.bench.eval import _models, _static_steady, SMOLLM2_SHAPE
dev = torch.device("cuda")
model, _ = _models(dev, torch.bfloat16)
ids = torch.randint(0, SMOLLM2_SHAPE["vocab_size"], (1, 512), device=dev)
P = kvlab.policies
seps = list(range(0, SMOLLM2_SHAPE["vocab_size"], 16))
rows = [("Full", P.Full()),
        ("StreamingLLM cache", P.StreamingLLM(4, 124)), ("StreamingLLM original", P.StreamingLLM(4, 124, positions="original")),
        ("SepLLMStreaming cache", P.SepLLMStreaming(4, 16, 64, 128, separators=seps)),
        ("SepLLMStreaming original", P.SepLLMStreaming(4, 16, 64, 128, separators=seps, positions="original")),
        ("LaCache cache", P.LaCache(128)), ("LaCache original", P.LaCache(128, positions="original"))]
for name, pol in rows:
    s, keep = _static_steady(model, pol, ids, dev)
    print(f"{name:28s} {511 / s:7.1f} tok/s  {1000 * s / 511:.2f} ms/token  keep+compact {1000 * keep:.3f} ms", flush=True)
PY
