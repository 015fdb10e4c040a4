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
           "positive_float"]


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


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return value
