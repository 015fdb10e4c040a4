"""Issue 23: how the retrieval harnesses generate and score answers (RULER's way: a fixed number of tokens, no
stop at a newline), the code-completion boundary (RepoEval's), and the same initial / recent entries (and the
question) kept by every eviction baseline of REFORM's tables."""

from __future__ import annotations

import pytest
import torch

from kvlab.eval import retrieval
from kvlab.experiments.reform import compare as compare
from kvlab.eval import tasks as T
from kvlab.eval.tasks import LongTask, task_score

pytestmark = pytest.mark.usefixtures("one_thread")

#: what the bigram model says after a prompt ending in "s": a colon, a newline, then the value
SCRIPT = "s:\n1234567."


class CharTok:
    """One token per character (codes below 128); no end-of-text token."""

    eos_token_id = None
    all_special_ids: list[int] = []

    def __call__(self, text, return_tensors=None, add_special_tokens=True, return_offsets_mapping=False):
        ids = [ord(c) % 128 for c in text]
        if return_offsets_mapping:
            return {"input_ids": ids, "offset_mapping": [(i, i + 1) for i in range(len(text))]}
        if return_tensors is None:
            return {"input_ids": ids}
        return type("Encoding", (), {"input_ids": torch.tensor([ids])})()

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(int(i)) for i in ids)


