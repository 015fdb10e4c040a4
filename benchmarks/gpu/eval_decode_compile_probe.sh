#!/usr/bin/env bash
# FastDecoder with and without torch.compile of the layers, bf16 and fp32, 512 tokens; compile time.
export PYTHONPATH=$PWD
"${PY:-python}" - <<'PY'
import time, torch, kvlab
from kvlab.experiments.bench.eval import _models, _static_steady, SMOLLM2_SHAPE
dev = torch.device("cuda")
ids = torch.randint(0, SMOLLM2_SHAPE["vocab_size"], (1, 512), device=dev)
P = kvlab.policies
seps = list(range(0, SMOLLM2_SHAPE["vocab_size"], 16))
for dtype in (torch.bfloat16, torch.float32):
    model, _ = _models(dev, dtype)
    for name, pol in [("Full", P.Full()), ("StreamingLLM", P.StreamingLLM(4, 124)),
                      ("SepLLMStreaming", P.SepLLMStreaming(4, 16, 64, 128, separators=seps)), ("LaCache", P.LaCache(128))]:
        for comp in (False, True):
            t0 = time.perf_counter()
            s, keep = _static_steady(model, pol, ids, dev, compile=comp)
            tot = time.perf_counter() - t0
            print(f"{dtype} {name:16s} compile={comp!s:5s} {511 / s:7.1f} tok/s {1000 * s / 511:.2f} ms/token  total {tot:.1f}s", flush=True)
PY
