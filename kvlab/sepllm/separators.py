"""Which token ids count as separators (SepLLM Sec. 4.1, App. G).

The paper keeps the KV of nine separators, ``. , ? ! ; : <space> \\t \\n``. A tokenizer never has just
nine ids for them: BPE merges punctuation with spaces and newlines (``" ."``, ``".\\n"``, ``",\\n\\n"``,
``"\\n\\n\\n"``) and SentencePiece writes a leading space as ``"▁"``. So the set is derived per tokenizer:
decode every id on its own and classify its text. Three readings, from narrow to broad:

* **the bare marks and their leading-space variants** (``match="official"``, the default): the text is one
  chosen character ``c`` or ``" " + c``. This is what the authors' code lists by hand per model (9-20 ids:
  ``"."``, ``" ."``, ``"\\n"``, ``" \\n"``, ``" "``, ``"  "`` ...). On SmolLM2 it gives 17 ids.
* **made of separators** (``match="exact"``): the text is non-empty, uses only separator characters
  and whitespace, and either contains one of the chosen punctuation marks or consists only of the
  chosen whitespace characters. ``" ."``, ``".\\n"``, ``"\\n\\n"``, ``"Ġ"`` (a lone space) qualify.
* **ends in a separator** (``match="suffix"``, the broadest: 415 ids on SmolLM2): additionally every token
  whose text, right after dropping trailing whitespace, ends in a chosen punctuation mark: ``"etc."``,
  ``"):"`` do, ``"...)"`` does not. Such a token closes its segment just as a lone ``"."`` would.

Special tokens (BOS, EOS, chat markers) are never separators. Smaller sets for the ablation of Table 16
are in :data:`SEPARATOR_SETS` ("9", "4", "2", "none").

Pseudocode::

    for id in vocabulary (minus special tokens):
        t = decode([id]);  core = t.rstrip(whitespace)
        if match == "official": separator iff t in {c, " " + c for c in chosen}
        elif t only uses separator chars and whitespace and (core has a chosen mark or t only uses chosen whitespace):
            separator
        elif match == "suffix" and core and core[-1] in chosen marks:
            separator
"""

from __future__ import annotations

from typing import Iterable

import torch

__all__ = ["SEPARATORS", "SEPARATOR_SETS", "MATCHES", "SeparatorSet", "separator_ids", "is_separator",
           "describe_separators"]

#: The paper's nine separators (Sec. 4.1).
SEPARATORS: tuple[str, ...] = (".", ",", "?", "!", ";", ":", " ", "\t", "\n")

#: Separator choices of the ablation (App. G, Table 16): all nine, four common marks, "." and "?", none.
SEPARATOR_SETS: dict[str, tuple[str, ...]] = {
    "9": SEPARATORS,
    "4": (".", ",", "?", ";"),
    "2": (".", "?"),
    "none": (),
}

#: Readings of "this token is a separator", narrow to broad (module docstring).
MATCHES: tuple[str, ...] = ("official", "exact", "suffix")

_WHITESPACE = frozenset(" \t\n\r\u00a0")
_ALL_SEPARATOR_CHARS = frozenset(SEPARATORS) | _WHITESPACE
_CACHE: dict[tuple, tuple[int, ...]] = {}


def _classify(text: str, marks: frozenset[str], spaces: frozenset[str], match: str) -> bool:
    if not text:
        return False
    if match == "official":
        return any(text == c or text == " " + c for c in marks | spaces)
    core = text.rstrip("".join(_WHITESPACE))
    if set(text) <= _ALL_SEPARATOR_CHARS:
        if any(ch in marks for ch in text):
            return True
        if spaces and set(text) <= spaces | {"\r", "\u00a0"} and set(text) & spaces:
            return True
        return False
    return match == "suffix" and bool(core) and core[-1] in marks


def _chosen_separators(separators: Iterable[str] | str, match: str) -> tuple[str, ...]:
    """The separator characters named by ``separators`` (a key of :data:`SEPARATOR_SETS` or characters), checked."""
    if isinstance(separators, str) and separators in SEPARATOR_SETS:
        chosen = tuple(SEPARATOR_SETS[separators])
    elif isinstance(separators, str):
        raise ValueError(f"separators={separators!r} is not a key of SEPARATOR_SETS {list(SEPARATOR_SETS)}; "
                         "pass an iterable of characters to choose your own")
    else:
        chosen = tuple(separators)
    unknown = [s for s in chosen if s not in SEPARATORS]
    if unknown:
        raise ValueError(f"{unknown} are not SepLLM separators; choose among {SEPARATORS}")
    if match not in MATCHES:
        raise ValueError(f"match must be one of {MATCHES}, got {match!r}")
    return chosen


