"""kvlab.datasets: corpora (real, fetched by the default set) and the retrieval prompt generators."""

from __future__ import annotations

import re

import pytest

from kvlab import datasets
from kvlab.datasets import NIAH_NEEDLE, PASSKEY_FILLER


class WordTokenizer:
    """A tokenizer with one token per whitespace-separated word and a BOS token.

    Stands in for a real tokenizer where exact counts make the test readable; it has the
    interface the generators use (``__call__`` with offsets, ``decode``).
    """

    def __call__(self, text, add_special_tokens=True, return_offsets_mapping=False):
        spans = [m.span() for m in re.finditer(r"\S+", text)]
        ids = [1] * len(spans)
        if add_special_tokens:
            ids, spans = [0] + ids, [(0, 0)] + spans
        out = {"input_ids": ids}
        if return_offsets_mapping:
            out["offset_mapping"] = spans
        return out


@pytest.fixture(scope="module")
def smol_tokenizer():
    from kvlab.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


def n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text)["input_ids"])


# --------------------------------------------------------------------------- corpora


def test_corpus_ids_and_unknown_names():
    assert {"austen", "shakespeare", "canterbury", "botchan", "wikitext", "paul-graham"} <= set(datasets.list_corpora())
    assert {"gsm8k", "mmlu", "hotpotqa", "squad"} <= set(datasets.list_record_sets())
    with pytest.raises(KeyError, match="wikitext"):
        datasets.load_text("no-such-corpus")
    with pytest.raises(KeyError, match="load_records"):
        datasets.load_text("gsm8k")
    with pytest.raises(KeyError, match="emma"):
        datasets.load_text("austen", documents=["middlemarch"])


@pytest.mark.slow
def test_austen_holds_a_book_of_over_200k_tokens(smol_tokenizer):
    novels = datasets.load_documents("austen")
    assert list(novels) == ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice",
                            "sensesensibility"]
    emma = datasets.load_text("austen", documents=["emma"])
    assert emma.startswith("EMMA\n") and "Emma Woodhouse, handsome, clever, and rich" in emma[:1000]
    assert n_tokens(smol_tokenizer, emma) >= 200_000
    both = datasets.load_text("austen", documents=["persuasion", "emma"])
    assert both == novels["persuasion"] + "\n" + novels["emma"]  # given order, blank line between


def test_shakespeare_and_milton_works():
    works = datasets.load_documents("shakespeare")
    assert len(works) == 49 and {"hamlet", "sonnets", "paradise_lost", "areopagitica"} <= set(works)
    assert all("\r" not in t and not t.startswith("\ufeff") for t in works.values())
    assert "To be, or not to be" in works["hamlet"]


def test_wikipedia_and_paul_graham():
    articles = datasets.load_documents("wikitext")
    assert len(articles) == 2349
    first = next(iter(articles))
    assert first == "2007 European Parliament election in Romania"
    assert "<doc" not in articles[first] and articles[first].startswith(first)
    essays = datasets.load_documents("paul-graham")
    assert len(essays) == 49 and "worked" in essays
    assert datasets.load_text("paul-graham") == "\n".join(essays.values())


def test_gutenberg_header_and_licence_are_dropped():
    text = ("\ufeffThe Project Gutenberg EBook of X\r\nlicence words\r\n"
            "*** START OF THIS PROJECT GUTENBERG EBOOK X ***\r\n\r\nChapter 1\r\nIt began.\r\n"
            "End of Project Gutenberg's X\r\n*** END OF THIS PROJECT GUTENBERG EBOOK X ***\r\nlicence\r\n")
    assert datasets._clean(text) == "Chapter 1\nIt began.\n"
    assert datasets._clean("No markers here.\r\n") == "No markers here.\n"


# --------------------------------------------------------------------------- sentences


