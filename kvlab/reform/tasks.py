"""Long-input tasks with token-level evidence labels, as REFORM builds them (App. C.2).

* :func:`kv_task` — synthetic key-value retrieval: ``The value corresponding to the id {key} is {value}.``
  lines scattered in WikiText (App. C.1, "pattern matching"); the evidence is the asked line. Built on
  :func:`kvlab.datasets.kv_retrieval_prompt` (its keys and values are UUIDs where the paper draws random
  10-character ASCII strings; reading: kvlab's generator stands in, as the task is the same).
* :func:`multihop_task` — multi-hop QA: the ten paragraphs of a HotpotQA (distractor) record put at random
  sentence boundaries of WikiText, the question at the end; the evidence is every token of the golden
  paragraphs (those named by ``supporting_facts``). reading: the paper says "documents from the HotPotQA
  dataset at random positions": we embed all ten (2 golden, 8 distractors), which makes the distractors
  compete as they do in HotpotQA.

Each task is split the way REFORM consumes it: ``context`` (the long part), ``query`` (the question: its
tokens drive the similarity search), ``answer_prefix`` (what the answer continues, left out of the search,
App. C.6) and ``answer`` (the reference continuation, leading space). ``context + query + answer_prefix``
is the whole prompt a baseline reads.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from kvlab.datasets import kv_retrieval_prompt, load_records, load_text, split_sentences

__all__ = ["LongTask", "kv_task", "multihop_task", "filler_text", "gold_token_mask"]


@dataclass
class LongTask:
    """One long-input example. ``gold_chars``: character spans of the evidence inside ``context``."""

    kind: str
    context: str
    query: str
    answer_prefix: str
    answer: str
    gold_chars: list[tuple[int, int]]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt(self) -> str:
        return self.context + self.query + self.answer_prefix

    def gold_tokens(self, tokenizer) -> torch.Tensor:
        """``(n_context_tokens,)`` bool: the context tokens that overlap the evidence."""
        return gold_token_mask(tokenizer, self.context, self.gold_chars)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "context": self.context, "query": self.query, "answer_prefix": self.answer_prefix,
                "answer": self.answer, "gold_chars": [list(g) for g in self.gold_chars], "info": self.info}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LongTask":
        return cls(d["kind"], d["context"], d["query"], d["answer_prefix"], d["answer"],
                   [tuple(g) for g in d["gold_chars"]], d.get("info", {}))


def gold_token_mask(tokenizer, text: str, spans: list[tuple[int, int]]) -> torch.Tensor:
    """Tokens of ``tokenizer(text)`` (special tokens included, as REFORM tokenises a context) whose
    characters overlap one of ``spans``; special tokens have empty offsets and are never gold."""
    enc = tokenizer(text, return_offsets_mapping=True)
    mask = torch.zeros(len(enc["input_ids"]), dtype=torch.bool)
    for i, (a, b) in enumerate(enc["offset_mapping"]):
        if b > a and any(a < e and b > s for s, e in spans):
            mask[i] = True
    return mask


_FILLER: dict[str, str] = {}


def filler_text(corpus: str = "wikitext") -> str:
    """A corpus of :mod:`kvlab.datasets` as one string (cached): the haystack of the tasks."""
    if corpus not in _FILLER:
        _FILLER[corpus] = load_text(corpus)
    return _FILLER[corpus]


def _filler_slice(tokenizer, filler: str, n_tokens: int, rng: random.Random) -> list[str]:
    """Sentences of a random stretch of ``filler`` holding about ``n_tokens`` tokens."""
    span = max(64, 6 * n_tokens)  # English runs 4-5 characters a token: a generous stretch
    start = rng.randrange(0, max(1, len(filler) - span))
    sentences = [s.replace("\n", " ").strip() for s in split_sentences(filler[start:start + span])[1:]]
    sentences = [s for s in sentences if s]
    out, total = [], 0
    while total < n_tokens and sentences:
        s = sentences.pop(0)
        out.append(s)
        total += len(tokenizer(" " + s, add_special_tokens=False)["input_ids"])
    return out


def kv_task(tokenizer, n_tokens: int | None, *, n_pairs: int | None = None, seed: int = 0,
            depth: float | None = None, filler: str | None = "wikitext", text: str | None = None,
            n_filler: int | None = None) -> LongTask:
    """Synthetic key-value retrieval of about ``n_tokens`` tokens (prompt and answer prefix included).

    ``filler``: a corpus id of :mod:`kvlab.datasets` (a random stretch of it per ``seed``), ``None`` for the
    passkey filler sentences; ``text`` gives the filler text itself instead. ``n_filler``: the number of
    filler sentences, given directly (no fitting to ``n_tokens``: fast for inputs of a million tokens).
    ``depth``: where the asked pair sits (fraction of the filler before it). ``n_pairs``: lines hidden
    (default ``n_tokens // 256`` between 1 and 16: a UUID line costs about 70 tokens, so 16 of them fill
    8k-token inputs, the paper's head-selection length, to 15%).
    """
    if n_pairs is None:
        n_pairs = max(1, min(16, (n_tokens or 4096) // 256))
    rng = random.Random(seed)
    if text is None and filler is not None:
        size = n_tokens if n_tokens is not None else 30 * n_filler
        text = " ".join(_filler_slice(tokenizer, filler_text(filler), size + 64, rng))
    if n_filler is not None:
        p = kv_retrieval_prompt(n_pairs=n_pairs, depth=depth, filler=text, seed=seed, n_filler=n_filler)
    else:
        p = kv_retrieval_prompt(tokenizer, n_tokens, n_pairs=n_pairs, depth=depth, filler=text, seed=seed)
    key, value = p.info["key"], p.info["value"]
    cut = p.prompt.rindex("\n\nWhat is the value")
    context = p.prompt[:cut]
    query = f"\n\nWhat is the value corresponding to the id {key}?"
    prefix = f" The value corresponding to the id {key} is"
    if context + query + prefix != p.prompt:
        raise RuntimeError("kvlab.datasets.kv_retrieval_prompt changed its layout; update kvlab.reform.tasks.kv_task")
    line = f"The value corresponding to the id {key} is {value}."
    at = context.index(line)
    return LongTask("kv", context, query, prefix, p.answer, [(at, at + len(line))],
                    {"key": key, "value": value, "depth": p.depth, "n_pairs": n_pairs, "seed": seed})


def multihop_task(tokenizer, n_tokens: int, *, record: dict | None = None, index: int | None = None, seed: int = 0,
                  filler: str = "wikitext") -> LongTask:
    """HotpotQA paragraphs hidden in ``filler`` text, about ``n_tokens`` tokens in all (App. C.2).

    ``record``: a HotpotQA record (``load_records("hotpotqa")``), or ``index`` into that set (default: drawn
    from ``seed``). Layout: an instruction, filler sentences with the ten ``Title: text`` paragraphs at
    random sentence boundaries, then ``\\n\\nQuestion: ...`` and ``\\nAnswer:``.
    """
    rng = random.Random(seed)
    if record is None:
        records = load_records("hotpotqa")
        record = records[rng.randrange(len(records)) if index is None else index]
    gold_titles = {t for t, _ in record["supporting_facts"]}
    docs = [(title, f"{title}: {''.join(sents).strip()}") for title, sents in record["context"]]
    head = "Read the text below and answer the question after it.\n\n"
    query = f"\n\nQuestion: {record['question']}"
    prefix = "\nAnswer:"
    fixed = len(tokenizer(head + " ".join(d for _, d in docs) + query + prefix)["input_ids"])
    sentences = _filler_slice(tokenizer, filler_text(filler), max(0, n_tokens - fixed), rng)
    slots = sorted(rng.randrange(len(sentences) + 1) for _ in docs)
    order = list(range(len(docs)))
    rng.shuffle(order)
    pieces: list[tuple[str, str | None]] = [(s, None) for s in sentences]
    for offset, (slot, which) in enumerate(zip(slots, order)):
        title, doc = docs[which]
        pieces.insert(slot + offset, (doc, title))
    context, gold = head, []
    for i, (text, title) in enumerate(pieces):
        if i:
            context += " "
        if title in gold_titles:
            gold.append((len(context), len(context) + len(text)))
        context += text
    return LongTask("multihop", context, query, prefix, " " + record["answer"], gold,
                    {"id": record["_id"], "question": record["question"], "gold_titles": sorted(gold_titles),
                     "seed": seed})
