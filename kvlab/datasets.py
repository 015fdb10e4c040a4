"""Texts and prompts for kvlab's experiments: long books, Wikipedia, essays, and the synthetic
retrieval tests of the KV-cache papers.

Corpora (fetched on first use through :mod:`kvlab.assets`; ``data/PROVENANCE.md`` says where
each comes from and what it stands in for)::

    load_text("austen")                       # Austen's six novels (PG19 stand-in), ~1M tokens
    load_text("austen", documents=["emma"])   # one novel, over 200k SmolLM2 tokens
    load_documents("paul-graham")             # {essay name: text}, the NIAH haystack
    load_records("gsm8k")                     # question/answer data sets as lists of dicts

Prompt generators (pure functions of their arguments; random choices come from ``seed``)::

    passkey_prompt(tokenizer, 4096, depth=0.5)            # Landmark Attention / StreamingLLM passkey
    niah_prompt(tokenizer, haystack, 4096, depth=0.25)    # gkamradt's Needle In A Haystack
    kv_retrieval_prompt(tokenizer, 4096, n_pairs=32)      # REFORM's synthetic key-value retrieval

Each returns a :class:`RetrievalPrompt` whose ``answer`` is the expected continuation of
``prompt`` (with its leading space), so ``prompt + answer`` reads as one text; it also unpacks
as ``prompt, answer = ...``.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvlab import assets

__all__ = [
    "RetrievalPrompt",
    "list_corpora",
    "list_record_sets",
    "load_documents",
    "load_text",
    "load_records",
    "sentence_spans",
    "split_sentences",
    "passkey_prompt",
    "niah_prompt",
    "niah_grid",
    "kv_retrieval_prompt",
    "PASSKEY_FILLER",
    "NIAH_NEEDLE",
    "NIAH_QUESTION",
]

# How each text corpus is cut into documents: "files" (one per file of a collection asset),
# "wiki-docs" (<doc title=...> blocks), "lines" (one document a line), "single", "json-text".
_TEXT_LAYOUT = {
    "austen": "files",
    "shakespeare": "files",
    "canterbury": "files",
    "paul-graham": "files",
    "botchan": "single",
    "wikitext": "wiki-docs",
    "c4-sample": "lines",
    "pg-essays-ruler": "json-text",
}
_RECORD_SETS = ("hotpotqa", "squad", "gsm8k", "gsm8k-cot-prompt", "mmlu")


# --------------------------------------------------------------------------- corpora


def list_corpora() -> list[str]:
    """Ids of the text corpora that :func:`load_text` and :func:`load_documents` read."""
    return list(_TEXT_LAYOUT)


def list_record_sets() -> list[str]:
    """Ids of the question/answer data sets that :func:`load_records` reads."""
    return list(_RECORD_SETS)


def _check_corpus(corpus_id: str) -> None:
    if corpus_id not in _TEXT_LAYOUT:
        hint = " (a record set: use load_records)" if corpus_id in _RECORD_SETS else ""
        raise KeyError(f"{corpus_id!r} is not a text corpus{hint}; corpora: {', '.join(_TEXT_LAYOUT)}")


def _clean(text: str) -> str:
    """Unify newlines, drop a byte-order mark and Project Gutenberg's header and licence."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    start = re.search(r"^\*\*\* ?START OF (?:THIS|THE) PROJECT GUTENBERG.*$", text, re.M)
    if start:
        text = text[start.end():]
        end = re.search(r"^(?:\*\*\* ?END OF (?:THIS|THE) PROJECT GUTENBERG|End of (?:the )?Project Gutenberg)",
                        text, re.M)
        if end:
            text = text[:end.start()]
    return text.strip("\n") + "\n"


def _document_name(stem: str) -> str:
    # "paradise_lost_(no_introduction)_gut" -> "paradise_lost"
    return re.sub(r"_\(.*?\)", "", stem).removesuffix("_gut")