@pytest.fixture(scope="module")
def bigram_llama():
    """A real Llama (2 layers, eager attention) whose layers add nothing and whose head maps each character to
    the next one of :data:`SCRIPT` (any other character to a space): a model that answers ``":\\n1234567."``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvlab.core import attach

    cfg = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=16, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    nxt = torch.full((128,), ord(" "))
    for a, b in zip(SCRIPT, SCRIPT[1:]):
        nxt[ord(a)] = ord(b)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(128))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()
        model.lm_head.weight[nxt, torch.arange(128)] = 1.0
    return attach(model)


def test_greedy_answer_goes_past_a_leading_newline():
    tok = CharTok()
    script = iter(":\n1234567.   ")

    def logits_of(ch):
        out = torch.zeros(1, 128)
        out[0, ord(ch)] = 1.0
        return out

    first = logits_of(next(script))
    said = retrieval.greedy_answer(tok, first, lambda token: logits_of(next(script)), 12)
    assert said == ":\n1234567.  "  # exactly 12 tokens, the newline did not stop it
    assert retrieval.string_match_all(said, ["1234567"]) == 1.0
    with pytest.raises(ValueError, match="max_new_tokens"):
        retrieval.greedy_answer(tok, first, lambda token: first, 0)


def test_ruler_string_match_scores():
    assert retrieval.string_match_all("A: 111 and 222", ["111", "222", "333", "444"]) == 0.5
    assert retrieval.string_match_part("A: 111 and 222", ["111", "999"]) == 1.0
    assert retrieval.string_match_part("nothing", ["111", "999"]) == 0.0
    with pytest.raises(ValueError, match="references"):
        retrieval.string_match_all("x", [])


def test_lacache_harness_finds_a_value_after_colon_newline(bigram_llama):
    from kvlab.baselines import Full, StreamingLLM

    prompt = "filler text " * 8 + "The special magic number is"
    for policy in (Full(), StreamingLLM(sink=4, window=32)):
        said, nll = retrieval.ask(bigram_llama, CharTok(), prompt, " 1234567", policy, chunk_size=16,
                                  max_new_tokens=12)
        assert said.startswith(":\n1234567"), said  # not cut to ":\n"
        assert retrieval.string_match_all(said, ["1234567"]) == 1.0
        assert nll > 0


@pytest.mark.parametrize("method", ["truncation", "streamingllm", "h2o", "tova"])
def test_reform_harness_finds_a_value_after_colon_newline(bigram_llama, method):
    task = LongTask("ruler-single", "filler text " * 16, "\nWhat is the special magic number?",
                    " The special magic number is", " 1234567", [(0, 4)], {"answers": ["1234567"]})
    r = compare.run_method(method, bigram_llama, CharTok(), task, budget=100, chunk_size=32, n_initial=4,
                           n_recent=8, max_new_tokens=12)
    assert r.text.startswith(":\n1234567"), r.text
    assert r.score == 1.0 and r.correct


# --------------------------------------------------------------------------- the same initial/recent for all


class _Recording(compare.KVCache):
    made: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _Recording.made.append(self)


@pytest.mark.parametrize("method", ["h2o", "tova"])
def test_baselines_keep_initial_recent_and_the_question(tiny_llama, method, monkeypatch):
    """Through run_method itself: after the prompt and the answer, every layer of the cache still holds the first
    n_initial context tokens and every question token (TOVA alone used to evict them)."""
    class Tok(CharTok):
        def __call__(self, text, **kwargs):
            out = super().__call__(text, **kwargs)
            if kwargs.get("return_tensors"):
                out.input_ids = out.input_ids % 96  # the tiny model's vocabulary
            return out

    monkeypatch.setattr(compare, "KVCache", _Recording)
    _Recording.made.clear()
    context = "".join(chr(33 + (7 * i) % 90) for i in range(150))
    question = "\nWhich value belongs to the key asked here, exactly?"
    task = LongTask("kv", context, question, " It is", " 42", [(0, 3)])
    n_initial = 6
    compare.run_method(method, tiny_llama, Tok(), task, budget=90, chunk_size=64, n_initial=n_initial, n_recent=4,
                       max_new_tokens=3)
    cache = _Recording.made[-1]
    start = len(context)
    wanted = set(range(n_initial)) | set(range(start, start + len(question + " It is")))
    for layer in cache.layers:
        held = set(layer.positions[0].tolist())
        assert wanted <= held, sorted(wanted - held)


def test_keep_initial_recent_checks_the_room():
    from kvlab.baselines import TOVA

    with pytest.raises(ValueError, match="budget"):
        compare.baseline_policy("tova", 16, 8, 8)
    with pytest.raises(ValueError, match="question"):
        compare.KeepInitialRecent(TOVA(64), 4, 4, question=(9, 3))
    assert isinstance(compare.baseline_policy("tova", 64, 8, 8, question=(10, 20)), compare.KeepInitialRecent)


# --------------------------------------------------------------------------- code completion (RepoEval)


def test_repo_prompt_ends_at_the_start_of_the_target_line():
    from kvlab.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m")
    task = T.repo_task(tok, 3000, seed=1)
    assert task.prompt.endswith("\n")  # the line before the target is complete
    assert not task.answer.startswith("\n") and task.info["name"] + "(" in task.answer
    # a model that writes the target line (then goes on) scores 1; a comment after it does not count
    assert task_score(task.answer + "\n    more_code()\n", task) == 1.0
    assert task_score("\n" + task.answer.strip() + "  \n", task) == 1.0
    assert task_score("  # a comment\n" + task.answer, task) < 1.0


def test_repoeval_prediction_and_similarity():
    assert T.repo_prediction("\n\n  x = f(1)\n  y = 2\n", "x = f(1)") == "x = f(1)"
    assert T.repo_prediction("a\n\nb\nc", "a\nb") == "a\nb"
    assert T.edit_similarity("abcd", "abxd") == pytest.approx(2 * 3 / 8)  # fuzz.ratio: 2 LCS / total length
    assert T.edit_similarity("", "") == 1.0 and T.edit_similarity("", "abc") == 0.0


def test_babilong_score_needs_the_answer_alone():
    assert T.babilong_score(" kitchen.\nQuestion", " kitchen") == 1.0
    assert T.babilong_score(" kitchen or the garden", " kitchen") == 0.0
    assert T.babilong_score(" garden", " kitchen") == 0.0
