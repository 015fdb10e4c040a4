"""Retrieval under a KV policy: passkey retrieval and needle-in-a-haystack grids.

A long prompt is streamed through the policy in chunks of ``chunk_size`` tokens (the policy compacts
the cache after every chunk, so at most ``budget + chunk_size`` entries are ever attended), then the
model answers greedily. Two numbers per cell:

* ``accuracy`` — the real benchmark: passkey found in the answer (1/0), or, for the needle, the share
  of the needle's content words the answer contains (the original NIAH test grades with GPT-4; word
  recall is our deterministic stand-in);
* ``answer_nll`` — a proxy that still separates policies when a small model rarely answers right: the
  teacher-forced mean NLL (nats/token) of the reference answer after the streamed prompt.

Answers are generated as RULER generates them (Hsieh et al. 2024, ``pred/call_api.py``): greedy, a fixed number of
tokens per task (RULER: 128 for the needles, 30 for variable tracking), stopping only at the end-of-text token, never
at a newline: a small model often starts with ``":\n"`` and names the value on the next line.
:func:`greedy_answer` is that loop, shared by every retrieval harness of kvlab (REFORM's and LaCache's tables too);
:func:`string_match_all` / :func:`string_match_part` are RULER's scores.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import torch

from kvlab.core import KVCache, Policy

__all__ = ["RetrievalResult", "needle_in_haystack", "passkey", "ask", "greedy_answer", "string_match_all",
           "string_match_part", "RULER_TOKENS"]

#: RULER's ``tokens_to_generate`` (``data/synthetic/constants.py``): the needles (``niah``) and variable tracking.
RULER_TOKENS = {"niah": 128, "vt": 30}

_STOPWORDS = {"the", "and", "with", "that", "this", "for", "on", "in", "a", "to", "is", "of", "do", "thing",
              "best", "sit", "day", "eat"}


@dataclass
class RetrievalResult:
    """Grids over ``lengths`` (rows) x ``depths`` (columns)."""

    task: str
    policy: str
    lengths: list[int]
    depths: list[float]
    accuracy: torch.Tensor
    answer_nll: torch.Tensor
    answers: list[list[str]] = field(default_factory=list)

    @property
    def mean_accuracy(self) -> float:
        return float(self.accuracy.mean())

    def __repr__(self) -> str:
        return (f"RetrievalResult({self.task}, {self.policy}: accuracy={self.mean_accuracy:.3f}, "
                f"answer_nll={float(self.answer_nll.mean()):.3f})")


def _stream(model, ids: torch.Tensor, cache: KVCache, chunk_size: int) -> torch.Tensor:
    logits = None
    for start in range(0, ids.shape[1], chunk_size):
        logits = model(input_ids=ids[:, start:start + chunk_size], past_key_values=cache, use_cache=True).logits
    return logits[:, -1]


@torch.no_grad()
def ask(model, tokenizer, prompt: str, answer: str, policy: Policy, *, chunk_size: int = 64,
        max_new_tokens: int = 16) -> tuple[str, float]:
    """Stream ``prompt`` through ``policy``; return (greedy continuation, teacher-forced NLL of ``answer``)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    device = next(model.parameters()).device
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
    target = tokenizer(answer, add_special_tokens=False, return_tensors="pt").input_ids.to(device)
    cache = KVCache(model, policy)
    last = _stream(model, ids, cache, chunk_size)
    forked = copy.deepcopy(cache)
    # teacher-forced answer: first answer token from the prompt's last logits, the rest from one chunk
    logp = torch.log_softmax(last.float(), dim=-1)[0, target[0, 0]]
    total = -float(logp)
    if target.shape[1] > 1:
        out = model(input_ids=target[:, :-1], past_key_values=forked, use_cache=True).logits[0].float()
        total += float(torch.nn.functional.cross_entropy(out, target[0, 1:], reduction="sum"))
    nll = total / target.shape[1]
    said = greedy_answer(tokenizer, last,
                         lambda t: model(input_ids=t, past_key_values=cache, use_cache=True).logits[:, -1],
                         max_new_tokens)
    return said, nll