def test_sentence_splitter_on_made_up_text():
    text = ('Mr. Smith went to Washington. He arrived at 3 p.m. and left at 5. Dr. J. R. Jones '
            'said: "Hello there!" Then he left? Yes.\n\nA heading without a full stop\n\n'
            'Prices rose 2.5 percent, e.g. for bread. The end... Really.')
    assert datasets.split_sentences(text) == [
        "Mr. Smith went to Washington.",
        "He arrived at 3 p.m. and left at 5.",
        'Dr. J. R. Jones said: "Hello there!"',
        "Then he left?",
        "Yes.",
        "A heading without a full stop",
        "Prices rose 2.5 percent, e.g. for bread.",
        "The end...",
        "Really.",
    ]
    # text glued together by HTML extraction still splits; spans index the original text
    glued = "I could see myself making 4 of these mistakes.If you had to compress them, fine."
    spans = datasets.sentence_spans(glued)
    assert [glued[a:b] for a, b in spans] == ["I could see myself making 4 of these mistakes.",
                                              "If you had to compress them, fine."]


# --------------------------------------------------------------------------- passkey


def test_passkey_layout_without_tokenizer():
    p = datasets.passkey_prompt(n_filler=10, depth=0.3, passkey=71432)
    prompt, answer = p  # unpacks
    assert answer == " 71432" and p.n_tokens is None
    assert prompt.startswith("There is an important info hidden inside a lot of irrelevant text.")
    assert prompt.endswith("What is the pass key? The pass key is")
    assert prompt.count(PASSKEY_FILLER) == 10
    before = prompt.split("The pass key is 71432. Remember it. 71432 is the pass key.")[0]
    assert before.count(PASSKEY_FILLER) == 3
    assert datasets.passkey_prompt(n_filler=4, depth=0.0).prompt.split(" The pass key is ")[0].count(PASSKEY_FILLER) == 0
    end = datasets.passkey_prompt(n_filler=4, depth=1.0, passkey=12345).prompt
    assert end.endswith(f"{PASSKEY_FILLER} The pass key is 12345. Remember it. 12345 is the pass key. "
                        "What is the pass key? The pass key is")


def test_passkey_is_seeded():
    keys = {datasets.passkey_prompt(n_filler=2, seed=s).info["passkey"] for s in range(20)}
    assert len(keys) > 15 and all(len(k) == 5 and k.isdigit() for k in keys)
    assert datasets.passkey_prompt(n_filler=2, seed=7) == datasets.passkey_prompt(n_filler=2, seed=7)
    with pytest.raises(ValueError):
        datasets.passkey_prompt(n_filler=2, depth=1.5)
    with pytest.raises(ValueError, match="either"):
        datasets.passkey_prompt()


@pytest.mark.slow
def test_passkey_fits_the_token_budget(smol_tokenizer):
    for length in (256, 1000, 2048):
        p = datasets.passkey_prompt(smol_tokenizer, length, 0.5, seed=1)
        per_copy = n_tokens(smol_tokenizer, " " + PASSKEY_FILLER)
        assert length - per_copy - 2 <= p.n_tokens <= length
        assert p.n_tokens == n_tokens(smol_tokenizer, p.prompt)
    with pytest.raises(ValueError, match="cannot hold"):
        datasets.passkey_prompt(smol_tokenizer, 20, 0.5)


# --------------------------------------------------------------------------- needle in a haystack


def test_niah_places_the_needle_at_a_sentence_boundary_by_depth():
    tok = WordTokenizer()
    haystack = " ".join(f"Sentence number {i} is here." for i in range(200))  # 5 tokens a sentence
    answers = set()
    positions = []
    for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
        p = datasets.niah_prompt(tok, haystack, 300, depth)
        answers.add(p.answer)
        assert p.n_tokens <= 300 and p.prompt.count(NIAH_NEEDLE) == 1
        assert p.prompt.index(NIAH_NEEDLE) == p.info["needle_char"]
        assert p.prompt.endswith("Question: What is the best thing to do in San Francisco?\n"
                                 "Answer: The best thing to do in San Francisco is")
        document = p.prompt.split("Document:\n", 1)[1].split("\n\nQuestion:")[0]
        before, after = document.split(NIAH_NEEDLE)
        assert before == "" or before.endswith("is here. ")
        assert after == "" or after.startswith(" Sentence number")
        positions.append(len(before.split()) / (len(before.split()) + len(after.split())))
    assert answers == {" eat a sandwich and sit in Dolores Park on a sunny day."}
    assert positions[0] == 0.0 and positions[-1] == 1.0
    for got, want in zip(positions[1:4], (0.25, 0.5, 0.75)):
        assert want - 0.05 <= got <= want  # the boundary at or before the depth


