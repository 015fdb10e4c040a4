"""SepLLM Table 10 (App. C): wall-clock time of one training iteration, Vanilla (full attention) against SepLLM(n=64).

The paper trains Pythia-160m-deduped from scratch (Sec. 4.1, 4.3: sequences of 2,048 tokens, global batch 1,024,
the Pythia recipe) and reports 2,524.45 ms per iteration for Vanilla against 1,648.11 ms for SepLLM(n=64)
(405.82 against 622.31 samples a second: 1,024 samples an iteration), a speed-up of about 1.53x. Here, on one GPU:

* the model: a random-weight Llama-style stand-in of Pythia-160m's dimensions (``--shape pythia-160m``: 12 layers,
  768 wide, 12 heads of 64, vocabulary 50,304, untied output head; a SwiGLU MLP of 2,048 whose three matrices hold
  as many weights as Pythia's 768 -> 3,072 -> 768 GELU MLP). kvlab plugs into Llama, Qwen2 and Gemma3, not GPT-NeoX;
* the data: windows of Paradise Lost's SmolLM2 token ids (package data ``kvlab/sepllm/data``), whose separators
  (the broad suffix set stored with them) place SepLLM's far keys as real text does;
* an iteration: ``--accumulate`` micro-batches of ``--batch`` sequences of ``--seq`` tokens, forward and backward under
  bfloat16 autocast (float32 weights), then one fused AdamW step, timed between two ``torch.cuda.synchronize``;
* the methods: ``vanilla`` (the model's own causal SDPA, FlashAttention on CUDA) and ``sepllm`` (SepLLM's mask in
  every layer through :class:`kvlab.sepllm.SepLLMPattern` with ``--backend`` ``triton``: kvlab's kernel with its
  backward, :mod:`kvlab.sepllm.triton`; ``flex``: FlexAttention; ``torch``: the eager reference, CPU).

``--warmup`` iterations per method first (compilation, autotuning, the allocator), not recorded; then ``--rounds``
rounds, each one iteration per method in an order that rotates from round to round. One record per (round, method)
and metric: ``iteration_ms``, ``samples_per_s`` and, on CUDA, ``iteration_peak_memory_bytes`` (the allocator's peak
during the iteration, weights and optimiser state included); example ``<shape>/<seq>/round<r>``, the config holding
every setting, the kept share of the causal entries and the device. Also ``training_speed.json`` (medians, the ratio
Vanilla / SepLLM beside the paper's 1.53). A second run into the same ``--out`` is refused.

    python -m kvlab run sepllm-training-speed --device cuda --out DIR                  # one H200, ~1 min
    python -m kvlab run sepllm-training-speed --smoke --out /tmp/x                     # CPU, seconds
"""
from __future__ import annotations

import contextlib
import json
import statistics
import time
from pathlib import Path

from kvlab.experiments import records, registry
from kvlab.experiments.registry import ParameterError
from kvlab.experiments.system import options

__all__ = ["parser", "check", "run", "METHODS", "SHAPES", "PAPER"]

NAME = "sepllm-training-speed"
METHODS = ("vanilla", "sepllm")
BACKENDS = ("triton", "flex", "torch")
RECORDS = "training_speed" + records.SUFFIX
SUMMARY = "training_speed.json"
SHAPES = {  # LlamaConfig fields; pythia-160m: Pythia-160m-deduped's dimensions (its config.json)
    "pythia-160m": dict(vocab_size=50304, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                        num_attention_heads=12, num_key_value_heads=12),
    "tiny": dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2),
}
PAPER = {"vanilla_ms": 2524.45, "sepllm_n64_ms": 1648.11, "sepllm_n128_ms": 1653.11, "speedup": 2524.45 / 1648.11,
         "model": "Pythia-160m-deduped", "seq": 2048, "global_batch": 1024, "where": "SepLLM App. C, Table 10"}


