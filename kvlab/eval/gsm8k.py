"""GSM8K-CoT, 8-shot, under a KV method (SepLLM Table 1, 15-17): the benchmark and a proxy.

* **Benchmark** (:func:`gsm8k_generate`): the standard 8 exemplars (``Q: ... A: ... The answer is N.``),
  greedy generation, then the two answer extractions the paper reports (lm-eval-harness conventions,
  re-implemented): ``strict-match`` reads the number after "The answer is"; ``flexible-extract`` takes the
  last number in the generation. A 135M model solves almost none of these, so its accuracy is noise.
* **Proxy** (:func:`gsm8k_answer_nll`): the teacher-forced mean NLL (nats/token) of the reference
  solution, written in the exemplars' style, after the 8-shot prompt, under the method's prefill pattern.
  It needs no generation and still orders the methods by how much of the context they keep usable.

A method is a prefill pattern (``kvlab.sepllm.SepLLMPattern`` ...) plus, for generation, the policy that
physically keeps the same entries (``kvlab.policies.SepLLM`` ...). The prompt is prefilled with the pattern
through a :class:`~kvlab.core.KVCache` of that policy, then each new token attends to what the policy kept
(the paper's training-free pipeline, Sec. 3.2). ``r.KV`` is the mean, over generated tokens, of entries held
over tokens seen, averaged over layers.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import torch

from kvlab.baselines import Full
from kvlab.core import KVCache, Policy, kv_ratio, use_pattern

__all__ = ["GSM8KResult", "cot_prompt", "reference_solution", "extract_answers", "gsm8k_generate",
           "gsm8k_answer_nll", "load_gsm8k"]

_STRICT = re.compile(r"The answer is \$?(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
_NUMBER = re.compile(r"-?\$?[0-9][0-9,]*(?:\.[0-9]+)?")


def load_gsm8k(n: int | None = None, *, start: int = 0) -> tuple[list[dict], list[dict]]:
    """(problems, exemplars): the first ``n`` test problems from ``start`` and the 8 CoT exemplars."""
    from kvlab import datasets

    problems = datasets.load_records("gsm8k")
    stop = None if n is None else start + n
    return problems[start:stop], datasets.load_records("gsm8k-cot-prompt")


def cot_prompt(question: str, exemplars: list[dict]) -> str:
    """The 8-shot CoT prompt: ``Q: <q>\\nA: <target>\\n\\n`` per exemplar, then ``Q: <question>\\nA:``."""
    shots = "".join(f"Q: {e['question']}\nA: {e['target']}\n\n" for e in exemplars)
    return f"{shots}Q: {question}\nA:"


def reference_solution(answer: str) -> str:
    """GSM8K's worked answer in the exemplars' style: calculator notes ``<<...>>`` removed, lines joined,
    and ``#### N`` turned into ``The answer is N.`` (with the leading space the prompt's ``A:`` expects)."""
    body, _, final = answer.partition("####")
    body = re.sub(r"<<[^>]*>>", "", body)
    lines = [line.strip() for line in body.strip().splitlines() if line.strip()]
    text = " ".join(line if line.endswith((".", "!", "?")) else line + "." for line in lines)
    return f" {text} The answer is {final.strip()}."


def _normalise(number: str | None) -> str | None:
    if number is None:
        return None
    s = number.replace(",", "").replace("$", "").rstrip(".")
    try:
        value = float(s)
    except ValueError:
        return None
    return str(int(value)) if value == int(value) else str(value)


def extract_answers(generation: str) -> tuple[str | None, str | None]:
    """(flexible, strict) answers of a generation, normalised (``"1,000.00"`` -> ``"1000"``); None if absent.

    strict: the number after the first ``The answer is``; flexible: the last number anywhere.
    """
    strict = _STRICT.search(generation)
    numbers = _NUMBER.findall(generation)
    return (_normalise(numbers[-1]) if numbers else None, _normalise(strict.group(1)) if strict else None)


def _target(answer: str) -> str:
    return _normalise(answer.split("####")[-1].strip())


@dataclass
class GSM8KResult:
    """Per-problem outputs and the summary numbers of one method."""

    method: str
    flexible: list[bool] = field(default_factory=list)
    strict: list[bool] = field(default_factory=list)
    kv_ratio: list[float] = field(default_factory=list)
    generations: list[str] = field(default_factory=list)
    answer_nll: list[float] = field(default_factory=list)

    @property
    def flexible_accuracy(self) -> float:
        return 100.0 * sum(self.flexible) / max(len(self.flexible), 1)

    @property
    def strict_accuracy(self) -> float:
        return 100.0 * sum(self.strict) / max(len(self.strict), 1)

    @property
    def mean_kv_ratio(self) -> float:
        return 100.0 * sum(self.kv_ratio) / max(len(self.kv_ratio), 1)

    @property
    def mean_answer_nll(self) -> float:
        return sum(self.answer_nll) / max(len(self.answer_nll), 1)


