"""GSM8K-CoT generation: where a generation stops, what is read from it, and the batched static engine.

The stop rule is lm-eval gsm8k-cot's ``until`` list (``Q:``, ``</s>``, ``<|im_end|>``) plus the model's end-of-turn
tokens and chat markers; the answers are read with lm-eval's strict-match and flexible-extract filters. The batched
generation (:func:`kvlab.eval.gsm8k.gsm8k_generate_static`) must give every problem exactly what the one-at-a-time
hooks harness gives it.
"""

from __future__ import annotations

import pytest
import torch

from conftest import _tiny
from kvlab.eval.gsm8k import (LM_EVAL_UNTIL, UNTIL, cut_at_stop, extract_answers, finish_generation, gsm8k_generate,
                              gsm8k_generate_static, stop_token_ids)
from kvlab.policies import Full, SepLLM, StreamingLLM
from kvlab.sepllm.pattern import SepLLMPattern, StreamingPattern

pytestmark = pytest.mark.usefixtures("one_thread")

# Qwen2.5-Coder-0.5B-Instruct's own greedy generations after the 8-shot CoT prompt (the first GSM8K test problems,
# benchmarks/results/headline/model_choice), every generated token decoded: the answer, then the end of its turn or
# the next exemplar. (answer both filters read once cut, stop)
REAL = [
    (' Janet started with 16 eggs per day. She ate 3 for breakfast every morning and bakes muffins for '
     "her friends every day with four. She sells the remainder at the farmers' market daily for $2 per "
     'fresh duck egg. So she sells 16 - 3 - 4 = 11 fresh duck eggs. 11 * 2 = 22. The answer is '
     '22.<|im_end|>',
     '22', '<|im_end|>'),
    (' A robe takes 2 bolts of blue fiber and half that much white fiber. So it takes 2 + 0.5 = 2.5 '
     'bolts. The answer is 2.5.\n\nQ:',
     '2.5', 'Q:'),
    (' Carla started with 200 GB. Normally she can download 2 GB/minute, but 40% of the way through the '
     'download, Windows forces a restart to install updates, which takes 20 minutes. Then Carla has to '
     'restart the download from the beginning. So the load is 200 / 2 = 100 GB. The answer is 100 '
     'GB.<|im_end|>',
     '100', '<|im_end|>'),
]
# Run-ons of the shapes the 1.5B model and other chat models produce: a "Human:" turn after the answer, blank lines
# and more text. Uncut, flexible-extract reads the run-on text. (raw, gold, stop)
SHAPES = [
    (" It takes 2 bolts of blue fiber and 2 / 2 = 1 bolt of white fiber. So in total it takes 2 + 1 = 3 bolts. "
     "The answer is 3.\n\nHuman: Can you explain how you got 4 bolts of fiber in total?\n\nAssistant: Sure, "
     "2 + 2 = 4", "3", "Human:"),
    (" He runs 3 * 3 = 9 sprints. 9 * 60 = 540 meters. The answer is 540.\n\n\n\n\n\nThe answer is 9.", "540",
     "\n\n\n"),
]


@pytest.mark.parametrize("raw,answer,stop", REAL, ids=[r[2] for r in REAL])
def test_real_generations_are_cut_at_the_end_of_the_turn(raw, answer, stop):
    text, found = cut_at_stop(raw)
    assert found == stop and stop not in text and text == raw[:raw.index(stop)]
    assert extract_answers(text) == (answer, answer)


@pytest.mark.parametrize("raw,gold,stop", SHAPES, ids=["Human turn", "blank lines"])
def test_run_on_generation_is_cut_where_the_answer_ends(raw, gold, stop):
    text, found = cut_at_stop(raw)
    assert found == stop and stop not in text
    assert extract_answers(text) == (gold, gold)  # flexible and strict agree once cut
    assert extract_answers(raw)[0] != gold  # uncut, flexible-extract reads the run-on text


