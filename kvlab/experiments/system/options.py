"""Option types and output steps the DHSA, OrthoRank and system experiments share.

Every helper here runs before a model is loaded: a number list is parsed and bounded by argparse, a records file
that an earlier run wrote into the same ``--out`` is refused (:func:`refuse_rerun`), a model name is checked
against kvlab's assets (:func:`check_model`) and the device against the machine (:func:`resolve_device`).
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
from pathlib import Path

from kvlab.experiments import records
from kvlab.experiments.registry import ParameterError

__all__ = ["number_list", "nonnegative_int", "start", "stem", "resolve_device", "device_string", "check_model",
           "check_device", "refuse_rerun", "records_name", "write_json", "write_text"]


def number_list(kind=int, *, low: float | None = None, high: float | None = None, what: str = "number"):
    """An argparse ``type`` for ``"1,2,3"``: every item a ``kind`` in ``[low, high]``; an empty list is refused."""

    def parse(text: str) -> list:
        items = [t.strip() for t in str(text).split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty list; give one or more {what}s, e.g. 1,2")
        out = []
        for t in items:
            try:
                v = kind(t)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{t!r} is not a {what} ({kind.__name__})") from None
            if (low is not None and v < low) or (high is not None and v > high):
                raise argparse.ArgumentTypeError(f"{what} {t} is outside [{low}, {high}]")
            out.append(v)
        return out

    parse.__name__ = f"{what} list"
    return parse


_NONNEGATIVE = number_list(int, low=0, what="integer")


def nonnegative_int(text: str) -> int:
    """An argparse ``type``: one integer >= 0."""
    values = _NONNEGATIVE(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one integer >= 0")
    return values[0]


def stem(text: str) -> str:
    """A file name stem (``dhsa_needle_smollm2_4k``): letters, digits, ``._-`` only, no folder."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", text or "") or text.endswith(records.SUFFIX):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file stem: letters, digits and ._+- only, no folder "
                                         f"and no suffix (the records go to STEM{records.SUFFIX})")
    return text


def records_name(stem_: str) -> str:
    return stem_ + records.SUFFIX


def resolve_device(device: str) -> str:
    """``auto`` as cuda where there is one, else cpu; other names unchanged (checked by :func:`check_device`)."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def check_device(device: str, *, needs_cuda: bool = False) -> None:
    import torch

    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise ParameterError(f"--device {device!r}: give cpu, cuda, cuda:N or auto")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ParameterError(f"--device {device}: this machine has no CUDA device; give --device cpu (or --smoke)")
    if needs_cuda and resolve_device(device) == "cpu":
        raise ParameterError("this experiment measures a CUDA device and there is none here; run it on a GPU "
                             "machine, or --smoke for the same code at tiny size on the CPU")


def device_string(device) -> str:
    """``"cpu"`` or ``"cuda (NVIDIA H200)"``: the ``device`` of every record."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def check_model(name: str) -> None:
    """A kvlab model id, a local checkpoint or GGUF file, or a hub id ``org/name``; a misspelt id is refused."""
    from kvlab.models import MODEL_IDS

    if name in MODEL_IDS or "/" in name or Path(name).exists():
        return
    near = difflib.get_close_matches(name, MODEL_IDS, n=1, cutoff=0.5)
    raise ParameterError(f"--model {name!r} is not a kvlab model" + (f" (did you mean {near[0]!r}?)" if near else "")
                         + f"; the models are {list(MODEL_IDS)}, or give a checkpoint folder")


def refuse_rerun(out: str | Path, *names: str) -> None:
    """Refuse (before any work) when ``out`` already holds one of ``names``: an earlier run's results are never
    replaced silently."""
    for name in names:
        for path in (Path(out) / name, Path(out) / (name + ".partial")):
            if path.exists():
                raise ParameterError(f"{path} is there already (an earlier run of this experiment wrote it); "
                                     "kvlab does not replace a run's results: give another --out, or move that "
                                     "file away to run again")


def start(args, name: str):
    """``(out, device, info)`` of a benchmark run: its OutputFolder, the torch device and the header its JSON
    carries (device string, torch version, date, command)."""
    import time

    import torch

    from kvlab.outputs import OutputFolder

    out = OutputFolder(args.out, f"python -m kvlab run {name}")
    device = torch.device(resolve_device(args.device))
    info = {"device": device_string(device), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": getattr(args, "command_line", None)
            or f"python -m kvlab run {name}" + (" --smoke" if args.smoke else "")}
    print(json.dumps(info), flush=True)
    return out, device, info


def write_json(out, rel: str, obj) -> Path:
    """``obj`` as indented JSON at ``rel`` inside the OutputFolder ``out`` (claimed first)."""
    return write_text(out, rel, json.dumps(obj, indent=1) + "\n")


def write_text(out, rel: str, text: str) -> Path:
    path = out.claim(rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    out.claim(str(Path(rel).with_name(tmp.name)))
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def smoke_model(name: str, *, layers: int = 2, seed: int = 0):
    """``(model, tokenizer)`` for ``--smoke``: ``name``'s own tokenizer and a tiny random-weight Llama over its
    vocabulary (hidden 64, ``layers`` layers, 4 heads, 2 KV heads), kvlab attached: the same code paths in a
    fraction of a second a forward pass."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvlab.core import attach
    from kvlab.models import load_tokenizer

    tok = load_tokenizer(name)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=16384,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    return attach(LlamaForCausalLM(cfg).eval()), tok


def smoke_predictor(model):
    """A random boundary predictor on ``model``'s key channels (the smoke model has no shipped one)."""
    import torch

    from kvlab.dhsa.boundary_predictor import BoundaryPredictor

    cfg = model.config
    torch.manual_seed(0)
    return BoundaryPredictor(cfg.num_key_value_heads * cfg.head_dim, window=4, heads=1, hidden=16).eval()
