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

__all__ = ["GSM8KResult", "UNTIL", "LM_EVAL_UNTIL", "cot_prompt", "reference_solution", "extract_answers",
           "cut_at_stop", "stop_token_ids", "finish_generation", "gsm8k_generate", "gsm8k_generate_static",
           "gsm8k_answer_nll", "load_gsm8k"]

#: lm-evaluation-harness gsm8k-cot (task version 3.0, the ``gsm8k-cot-prompt`` asset): ``generation_kwargs.until``.
LM_EVAL_UNTIL = ("Q:", "</s>", "<|im_end|>")
#: Where an instruct model ends its turn or starts a new one, and a run of blank lines: lm-eval stops at the model's
#: EOS token as well (its HF backend adds it to ``until``); these are the other chat families' markers, so a model
#: that ends its answer and goes on with a "Human: ..." turn is cut where its answer ended.
TURN_MARKERS = ("<|endoftext|>", "<|im_start|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>",
                "Human:", "User:", "Assistant:", "Question:", "\n\n\n")
#: The stop strings of :func:`gsm8k_generate`: lm-eval's list first, then the turn markers.
UNTIL = LM_EVAL_UNTIL + TURN_MARKERS

# lm-eval gsm8k-cot's filters: strict-match takes the first "The answer is N."; flexible-extract the last match of
# its number pattern (the first non-empty group of that match)
_STRICT = re.compile(r"The answer is (\-?[0-9\.\,]+).")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
# lm-eval's exact_match settings for the task: these removed from prediction and reference, then compared ignoring case
_IGNORE = (r",", r"\$", r"(?s).*#### ", r"\.$")


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


def _normalise(answer: str | None) -> str | None:
    """lm-eval's exact_match normalisation: commas, ``$``, a ``#### `` prefix and one trailing period removed,
    lower-cased. None stays None (lm-eval's ``[invalid]``, which never matches)."""
    if answer is None:
        return None
    for pattern in _IGNORE:
        answer = re.sub(pattern, "", answer)
    return answer.strip().lower()


def extract_answers(generation: str) -> tuple[str | None, str | None]:
    """(flexible, strict) answers of a generation as lm-eval's gsm8k-cot filters read them, normalised as its
    exact_match compares them (``"$1,200."`` -> ``"1200"``); None when the pattern does not occur.

    strict: the number in the first ``The answer is N.`` (a character must follow N, as in lm-eval's regex);
    flexible: the last number-like match anywhere (``-?[$0-9.,]{2,}`` or ``-?[0-9]+``).
    """
    strict = _STRICT.search(generation)
    flexible = _FLEXIBLE.findall(generation)
    last = next((g for g in flexible[-1] if g), None) if flexible else None
    return _normalise(last), _normalise(strict.group(1)) if strict else None


def cut_at_stop(text: str, until: tuple[str, ...] = UNTIL) -> tuple[str, str | None]:
    """``(text before the earliest stop string, that stop string)``; ``(text, None)`` when none occurs.

    lm-eval cuts a generation at the first occurrence of any of its ``until`` strings; so does this."""
    hits = [(i, s) for s in until if (i := text.find(s)) >= 0]
    if not hits:
        return text, None
    i, stop = min(hits)
    return text[:i], stop


def stop_token_ids(tokenizer, until: tuple[str, ...] = UNTIL) -> set[int]:
    """Token ids that end a generation: the tokenizer's EOS and every stop string that is one special token of this
    vocabulary (``<|im_end|>``, ``<|endoftext|>`` ... for Qwen)."""
    ids = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    special = set(getattr(tokenizer, "all_special_tokens", []) or []) | set(
        getattr(tokenizer, "added_tokens_encoder", {}) or {})
    for s in until:
        if s in special:
            i = tokenizer.convert_tokens_to_ids(s)
            if isinstance(i, int) and i >= 0 and i != getattr(tokenizer, "unk_token_id", None):
                ids.add(i)
    return ids


