"""What LaCache's experiments share: the policies named by expressions, the device line their records carry, the CPU
model load (float32, one thread) and the WikiText windows' records."""
from __future__ import annotations

import platform


def policy(expr: str, **values):
    """The policy of an expression of the experiments' tables (``"LaCache.official(256, 16, 0)"``); ``values`` name
    the variables it uses (``length``, ``n``, ``sink``)."""
    from kvlab.baselines import H2O
    from kvlab.lacache.policy import LaCache
    from kvlab.policies import Full, StreamingLLM

    names = {"Full": Full, "StreamingLLM": StreamingLLM, "LaCache": LaCache, "H2O": H2O, **values}
    return eval(expr, {"__builtins__": {}}, names)  # expressions come from the experiments' own tables


def device_line(device: str = "cpu") -> str:
    """The ``device`` of a record: the CPU (its processor, torch, threads) or the CUDA device's name."""
    import torch

    if str(device).startswith("cuda"):
        return f"cuda ({torch.cuda.get_device_name()}), torch {torch.__version__}"
    return f"cpu ({platform.processor() or platform.machine()}), torch {torch.__version__}, threads {torch.get_num_threads()}"


def load_cpu_model(name: str = "smollm2-135m", device: str = "cpu"):
    """``(model, tokenizer)`` in float32 on one thread (the CPU runs' setting)."""
    import torch

    torch.set_num_threads(1)
    import kvlab

    return kvlab.load_model(name, device=device, dtype="float32")


def window_records(nll, window: int, example, method: str, config: dict, device: str, **extra) -> list[dict]:
    """One ``window_nll`` record per whole window of ``window`` tokens of a stream's per-token NLL;
    ``example(w)`` names window ``w``."""
    from kvlab.experiments import records

    nll = nll.double()
    return [records.record(example(w), method, "window_nll", float(nll[w * window:(w + 1) * window].mean()),
                           config=config, device=device, **extra) for w in range(len(nll) // window)]
