"""What every SepLLM and headline experiment shares: the device it ran on, its output folder (an earlier run's
records are never replaced), comma lists of counts, and the JSON summary beside the records."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from kvlab.experiments import records
from kvlab.experiments.registry import ParameterError
from kvlab.outputs import OutputFolder

__all__ = ["resolve_device", "device_label", "open_out", "write_summary", "int_list", "nonnegative_int",
           "positive_float", "smallest_reaching", "load_model", "start_model"]


def resolve_device(name: str) -> str:
    """``auto``: cuda when there is one, else cpu; any other name as given."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_label(device: str) -> str:
    """The device a record was measured on, as the records name it: ``cpu`` or ``cuda (NVIDIA H200)``."""
    if str(device).startswith("cuda"):
        import torch

        return f"cuda ({torch.cuda.get_device_name(torch.device(device))})"
    return str(device)


def open_out(args, name: str, record_files: list[str]) -> OutputFolder:
    """The experiment's output folder, opened before any model loads: refused when it holds a file kvlab did not
    write, or when one of ``record_files`` is there already (an earlier run's records are never replaced)."""
    out = OutputFolder(args.out, f"python -m kvlab run {name}")
    for rel in record_files:
        path = out.root / rel
        if path.exists() or (path.name.endswith(".gz") and path.with_name(path.name[:-3]).exists()):
            raise ParameterError(
                f"--out {out.root}: {rel} holds the records of an earlier run, which this run would replace; give "
                f"another --out (or move that file away to run again)")
    return out


def write_summary(out: OutputFolder, rel: str, data: dict) -> Path:
    """``data`` as indented JSON at ``rel`` inside ``out``, written whole or not at all."""
    path, tmp = out.claim(rel, rel + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def int_list(minimum: int = 1, what: str = "value"):
    """An argparse ``type``: a comma list of integers, each ``>= minimum``, at least one."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(t) for t in str(text).split(",") if t.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of integers") from None
        if not values:
            raise argparse.ArgumentTypeError(f"empty list; give one or more {what}s")
        low = [v for v in values if v < minimum]
        if low:
            raise argparse.ArgumentTypeError(f"every {what} must be >= {minimum}, got {low}")
        return values

    parse.__name__ = f"{what} list"
    return parse


def _number(text: str, kind, what: str, ok, rule: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{value} must be {rule}")
    return value


def nonnegative_int(text: str) -> int:
    return _number(text, int, "an integer", lambda v: v >= 0, ">= 0")


def positive_float(text: str) -> float:
    return _number(text, float, "a number", lambda v: v > 0, "> 0")


def smallest_reaching(score, target: float, lo: int, hi: int) -> int:
    """Smallest ``n`` in ``[lo, hi]`` with ``score(n) >= target`` (``score`` grows with ``n``); ``hi`` when none
    below it reaches the target (a bisection)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if score(mid) < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


def load_model(name: str, device: str, *, smoke: bool = False):
    """``(model, tokenizer)`` of kvlab model id ``name`` on ``device``. ``smoke``: ``name``'s own tokenizer before a
    tiny random model of the same architecture (4 layers, its heads of width 16, the tokenizer's vocabulary, kvlab attached),
    so a ``--smoke`` run takes the same code path in seconds."""
    import kvlab

    if not smoke:
        return kvlab.load_model(name, device=device)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from kvlab.core import attach
    from kvlab.models import converted_path, load_tokenizer

    tokenizer = load_tokenizer(name)
    try:
        config = AutoConfig.from_pretrained(converted_path(name))
    except (KeyError, OSError):  # not converted yet, or not a kvlab id: a Llama
        from transformers import LlamaConfig

        config = LlamaConfig()
    config = getattr(config, "text_config", config)
    heads = getattr(config, "num_attention_heads", 4)  # the real head counts: head-wise methods still fit
    for key, value in dict(vocab_size=len(tokenizer), hidden_size=16 * heads, intermediate_size=128,
                           num_hidden_layers=4, head_dim=16).items():
        setattr(config, key, value)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types[:4])
    torch.manual_seed(0)
    return attach(AutoModelForCausalLM.from_config(config).eval().to(device)), tokenizer


def start_model(args):
    """``(device, model, tokenizer)`` of ``args.model``: ``args.threads`` CPU threads (0 or None: torch's default),
    torch's seed 0, ``args.device`` resolved, and ``--smoke``'s tiny random model (:func:`load_model`)."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = resolve_device(args.device)
    return (device, *load_model(args.model, device, smoke=args.smoke))
