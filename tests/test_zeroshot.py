"""Zero-shot log-likelihood scoring as lm-eval does it (kvlab.eval.zeroshot): metrics and log-likelihoods on
tiny examples computed by hand, lm-eval's tokenisation of (context, continuation), the task records, bad inputs."""

from __future__ import annotations

import gzip
import json
import math
from types import SimpleNamespace

import pytest
import torch

from kvlab.eval import zeroshot
from kvlab.eval.zeroshot import Question, choice_metrics, encode_pair, evaluate_task, load_task, loglikelihood

VOCAB = "abc "


class CharTokenizer:
    """One token per character of ``VOCAB``; ``bos``/``eos`` ids 4/5."""

    bos_token_id, eos_token_id = 4, 5

    def __call__(self, text, add_special_tokens=False):
        return SimpleNamespace(input_ids=[VOCAB.index(c) for c in text])


class Bigram(torch.nn.Module):
    """logits[t] = log P[ids[t]]: the next-token distribution depends on the current token only."""

    def __init__(self, probs):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(probs, dtype=torch.float64).log())

    def forward(self, input_ids, use_cache=False, logits_to_keep=0):
        return SimpleNamespace(logits=self.table[input_ids][:, -logits_to_keep:])


# rows: current token a, b, c, ' ', bos, eos; columns: next token (6 ids)
P = [[0.5, 0.25, 0.125, 0.125, 0, 0],
     [0.25, 0.5, 0.125, 0.125, 0, 0],
     [0.125, 0.125, 0.5, 0.25, 0, 0],
     [0.5, 0.25, 0.25, 0, 0, 0],
     [0.25, 0.25, 0.25, 0.25, 0, 0],
     [0.25, 0.25, 0.25, 0.25, 0, 0]]


def test_choice_metrics_by_hand():
    # lls -4, -6 over 2 and 6 characters: acc picks choice 0 (-4 > -6), acc_norm choice 1 (-1 > -2)
    assert choice_metrics([-4.0, -6.0], 1, [2, 6]) == (0, 1)
    assert choice_metrics([-4.0, -6.0], 0, [2, 6]) == (1, 0)
    assert choice_metrics([-4.0, -6.0], 0) == (1, None)
    assert choice_metrics([-3.0, -3.0, -5.0], 0, [3, 3, 1]) == (1, 1)  # ties go to the first choice
    assert choice_metrics([-3.0, -3.0, -5.0], 1, [3, 3, 1]) == (0, 0)


def test_loglikelihood_by_hand():
    model, tok = Bigram(P), CharTokenizer()
    # context "ab", continuation "ba": log P(b | b) + log P(a | b) = log 1/2 + log 1/4 = -3 log 2
    assert loglikelihood(model, *encode_pair(tok, "ab", "ba")) == pytest.approx(-3 * math.log(2), abs=1e-12)
    # trailing space of the context moves to the continuation: "a" | " c" -> log P(' '|a) + log P(c|' ')
    ctx, cont = encode_pair(tok, "a ", "c")
    assert (ctx, cont) == ([0], [3, 2])
    assert loglikelihood(model, ctx, cont) == pytest.approx(math.log(0.125) + math.log(0.25), abs=1e-12)
    # add_bos: the BOS token starts the context
    ctx, cont = encode_pair(tok, "c", "c", add_bos=True)
    assert (ctx, cont) == ([4, 2], [2])


def test_evaluate_task_by_hand():
    model, tok = Bigram(P), CharTokenizer()
    # continuation " a": log P(' '|b) + log P(a|' ') = log 1/8 + log 1/2; " cc": log 1/8 + log 1/4 + log 1/2
    q = Question(("b", "b"), (" a", " cc"), gold=1, lengths=(1, 2))
    r = evaluate_task(model, tok, [q])
    lls = [math.log(1 / 8) + math.log(1 / 2), math.log(1 / 8) + math.log(1 / 4) + math.log(1 / 2)]
    assert r.lls[0] == pytest.approx(lls, abs=1e-12)
    # acc: -2.77 > -4.16 picks choice 0 (wrong); acc_norm: -2.77 / 1 < -4.16 / 2 = -2.08 picks choice 1 (right)
    assert (r.acc, r.acc_norm) == (0.0, 1.0)
    # WinoGrande-style: two contexts, one continuation, no acc_norm; P(' '|c) = 1/4 > P(' '|a) = 1/8
    w = Question(("a", "c"), (" a", " a"), gold=1, lengths=None)
    r = evaluate_task(model, tok, [w, q])
    assert r.acc_norm is None and r.n == 2
    assert r.lls[0] == pytest.approx([math.log(1 / 16), math.log(1 / 8)], abs=1e-12)
    assert r.acc == pytest.approx(0.5)  # w right, q wrong


