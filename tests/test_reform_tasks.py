"""REFORM's experiment tasks and baselines (kvlab.eval.tasks / compare): RULER needles, variable tracking,
BABILong-style stories, repository-level code completion, InfiniPot's keep rule, BM25 OP-RAG, scoring."""

from __future__ import annotations

import random
import re

import pytest
import torch

from kvlab.experiments.reform import compare as compare
from kvlab.eval import tasks as T
from kvlab.eval.tasks import LongTask, task_score

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok():
    from kvlab.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


def _length(tok, task: LongTask) -> int:
    return len(tok(task.prompt)["input_ids"])


def _evidence(task: LongTask) -> list[str]:
    return [task.context[a:b] for a, b in task.gold_chars]


# --------------------------------------------------------------------------- RULER


@pytest.mark.parametrize("kind", list(T.RULER_NEEDLES))
def test_needles_hold_every_answer_at_known_places(tok, kind):
    n_keys, n_values, n_asked = T.RULER_NEEDLES[kind]
    task = T.needle_task(tok, 1500, kind, seed=3)
    assert abs(_length(tok, task) - 1500) < 120
    needles = re.findall(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.", task.context)
    assert len(needles) == n_keys * n_values
    assert len(task.info["answers"]) == n_values * n_asked
    evidence = _evidence(task)
    assert len(evidence) == n_values * n_asked  # the asked keys' needles, and nothing else
    for value in task.info["answers"]:
        assert sum(value in e for e in evidence) == 1
        assert value in task.answer
    for key in task.info["asked"]:
        assert key in task.query and key in task.answer_prefix
    assert task.prompt.startswith("Some special magic numbers" if n_values * n_asked > 1 else "A special magic number")
    gold = task.gold_tokens(tok)
    assert 0 < int(gold.sum()) < gold.numel() // 4


def test_needle_kind_checked(tok):
    with pytest.raises(ValueError, match="kind must be one of"):
        T.needle_task(tok, 500, "multi")


def test_variable_tracking_chain_is_in_order_and_complete(tok):
    task = T.variable_tracking_task(tok, 1200, seed=5)
    assert abs(_length(tok, task) - 1200) < 120
    evidence = _evidence(task)
    names = task.info["answers"]
    assert len(names) == 5 and evidence[0] == f"VAR {names[0]} = {task.info['value']}."
    for j in range(1, 5):  # each assignment comes after the one it copies
        assert evidence[j] == f"VAR {names[j]} = VAR {names[j - 1]}."
    assert [a for a, _ in task.gold_chars] == sorted(a for a, _ in task.gold_chars)
    assert task.info["value"] in task.query and task.answer == " " + " ".join(names)


# --------------------------------------------------------------------------- BABILong


@pytest.mark.parametrize("which", ["qa1", "qa2"])
def test_babi_answer_follows_from_the_evidence(which):
    for seed in range(30):
        facts, question, prefix, answer, evidence = T.babi_story(random.Random(seed), which, 8)
        place = answer.strip()
        last = facts[evidence[-1]]
        assert last.endswith(f"the {place}.") or "there" in last
        if which == "qa1":
            who = question.split()[-1][:-1]
            moves = [i for i, f in enumerate(facts) if f.startswith(who + " ")]
            assert evidence == [moves[-1]] and facts[moves[-1]].endswith(f"the {place}.")
        else:
            obj = question.split()[-1][:-1]
            pick = next(i for i, f in enumerate(facts) if f.endswith(f"the {obj} there."))
            holder = facts[pick].split()[0]
            moves = [i for i, f in enumerate(facts) if f.startswith(holder + " ") and i != pick]
            assert sorted({pick, moves[-1]}) == evidence and facts[moves[-1]].endswith(f"the {place}.")


def test_babilong_hides_facts_in_order(tok):
    task = T.babilong_task(tok, 1500, task="qa2", seed=2)
    assert abs(_length(tok, task) - 1500) < 120
    at = [task.context.index(f) for f in task.info["facts"]]
    assert at == sorted(at)
    assert _evidence(task) == [task.info["facts"][i] for i in task.info["evidence"]]
    with pytest.raises(ValueError, match="qa1"):
        T.babi_story(random.Random(0), "qa3")


# --------------------------------------------------------------------------- repository code completion


def test_edit_similarity():
    assert T.edit_similarity("  foo(a)", "foo(a)  ") == 1.0
    assert T.edit_similarity("foo(a)", "foo(b)") == pytest.approx(1 - 1 / 6)
    assert T.edit_similarity("", "abc") == 0.0


def test_api_uses_finds_cross_file_calls():
    files = {"p/a.py": "def helper_fn(x):\n    return x\n", "p/b.py": "import os\n\n\n\ny = helper_fn(3)\n",
             "p/c.py": "z = 1\n"}
    assert T.api_uses(files) == [("p/a.py", "p/b.py", 4, "helper_fn")]
    files["p/c.py"] = "def helper_fn():\n    pass\n"  # defined twice: not a unique API any more
    assert T.api_uses(files) == []


def test_repo_task_puts_the_definition_in_and_the_using_file_last(tok):
    task = T.repo_task(tok, 3000, seed=1)
    info = task.info
    assert _length(tok, task) <= 3000 + 50
    definition = _evidence(task)[0]
    assert definition.startswith(f"def {info['name']}(")
    assert info["name"] + "(" in task.answer and task.prompt.endswith("\n")  # RepoEval: the target line starts next
    last_file = task.context.rindex("# file: ")
    assert task.context[last_file:].startswith(f"# file: {info['file']}")
    assert task.context.index(f"# file: {info['definition']}") < last_file
    assert task_score(task.answer + "\n", task) == 1.0


# --------------------------------------------------------------------------- baselines and scoring


def test_task_score_rules():
    multi = LongTask("ruler-multivalue", "c", "q", "p", " 1, 2", [], {"answers": ["1234567", "7654321"]})
    assert task_score("1234567 and 7654321", multi) == 1.0
    assert task_score("only 1234567", multi) == 0.5
    single = LongTask("kv", "c", "q", "p", " 649dda6e-b49c-43dc-acbc-408cc5521660", [])
    assert task_score(" 649dda6e-b49c-43dc", single) == 1.0


def test_infinipot_keep_splits_the_room_between_cap_and_nuc():
    cap = torch.tensor([0, 0, 9, 8, 0, 0, 0, 0, 0, 0], dtype=torch.float)
    nuc = torch.tensor([0, 0, 9, 0, 0, 7, 6, 0, 0, 0], dtype=torch.float)
    keep = compare.infinipot_keep(cap, nuc, budget=6, n_initial=1, n_recent=1)
    assert keep.tolist() == [0, 2, 3, 5, 6, 9]  # CaP's two best (2, 3), then NuC's best of the rest (5, 6)
    assert compare.infinipot_keep(cap, nuc, 20, 1, 1).tolist() == list(range(10))


def test_bm25_picks_the_chunk_with_the_question_words_in_order():
    class WordTok:
        vocab = "alpha beta gamma delta zebra needle".split()

        def decode(self, ids):
            return " ".join(self.vocab[int(i)] for i in ids)

    ids = torch.tensor([[0, 1, 2, 3] * 2 + [5, 4, 5, 4] + [0, 1, 2, 3]])
    chosen_ids, chosen = compare.bm25_ids(WordTok(), ids, "where is the zebra needle?", 8, chunk=4)
    assert 2 in chosen.tolist() and chosen.tolist() == sorted(chosen.tolist())  # the zebra-needle chunk, in order
    assert chosen_ids.shape == (1, 8)


def test_new_methods_run_on_a_tiny_model(tiny_llama):
    class Tok:
        eos_token_id = None
        all_special_ids: list[int] = []

        def __call__(self, text, return_tensors=None, add_special_tokens=True, return_offsets_mapping=False):
            if return_offsets_mapping:  # one character a token
                return {"input_ids": [ord(c) % 96 for c in text],
                        "offset_mapping": [(i, i + 1) for i in range(len(text))]}
            return type("E", (), {"input_ids": torch.tensor([[ord(c) % 96 for c in text]])})()

        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(65 + int(i) % 26) for i in ids)

    task = LongTask("kv", "x" * 180, "?", "", " ab", [(0, 3)])
    for method in ("tova", "infinipot", "reform_no_gather"):
        r = compare.run_method(method, tiny_llama, Tok(), task, budget=48, chunk_size=40, n_initial=4, n_recent=4,
                               n_final=4, max_new_tokens=3, heads=["v:1:0"])
        assert r.method == method and r.answer_nll > 0
        if method == "infinipot":
            assert r.extra["held"] == 48
        if method == "reform_no_gather":  # what compression kept: the budget, context tokens only
            assert r.extra["gathered"] == 48


def test_experiment_helpers(tiny_llama):
    from kvlab.experiments.reform import tables as E

    summary = {"single": {"reform": {"accuracy": 100.0}, "h2o": {"accuracy": 0.0}},
               "vt": {"reform": {"accuracy": 50.0}, "h2o": {"accuracy": 10.0}}}
    assert E.averages(summary, ["single", "vt", "missing"]) == {"h2o": 5.0, "reform": 75.0}
    rows = E.ablations(tiny_llama)
    assert set(rows) == {"reform", "no gather", "no recompute", "no early exit", "random heads", "kernel 5"}
    assert rows["no early exit"][1]["early_exit_layer"] == tiny_llama.config.num_hidden_layers
    assert all(h.layer < int(0.7 * tiny_llama.config.num_hidden_layers) for h in rows["random heads"][1]["heads"])
    table = E.side_by_side("t", {"reform": 79.9}, {"reform": 12.5, "h2o": 0.0})
    assert "79.9" in table and "12.5" in table and table.splitlines()[-1].split() == ["h2o", "-", "0.0"]