@torch.no_grad()
def greedy_answer(tokenizer, logits: torch.Tensor, step, max_new_tokens: int) -> str:
    """Greedy generation as RULER does it: ``max_new_tokens`` tokens, stopping only at the end-of-text token.

    logits ``(1, vocab)``: the last position's logits after the prompt; ``step(token (1, 1)) -> (1, vocab)``
    feeds one token and returns the next logits (through whatever cache the caller holds). No stop at a
    newline: an answer that starts with ``":\n"`` goes on to the value, and the score looks for the
    reference anywhere in the text (:func:`string_match_all`)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1 (tokens generated per answer), got {max_new_tokens}")
    generated = []
    token = logits.argmax(dim=-1, keepdim=True)
    eos = getattr(tokenizer, "eos_token_id", None)
    for i in range(max_new_tokens):
        if eos is not None and int(token) == eos:
            break
        generated.append(int(token))
        if i + 1 < max_new_tokens:
            token = step(token).argmax(dim=-1, keepdim=True)
    return tokenizer.decode(generated, skip_special_tokens=True)


def string_match_all(text: str, references) -> float:
    """RULER's ``string_match_all``: the fraction of ``references`` found in ``text`` (case aside)."""
    references = list(references)
    if not references:
        raise ValueError("references must hold at least one reference answer")
    low = text.lower()
    return sum(r.lower() in low for r in references) / len(references)


def string_match_part(text: str, references) -> float:
    """RULER's ``string_match_part``: 1 when any of ``references`` is in ``text`` (case aside), else 0."""
    references = list(references)
    if not references:
        raise ValueError("references must hold at least one reference answer")
    low = text.lower()
    return float(any(r.lower() in low for r in references))


def needle_score(answer: str, needle: str) -> float:
    words = {w for w in re.findall(r"[a-z]+", needle.lower()) if w not in _STOPWORDS and len(w) > 2}
    found = set(re.findall(r"[a-z]+", answer.lower()))
    return len(words & found) / max(len(words), 1)


def _grid(task, model, tokenizer, policy, lengths, depths, make, score, chunk_size, max_new_tokens, progress):
    from tqdm.auto import tqdm

    acc = torch.zeros(len(lengths), len(depths))
    nll = torch.zeros(len(lengths), len(depths))
    answers = [["" for _ in depths] for _ in lengths]
    cells = [(i, j) for i in range(len(lengths)) for j in range(len(depths))]
    for i, j in tqdm(cells, desc=f"{task} {type(policy).__name__}", disable=not progress):
        prompt, answer = make(lengths[i], depths[j])
        said, answer_nll = ask(model, tokenizer, prompt, answer, policy, chunk_size=chunk_size,
                               max_new_tokens=max_new_tokens)
        acc[i, j], nll[i, j], answers[i][j] = score(said, answer), answer_nll, said
    return RetrievalResult(task, repr(policy), list(lengths), list(depths), acc, nll, answers)


def _check_grid(lengths, depths):
    if not lengths or not depths:
        raise ValueError("lengths and depths must be non-empty lists")
    for d in depths:
        if not 0.0 <= d <= 1.0:
            raise ValueError(f"depths are fractions of the context in [0, 1], got {d}")
    for n in lengths:
        if n < 32:
            raise ValueError(f"context lengths must be >= 32 tokens, got {n}")


def passkey(model, tokenizer, policy: Policy, lengths=(1024, 2048), depths=(0.0, 0.5, 1.0), *, seed: int = 0,
            chunk_size: int = 64, progress: bool = True) -> RetrievalResult:
    """Passkey retrieval (Mohtashami & Jaggi 2023; StreamingLLM, LaCache Fig. 9): a 5-digit key hidden at
    ``depth`` inside ``length`` tokens of repeated filler; accuracy = key found in the greedy answer."""
    from kvlab import datasets

    _check_grid(lengths, depths)

    def make(length, depth):
        p = datasets.passkey_prompt(tokenizer, length, depth, seed=seed + length + int(depth * 1000))
        return p.prompt, p.answer

    return _grid("passkey", model, tokenizer, policy, lengths, depths, make,
                 lambda said, answer: string_match_all(said, [answer.strip()]), chunk_size, 8, progress)


def needle_in_haystack(model, tokenizer, policy: Policy, lengths=(1024, 2048), depths=(0.0, 0.5, 1.0), *,
                       haystack: str | None = None, chunk_size: int = 64, progress: bool = True) -> RetrievalResult:
    """Needle-in-a-haystack (Kamradt 2023; SepLLM App. F, LaCache Fig. 8): the San Francisco needle at
    ``depth`` of a ``length``-token Paul Graham haystack; accuracy = needle word recall of the answer."""
    from kvlab import datasets

    _check_grid(lengths, depths)
    text = haystack if haystack is not None else datasets.load_text("paul-graham")

    def make(length, depth):
        p = datasets.niah_prompt(tokenizer, text, length, depth)
        return p.prompt, p.answer

    return _grid("needle", model, tokenizer, policy, lengths, depths, make,
                 lambda said, answer: needle_score(said, answer), chunk_size, 32, progress)