def _target(answer: str) -> str:
    """The reference as lm-eval's doc_to_target writes it (the text after ``####``), normalised."""
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
    stops: list[str] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)  # every generated token decoded, before the cut at the stop

    def record(self, problem: dict, text: str, stop: str, kv: float, raw: str = "") -> None:
        """Score one generation against ``problem``'s answer (both lm-eval filters) and keep it."""
        flexible, strict = extract_answers(text)
        want = _target(problem["answer"])
        self.generations.append(text)
        self.flexible.append(flexible == want)
        self.strict.append(strict == want)
        self.kv_ratio.append(kv)
        self.stops.append(stop)
        self.raw.append(raw)

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
                   progress: bool = True, until: tuple[str, ...] = UNTIL) -> GSM8KResult:
    """The real benchmark: 8-shot CoT prompt, prefill under ``pattern``, greedy decoding through ``policy``.

    Generation stops at ``max_new_tokens``, at a token of :func:`stop_token_ids` (EOS, end of turn), or when the
    text holds one of the ``until`` strings (:data:`UNTIL`: lm-eval's ``Q:`` ... and the chat markers); the
    generation is then cut at the earliest stop string (:func:`cut_at_stop`), as lm-eval does, and ``r.stops`` says
    which stop ended each one (``"max_new_tokens"`` when none did).
    """
    from tqdm.auto import tqdm

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    policy = policy if policy is not None else Full()
    device = next(model.parameters()).device
    out = GSM8KResult(name or repr(policy))
    prefix = _prefix(model, tokenizer, exemplars, pattern, policy, layers)
    stop_ids = stop_token_ids(tokenizer, until)
    for problem in tqdm(problems, desc=f"gsm8k {out.method}", disable=not progress):
        ids = tokenizer(_question(problem), add_special_tokens=False, return_tensors="pt").input_ids.to(device)
        cache = copy.deepcopy(prefix)
        with use_pattern(model, pattern, layers):
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
        tokens, ratios = [], []
        for _ in range(max_new_tokens):
            token = logits.argmax(dim=-1, keepdim=True)
            tokens.append(int(token))
            if tokens[-1] in stop_ids or len(tokens) == max_new_tokens or _tail_stops(tokenizer, tokens, until):
                break  # the last token is never fed
            logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1]
            ratios.append(sum(cache.held()) / (len(cache.held()) * cache.seen))
        text, stop = finish_generation(tokenizer, tokens, stop_ids, until)
        out.record(problem, text, stop, sum(ratios) / len(ratios) if ratios else 1.0,
                   tokenizer.decode(tokens, skip_special_tokens=False))
    return out


@torch.no_grad()
def gsm8k_generate_static(model, tokenizer, problems: list[dict], exemplars: list[dict], policy: Policy | None = None,
                          *, max_new_tokens: int = 256, batch: int = 256, name: str = "", progress: bool = True,
                          until: tuple[str, ...] = UNTIL, compile: bool = False) -> GSM8KResult:
    """:func:`gsm8k_generate` for many problems at once: the static decode engine
    (:func:`kvlab.eval.fast.generate_static`), ``batch`` problems a pass, each prompt streamed through ``policy``.

    The same prompts (the exemplars' ids, then the question's), greedy tokens, stop rule, cut and scoring as
    :func:`gsm8k_generate` with ``pattern`` the policy's own prefill pattern (SepLLM, StreamingLLM with
    ``positions="original"``, Full: tested equal); a policy the static engine cannot run raises."""
    from kvlab.eval.fast import generate_static

    policy = policy if policy is not None else Full()
    out = GSM8KResult(name or repr(policy))
    prefix = tokenizer(cot_prompt("", exemplars).rsplit("Q: ", 1)[0]).input_ids
    prompts = [list(prefix) + list(tokenizer(_question(p), add_special_tokens=False).input_ids) for p in problems]
    stop_ids = stop_token_ids(tokenizer, until)

    def stopped(tokens: list[int]) -> bool:
        return cut_at_stop(tokenizer.decode(tokens, skip_special_tokens=False), until)[1] is not None

    runs = generate_static(model, prompts, policy, max_new_tokens=max_new_tokens, stop_ids=stop_ids, stopped=stopped,
                           batch=batch, compile=compile, progress=progress)
    for problem, run in zip(problems, runs):
        text, stop = finish_generation(tokenizer, run["tokens"], stop_ids, until)
        out.record(problem, text, stop, run["r_kv"], tokenizer.decode(run["tokens"], skip_special_tokens=False))
    return out


def _tail_stops(tokenizer, tokens: list[int], until: tuple[str, ...]) -> bool:
    """Whether the last few generated tokens spell a stop string (one spans at most a few tokens)."""
    tail = tokenizer.decode(tokens[-8:], skip_special_tokens=False)
    return any(s in tail for s in until)


def finish_generation(tokenizer, tokens: list[int], stop_ids: set[int], until: tuple[str, ...] = UNTIL
                      ) -> tuple[str, str]:
    """``(text, stop)`` of a finished greedy generation: the decoded tokens cut at the earliest stop string, and what
    stopped it (the stop string, ``"token <id>"`` for a stop token that spells none, or ``"max_new_tokens"``)."""
    text, stop = cut_at_stop(tokenizer.decode(tokens, skip_special_tokens=False), until)
    if stop is None and tokens and tokens[-1] in stop_ids:
        text, stop = tokenizer.decode(tokens[:-1], skip_special_tokens=False), f"token {tokens[-1]}"
    return text, stop or "max_new_tokens"


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
