"""SepLLM Table 2's "H" row (first layer full, n = 64): ``Variant("SepLLM(n=64,H)", "sepllm", 4, 64, full_layers=(0,))``
trained exactly like notebook 04's full-size run (``notebooks/params/04_sepllm_training.full.yaml``: 20M characters
of Shakespeare, compact vocabulary 16,384, 512 wide x 8 layers, sequences of 2,048, batch 16, 600 steps, lr 1e-3,
flex backend, seed 0, the broad separator set of that run), so its numbers sit beside
``benchmarks/results/sepllm/training_h200/run.log``'s five rows (same data, same seed). ``--anchor`` also retrains
SepLLM(n=64), to check the old row reproduces on this machine (+~100 s on an H100).

Writes ``training_h.examples.jsonl.gz`` (one record per variant and metric: final and held-out loss, FLOPs and
attention share) and ``result.json`` (what notebook 04 reads)::

    python -m kvlab run sepllm-training-h --device cuda --out benchmarks/results/sepllm/table2_h
"""
from __future__ import annotations

import time

import torch

from kvlab.experiments import records
from kvlab.experiments.registry import experiment_parser, positive_int
from kvlab.experiments.sepllm.common import device_label, open_out, resolve_device, write_summary

NAME = "sepllm-training-h"
FULL = dict(train_chars=20_000_000, vocab=16384, hidden=512, layers=8, heads=8, seq_len=2048, batch=16, steps=600,
            lr=1e-3, short=64, backend="flex", seed=0)  # notebooks/params/04_sepllm_training.full.yaml
SMOKE = dict(train_chars=20_000, vocab=512, hidden=32, layers=2, heads=2, seq_len=128, batch=2, steps=2,
             backend="mask")
METRICS = ("final_loss", "held_out", "flops_pct", "atten_pct")


def parser():
    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--steps", type=positive_int, default=FULL["steps"], help="training steps (notebook 04: 600)")
    p.add_argument("--anchor", action="store_true", help="also retrain SepLLM(n=64), the row it sits beside")
    return p


def check(args) -> None:
    args.params = dict(FULL, steps=args.steps) | (SMOKE if args.smoke else {})


def _data(p):
    import kvlab
    from kvlab.sepllm.separators import separator_ids
    from kvlab.sepllm.training import CompactVocab

    tok = kvlab.models.load_tokenizer("smollm2-135m")
    raw = tok(kvlab.datasets.load_text("shakespeare")[:p["train_chars"]], return_tensors="pt").input_ids[0]
    cv = CompactVocab(raw, p["vocab"], separator_ids(tok, match="suffix"))  # the broad set, as the full-size run
    data = cv.encode(raw)
    split = int(0.95 * data.numel())
    print(f"{raw.numel():,} tokens (the committed run: 1,968,997)", flush=True)
    return data[:split], data[split:], cv.separators.tolist()


def _train_one(v, p, cfg, train_data, held_out, sep_ids, device) -> dict:
    from kvlab.sepllm.training import Variant, evaluate_loss, step_flops, tiny_llama, train

    t = time.time()
    model = tiny_llama(cfg, seed=p["seed"]).to(device)
    r = train(model, v, train_data, sep_ids, steps=p["steps"], batch=p["batch"], seq_len=p["seq_len"], lr=p["lr"],
              seed=p["seed"], backend=p["backend"])
    held = evaluate_loss(model, held_out, pattern=v.pattern(sep_ids), layers=v.sparse_layers(p["layers"]),
                         seq_len=p["seq_len"])
    ids = train_data[: p["batch"] * p["seq_len"]].view(p["batch"], p["seq_len"])
    vanilla_step = step_flops(model, Variant("Vanilla", "vanilla"), ids, sep_ids)[0]  # independent of the ids
    return dict(final_loss=sum(r.losses[-10:]) / len(r.losses[-10:]), held_out=held,
                flops_pct=100 * r.flops[-1] / (p["steps"] * vanilla_step), atten_pct=100 * r.attention_ratio,
                seconds=time.time() - t)


def run(args):
    from kvlab.sepllm.training import TinyConfig, Variant

    out = open_out(args, NAME, ["training_h" + records.SUFFIX])
    p = args.params
    device = resolve_device(args.device)
    torch.manual_seed(p["seed"])
    train_data, held_out, sep_ids = _data(p)
    cfg = TinyConfig(vocab=p["vocab"], hidden=p["hidden"], layers=p["layers"], heads=p["heads"],
                     kv_heads=p["heads"] // 2, intermediate=3 * p["hidden"], max_positions=max(p["seq_len"], 512))
    variants = [Variant("SepLLM(n=64,H)", "sepllm", 4, p["short"], (0,))]
    if args.anchor:
        variants.append(Variant("SepLLM(n=64)", "sepllm", 4, p["short"]))
    rows = {v.name: _train_one(v, p, cfg, train_data, held_out, sep_ids, device) for v in variants}
    for name, x in rows.items():
        print(f"{name:22s} final {x['final_loss']:.3f} held-out {x['held_out']:.3f} FLOPs {x['flops_pct']:.2f} % "
              f"attention {x['atten_pct']:.2f} % ({p['steps']} steps)", flush=True)
    label = device_label(device)
    recs = [records.record("shakespeare-train", name, m, float(x[m]), config=p, device=label, seconds=x["seconds"])
            for name, x in rows.items() for m in METRICS]
    written = [records.write("training_h" + records.SUFFIX, recs, out=out)]
    written.append(write_summary(out, "result.json", dict(params=p, rows=rows, device=label)))
    return written