def _read_text(path: Path, asset_id: str) -> str:
    """A cached corpus file as text; a file that is not UTF-8 gets one error naming it and the fix.

    (``assets.fetch`` has checked its size and sha256 already; this catches a file damaged in
    place after that check, or a registry entry whose text is not UTF-8.)
    """
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise assets.DamagedAssetError(
            f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}), so {asset_id!r} "
            f"cannot be read. Fix: delete {path} and re-run `python -m kvlab fetch {asset_id}`; if the fresh copy "
            f"fails the same way, the registry entry of {asset_id!r} is wrong") from exc


@functools.lru_cache(maxsize=8)
def _documents(corpus_id: str) -> tuple[tuple[str, str], ...]:
    layout = _TEXT_LAYOUT[corpus_id]
    path = assets.fetch(corpus_id, progress=True)
    if layout == "files":
        files = sorted(p for p in path.iterdir() if p.suffix == ".txt")
        return tuple((_document_name(p.stem), _clean(_read_text(p, corpus_id))) for p in files)
    raw = _read_text(path, corpus_id)
    if layout == "single":
        return ((Path(path).stem, _clean(raw)),)
    if layout == "json-text":
        return ((corpus_id, _clean(json.loads(raw)["text"])),)
    if layout == "lines":
        lines = [line.strip() for line in raw.splitlines() if line.strip()]
        return tuple((f"{corpus_id}-{i:04d}", line + "\n") for i, line in enumerate(lines))
    docs: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for m in re.finditer(r'<doc [^>]*title="([^"]*)">\n(.*?)</doc>', raw, re.S):
        title = m.group(1)
        seen[title] = seen.get(title, 0) + 1
        docs.append((title if seen[title] == 1 else f"{title} ({seen[title]})", _clean(m.group(2))))
    return tuple(docs)


def load_documents(corpus_id: str, documents: Iterable[str] | None = None) -> dict[str, str]:
    """``{document name: text}`` of a corpus, in a stable order (fetches it if needed).

    Names are file stems for collections (``"emma"``, ``"hamlet"``, ``"paradise_lost"``,
    ``"addiction"``), article titles for ``wikitext``. ``documents`` keeps only those named;
    an unknown name raises ``KeyError`` listing the available ones.
    """
    _check_corpus(corpus_id)
    docs = dict(_documents(corpus_id))
    if documents is None:
        return docs
    wanted = [documents] if isinstance(documents, str) else list(documents)
    twice = sorted({d for d in wanted if wanted.count(d) > 1})
    if twice:
        raise ValueError(f"documents names {', '.join(map(repr, twice))} more than once; each document is given once "
                         f"(to repeat a text, repeat the string: load_text({corpus_id!r}, [name]) * 2)")
    missing = [d for d in wanted if d not in docs]
    if missing:
        raise KeyError(f"{corpus_id} has no document {', '.join(map(repr, missing))}; "
                       f"available: {', '.join(docs)}")
    return {d: docs[d] for d in wanted}


def load_text(corpus_id: str, documents: Iterable[str] | None = None) -> str:
    """The corpus (or the named ``documents`` of it, in the order given) as one string.

    Documents are joined with a blank line. ``load_text("austen", documents=["emma"])`` is a
    single long book (~230k tokens with the SmolLM2 tokenizer).
    """
    return "\n".join(load_documents(corpus_id, documents).values())