@torch.no_grad()
def gsm8k_generate(model, tokenizer, problems: list[dict], exemplars: list[dict], *, pattern=None,
                   policy: Policy | None = None, layers=None, max_new_tokens: int = 256, name: str = "",
                   progress: bool = True) -> GSM8KResult:
    """The real benchmark: 8-shot CoT prompt, prefill under ``pattern``, greedy decoding through ``policy``.

    Generation stops at ``max_new_tokens``, at EOS, or when the model starts the next ``Q:``.
    """
    from tqdm.auto import tqdm

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    policy = policy if policy is not None else Full()
    device = next(model.parameters()).device
    out = GSM8KResult(name or repr(policy))
    prefix = _prefix(model, tokenizer, exemplars, pattern, policy, layers)
    for problem in tqdm(problems, desc=f"gsm8k {out.method}", disable=not progress):
        ids = tokenizer(_question(problem), add_special_tokens=False, return_tensors="pt").input_ids.to(device)
        cache = copy.deepcopy(prefix)
        with use_pattern(model, pattern, layers):
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
        tokens, ratios = [], []
        for _ in range(max_new_tokens):
            token = logits.argmax(dim=-1, keepdim=True)
            if tokenizer.eos_token_id is not None and int(token) == tokenizer.eos_token_id:
                break
            tokens.append(int(token))
            if "Q:" in tokenizer.decode(tokens[-4:]) or "\n\n" in tokenizer.decode(tokens[-3:]):
                break
            logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1]
            ratios.append(sum(cache.held()) / (len(cache.held()) * cache.seen))
        text = tokenizer.decode(tokens, skip_special_tokens=True).split("Q:")[0]
        flexible, strict = extract_answers(text)
        want = _target(problem["answer"])
        out.generations.append(text)
        out.flexible.append(flexible == want)
        out.strict.append(strict == want)
        out.kv_ratio.append(sum(ratios) / len(ratios) if ratios else 1.0)
    return out


@torch.no_grad()
def gsm8k_answer_nll(model, tokenizer, problems: list[dict], exemplars: list[dict], *, pattern=None, layers=None,
                     name: str = "", progress: bool = True) -> GSM8KResult:
    """The proxy: teacher-forced mean NLL of :func:`reference_solution` after the 8-shot prompt, under
    ``pattern`` (one forward pass per problem), and the pattern's kept share of the causal entries (r.KV)."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    out = GSM8KResult(name or repr(pattern))
    prefix = _prefix(model, tokenizer, exemplars, pattern, Full(), layers)
    prefix_ids = prefix.layers[0].token_ids.cpu()
    for problem in tqdm(problems, desc=f"gsm8k-nll {out.method}", disable=not progress):
        question = tokenizer(_question(problem), add_special_tokens=False, return_tensors="pt").input_ids
        answer = tokenizer(reference_solution(problem["answer"]), add_special_tokens=False,
                           return_tensors="pt").input_ids
        ids = torch.cat([question, answer], dim=1).to(device)
        cache = copy.deepcopy(prefix)
        with use_pattern(model, pattern, layers):
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0].float()
        q = question.shape[1]
        out.answer_nll.append(float(torch.nn.functional.cross_entropy(logits[q - 1:-1], ids[0, q:])))
        out.kv_ratio.append(kv_ratio(pattern, torch.cat([prefix_ids, ids.cpu()], dim=1)))
    return out


def _question(problem: dict) -> str:
    return f"Q: {problem['question']}\nA:"


@torch.no_grad()
def _prefix(model, tokenizer, exemplars, pattern, policy, layers) -> KVCache:
    """The 8 exemplars prefilled once (under ``pattern``) into a cache of ``policy``; problems copy it.

    The prompt's ids are the exemplars' ids followed by the question's ids, each tokenized on its own
    (the boundary is a blank line, where BPE does not merge anyway)."""
    device = next(model.parameters()).device
    ids = tokenizer(cot_prompt("", exemplars).rsplit("Q: ", 1)[0], return_tensors="pt").input_ids.to(device)
    cache = KVCache(model, policy)
    with use_pattern(model, pattern, layers):
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    return cache