def parser():
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="pythia-160m", help="model dimensions")
    p.add_argument("--seq", type=registry.positive_int, default=2048, help="tokens per sequence (Pythia: 2,048)")
    p.add_argument("--batch", type=registry.positive_int, default=16, help="sequences per micro-batch")
    p.add_argument("--accumulate", type=registry.positive_int, default=1, help="micro-batches per iteration")
    p.add_argument("--methods", type=registry.names_list(METHODS, what="method"), default=list(METHODS))
    p.add_argument("--backend", choices=BACKENDS, default="triton", help="SepLLM's attention (torch: any device)")
    p.add_argument("--init", type=options.nonnegative_int, default=4, help="initial tokens a")
    p.add_argument("--neighbors", type=registry.positive_int, default=64, help="neighbouring tokens n (Table 10: 64)")
    p.add_argument("--rounds", type=registry.positive_int, default=20, help="paired rounds (the ledger's n)")
    p.add_argument("--warmup", type=options.nonnegative_int, default=3, help="unrecorded iterations per method")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (the values do not matter here)")
    return p


def check(args) -> None:
    options.check_device(args.device)
    if not args.lr > 0:
        raise ParameterError(f"--lr must be > 0, got {args.lr}")
    if args.smoke:  # the same code at tiny size: 2 layers, 128 tokens, the eager reference on the CPU
        args.asked = (args.shape, args.seq)
        args.shape, args.seq, args.batch, args.accumulate = "tiny", 128, 2, 1
        args.rounds, args.warmup, args.backend, args.neighbors = min(args.rounds, 2), min(args.warmup, 1), "torch", 16
    else:
        args.asked = (args.shape, args.seq)
        cuda = options.resolve_device(args.device).startswith("cuda")
        if args.backend != "torch" and not cuda:
            raise ParameterError(f"--backend {args.backend} runs on CUDA: give --device cuda, --backend torch "
                                 "(the eager reference) or --smoke")
    if args.seq <= args.neighbors:
        raise ParameterError(f"--seq {args.seq} must exceed --neighbors {args.neighbors} (else SepLLM's mask is "
                             "the causal one)")
    options.refuse_rerun(args.out, RECORDS, SUMMARY)