def test_until_keeps_lm_eval_first_and_adds_turn_markers():
    assert UNTIL[:3] == LM_EVAL_UNTIL == ("Q:", "</s>", "<|im_end|>")
    for marker in ("<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "Human:", "User:", "\n\n\n"):
        assert marker in UNTIL
    assert "\n\n" not in UNTIL  # a blank line inside a worked answer does not end it (lm-eval v3 neither)
    assert cut_at_stop("a\n\nb") == ("a\n\nb", None)
    assert cut_at_stop("x Human: y Q: z") == ("x ", "Human:")  # the earliest stop wins, whatever its rank


def test_lm_eval_filters():
    """strict-match: ``The answer is (\\-?[0-9\\.\\,]+).`` (one character must follow); flexible-extract: the last
    ``(-?[$0-9.,]{2,})|(-?[0-9]+)``; both normalised as lm-eval's exact_match (``,``, ``$``, trailing ``.``)."""
    assert extract_answers(" So 48 + 24 = 72. The answer is 72.") == ("72", "72")
    # nothing after N: lm-eval's "." takes N's last digit, so strict-match reads "7" (and misses) as lm-eval does
    assert extract_answers("The answer is 72") == ("72", "7")
    assert extract_answers("The answer is 7") == ("7", None)
    assert extract_answers("The total is $1,200.00 dollars") == ("1200.00", None)  # lm-eval: 1200.00 != 1200
    assert extract_answers("The answer is 1,200.") == ("1200", "1200")
    assert extract_answers("The answer is $1,200.") == ("1200", None)  # strict-match allows no "$"
    assert extract_answers("I think 5 or maybe -6 today") == ("-6", None)
    assert extract_answers("no numbers") == (None, None)


class _SpecialTokenizer:
    """The parts of a Qwen tokenizer the stop rule reads."""

    eos_token_id = 151645
    unk_token_id = None
    all_special_tokens = ["<|im_end|>", "<|endoftext|>", "<|im_start|>"]
    added_tokens_encoder = {"<|im_end|>": 151645, "<|endoftext|>": 151643, "<|im_start|>": 151644}

    def convert_tokens_to_ids(self, token):
        return self.added_tokens_encoder[token]

    def decode(self, ids, skip_special_tokens=False):
        names = {v: k for k, v in self.added_tokens_encoder.items()}
        return "".join(names.get(i, chr(i)) for i in ids)


def test_stop_tokens_are_eos_and_single_token_markers():
    tok = _SpecialTokenizer()
    assert stop_token_ids(tok) == {151645, 151643, 151644}
    text, stop = finish_generation(tok, [ord(c) for c in " The answer is 5."] + [151645], {151645})
    assert (text, stop) == (" The answer is 5.", "<|im_end|>")
    assert finish_generation(tok, [ord(c) for c in " 5 5"], {151645}) == (" 5 5", "max_new_tokens")


class ByteTokenizer:
    """One id per character (``ord % 90 + 2``); no special tokens."""

    bos_token_id = eos_token_id = None

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        ids = [ord(c) % 90 + 2 for c in text]
        return type("Encoding", (), {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids})()

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i - 2) if i >= 2 else "?" for i in ids)


TOK = ByteTokenizer()
SEPS = [TOK(c).input_ids[0] for c in ".,\n "]
EXEMPLARS = [{"question": "a b, c.", "target": "c d. The answer is 1."},
             {"question": "e f.", "target": "g. The answer is 2."}]
PROBLEMS = [{"question": "how " + "ab cd. " * k + "?", "answer": f"x\n#### {k}"} for k in (1, 5, 3, 8, 2)]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("method", ["vanilla", "sepllm", "streamingllm"])
def test_batched_static_generation_equals_the_hooks_harness(arch, method):
    """Ragged prompts (5 problems, batch 2: three passes, the last padded), each problem's tokens, stop, answers
    and r.KV as the one-at-a-time harness that prefills under the method's pattern."""
    model = _tiny(arch)
    pattern, policy = {
        "vanilla": (None, Full()),
        "sepllm": (SepLLMPattern(SEPS, 2, 9), SepLLM(2, 9, separators=SEPS)),
        "streamingllm": (StreamingPattern(2, 9), StreamingLLM(sink=2, window=8, positions="original")),
    }[method]
    hooks = gsm8k_generate(model, TOK, PROBLEMS, EXEMPLARS, pattern=pattern, policy=policy, max_new_tokens=12,
                           progress=False)
    static = gsm8k_generate_static(model, TOK, PROBLEMS, EXEMPLARS, policy, max_new_tokens=12, batch=2,
                                   progress=False)
    assert static.raw == hooks.raw and static.generations == hooks.generations
    assert static.stops == hooks.stops and static.flexible == hooks.flexible and static.strict == hooks.strict
    torch.testing.assert_close(torch.tensor(static.kv_ratio), torch.tensor(hooks.kv_ratio), rtol=1e-9, atol=1e-3)
    if method != "vanilla":
        assert max(static.kv_ratio) < 1.0