def load_records(dataset_id: str) -> list[dict[str, Any]]:
    """Question/answer data sets as lists of dicts.

    ``hotpotqa``: ``_id, question, answer, supporting_facts, context`` (dev, distractor);
    ``squad``: one dict per question, ``id, question, context, title, answers, is_impossible``;
    ``gsm8k``: ``question, answer`` (the answer ends with ``#### <number>``);
    ``gsm8k-cot-prompt``: the 8 exemplars ``question, target`` of the standard CoT prompt;
    ``mmlu``: ``question, answer_a..answer_d, correct_answer, topic`` (the 2 header rows dropped).
    """
    if dataset_id not in _RECORD_SETS:
        raise KeyError(f"unknown record set {dataset_id!r}; record sets: {', '.join(_RECORD_SETS)}")
    path = assets.fetch(dataset_id, progress=True)
    text = _read_text(path, dataset_id)
    if dataset_id == "hotpotqa":
        return json.loads(text)
    if dataset_id == "squad":
        out = []
        for article in json.loads(text)["data"]:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    out.append({"id": qa["id"], "title": article["title"], "context": paragraph["context"],
                                "question": qa["question"], "answers": [a["text"] for a in qa["answers"]],
                                "is_impossible": qa.get("is_impossible", False)})
        return out
    if dataset_id == "gsm8k-cot-prompt":
        import yaml

        return [dict(s) for s in yaml.safe_load(text)["fewshot_config"]["samples"]]
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if dataset_id == "mmlu":
        rows = [r for r in rows if r["correct_answer"] in ("A", "B", "C", "D")]
    return rows


# --------------------------------------------------------------------------- sentences

_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr prof rev gen col capt lt sgt gov sen rep hon messrs mme mlle "
    "vs etc e.g i.e cf al fig eq vol ch pp approx dept inc ltd co corp jan feb mar apr "
    "jun jul aug sep sept oct nov dec u.s u.k a.m p.m".split()
)
# A candidate end: ., ! or ? (maybe repeated), closing quotes or brackets, then either
# whitespace or, for text glued together by HTML extraction ("mistakes.If"), a capital
# letter right after a lower-case word.
_END = re.compile(r"""[.!?]+["'\u201d\u2019)\]]*(?:(?=\s)|(?<=[a-z][a-z][.!?])(?=[A-Z][a-z]))""")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the sentences of ``text``; ``text[end:]`` starts
    with whitespace or the next sentence.

    A rule-based splitter (no model): a sentence ends at ``.``, ``!`` or ``?`` (plus closing
    quotes) before whitespace that leads to an upper-case letter, digit or quote, or at a
    blank line. It does not end after common abbreviations (``Mr.``, ``e.g.``) or a single
    initial (``J.``). Good enough to put a needle between two sentences, which is its job.
    """
    spans: list[tuple[int, int]] = []
    start = _skip_space(text, 0)
    paragraph_breaks = {m.start() for m in re.finditer(r"\n[ \t]*\n", text)}
    for end in sorted(paragraph_breaks | {m.end() for m in _END.finditer(text)}):
        if end <= start:
            continue
        if end not in paragraph_breaks and not _real_end(text, start, end):
            continue
        if text[start:end].strip():
            spans.append((start, end))
        start = _skip_space(text, end)
    if start < len(text) and text[start:].strip():
        spans.append((start, len(text.rstrip())))
    return spans


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _real_end(text: str, start: int, end: int) -> bool:
    after = text[_skip_space(text, end):_skip_space(text, end) + 1]
    if after and not (after.isupper() or after.isdigit() or after in "\"'\u201c\u2018([-"):
        return False  # "... e.g. the" or "3 p.m. and": the next word is lower-case
    word = re.search(r"(\S+?)[.!?\"')\]\u201d\u2019]*$", text[start:end])
    if word is None or text[end - 1] in "!?" or not text[start:end].rstrip("\"')]\u201d\u2019").endswith("."):
        return True
    token = word.group(1).lower().strip("(\"'\u201c\u2018")
    if token in _ABBREVIATIONS:
        return False
    return not (len(token) == 1 and token.isalpha())  # an initial, "J. R. R. Tolkien"


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text`` (see :func:`sentence_spans`)."""
    return [text[a:b] for a, b in sentence_spans(text)]


# --------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class RetrievalPrompt:
    """A retrieval prompt and its expected continuation.

    ``n_tokens`` counts the prompt's tokens as the model sees them (special tokens included)
    when a tokenizer was given; ``depth`` is where the fact sits, as a fraction of the
    filler before it; ``info`` holds generator-specific details (the passkey, the pairs, ...).
    """

    prompt: str
    answer: str
    n_tokens: int | None
    depth: float
    info: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[str]:
        return iter((self.prompt, self.answer))


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text)["input_ids"])


