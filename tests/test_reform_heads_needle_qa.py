"""kvlab.experiments.reform.heads_needle_qa: the candidates are fixed from the committed grids (best, median), the
needle and QA prompts split into REFORM's context / query / answer prefix without changing a character."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def mod():
    from kvlab.experiments.reform import heads_needle_qa

    return heads_needle_qa


@pytest.fixture(scope="module")
def tok():
    from kvlab.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


def test_candidates_pick_best_and_median(mod):
    grids = {"q": [[5.0, 9.0], [8.0, 7.0]], "k": [[6.0, 9.0], [9.0, 9.0]], "v": [[4.0, 3.0], [2.0, 10.0]],
             "attention": [[7.0, 1.5], [9.0, 9.0]], "hidden": [[8.0], [6.5]]}
    c = mod.candidates(grids)
    assert c["best-qkv"] == ("v", 1, 0) and c["best-v"] == ("v", 1, 0)
    assert c["best-attention"] == ("attention", 0, 1)
    assert c["best-hidden"] == ("hidden", 1, 0)
    assert c["median-v"] == ("v", 0, 1)  # sorted V: 2, 3, 4, 10 -> the lower middle is 3


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_needle_task_keeps_the_prompt_and_marks_the_needle(mod, tok, depth):
    from kvlab.datasets import NIAH_NEEDLE, load_text
    from kvlab.eval.retrieval import string_match_all

    task = mod.needle_task(tok, 1024, depth, 1, load_text("paul-graham"))
    assert task.prompt.endswith("\nAnswer: The best thing to do in San Francisco is")
    assert task.query.startswith("\n\nQuestion: ") and NIAH_NEEDLE in task.context
    (start, end), = task.gold_chars
    assert task.context[start:end] == NIAH_NEEDLE
    assert int(task.gold_tokens(tok).sum()) > 10
    assert string_match_all(task.answer, task.info["answers"]) == 1.0  # the reference passes the paper's rule
    assert string_match_all(" eat a sandwich.", task.info["answers"]) < 1.0


def test_needle_offsets_give_other_haystacks(mod, tok):
    from kvlab.datasets import load_text

    text = load_text("paul-graham")
    a, b = (mod.needle_task(tok, 1024, 0.5, o, text) for o in (0, 1))
    assert a.context != b.context


def test_qa_task_splits_the_qa_prompt_unchanged(mod):
    from kvlab.eval.qa import QAItem

    prompt = ("Document:\n\nThe harbour was built by Romans. Later the Romans left.\n\n"
              "Answer the question with a short phrase from the text.\nQuestion: Who built the harbour?\nAnswer:")
    task = mod.qa_task(QAItem("single-doc", prompt, ["Romans", "the Romans"], 40), 3)
    assert task.prompt == prompt
    assert task.answer_prefix == "\nAnswer:" and task.query.endswith("Who built the harbour?")
    assert all(task.context[s:e] in ("Romans", "the Romans") for s, e in task.gold_chars)
    assert len(task.gold_chars) == 3 and task.info["seed"] == 3  # "Romans" twice, "the Romans" once
