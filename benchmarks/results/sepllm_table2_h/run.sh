#!/usr/bin/env bash
# Issue 14, SepLLM Table 2's "H" row (first layer full, n=64), helper "lacache_tables". No new code: the row is
# kvlab.sepllm.training.Variant("SepLLM(n=64,H)", "sepllm", 4, 64, full_layers=(0,)), trained exactly like notebook
# 04's full-size run (notebooks/params/04_sepllm_training.full.yaml: 20M characters of shakespeare, compact vocab 16384,
# 512 wide x 8 layers, seq 2048, batch 16, 600 steps, lr 1e-3, flex backend, seed 0, broad separator set as that run)
# so its numbers sit beside benchmarks/results/sepllm_training_h200/run.log's five rows (same data, same seed).
# ANCHOR=1 also retrains SepLLM(n=64) here, to check the old row reproduces on this machine (+~100 s).
# Needs the tokenizer and corpus: stage .devw/st/01-03 as for gpujobs/fidelity2.sh (setup_devw.sh).
# About 100-130 s of training on an H100 (the H200 run took 85-104 s per SepLLM variant). Writes $OUT/sepllm_table2_h/.
set -uo pipefail
OUT=${OUT:-$PWD/out}; R="$OUT/sepllm_table2_h"; mkdir -p "$R"
[ -f gpujobs/setup_devw.sh ] && source gpujobs/setup_devw.sh  # our GPU machine only: assets staged into a kvlab cache
timeout ${LIMIT:-230} python - "$R" "${ANCHOR:-0}" <<'PY' 2>&1 | tee "$R/run.log"
import json, os, sys, time
import torch
import kvlab
from kvlab.sepllm.separators import separator_ids
from kvlab.sepllm.training import CompactVocab, TinyConfig, Variant, evaluate_loss, step_flops, tiny_llama, train

out, anchor = sys.argv[1], sys.argv[2] == "1"
p = dict(train_chars=20_000_000, vocab=16384, hidden=512, layers=8, heads=8, seq_len=2048, batch=16, steps=600, lr=1e-3,
         short=64, backend="flex", seed=0)  # notebooks/params/04_sepllm_training.full.yaml
p.update(json.loads(os.environ.get("H_PARAMS", "{}")))  # only for a CPU dry run with small sizes
dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(p["seed"])
tok = kvlab.models.load_tokenizer("smollm2-135m")
raw = tok(kvlab.datasets.load_text("shakespeare")[:p["train_chars"]], return_tensors="pt").input_ids[0]
cv = CompactVocab(raw, p["vocab"], separator_ids(tok, match="suffix"))  # the broad set, as the full-size run
data = cv.encode(raw)
split = int(0.95 * data.numel())
train_data, held_out, sep_ids = data[:split], data[split:], cv.separators.tolist()
print(f"{raw.numel():,} tokens (the committed run: 1,968,997)", flush=True)
cfg = TinyConfig(vocab=p["vocab"], hidden=p["hidden"], layers=p["layers"], heads=p["heads"], kv_heads=p["heads"] // 2,
                 intermediate=3 * p["hidden"], max_positions=max(p["seq_len"], 512))
variants = [Variant("SepLLM(n=64,H)", "sepllm", 4, p["short"], (0,))]
if anchor:
    variants.append(Variant("SepLLM(n=64)", "sepllm", 4, p["short"]))
rows = {}
for v in variants:
    t = time.time()
    model = tiny_llama(cfg, seed=p["seed"]).to(dev)
    r = train(model, v, train_data, sep_ids, steps=p["steps"], batch=p["batch"], seq_len=p["seq_len"], lr=p["lr"],
              seed=p["seed"], backend=p["backend"])
    held = evaluate_loss(model, held_out, pattern=v.pattern(sep_ids), layers=v.sparse_layers(p["layers"]),
                         seq_len=p["seq_len"])
    ids = train_data[: p["batch"] * p["seq_len"]].view(p["batch"], p["seq_len"])
    vanilla_step = step_flops(model, Variant("Vanilla", "vanilla"), ids, sep_ids)[0]  # vanilla FLOPs don't depend on ids
    rows[v.name] = dict(final_loss=sum(r.losses[-10:]) / len(r.losses[-10:]), held_out=held,
                        flops_pct=100 * r.flops[-1] / (p["steps"] * vanilla_step), atten_pct=100 * r.attention_ratio,
                        seconds=time.time() - t)
    print(v.name, rows[v.name], flush=True)
print(f"{'variant':22s} {'final loss':>10s} {'held-out':>9s} {'FLOPs %':>8s} {'Atten. %':>9s}   ({p['steps']} steps)")
for name, x in rows.items():
    print(f"{name:22s} {x['final_loss']:10.3f} {x['held_out']:9.3f} {x['flops_pct']:8.2f} {x['atten_pct']:9.2f}")
print("paper (Pythia-160m, Tables 2-3): SepLLM(n=64,H) LAMBADA ppl 36.54 (n=64: 40.08, H/T: 33.41), FLOPs 72.83 %, "
      "Atten. 24.11 %")
json.dump(dict(params=p, rows=rows, device=torch.cuda.get_device_name() if dev == "cuda" else "cpu"), open(f"{out}/result.json", "w"), indent=1)
PY