def _check_depth(depth: float) -> None:
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth is a fraction of the context in [0, 1], got {depth}")


def _fit(tokenizer, build, n_tokens: int, lo: int, hi: int) -> int:
    """Largest k in [lo, hi] with ``_count(build(k)) <= n_tokens`` (token counts grow with k)."""
    if _count(tokenizer, build(lo)) > n_tokens:
        raise ValueError(f"{n_tokens} tokens cannot hold even the fixed parts of the prompt "
                         f"({_count(tokenizer, build(lo))} tokens)")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _count(tokenizer, build(mid)) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return lo


#: The filler of the passkey test: five sentences repeated (Mohtashami & Jaggi, 2023).
PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
_PASSKEY_TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
                 "I will quiz you about the important information there.")


def passkey_prompt(tokenizer=None, n_tokens: int | None = None, depth: float = 0.5, *,
                   n_filler: int | None = None, passkey: int | str | None = None,
                   seed: int = 0) -> RetrievalPrompt:
    """Passkey retrieval (Landmark Attention, Mohtashami & Jaggi 2023, arXiv:2305.16300; used
    by StreamingLLM, LaCache and SepLLM): a 5-digit key hidden in repeated filler.

    Layout: task description, ``k`` copies of :data:`PASSKEY_FILLER` of which
    ``round(depth * k)`` come before the line ``The pass key is 71432. Remember it. 71432 is
    the pass key.``, then ``What is the pass key? The pass key is``; the answer is ``" 71432"``.

    Give either ``tokenizer`` and ``n_tokens`` (``k`` is the largest that keeps the prompt
    within ``n_tokens`` tokens) or ``n_filler=k`` directly. ``passkey`` defaults to a
    random 5-digit number drawn from ``seed``.
    """
    _check_depth(depth)
    if (n_filler is None) == (tokenizer is None or n_tokens is None):
        raise ValueError("give either tokenizer and n_tokens, or n_filler")
    key = str(passkey) if passkey is not None else str(random.Random(seed).randint(10000, 99999))
    info_line = f"The pass key is {key}. Remember it. {key} is the pass key."
    question = "What is the pass key? The pass key is"

    def build(k: int) -> str:
        before = round(depth * k)
        parts = [_PASSKEY_TASK, *[PASSKEY_FILLER] * before, info_line, *[PASSKEY_FILLER] * (k - before), question]
        return " ".join(parts)

    if n_filler is None:
        per_copy = max(1, _count(tokenizer, PASSKEY_FILLER) - _count(tokenizer, ""))
        n_filler = _fit(tokenizer, build, n_tokens, 0, n_tokens // per_copy + 1)
    prompt = build(n_filler)
    return RetrievalPrompt(prompt, f" {key}", _count(tokenizer, prompt) if tokenizer is not None else None,
                           depth, {"passkey": key, "n_filler": n_filler})


#: The needle and question of the Needle In A Haystack test (Kamradt, 2023).
NIAH_NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
NIAH_QUESTION = "What is the best thing to do in San Francisco?"
_NIAH_ANSWER_PREFIX = "The best thing to do in San Francisco is"


def _token_prefix(tokenizer, text: str, n: int) -> str:
    """The longest prefix of ``text`` whose tokens are (about) its first ``n`` tokens."""
    if n <= 0:
        return ""
    if len(text) > 8 * n:
        # English runs ~4-5 characters a token: tokenize a generous prefix, not a whole book.
        head = _token_prefix(tokenizer, text[:8 * n], n)
        if len(head) < 8 * n:
            return head
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc.get("offset_mapping") if hasattr(enc, "get") else None
    ids = enc["input_ids"]
    if len(ids) <= n:
        return text
    if offsets:
        return text[:offsets[n - 1][1]]
    return tokenizer.decode(ids[:n])


def niah_prompt(tokenizer, haystack: str, context_length: int, depth: float, *,
                needle: str = NIAH_NEEDLE, question: str = NIAH_QUESTION,
                answer_prefix: str | None = _NIAH_ANSWER_PREFIX) -> RetrievalPrompt:
    """Needle In A Haystack (Kamradt 2023; used by SepLLM, LaCache, DHSA and REFORM).

    The haystack (Paul Graham's essays: ``load_text("paul-graham")``; repeated if short) is
    cut so that the whole prompt has at most ``context_length`` tokens of ``tokenizer``;
    the needle goes in at the sentence boundary nearest before ``depth`` of the haystack's
    tokens (``depth=0``: first, ``1``: last), as the original walks back to a full stop.
    The prompt ends with the question and ``answer_prefix``; the answer is the rest of
    the needle (``" eat a sandwich and sit in Dolores Park on a sunny day."``), or the
    whole needle after ``Answer:`` when the prefix does not start it. ``info["needle_char"]``
    is where the needle starts in the prompt. The
    original asks a chat model and grades with GPT-4; a completion with a prefix lets
    small models answer and be scored by word recall.
    """
    _check_depth(depth)
    if not haystack.strip():
        raise ValueError("the haystack is empty")
    if answer_prefix and needle.startswith(answer_prefix):
        answer = needle[len(answer_prefix):]
    else:  # a prefix that does not start the needle would give the answer away wrongly
        answer, answer_prefix = " " + needle, ""
    head = "Read the document below and answer the question after it.\n\nDocument:\n"
    tail = f"\n\nQuestion: {question}\nAnswer:{' ' + answer_prefix if answer_prefix else ''}"

    fixed = _count(tokenizer, head + " " + needle + " " + tail)
    text = haystack
    # short haystack: repeat it, as the original does. Doubling the copies keeps this linear in the prompt length
    # (one copy at a time re-tokenises the growing text each time: quadratic); the prompt is a token prefix of
    # the text, so extra copies change nothing.
    while _count_upto(tokenizer, text, context_length) < context_length - fixed:
        text = text + "\n\n" + text

    def build(n_hay: int) -> tuple[str, int]:
        context = _token_prefix(tokenizer, text, n_hay).rstrip()
        spans = sentence_spans(context)
        if len(spans) > 1 and not _ends_sentence(context):
            context = context[:spans[-2][1]]  # drop the sentence that the token cut broke off
        at = _boundary_before(context, tokenizer, depth)
        before, after = context[:at].rstrip(), context[at:].lstrip()
        body = " ".join(part for part in (before, needle, after) if part)
        return head + body + tail, len(head) + len(before) + (1 if before else 0)

    budget = max(0, context_length - fixed)
    while True:
        prompt, position = build(budget)
        excess = _count(tokenizer, prompt) - context_length
        if excess <= 0 or budget == 0:
            break
        budget = max(0, budget - excess)
    n = _count(tokenizer, prompt)
    if n > context_length:
        raise ValueError(f"context_length={context_length} is too short for the needle and question ({n} tokens)")
    return RetrievalPrompt(prompt, answer, n, depth,
                           {"needle": needle, "question": question, "needle_char": position,
                            "haystack_tokens": budget})


def _ends_sentence(text: str) -> bool:
    return text.rstrip("\"')]\u201d\u2019").endswith((".", "!", "?"))


def _count_upto(tokenizer, text: str, limit: int) -> int:
    # Tokenizing a book to learn it is long enough: look at a prefix of ~8 chars a token first.
    return _count(tokenizer, text[: max(1, limit) * 8]) if len(text) > limit * 8 else _count(tokenizer, text)


def _boundary_before(context: str, tokenizer, depth: float) -> int:
    """Character index of the sentence boundary at or before ``depth`` of ``context``'s tokens."""
    if depth <= 0.0 or not context:
        return 0
    if depth >= 1.0:
        return len(context)
    target_tokens = round(depth * _count(tokenizer, context))
    target_char = len(_token_prefix(tokenizer, context, target_tokens))
    ends = [0] + [b for _, b in sentence_spans(context)]
    return max(e for e in ends if e <= target_char)


def niah_grid(lengths: Sequence[int], depths: Sequence[float] | int = 5) -> list[tuple[int, float]]:
    """The cells ``(context_length, depth)`` of a NIAH heat map, lengths outer, depths inner.

    ``depths`` is a list of fractions, or a count of evenly spaced depths from 0 to 1
    (``5`` -> 0, 0.25, 0.5, 0.75, 1, the original's ``document_depth_percent_intervals``).
    """
    if isinstance(depths, int):
        if depths < 1:
            raise ValueError(f"need at least one depth, got {depths}")
        depths = [i / (depths - 1) for i in range(depths)] if depths > 1 else [0.5]
    for d in depths:
        _check_depth(d)
    return [(int(n), float(d)) for n in lengths for d in depths]


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-{h[20:]}"


def kv_retrieval_prompt(tokenizer=None, n_tokens: int | None = None, *, n_pairs: int = 16,
                        depth: float | None = None, filler: str | None = None, n_filler: int | None = None,
                        seed: int = 0) -> RetrievalPrompt:
    """Synthetic key-value retrieval as in REFORM (Song et al. 2025, arXiv:2506.01215).

    ``n_pairs`` lines ``The value corresponding to the id {key} is {value}.`` (keys and values
    are random UUIDs drawn from ``seed``) are scattered at random sentence boundaries of the
    filler; the question asks for one key's value: ``... What is the value corresponding to
    the id {key}? The value corresponding to the id {key} is`` with answer ``" {value}"``.
    ``depth`` pins where the asked pair sits (fraction of the filler before it); by default
    it is one of the scattered pairs chosen at random.

    Filler: ``filler`` text (e.g. a corpus: its sentences are cycled) or, by default,
    :data:`PASSKEY_FILLER`. Size: ``tokenizer`` and ``n_tokens`` (the most filler sentences
    that keep the prompt within ``n_tokens`` tokens), or ``n_filler`` sentences directly.
    """
    if depth is not None:
        _check_depth(depth)
    if n_pairs < 1:
        raise ValueError(f"n_pairs must be >= 1, got {n_pairs}")
    if (n_filler is None) == (tokenizer is None or n_tokens is None):
        raise ValueError("give either tokenizer and n_tokens, or n_filler")
    rng = random.Random(seed)
    pairs = [(_uuid(rng), _uuid(rng)) for _ in range(n_pairs)]
    asked = rng.randrange(n_pairs)
    slots = [rng.random() for _ in range(n_pairs)]  # where each pair goes, as a fraction of the filler
    if depth is not None:
        slots[asked] = depth
    sentences = split_sentences(filler) if filler is not None else split_sentences(PASSKEY_FILLER)
    if not sentences:
        raise ValueError("the filler has no sentences")
    key, value = pairs[asked]
    head = "Below is a text with some ids and their values hidden in it. Remember them.\n\n"
    tail = f"\n\nWhat is the value corresponding to the id {key}? The value corresponding to the id {key} is"

    def build(k: int) -> str:
        body = [sentences[i % len(sentences)].replace("\n", " ") for i in range(k)]
        inserts = sorted(((round(s * k), i) for i, s in enumerate(slots)), key=lambda t: (t[0], t[1]))
        for offset, (at, i) in enumerate(inserts):
            body.insert(at + offset, f"The value corresponding to the id {pairs[i][0]} is {pairs[i][1]}.")
        return head + " ".join(body) + tail

    if n_filler is None:
        n_filler = _fit(tokenizer, build, n_tokens, 0, n_tokens)
    prompt = build(n_filler)
    return RetrievalPrompt(prompt, f" {value}", _count(tokenizer, prompt) if tokenizer is not None else None,
                           slots[asked], {"key": key, "value": value, "pairs": pairs, "n_filler": n_filler})