def separator_ids(tokenizer, separators: Iterable[str] | str = SEPARATORS, match: str = "official") -> list[int]:
    """Every id of ``tokenizer`` whose text is one of ``separators`` (by the reading ``match``); sorted.

    Args:
        tokenizer: a transformers tokenizer (anything with ``decode``, ``__len__`` and ``all_special_ids``).
        separators: characters from :data:`SEPARATORS`, or a key of :data:`SEPARATOR_SETS` ("9", "4", ...).
        match: ``"official"`` (default: the bare marks and their leading-space variants, as the authors'
            code lists them), ``"exact"`` (every id made of separator characters) or ``"suffix"`` (also ids
            that end in a mark, like ``"etc."``).

    Results are cached per (tokenizer name, vocabulary size, separators, match) when the tokenizer has a
    name (decoding a 262k vocabulary takes seconds); a tokenizer without one is decoded every time.
    """
    chosen = _chosen_separators(separators, match)
    name = getattr(tokenizer, "name_or_path", None)
    key = (name, len(tokenizer), tuple(sorted(chosen)), match) if name else None
    if key is not None and key in _CACHE:
        return list(_CACHE[key])
    marks = frozenset(c for c in chosen if c not in _WHITESPACE)
    spaces = frozenset(c for c in chosen if c in _WHITESPACE)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(vocab)]) if chosen else []
    ids = [i for i, t in enumerate(texts) if i not in special and _classify(t, marks, spaces, match)]
    if key is not None:
        _CACHE[key] = tuple(ids)
    return ids


def is_separator(token_ids: torch.Tensor, separators: Iterable[int] | torch.Tensor) -> torch.Tensor:
    """Bool tensor of ``token_ids``' shape: True where the id is one of ``separators``.

    ``token_ids`` of -1 (the model was fed embeddings, not ids) are never separators.
    """
    sep = torch.as_tensor(list(separators) if not isinstance(separators, torch.Tensor) else separators,
                          dtype=torch.long, device=token_ids.device)
    if sep.numel() == 0:
        return torch.zeros_like(token_ids, dtype=torch.bool)
    return torch.isin(token_ids, sep) & (token_ids >= 0)


def describe_separators(tokenizer, ids: Iterable[int]) -> list[tuple[int, str]]:
    """``[(id, printable text)]`` with whitespace made visible (``\\n``, ``\\t``, ``␣`` for a space)."""
    out = []
    for i in ids:
        text = tokenizer.decode([i])
        shown = text.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r").replace(" ", "␣")
        out.append((int(i), shown))
    return out


class SeparatorSet:
    """The separator ids a SepLLM policy or pattern uses, checked once.

    ``separators``: a tokenizer (then :func:`separator_ids` of it) or token ids (a tensor or an iterable of
    ints). ``ids`` is the sorted ``(k,)`` long tensor; :meth:`flags` marks separators in token ids.
    """

    def __init__(self, separators):
        if separators is None:
            raise ValueError("separators is required: pass token ids or the tokenizer "
                             "(kvlab.sepllm.separator_ids(tokenizer) lists them)")
        if isinstance(separators, (str, bytes)):
            raise TypeError(f"separators must be token ids or a tokenizer, got the string {separators!r}; to pick "
                            "separator characters use kvlab.sepllm.separator_ids(tokenizer, separators="
                            f"{separators!r})")
        if hasattr(separators, "batch_decode"):
            separators = separator_ids(separators)
        values = separators.tolist() if isinstance(separators, torch.Tensor) else list(separators)
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int)]
        if bad:
            raise TypeError(f"separators must be integer token ids, got {bad[:3]!r}")
        ids = sorted(set(values))
        if ids and ids[0] < 0:
            raise ValueError(f"separator ids must be >= 0, got {ids[0]}")
        self.ids = torch.tensor(ids, dtype=torch.long)
        self._on_device = {self.ids.device: self.ids}  # copies per device, made once (not one per layer call)

    def __len__(self) -> int:
        return self.ids.numel()

    def check_vocab(self, vocab_size: int) -> None:
        """Raise if an id lies outside a vocabulary of ``vocab_size`` tokens (it could never match)."""
        if self.ids.numel() and int(self.ids[-1]) >= vocab_size:
            raise ValueError(f"separator id {int(self.ids[-1])} is outside the model's vocabulary of {vocab_size} "
                             "tokens: pass ids from this model's tokenizer (kvlab.sepllm.separator_ids(tokenizer))")

    def flags(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Bool tensor of ``token_ids``' shape: True at separators (never at -1, an embedding input)."""
        ids = self._on_device.get(token_ids.device)
        if ids is None:
            ids = self._on_device[token_ids.device] = self.ids.to(token_ids.device)
        return is_separator(token_ids, ids)
