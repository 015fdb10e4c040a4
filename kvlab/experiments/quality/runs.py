"""Full-size quality runs of the SepLLM and LaCache issues on the pretrained default model.

Every job calls the same package functions as notebooks 02, 03 and 06 (``chunked_perplexity``,
``needle_in_haystack``, ``passkey``, ``gsm8k_generate``, ``decode_throughput``), only with the sizes
of the papers' tables: 64K-token streams, 16K/32K decoding lengths, 100 GSM8K problems. Jobs are tasks
of a Dask sweep (``kvlab.experiments.sweep``): worker processes, one thread each, each with its own copy of the model
(float32, like the CPU notebooks), on the CPU or on a GPU (workers holding the ``GPU`` resource); each
result is written atomically to ``OUT/<job>.json``, and a job whose result exists with the same parameters
is skipped, so a run cut short goes on where it stopped. A failed job is retried once, then listed with its
parameters; the others finish.

    python -m kvlab run quality-runs --list [--scale smoke]
    python -m kvlab run quality-runs --out DIR [--only REGEX] [--methods A,B] [--cpu-workers N] [--gpu-workers M]
                                     [--scale full|smoke] [--scheduler tcp://HOST:8786] [--records-name NAME]

``--scheduler`` sends the jobs to a running Dask cluster (``dask scheduler`` on one machine, ``dask worker
tcp://HOST:8786 --nthreads 1`` on each machine, ``--resources GPU=1`` on GPU machines) instead of local workers.

``--methods`` keeps the jobs whose records carry these methods (the names of the records and of the ledger's
``method_a`` / ``method_b``: a GSM8K method's chunk jobs, a needle method's job per length), and the records file
then holds those methods only (not the other jobs an earlier run left in the folder).

``--scale smoke`` shrinks every job (a few hundred tokens, two problems) to check the whole pipeline
in a minute (``--smoke``: the smallest job, in this process; with ``--methods``, the smallest job of each, so that a
ledger row's pair is compared on the same examples). After the sweep the jobs' per-example outcomes are
written as ``<records-name>.examples.jsonl.gz`` (:mod:`kvlab.experiments.quality.claims_examples`);
``python -m kvlab run quality-report --source DIR`` turns the results into the tables of
``benchmarks/results/fidelity/fullsize_runs.md``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

#: decoding lengths reported by every perplexity job (the papers' columns), where the run is long enough
LENGTHS = [1024, 2048, 4096, 5000, 8192, 10000, 15000, 16384, 20000, 32768, 65536]


@dataclass
class Job:
    name: str
    kind: str  # "ppl", "niah", "passkey", "gsm8k", "throughput", "mmlu", "longtask"
    args: dict = field(default_factory=dict)
    device: str = "cpu"  # "cpu" or "gpu" (a GPU worker when there is one, else a CPU worker)
    cost: float = 1.0  # rough single-thread minutes, for longest-first ordering


def lacache_protocol_jobs(task: str, length: int, depths: list[float]) -> list[Job]:
    """LaCache's retrieval protocol (Figs. 8-9): full-attention prefill, compact once, 64 sinks, S ~ L x budget,
    O = 0, LaCache and StreamingLLM at 50 % and 25 % of ``length``; ``task`` "niah" or "passkey"."""
    grid = dict(length=length, depths=depths)
    out = []
    for frac in (0.5, 0.25):
        b, pct, span = int(frac * length), int(100 * frac), round(30 * frac)
        out.append(Job(f"lacache-{task}-officialprotocol-lacache{pct}-{length}", task,
                       dict(policy=f"LaCache.official({b}, {span}, 0, sink=64)", chunk=1 << 20, **grid),
                       cost=length / 4000))
        out.append(Job(f"lacache-{task}-officialprotocol-strm{pct}-{length}", task,
                       dict(policy=f"StreamingLLM(sink=64, cache_size={b})", chunk=1 << 20, **grid),
                       cost=length / 4000))
    return out


def jobs(scale: str = "full") -> list[Job]:
    """The job list. Policies are Python expressions over ``kvlab.policies`` (``seps``: SmolLM2's separator ids)."""
    smoke = scale == "smoke"

    def tokens(n):
        return min(n, 384) if smoke else n

    out = []

    def ppl(name, policy, n, *, corpus="wikitext", chunk=16, device="cpu"):
        n = tokens(n)
        out.append(Job(name, "ppl", dict(policy=policy, corpus=corpus, tokens=n, chunk=chunk), device,
                       cost=n / (60 * (100 if chunk > 1 else 16))))

    # --- LaCache (issue 4): Table 1 to 16K, Table 2 to 32K, token-by-token confirmation -------------
    ppl("lacache-t1-full-16k", "Full()", 16384, chunk=1024)
    for b in (256, 512):
        ppl(f"lacache-t1-strm{b}-16k", f"StreamingLLM(sink=4, cache_size={b})", 16384)
        ppl(f"lacache-t1-lacache{b}-16k", f"LaCache({b})", 16384)
    ppl("lacache-t2-strm80-32k", "StreamingLLM(sink=4, cache_size=80)", 32768)
    ppl("lacache-t2-lacache80-32k", "LaCache(80)", 32768)
    ppl("lacache-tbt-strm256-4k", "StreamingLLM(sink=4, cache_size=256)", 4096, chunk=1)
    ppl("lacache-tbt-lacache256-4k", "LaCache(256)", 4096, chunk=1)
    # --- SepLLM streaming (issue 3): Table 5 (PG19 stand-in, 64K, c=800), Tables 6-8 (WikiText) ----------
    ppl("sepllm-t5-full-64k", "Full()", 65536, corpus="austen", chunk=1024, device="gpu")
    ppl("sepllm-t5-strm800-64k", "StreamingLLM(sink=4, cache_size=800)", 65536, corpus="austen", device="gpu")
    ppl("sepllm-t5-sep800-64k", "SepLLMStreaming(4, 64, 256, 800, separators=seps_broad)", 65536, corpus="austen",
        device="gpu")
    ppl("sepllm-t8-full-64k", "Full()", 65536, chunk=1024, device="gpu")
    ppl("sepllm-t8-strm324-64k", "StreamingLLM(sink=4, cache_size=324)", 65536, device="gpu")
    ppl("sepllm-t8-sep32-64k", "SepLLMStreaming(4, 32, 224, 324, separators=seps_broad)", 65536, device="gpu")
    ppl("sepllm-t6-sep64-64k", "SepLLMStreaming(4, 64, 224, 324, separators=seps_broad)", 65536, device="gpu")
    ppl("sepllm-t8-strm324-noshift-64k", "StreamingLLM(sink=4, cache_size=324, positions='original')", 65536,
        device="gpu")
    ppl("sepllm-t8-sep32-noshift-64k", "SepLLMStreaming(4, 32, 224, 324, separators=seps_broad, positions='original')",
        65536, device="gpu")
    ppl("sepllm-t6-sep48-20k", "SepLLMStreaming(4, 48, 224, 324, separators=seps_broad)", 20000)
    for w, c in ((320, 516), (512, 800)):
        ppl(f"sepllm-t7-strm{c}-20k", f"StreamingLLM(sink=4, cache_size={c})", 20000)
        ppl(f"sepllm-t7-sep{c}-20k", f"SepLLMStreaming(4, 64, {w}, {c}, separators=seps_broad)", 20000)
    ppl("sepllm-t8-strm324-noinit-20k", "StreamingLLM(sink=0, cache_size=324)", 20000)
    ppl("sepllm-t8-sep32-noinit-20k", "SepLLMStreaming(0, 32, 224, 324, separators=seps_broad)", 20000)
    ppl("sepllm-t8-strm324-noinit-noshift-20k", "StreamingLLM(sink=0, cache_size=324, positions='original')", 20000)
    ppl("sepllm-t8-sep32-noinit-noshift-20k",
        "SepLLMStreaming(0, 32, 224, 324, separators=seps_broad, positions='original')", 20000)

    # --- retrieval: LaCache Fig. 8-9 (50% / 25% budgets), SepLLM App. F (equal KV) --------------------
    lengths = [384] if smoke else [1024, 2048, 4096]
    depths = [0.5] if smoke else [0.1, 0.3, 0.5, 0.7, 0.9]
    for task in ("niah", "passkey"):
        for length in lengths:
            grid = dict(length=length, depths=depths)
            out.append(Job(f"lacache-{task}-full-{length}", task, dict(policy="Full()", **grid), cost=length / 800))
            for frac in (0.5, 0.25):
                b = int(frac * length)
                pct = int(100 * frac)
                out.append(Job(f"lacache-{task}-strm{pct}-{length}", task,
                               dict(policy=f"StreamingLLM(sink=4, cache_size={b})", **grid), cost=length / 800))
                out.append(Job(f"lacache-{task}-lacache{pct}-{length}", task,
                               dict(policy=f"LaCache({b})", **grid), cost=length / 800))
        for length in lengths:
            grid = dict(length=length, depths=depths)
            out.append(Job(f"sepllm-{task}-strm324-{length}", task,
                           dict(policy="StreamingLLM(sink=4, cache_size=324)", **grid), cost=length / 800))
            out.append(Job(f"sepllm-{task}-sep324-{length}", task,
                           dict(policy="SepLLMStreaming(4, 32, 224, 324, separators=seps_broad)", **grid),
                           cost=length / 800))

    fidelity_jobs(out, ppl, smoke)
    lacache_task_jobs(out, smoke)

    # --- GSM8K 8-shot CoT generation (issue 3, Table 1 real benchmark) -------------------------------
    problems, shard = (2, 2) if smoke else (100, 10)
    for method in ("Vanilla", "StrmLLM (n=256)", "StrmLLM (n matched)", "SepLLM (n=256)", "FixLLM (Δ=5, n=256)"):
        slug = re.sub(r"[^a-z0-9]+", "-", method.lower()).strip("-")
        for start in range(0, problems, shard):
            out.append(Job(f"sepllm-gsm8k-{slug}-{start:03d}", "gsm8k",
                           dict(method=method, start=start, count=shard, max_new_tokens=16 if smoke else 256),
                           cost=shard * 0.12))

    # --- decode throughput with long caches (issue 4, Fig. 7 in spirit): needs the GPU to mean anything ---
    for prefill in ((256,) if smoke else (4096, 16384)):
        out.append(Job(f"lacache-throughput-{prefill}", "throughput",
                       dict(prefill=prefill, budget=min(512, prefill // 2), steps=16 if smoke else 128, rounds=3),
                       device="gpu", cost=2.0))
    return out


def fidelity_jobs(out, ppl, smoke) -> None:
    """Issue 14 (SepLLM and LaCache fidelity round 2): what the papers tested, at full size."""
    # SepLLM Table 8 with the official code's positions ("insertion": new token at the cache length, cached keys
    # keep their first rotation), official-style separators (seps, 17 ids) beside the broad set (seps_broad)
    for a, n in ((4, 65536), (0, 20000)):
        tag = f"-noinit-{n // 1000}k" if a == 0 else "-64k"
        ppl(f"sepllm-t8-strm324-insertion{tag}", f"StreamingLLM(sink={a}, cache_size=324, positions='insertion')", n,
            device="gpu")
        ppl(f"sepllm-t8-sep32-insertion{tag}",
            f"SepLLMStreaming({a}, 32, 224, 324, separators=seps, positions='insertion')", n, device="gpu")
    ppl("sepllm-t8-sep32-official-64k", "SepLLMStreaming(4, 32, 224, 324, separators=seps)", 65536, device="gpu")
    # LaCache (S, O) sweep at budgets 80 (to 32K), 256 and 512 (to 16K); the official examples S=L/2 and S=16
    # with O=0, and the official accounting (cache grown by floor(R/2)) at the paper's and the public code's setting
    for b, n in ((80, 32768), (256, 16384), (512, 16384)):
        for s_, o in ((8, 0), (15, 7), (15, 0), (16, 0), (4, 2)):
            ppl(f"lacache-sweep{b}-s{s_}o{o}-{n // 1024}k", f"LaCache({b}, span={s_}, overlap={o})", n)
        for s_, o in ((8, 4), (16, 0)):
            ppl(f"lacache-sweep{b}-official-s{s_}o{o}-{n // 1024}k", f"LaCache.official({b}, {s_}, {o})", n)
    lengths = [384] if smoke else [1024, 2048, 4096]
    depths = [0.5] if smoke else [0.1, 0.3, 0.5, 0.7, 0.9]
    for task in ("niah", "passkey"):
        for length in lengths:
            out += lacache_protocol_jobs(task, length, depths)
    # SepLLM needle with the paper's basic (non-streaming) design, scaled to our context (Figs. 9-11)
    for length in lengths:
        grid = dict(length=length, depths=depths)
        for name, expr in (("n64ht", "SepLLM(4, 64, separators=seps, full_layers=(0, -1))"),
                           ("n256a32ht2", "SepLLM(32, 256, separators=seps, full_layers=(0, 1, -2, -1))"),
                           ("strm-n64ht", "SepLLM(4, 64, separators=[], full_layers=(0, -1))"),
                           ("sep324-official", "SepLLMStreaming(4, 32, 224, 324, separators=seps)")):
            out.append(Job(f"sepllm-niah-basic-{name}-{length}", "niah", dict(policy=expr, **grid), cost=length / 800))
    # MMLU 5-shot by answer-letter log-likelihood (Tables 1, 9, 17): all 57 subjects, 20 questions each
    for method in ("Vanilla", "StrmLLM (n=256)", "StrmLLM (n matched)", "SepLLM (n=256)", "SepLLM broad (n=256)",
                   "FixLLM (Δ=5, n=256)"):
        slug = re.sub(r"[^a-z0-9]+", "-", method.lower()).strip("-")
        out.append(Job(f"sepllm-mmlu-{slug}", "mmlu", dict(method=method, subjects=57, questions=2 if smoke else 20,
                                                             shots=5), device="gpu", cost=20.0))
    # Table 15: H2O vs SepLLM at equal runtime KV, GSM8K-CoT 8-shot generation (100 problems)
    problems, shard = (2, 2) if smoke else (100, 10)
    for start in range(0, problems, shard):
        for method, cost in (("H2O (KV matched)", 0.2), ("SepLLM official separators (n=256)", 0.12)):
            slug = re.sub(r"[^a-z0-9]+", "-", method.lower()).strip("-")
            out.append(Job(f"sepllm-gsm8k-{slug}-{start:03d}", "gsm8k",
                           dict(method=method, start=start, count=shard, max_new_tokens=16 if smoke else 256),
                           cost=shard * cost))


#: LaCache's long-input task tables at SmolLM2-135M's scale (issue 14): RULER kinds (Table 5; ``kvlab.eval.tasks``
#: builders; answer tokens to generate: RULER's, 128 for the needles and 30 for variable tracking, no newline stop)
#: and the LongBench stand-in's QA tasks (Tables 3/4; ``kvlab.experiments.dhsa``)
LACACHE_RULER = {"single": 128, "multikey": 128, "multivalue": 128, "multiquery": 128, "vt": 30}
LACACHE_QA = {"single-doc": 16, "multi-doc": 16}


def lacache_policies() -> dict[str, tuple[str, int]]:
    """``{slug: (policy expression over n = the prompt's tokens and sink = the protocol's sinks, chunk)}``.

    ``official-*``: LaCache's retrieval/LongBench protocol (full-attention prefill, compact once, first answer token
    from the full-attention logits, ``sink`` initial tokens, S ~ L x budget = 15 / 8 of 30 layers, O = 0, official
    accounting); ``ours-*``: the prompt streamed in chunks of 64 through the policy, 4 sinks, S=8/O=4 (L/4, S/2);
    ``-o4`` / ``-o8``: Table 6's overlap O = S/4, S/2 (rounded up) at S = 15 (O = 0 is ``official-lacache50``): on 30
    layers O = 0, 4, 8 give three different ladders (G/A = 2/1, 3/2, 4/3), where O = 7 gave O = 4's."""
    one = 1 << 20  # one chunk: the whole prompt is prefilled with full attention, then compacted once
    return {"full": ("Full()", one),
            "official-lacache50": ("LaCache.official(n // 2, 15, 0, sink=sink)", one),
            "official-strm50": ("StreamingLLM(sink=sink, cache_size=n // 2)", one),
            "official-lacache25": ("LaCache.official(n // 4, 8, 0, sink=sink)", one),
            "official-strm25": ("StreamingLLM(sink=sink, cache_size=n // 4)", one),
            "ours-lacache50": ("LaCache(n // 2)", 64),
            "ours-strm50": ("StreamingLLM(sink=4, cache_size=n // 2)", 64),
            "official-lacache50-o4": ("LaCache.official(n // 2, 15, 4, sink=sink)", one),
            "official-lacache50-o8": ("LaCache.official(n // 2, 15, 8, sink=sink)", one)}


def lacache_task_jobs(out, smoke) -> None:
    """LaCache Table 5 (RULER), Tables 3/4 (LongBench stand-in: SQuAD article / HotpotQA paragraphs padded with
    distractor paragraphs) and Table 6 (overlap), 2K and 4K-token inputs; every policy sees the same examples."""
    lengths, per_ruler, per_qa = ([512], 1, 1) if smoke else ([2048, 4096], 6, 8)
    grids = [("ruler", kind, per_ruler, 64, new) for kind, new in LACACHE_RULER.items()]
    grids += [("longqa", kind, per_qa, 128, new) for kind, new in LACACHE_QA.items()]  # LongBench keeps 128 tokens
    for table, kind, examples, sink, new_tokens in grids:
        sink = min(sink, 32) if smoke else sink  # 128 sinks would fill a 25% budget of a 512-token smoke input
        for length in lengths:
            for slug, (expr, chunk) in lacache_policies().items():
                out.append(Job(f"lacache-{table}-{kind}-{slug}-{length}", "longtask",
                               dict(task=f"{table}-{kind}", length=length, examples=examples, policy=expr, sink=sink,
                                    chunk=chunk, max_new_tokens=new_tokens), device="gpu",
                               cost=examples * length / (4000 if chunk > 64 else 800)))


# ----------------------------------------------------------------------------------------------------
# worker side

_STATE: dict = {}


def _ensure_state(device: str, dtype: str = "float32") -> None:
    """Load the model once per worker process (Dask keeps the process, so later jobs reuse it)."""
    if _STATE.get("device") == device:
        return
    import torch

    torch.set_num_threads(1)
    import kvlab
    from kvlab.sepllm.separators import separator_ids

    model, tokenizer = kvlab.load_model("smollm2-135m", device=device, dtype=dtype)
    # seps: the official-style set (17 ids, the default since issue 14); seps_broad: the 415 ids of the earlier runs
    _STATE.update(model=model, tokenizer=tokenizer, seps=separator_ids(tokenizer),
                  seps_broad=separator_ids(tokenizer, match="suffix"), device=device, texts={})


def _policy(expr: str, **values):
    from kvlab import policies
    from kvlab.baselines.h2o import H2O
    from kvlab.lacache.policy import LaCache
    from kvlab.sepllm.policy import FixLLM, SepLLM, SepLLMStreaming

    names = {"Full": policies.Full, "StreamingLLM": policies.StreamingLLM, "LaCache": LaCache, "H2O": H2O,
             "SepLLM": SepLLM, "SepLLMStreaming": SepLLMStreaming, "FixLLM": FixLLM, "seps": _STATE["seps"],
             "seps_broad": _STATE["seps_broad"], **values}  # values: e.g. n, the prompt's tokens
    return eval(expr, {"__builtins__": {}}, names)  # expressions come from jobs() above, not from users


def _ids(corpus: str, tokens: int):
    key = (corpus, tokens)
    if key not in _STATE["texts"]:
        from kvlab.datasets import load_text

        # the notebooks' recipe: about 4 characters a token, cut to the first `tokens` ids
        text = load_text(corpus)[: 8 * tokens]
        _STATE["texts"][key] = _STATE["tokenizer"](text, return_tensors="pt").input_ids[:, :tokens]
    ids = _STATE["texts"][key]
    if ids.shape[1] < tokens:
        raise ValueError(f"corpus {corpus!r} has only {ids.shape[1]} tokens in its first {8 * tokens} characters")
    return ids


def _run_ppl(args):
    from kvlab.eval import chunked_perplexity, ppl_at_lengths

    policy = _policy(args["policy"])
    r = chunked_perplexity(_STATE["model"], _STATE["tokenizer"], _ids(args["corpus"], args["tokens"]), policy,
                           max_tokens=None, chunk_size=args["chunk"])
    kv = r.kv_trace_per_layer.float()
    used = dict(policy_used=repr(policy))  # after the run: LaCache's repr shows the span/overlap it used
    if hasattr(policy, "settings"):
        used["settings"] = policy.settings(_STATE["model"].config.num_hidden_layers)
    at = ppl_at_lengths(r, LENGTHS + [args["tokens"]])
    return dict(ppl=r.ppl, ppl_at={str(n): p for n, p in at.items()}, mean_kv=float(kv.mean()),
                max_kv=int(kv.max()), seconds=r.seconds, nll=[round(float(x), 4) for x in r.nll], **used)


def _run_retrieval(task, args):
    from kvlab.eval import needle_in_haystack, passkey

    fn = needle_in_haystack if task == "niah" else passkey
    policy = _policy(args["policy"])
    r = fn(_STATE["model"], _STATE["tokenizer"], policy, lengths=[args["length"]], depths=args["depths"],
           chunk_size=args.get("chunk", 64), progress=False)
    return dict(accuracy=r.accuracy[0].tolist(), answer_nll=r.answer_nll[0].tolist(), answers=r.answers,
                policy_used=repr(policy))


def _long_tasks(task: str, length: int, examples: int) -> list[tuple]:
    """``(prompt, reference answer, answers scored, score(said))`` of ``examples`` inputs of about ``length``
    tokens, seeds 0.."""
    key = ("long", task, length, examples)  # a worker builds each set once for all the policies it runs
    if key not in _STATE["texts"]:
        tok = _STATE["tokenizer"]
        table, kind = task.split("-", 1)
        if table == "ruler":  # RULER's generators as REFORM's tables build and score them (string_match_all)
            from kvlab.eval.tasks import task_score
            from kvlab.eval.tasks import ruler_task

            tasks = [ruler_task(tok, length, kind, seed=s) for s in range(examples)]
            _STATE["texts"][key] = [(t.prompt, t.answer, t.info["answers"], lambda said, t=t: task_score(said, t))
                                    for t in tasks]
        else:
            from kvlab.eval.qa import qa_f1, qa_items

            _STATE["texts"][key] = [(it.prompt, " " + it.answers[0], it.answers,
                                     lambda said, a=it.answers: qa_f1(said, a))
                                    for it in qa_items(tok, kind, examples, length, seed=0)]
    return _STATE["texts"][key]


def _run_longtask(args):
    """LaCache Tables 3-6: greedy answer (RULER ``string_match_all`` / QA token F1) and teacher-forced answer NLL."""
    from kvlab.eval import ask

    tok, rows, policy = _STATE["tokenizer"], [], None
    for prompt, answer, answers, score in _long_tasks(args["task"], args["length"], args["examples"]):
        n = tok(prompt, return_tensors="pt").input_ids.shape[1]
        policy = _policy(args["policy"], n=n, sink=args["sink"])
        said, nll = ask(_STATE["model"], tok, prompt, answer, policy, chunk_size=args["chunk"],
                        max_new_tokens=args["max_new_tokens"])
        rows.append(dict(tokens=n, score=score(said), answer_nll=nll, said=said, answers=answers))
    used = dict(policy_used=repr(policy))
    if hasattr(policy, "settings"):
        used["settings"] = policy.settings(_STATE["model"].config.num_hidden_layers)
    mean = {key: sum(r[key] for r in rows) / len(rows) for key in ("score", "answer_nll")}
    return dict(**mean, examples=rows, **used)


def _gsm8k_method(method, tokenizer, exemplars, sample_ids):
    from kvlab.policies import Full, StreamingLLM
    from kvlab.sepllm.policy import FixLLM, SepLLM
    from kvlab.sepllm.pattern import FixLLMPattern, SepLLMPattern, StreamingPattern, match_neighbors

    seps, a, n = _STATE["seps_broad"], 3, 256  # the earlier runs' set; issue 14's jobs name theirs
    if method == "Vanilla":
        return None, Full(), None
    if method == "StrmLLM (n=256)":
        return StreamingPattern(a, n), StreamingLLM(sink=a, window=n - 1, positions="original"), n
    if method == "StrmLLM (n matched)":  # window matched to SepLLM's r.KV on a GSM8K prompt, as notebook 02 does
        m = match_neighbors(lambda k: StreamingPattern(a, k), SepLLMPattern(seps, a, n).kept_fraction(sample_ids),
                            sample_ids)
        return StreamingPattern(a, m), StreamingLLM(sink=a, window=m - 1, positions="original"), m
    if method == "SepLLM (n=256)":
        return SepLLMPattern(seps, a, n), SepLLM(a, n, separators=seps), n
    if method == "FixLLM (Δ=5, n=256)":
        return FixLLMPattern(a, n, 5), FixLLM(a, n, 5), n
    if method == "SepLLM official separators (n=256)":
        return SepLLMPattern(_STATE["seps"], a, n), SepLLM(a, n, separators=_STATE["seps"]), n
    if method == "H2O (KV matched)":  # Table 15: H2O's budget = the entries SepLLM keeps on average on a prompt
        from kvlab.baselines.h2o import H2O

        budget = round(SepLLMPattern(_STATE["seps"], a, n).kept_fraction(sample_ids) * sample_ids.shape[1])
        return None, H2O(budget, recent=budget // 2), budget
    raise ValueError(f"unknown GSM8K method {method!r}")


def _run_mmlu(args):
    from kvlab.experiments.sepllm.mmlu import mmlu_accuracy, mmlu_prompts
    from kvlab.sepllm.pattern import FixLLMPattern, SepLLMPattern, StreamingPattern, match_neighbors

    tok, a, n = _STATE["tokenizer"], 3, 256
    prompts = mmlu_prompts(args["subjects"], args["questions"], args["shots"])
    sample = tok(prompts[0].text, return_tensors="pt").input_ids
    sep = SepLLMPattern(_STATE["seps"], a, n)
    patterns = {"Vanilla": lambda: None, "StrmLLM (n=256)": lambda: StreamingPattern(a, n),
                "StrmLLM (n matched)": lambda: StreamingPattern(a, match_neighbors(
                    lambda k: StreamingPattern(a, k), sep.kept_fraction(sample), sample)),
                "SepLLM (n=256)": lambda: sep, "SepLLM broad (n=256)": lambda: SepLLMPattern(_STATE["seps_broad"], a, n),
                "FixLLM (Δ=5, n=256)": lambda: FixLLMPattern(a, n, 5)}
    pattern = patterns[args["method"]]()
    acc, kv, preds = mmlu_accuracy(_STATE["model"], tok, prompts, pattern)
    return dict(accuracy=acc, r_kv=kv, predictions=preds, gold=[p.gold for p in prompts],
                subjects=[p.subject for p in prompts], neighbors=getattr(pattern, "neighbors", None))


def _run_gsm8k(args):
    from kvlab.eval.gsm8k import cot_prompt, gsm8k_generate, load_gsm8k, reference_solution

    tok = _STATE["tokenizer"]
    problems, exemplars = load_gsm8k(args["count"], start=args["start"])
    exemplars = exemplars[:8]
    first, _ = load_gsm8k(1)
    sample = tok(cot_prompt(first[0]["question"], exemplars) + reference_solution(first[0]["answer"]),
                 return_tensors="pt").input_ids
    pattern, policy, n = _gsm8k_method(args["method"], tok, exemplars, sample)
    r = gsm8k_generate(_STATE["model"], tok, problems, exemplars, pattern=pattern, policy=policy,
                       max_new_tokens=args["max_new_tokens"], name=args["method"], progress=False)
    return dict(neighbors=n, flexible=r.flexible, strict=r.strict, kv_ratio=r.kv_ratio, generations=r.generations,
                answers=[p["answer"].split("####")[-1].strip() for p in problems])


def _run_throughput(args):
    from kvlab.lacache import decode_throughput

    b = args["budget"]
    policies = {"Full": "Full()", "StreamingLLM": f"StreamingLLM(sink=4, cache_size={b})", "LaCache": f"LaCache({b})",
                "H2O": f"H2O({b}, recent={b // 2})"}
    ids = _ids("wikitext", args["prefill"] + args["steps"])
    rounds = {name: [] for name in policies}
    for _ in range(args["rounds"]):  # round robin: every policy sees the same machine state
        for name, expr in policies.items():
            rounds[name].append(decode_throughput(_STATE["model"], ids, _policy(expr), prefill=args["prefill"],
                                                  steps=args["steps"]))
    import torch

    device = torch.cuda.get_device_name() if _STATE["device"] == "cuda" else "cpu (1 thread)"
    return dict(tokens_per_s=rounds, device=device, attn=_STATE["model"].config._attn_implementation)


def run_job(kind: str, args: dict, device: str = "cpu") -> dict:
    """One job in a Dask worker (the target of every task of the sweep); kvlab.experiments.sweep writes the record."""
    import torch

    _ensure_state("cuda" if device == "gpu" and torch.cuda.is_available() else "cpu")
    runners = {"ppl": _run_ppl, "gsm8k": _run_gsm8k, "throughput": _run_throughput,
               "niah": lambda a: _run_retrieval("niah", a), "passkey": lambda a: _run_retrieval("passkey", a),
               "mmlu": _run_mmlu, "longtask": _run_longtask}
    if kind not in runners:
        raise ValueError(f"unknown job kind {kind!r}; known: {sorted(runners)}")
    result = runners[kind](args)
    result["worker"] = _STATE["device"]
    result["torch"] = torch.__version__
    return result


# ----------------------------------------------------------------------------------------------------
# parent side

NAME = "quality-runs"
RECORD_NAMES = ("fullsize_runs", "fidelity_gpu_h100", "fidelity_gpu_h100_sweep", "fidelity_cpu")


def _method(job: Job) -> str:
    from kvlab.experiments.quality.claims_examples import job_method

    return job_method(job.name, job.kind, job.args)


def methods() -> list[str]:
    """Every method of the full-size jobs' records (the choices of ``--methods``), in job order."""
    return list(dict.fromkeys(_method(j) for j in jobs()))


def _selected(args) -> list[Job]:
    todo = [j for j in jobs(args.scale) if (not args.only or re.search(args.only, j.name))
            and (not args.methods or _method(j) in args.methods)]
    return sorted(todo, key=lambda j: -j.cost)


def _smoke_jobs(selected: list[Job], args) -> list[Job]:
    """``--smoke``: the cheapest job, or the cheapest of each of ``--methods`` (a ledger row's pair)."""
    cheapest: dict[str, Job] = {}
    for j in sorted(selected, key=lambda j: j.cost):
        cheapest.setdefault(_method(j) if args.methods else "", j)
    return list(cheapest.values())


def parser():
    from kvlab.experiments.registry import experiment_parser, names_list, positive_int
    from kvlab.experiments.sepllm.common import nonnegative_int

    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--list", action="store_true", help="print the jobs and stop")
    p.add_argument("--only", default="", help="regular expression on job names (it must match at least one)")
    p.add_argument("--methods", type=names_list(methods(), what="method"), default=None,
                   help="only the jobs whose records carry these methods (comma-separated record method names, "
                        "e.g. sepllm-gsm8k-sepllm-n-256,sepllm-gsm8k-strmllm-n-256)")
    p.add_argument("--scale", choices=["full", "smoke"], default="full")
    p.add_argument("--cpu-workers", type=positive_int, default=max((os.cpu_count() or 2) - 1, 1))
    p.add_argument("--gpu-workers", type=nonnegative_int, default=4)
    p.add_argument("--scheduler", default=None, help="address of a running Dask scheduler (default: local workers)")
    p.add_argument("--records-name", choices=RECORD_NAMES, default="fullsize_runs",
                   help="basename of the records file (the ledger's results_file)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def check(args) -> None:
    from kvlab.experiments.registry import ParameterError

    if args.smoke:
        args.scale = "smoke"
    try:
        re.compile(args.only)
    except re.error as e:
        raise ParameterError(f"--only {args.only!r} is not a regular expression ({e})") from None
    args.jobs = _selected(args)
    missing = sorted(set(args.methods or []) - {_method(j) for j in args.jobs})
    if missing:
        raise ParameterError(f"--methods {','.join(missing)}: no job of --only {args.only!r} at --scale {args.scale} "
                             "carries them; --list shows the jobs")
    if args.smoke:
        args.jobs = _smoke_jobs(args.jobs, args)
    if not args.jobs:
        raise ParameterError(f"--only {args.only!r} matches no job; --list shows the job names")


def _records(out, name: str, methods: list[str] | None = None) -> Path:
    """``<name>.examples.jsonl.gz``: the records of every job result in the folder (a resumed or earlier run's
    too); with ``--methods``, of those methods only."""
    from kvlab.experiments import records
    from kvlab.experiments.quality.claims_examples import convert_jobs
    from kvlab.experiments.quality.report import load

    recs = [r for r in convert_jobs(load(out.root)) if not methods or r["method"] in methods]
    return records.write(name + records.SUFFIX, recs, out=out)


def run(args) -> list:
    """Submit the unfinished jobs to a Dask cluster (kvlab.experiments.sweep): local workers, or --scheduler
    ADDRESS; ``--smoke`` runs its job(s) in this process. A job whose result is there is skipped (resume)."""
    if args.list:
        for j in args.jobs:
            print(f"{j.cost:7.1f} min  {j.device:3s}  {j.name:42s} {j.args}")
        return []
    import torch

    from kvlab.experiments.sweep import Task, open_results, run_sweep, visible_gpus

    tasks = [Task(j.name, "kvlab.experiments.quality.runs:run_job", dict(kind=j.kind, args=j.args, device=j.device),
                  j.device, j.cost) for j in args.jobs]
    if args.smoke:
        from kvlab.experiments.sweep import call_task

        open_results(tasks, args.out)
        for task in tasks:  # the cheapest job, or one per --methods
            call_task(task, str(args.out), [str(ROOT)])
    else:
        gpu_workers = args.gpu_workers if (torch.cuda.is_available() or args.scheduler) else 0
        print(f"{len(tasks)} jobs ({sum(t.cost for t in tasks):.0f} single-thread minutes, rough); "
              f"{args.scheduler or f'{args.cpu_workers} CPU workers, {gpu_workers} GPU workers'}", flush=True)
        # several model copies share a GPU here (--gpu-workers 8 on one H100): spread them over the visible GPUs
        per_gpu = -(-gpu_workers // max(1, len(visible_gpus()))) if gpu_workers and not args.scheduler else 1
        report = run_sweep(tasks, args.out, scheduler=args.scheduler, workers=args.cpu_workers,
                           gpu_workers=gpu_workers, workers_per_gpu=per_gpu, python_path=[str(ROOT)],
                           progress=not args.quiet)
        print(report.summary(), flush=True)
        if report.failed:
            raise RuntimeError(f"{len(report.failed)} jobs failed: {report.summary()}")
    return [_records(open_results(tasks, args.out), args.records_name, args.methods)]