def test_niah_repeats_a_short_haystack_and_takes_any_needle():
    p = datasets.niah_prompt(WordTokenizer(), "Tiny essay. Only two sentences.", 120, 0.5)
    assert p.n_tokens <= 120 and p.prompt.count("Tiny essay.") > 5
    own = datasets.niah_prompt(WordTokenizer(), "Tiny essay. Only two sentences.", 120, 0.5,
                               needle="The secret word is heliotrope.", question="What is the secret word?")
    assert own.answer == " The secret word is heliotrope." and own.prompt.endswith("What is the secret word?\nAnswer:")


@pytest.mark.slow
def test_niah_on_paul_graham_with_smollm2(smol_tokenizer):
    haystack = datasets.load_text("paul-graham")
    for length in (512, 2048):
        p = datasets.niah_prompt(smol_tokenizer, haystack, length, 0.5)
        assert length - 100 <= p.n_tokens <= length
        assert p.n_tokens == n_tokens(smol_tokenizer, p.prompt)
        assert p.prompt.count(NIAH_NEEDLE) == 1
    with pytest.raises(ValueError, match="too short"):
        datasets.niah_prompt(smol_tokenizer, haystack, 30, 0.5)


def test_niah_grid():
    cells = datasets.niah_grid([1024, 2048], 5)
    assert cells[:5] == [(1024, 0.0), (1024, 0.25), (1024, 0.5), (1024, 0.75), (1024, 1.0)]
    assert len(cells) == 10 and cells[5] == (2048, 0.0)
    assert datasets.niah_grid([64], [0.1, 0.9]) == [(64, 0.1), (64, 0.9)]
    with pytest.raises(ValueError):
        datasets.niah_grid([64], [1.1])


# --------------------------------------------------------------------------- key-value retrieval


def test_kv_retrieval_layout():
    p = datasets.kv_retrieval_prompt(n_filler=40, n_pairs=6, seed=3)
    lines = re.findall(r"The value corresponding to the id ([0-9a-f-]{36}) is ([0-9a-f-]{36})\.", p.prompt)
    assert [tuple(x) for x in lines] != [] and sorted(lines) == sorted(p.info["pairs"])
    key, value = p.info["key"], p.info["value"]
    assert (key, value) in p.info["pairs"] and p.answer == f" {value}"
    assert p.prompt.endswith(f"What is the value corresponding to the id {key}? "
                             f"The value corresponding to the id {key} is")
    assert p == datasets.kv_retrieval_prompt(n_filler=40, n_pairs=6, seed=3)
    assert p.info["key"] != datasets.kv_retrieval_prompt(n_filler=40, n_pairs=6, seed=4).info["key"]


def test_kv_retrieval_depth_and_filler():
    filler = "Alpha is first. Beta is second. Gamma is third. Delta is fourth."
    early = datasets.kv_retrieval_prompt(n_filler=100, n_pairs=3, depth=0.0, filler=filler, seed=1)
    late = datasets.kv_retrieval_prompt(n_filler=100, n_pairs=3, depth=1.0, filler=filler, seed=1)
    line = f"The value corresponding to the id {early.info['key']} is {early.info['value']}."
    body = early.prompt.split("\n\n")[1]
    assert body.startswith(line) or body.index(line) < 200
    assert late.prompt.split("\n\n")[1].rstrip().endswith(
        f"The value corresponding to the id {late.info['key']} is {late.info['value']}.")
    assert "Gamma is third." in early.prompt and "grass is green" not in early.prompt


@pytest.mark.slow
def test_kv_retrieval_fits_the_token_budget(smol_tokenizer):
    p = datasets.kv_retrieval_prompt(smol_tokenizer, 1024, n_pairs=8, seed=0)
    assert 1024 - 30 <= p.n_tokens <= 1024


# --------------------------------------------------------------------------- records


def test_small_record_sets():
    gsm = datasets.load_records("gsm8k")
    assert len(gsm) == 1319 and gsm[0]["question"].startswith("Janet") and "#### 18" in gsm[0]["answer"]
    shots = datasets.load_records("gsm8k-cot-prompt")
    assert len(shots) == 8 and shots[0]["target"].endswith("The answer is 6.")
    mmlu = datasets.load_records("mmlu")
    assert len(mmlu) == 14042 and len({r["topic"] for r in mmlu}) == 57
    with pytest.raises(KeyError, match="mmlu"):
        datasets.load_records("wikitext")