def _write_records(path, docs):
    with gzip.open(path, "wt") as fh:
        for i, doc in enumerate(docs):
            for _ in range(2):  # one record per choice, as the OLMES request files hold
                fh.write(json.dumps({"doc_id": i, "request_type": "loglikelihood", "doc": doc}) + "\n")
            fh.write(json.dumps({"doc_id": 1_000_000 + i, "doc": doc}) + "\n")  # unconditioned request: skipped


def test_task_records_become_lm_eval_prompts(tmp_path, monkeypatch):
    from kvlab import assets

    files = {
        "piqa": [{"goal": "Open a jar", "sol1": "twist the lid", "sol2": "hit it", "label": 0}],
        "winogrande": [{"sentence": "Ann helped Bo because _ was kind.", "option1": "Ann", "option2": "Bo",
                        "answer": "1"}],
        "hellaswag": [{"query": "Cooking: A man cuts onions. He", "choices": ["cries.", "flies.", "sings.", "runs."],
                       "gold": 0}],
        "arc-easy": [{"query": "Question: What is hot?\nAnswer:", "choices": ["ice", "fire", "snow"], "gold": 1},
                     {"query": "Question: What is cold?\nAnswer:", "choices": ["ice", "fire"], "gold": 0}],
    }
    for name, docs in files.items():
        _write_records(tmp_path / f"{name}.gz", docs)
    monkeypatch.setattr(assets, "fetch", lambda name, progress=False: tmp_path / f"{name}.gz")
    (piqa,) = load_task("piqa")
    assert piqa.contexts == ("Question: Open a jar\nAnswer:",) * 2
    assert piqa.continuations == (" twist the lid", " hit it") and piqa.gold == 0 and piqa.lengths == (13, 6)
    (wino,) = load_task("winogrande")
    assert wino.contexts == ("Ann helped Bo because Ann", "Ann helped Bo because Bo")
    assert wino.continuations == (" was kind.", " was kind.") and wino.gold == 0 and wino.lengths is None
    (hella,) = load_task("hellaswag")
    assert hella.continuations[0] == " cries." and hella.gold == 0 and len(hella.contexts) == 4
    arc = load_task("arc-easy")
    assert len(arc) == 2 and arc[0].gold == 1 and arc[1].contexts[0] == "Question: What is cold?\nAnswer:"
    assert len(load_task("arc-easy", 1)) == 1


def test_bad_inputs_raise_value_error():
    model, tok = Bigram(P), CharTokenizer()
    with pytest.raises(ValueError, match="at least 2 choices"):
        choice_metrics([-1.0], 0)
    with pytest.raises(ValueError, match="gold must be a choice index"):
        choice_metrics([-1.0, -2.0], 2)
    with pytest.raises(ValueError, match="one positive length per choice"):
        choice_metrics([-1.0, -2.0], 0, [3])
    with pytest.raises(ValueError, match="NaN"):
        choice_metrics([float("nan"), -2.0], 0)
    with pytest.raises(ValueError, match="gold must index a choice"):
        Question(("a", "a"), (" a", " b"), gold=2, lengths=None)
    with pytest.raises(ValueError, match="one context per choice"):
        Question(("a",), (" a", " b"), gold=0, lengths=None)
    with pytest.raises(ValueError, match="non-empty string"):
        encode_pair(tok, "a", "")
    with pytest.raises(ValueError, match="at least one context token"):
        loglikelihood(model, [], [1])
    with pytest.raises(ValueError, match="task must be one of"):
        load_task("mmlu-pro")
    with pytest.raises(ValueError, match="n must be"):
        load_task("piqa", 0)
    with pytest.raises(ValueError, match="non-empty list of Question"):
        evaluate_task(model, tok, [])
    assert zeroshot.TASKS == ("piqa", "winogrande", "hellaswag", "arc-easy", "arc-challenge")