def _token_windows(count: int, seq: int, vocab: int):
    """``(count, seq)`` windows of Paradise Lost's token ids, one after the other (the text repeats if needed),
    and the separator ids stored with them; ids modulo ``vocab`` (a no-op at Pythia's 50,304, which holds SmolLM2's
    49,152; the tiny smoke model folds them)."""
    import numpy as np
    import torch

    from kvlab.experiments.bench.sepllm import DATA

    data = np.load(DATA / "separators_paradise_lost.npz")
    ids = data["token_ids"].astype(np.int64)
    ids = np.tile(ids, -(-count * seq // len(ids)))[: count * seq].reshape(count, seq)
    return torch.as_tensor(ids % vocab), torch.as_tensor(data["separator_ids"].astype(np.int64) % vocab).unique()


def _model(shape: str, seq: int, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvlab.core import attach

    cfg = LlamaConfig(max_position_embeddings=seq, tie_word_embeddings=False, **SHAPES[shape])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return attach(LlamaForCausalLM(cfg).to(device).train())


class _Iteration:
    """One training iteration of ``model`` on ``micro`` (a list of ``(batch, seq)`` id tensors) under a pattern."""

    def __init__(self, model, micro, device, lr: float):
        import torch

        self.model, self.micro, self.device = model, micro, device
        self.cuda = device.type == "cuda"
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1,
                                     fused=self.cuda)

    def __call__(self, pattern) -> dict:
        import torch

        from kvlab.core import use_pattern

        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        for ids in self.micro:
            amp = torch.autocast("cuda", dtype=torch.bfloat16) if self.cuda else contextlib.nullcontext()
            with amp, (use_pattern(self.model, pattern) if pattern is not None else contextlib.nullcontext()):
                loss = self.model(input_ids=ids, labels=ids, use_cache=False).loss / len(self.micro)
            loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        ms = (time.perf_counter() - t0) * 1e3
        out = {"iteration_ms": ms, "loss": float(loss.detach()) * len(self.micro)}
        if self.cuda:
            out["iteration_peak_memory_bytes"] = float(torch.cuda.max_memory_allocated(self.device))
        return out


def _patterns(args, sep_ids) -> dict:
    from kvlab.sepllm.pattern import SepLLMPattern

    made = {"vanilla": None, "sepllm": SepLLMPattern(sep_ids, init=args.init, neighbors=args.neighbors,
                                                     backend=args.backend)}
    return {m: made[m] for m in args.methods}


def _config(args, kept: float, sep_share: float, params: int, cuda: bool) -> dict:
    return {"shape": args.shape, "stands_in_for": list(args.asked), "seq": args.seq, "batch": args.batch,
            "accumulate": args.accumulate, "samples_per_iteration": args.batch * args.accumulate,
            "init": args.init, "neighbors": args.neighbors, "backend": args.backend, "kept_share": kept,
            "separator_share": sep_share, "parameters": params, "precision": "bf16 autocast, fp32 weights, fused AdamW" if cuda else "fp32, AdamW",
            "warmup": args.warmup}


def run(args) -> list[Path]:
    import torch

    from kvlab.sepllm.reference import kept_fraction

    out, device, info = options.start(args, NAME)
    model = _model(args.shape, args.seq, device)
    ids, sep_ids = _token_windows(args.batch * args.accumulate, args.seq, SHAPES[args.shape]["vocab_size"])
    micro = [m.to(device) for m in ids.split(args.batch)]
    is_sep = torch.isin(ids, sep_ids)
    kept = float(kept_fraction(is_sep, args.init, args.neighbors))
    config = _config(args, kept, float(is_sep.float().mean()), sum(p.numel() for p in model.parameters()),
                     device.type == "cuda")
    patterns = _patterns(args, sep_ids)
    step = _Iteration(model, micro, device, args.lr)
    for method, pattern in patterns.items():  # warm-up: compilation, autotuning, the allocator
        for _ in range(args.warmup):
            step(pattern)
    samples = args.batch * args.accumulate
    methods = list(patterns)
    with records.RecordWriter(RECORDS, out=out) as w:
        for r in range(args.rounds):
            order = methods[r % len(methods):] + methods[:r % len(methods)]
            for method in order:
                res = step(patterns[method])
                cfg = dict(config, position_in_round=order.index(method), loss=round(res.pop("loss"), 4))
                res["samples_per_s"] = samples / res["iteration_ms"] * 1e3
                for metric, value in res.items():
                    w.add(records.record(f"{args.asked[0]}/{args.asked[1]}/round{r:02d}", method, metric, value,
                                         config=cfg, device=info["device"]))
            print(json.dumps({"round": r, "order": order}), flush=True)
    summary = _summary(records.read(w.path), info, config)
    print(json.dumps(summary["medians"] | {"ratio_vanilla_over_sepllm": summary.get("ratio_vanilla_over_sepllm")}))
    return [w.path, options.write_json(out, SUMMARY, summary)]


def _summary(recs: list[dict], info: dict, config: dict) -> dict:
    med = {}
    for rec in recs:
        med.setdefault(f"{rec['method']}_{rec['metric']}", []).append(rec["value"])
    medians = {k: statistics.median(v) for k, v in med.items()}
    summary = {"info": info, "config": config, "paper": PAPER, "medians": medians}
    if "vanilla_iteration_ms" in medians and "sepllm_iteration_ms" in medians:
        summary["ratio_vanilla_over_sepllm"] = medians["vanilla_iteration_ms"] / medians["sepllm_iteration_ms"]
    return summary
