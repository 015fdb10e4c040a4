"""Every experiment kvlab runs, by name: ``python -m kvlab run NAME [OPTIONS]`` and the ledger's reruns.

An experiment is a module of :mod:`kvlab.experiments` with two functions:

    def parser() -> argparse.ArgumentParser      # made with experiment_parser(): --out, --device, --smoke included
    def run(args) -> list[Path]                  # the files it wrote (records first), every one inside args.out

``run`` checks every option before it loads a model or writes a file (:func:`check_all` runs the parser's checks;
a module may add ``check(args)``, called before ``run``), writes only through the one output rule
(:class:`kvlab.outputs.OutputFolder` on ``args.out``) and writes its per-example records with
:mod:`kvlab.experiments.records`. ``--smoke`` runs the same code at tiny size on a CPU in seconds; it is how each
experiment is tested (``tests/test_experiments.py``) before a GPU is spent on it.

The claims ledger names each row's experiment and its configuration as data (columns ``experiment`` and ``config``,
a JSON object of the experiment's options): ``python -m kvlab claims --rerun ROW`` turns the configuration into
options (:func:`config_argv`) and runs it. This table says what each experiment needs; ``python -m kvlab run --list``
prints it.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Experiment", "EXPERIMENTS", "get", "experiment_parser", "names_list", "seed_range", "positive_int",
           "config_argv", "run", "main", "list_text", "ParameterError"]


class ParameterError(ValueError):
    """An option of an experiment is wrong; the message names the option, the constraint and the fix."""


@dataclass(frozen=True)
class Experiment:
    name: str      # what `python -m kvlab run` and the ledger's `experiment` column call it
    module: str    # the module holding parser() and run(args)
    paper: str     # the paper it measures (or "all" / "package")
    needs: str     # "cpu", "gpu" or "cpu or gpu" at full size (--smoke always runs on a CPU)
    model: str     # the model (asset name) it loads at full size, or "none"
    minutes: str   # how long the full-size run takes, on the device it was measured on
    summary: str   # one line: what it measures


# The registry. A new experiment is one line here and one module; tests/test_experiments.py smoke-runs each.
EXPERIMENTS: dict[str, Experiment] = {}


def _add(*exps: Experiment) -> None:
    for e in exps:
        if e.name in EXPERIMENTS:
            raise ValueError(f"experiment {e.name!r} registered twice")
        EXPERIMENTS[e.name] = e


# ---- package-wide experiments (the ledger's tests, notebooks) --------------------------------------------------
# (entries: Experiment(name, module, paper, needs, model, minutes, summary))
_add(
    Experiment("tests", "kvlab.experiments.checks.pytest_run", "package", "cpu", "none", "1-3 (CPU, by test file)",
               "the ledger's exact rows: pytest on the named tests, one record per test"),
    Experiment("notebook", "kvlab.experiments.checks.notebook_run", "package", "cpu or gpu", "smollm2-135m",
               "1-60 (CPU or H200, by notebook and set)",
               "a numbered notebook through papermill at a parameter set (full, ci, book), one record per cell"),
    Experiment("peers", "kvlab.experiments.checks.peer_check", "package", "cpu", "smollm2-135m", "3 (CPU)",
               "kvlab's StreamingLLM/TOVA/H2O against NVIDIA kvpress's kept positions (scripts/peers.sh)"),
)

# ---- SepLLM and the headline / quality runs ---------------------------------------------------------------------
_add(
    Experiment("sepllm-headline", "kvlab.experiments.sepllm.headline", "sepllm", "gpu", "qwen2.5-coder-0.5b",
               "8 (H100, both parts); Table 9 MMLU 40 (CPU)",
               "Table 1 / 9 / 15: GSM8K-CoT and MMLU accuracy of SepLLM against full, StreamingLLM, H2O"),
    Experiment("sepllm-ablations", "kvlab.experiments.sepllm.ablations", "sepllm", "cpu or gpu", "smollm2-135m",
               "30 (CPU, Table 9 at 20 problems); 40 (H100, Tables 9/16/17)",
               "Tables 9, 16, 17 (GSM8K answer NLL, paired) and the needle Figs. 8-11"),
    Experiment("sepllm-gsm8k-matched", "kvlab.experiments.sepllm.gsm8k_matched", "sepllm", "gpu", "smollm2-135m",
               "10 (H200)", "Table 1 at matched r.KV: answer NLL and exact match of SepLLM vs a widened window"),
    Experiment("sepllm-position-shift", "kvlab.experiments.sepllm.position_shift", "sepllm", "cpu",
               "smollm2-135m", "10 (CPU)", "Table 8: window NLL with and without the positional shift"),
    Experiment("sepllm-architectures", "kvlab.experiments.sepllm.architectures", "sepllm", "cpu",
               "qwen2.5-coder-0.5b", "15 (CPU)", "Table 11: SepLLM against StreamingLLM on another architecture"),
    Experiment("sepllm-separator-cache", "kvlab.experiments.sepllm.separator_cache", "sepllm", "gpu",
               "smollm2-135m", "8 (H200)", "Table 6: window NLL of separator caches s = 32, 48, 64"),
    Experiment("sepllm-flops-ratio", "kvlab.experiments.sepllm.flops_ratio", "sepllm", "cpu", "none", "2 (CPU)",
               "Table 3: attention-map share and training FLOPs of each variant per sequence"),
    Experiment("sepllm-separator-attention", "kvlab.experiments.sepllm.separator_attention", "sepllm", "cpu",
               "smollm2-135m", "3 (CPU)", "Fig. 2: attention received per separator key against other keys"),
    Experiment("sepllm-training-h", "kvlab.experiments.sepllm.training_h", "sepllm", "gpu", "none", "3 (H100)",
               "Table 2's H row: training loss, FLOPs and attention share of SepLLM(n=64, H)"),
    Experiment("sepllm-training-speed", "kvlab.experiments.sepllm.training_speed", "sepllm", "gpu", "none",
               "1-2 (H200, random weights)",
               "Table 10: ms per training iteration, Vanilla (SDPA) vs SepLLM(n=64) (Triton kernel), paired rounds"),
    Experiment("sepllm-prepare-separators", "kvlab.experiments.sepllm.prepare_separators", "sepllm", "cpu",
               "smollm2-135m (tokenizer)", "1 (CPU)", "the separator flags of a book for the kernel benchmarks"),
    Experiment("quality-runs", "kvlab.experiments.quality.runs", "all", "cpu or gpu", "smollm2-135m",
               "hours (14 CPU + 3 GPU workers)", "the full-size SepLLM / LaCache quality jobs as a Dask sweep"),
    Experiment("quality-report", "kvlab.experiments.quality.report", "all", "cpu", "none", "1 (CPU)",
               "the tables of a quality-runs folder beside the papers' numbers"),
    Experiment("quality-claims-examples", "kvlab.experiments.quality.claims_examples", "all", "cpu", "none",
               "1 (CPU)", "per-example records converted from committed results that hold them"),
    Experiment("headline-model-choice", "kvlab.experiments.quality.model_choice", "sepllm", "cpu",
               "qwen2.5-coder-0.5b", "60 (CPU)", "which model clears the accuracy floor (vanilla MMLU / GSM8K)"),
    Experiment("headline-claim-rows", "kvlab.experiments.quality.headline_rows", "sepllm", "cpu", "none",
               "1 (CPU)", "the ledger rows of a sepllm-headline run, as data to add to the ledger"),
)

# ---- DHSA and OrthoRank -----------------------------------------------------------------------------------------
_add(
    Experiment("dhsa-needle", "kvlab.experiments.dhsa.needle", "dhsa", "gpu", "smollm2-135m", "6-40 (H200)",
               "Fig. 2/6 needle grid: dense, block-sparse and DHSA under App. A's and the authors' protocol"),
    Experiment("dhsa-boundaries", "kvlab.experiments.dhsa.boundaries", "dhsa", "cpu or gpu", "smollm2-135m",
               "1 (H200), 10 (CPU at 512 tokens)", "App. B: attention mass kept and chunk counts per NMS window"),
    Experiment("dhsa-qa", "kvlab.experiments.dhsa.qa", "dhsa", "gpu", "smollm2-135m", "6-22 (H200)",
               "Table 1's LongBench stand-in: token F1 and answer NLL per question and method"),
    Experiment("dhsa-table2", "kvlab.experiments.dhsa.table2", "dhsa", "gpu", "smollm2-135m", "1 (H200)",
               "Table 2: prefill latency and peak memory per method and backend beside the needle accuracy"),
    Experiment("dhsa-app-d-costs", "kvlab.experiments.dhsa.app_d_costs", "dhsa", "cpu or gpu", "smollm2-135m",
               "20 (CPU), 2 (H200, random weights)",
               "App. D: decode latency / cache memory of dense vs StreamingLLM, block-sparse prefill, paired rounds"),
    Experiment("dhsa-needle-separating", "kvlab.experiments.dhsa.needle_separating", "dhsa", "cpu", "none",
               "0.1 (CPU)", "picks the needle depths that separate chunkings from a pilot, and judges the grid"),
    Experiment("dhsa-predictor-position", "kvlab.experiments.dhsa.predictor_position", "dhsa", "cpu",
               "smollm2-135m", "10 (CPU)", "do the predicted chunks follow the text or the position (held-out text)"),
    Experiment("dhsa-predictor-time", "kvlab.experiments.dhsa.predictor_time", "dhsa", "gpu", "none", "2 (H200)",
               "the boundary predictor + NMS against one layer's dense SDPA at 32k tokens, per layer shape"),
    Experiment("dhsa-prefill-e2e", "kvlab.experiments.dhsa.prefill_e2e", "dhsa", "gpu", "none", "5-8 (H200)",
               "Tables 2-3: one prefill, dense SDPA vs DHSA in every global layer, paired rounds with peak memory"),
    Experiment("orthorank-zeroshot", "kvlab.experiments.orthorank.zeroshot", "orthorank", "cpu or gpu",
               "smollm2-135m", "30 (CPU, 20 questions)", "Table 2: zero-shot accuracy per task of dense, SLEB, OrthoRank"),
    Experiment("orthorank-geometry", "kvlab.experiments.orthorank.geometry", "orthorank", "cpu", "smollm2-135m",
               "1 (CPU)", "Figs. 2-3 in numbers: l_sink, norm ratio, attention mass, cosine to the sink per layer"),
    Experiment("orthorank-model", "kvlab.experiments.orthorank.model_study", "orthorank", "cpu", "gemma3-270m",
               "20 (CPU)", "Figs. 2-3 and Table 1 on another model: searches and perplexity per plan"),
    Experiment("orthorank-table4", "kvlab.experiments.orthorank.table4", "orthorank", "cpu", "smollm2-135m",
               "15 (CPU)", "Table 4: layers removed vs routed at each token ratio, perplexity"),
    Experiment("orthorank-table1", "kvlab.experiments.orthorank.table1", "orthorank", "cpu or gpu", "smollm2-135m",
               "3 (H200), 40 (CPU)", "Tables 1 and 3 over one window per C4 document, per-window NLL"),
    Experiment("orthorank-alignment", "kvlab.experiments.orthorank.alignment", "orthorank", "cpu", "smollm2-135m",
               "10 (CPU)", "Figs. 2-3, 6-7 per window: the rise of the cosine to the sink, the static sink"),
    Experiment("orthorank-fig4", "kvlab.experiments.orthorank.fig4", "orthorank", "cpu or gpu", "smollm2-135m",
               "30 (CPU, 20 documents)", "Fig. 4: each layer routed alone, most vs least orthogonal tokens"),
    Experiment("orthorank-table4docs", "kvlab.experiments.orthorank.table4docs", "orthorank", "cpu or gpu",
               "smollm2-135m", "20 (CPU)", "Table 4 per C4 window: layers removed vs routed at 0.33 and 0.5"),
    Experiment("orthorank-zeroshot-records", "kvlab.experiments.orthorank.zeroshot_records", "orthorank",
               "cpu or gpu", "smollm2-135m", "25 (CPU, 5 x 40 questions)",
               "Tables 2 and 4: zero-shot accuracy per question, paired across plans"),
    Experiment("package-streaming-cuda", "kvlab.experiments.system.streaming_cuda", "package", "gpu", "none",
               "0.5 (H200)", "streaming perplexity on CUDA: full stream equals parallel NLL, a bounded cache's saving"),
    Experiment("package-threads", "kvlab.experiments.system.threads", "package", "cpu", "smollm2-135m",
               "9 (CPU, 2 cores)", "decode speed of one kvlab process alone and of two side by side"),
)

# ---- LaCache, REFORM and the leaderboard -------------------------------------------------------------------------
_add(
    Experiment("reform-reruns", "kvlab.experiments.reform.reruns", "REFORM", "gpu", "smollm2-135m", "8 (H200)",
               "Tables 1, 4, 5 and 6a again with the fixed harness, >= 20 examples per cell"),
    Experiment("lacache-pareto", "kvlab.experiments.lacache.pareto", "LaCache", "cpu", "smollm2-135m", "60 (CPU)",
               "Fig. 3 held out: the ladder against the best random pattern chosen on other windows"),
    Experiment("lacache-cpu-claims", "kvlab.experiments.lacache.cpu_claims", "LaCache", "cpu", "smollm2-135m",
               "40 (CPU)", "Table 1 / Fig. 10 perplexity windows (ppl) and Fig. 7 decode throughput (throughput)"),
    Experiment("lacache-reruns", "kvlab.experiments.lacache.reruns", "LaCache", "gpu", "smollm2-135m", "7 (H200)",
               "Tables 5-6 RULER tasks, the passkey grid and Table 1 / Fig. 10 streams, >= 20 prompts per cell"),
    Experiment("reform-heads-needle-qa", "kvlab.experiments.reform.heads_needle_qa", "REFORM", "cpu", "smollm2-135m",
               "60 (CPU)", "Figs. 2-4 / Tables 2, 7 head MNR (mnr), Fig. 3 needle depths (needle), Table 3 QA (qa)"),
    Experiment("lacache-longstream", "kvlab.experiments.lacache.longstream", "LaCache", "gpu", "smollm2-135m",
               "9 (H100)", "Figs. 5-6 / SepLLM Table 4: perplexity over a 0.8M-2M-token stream, per segment"),
)


def get(name: str) -> Experiment:
    """The experiment called ``name``; an unknown name is refused with the nearest one."""
    if name in EXPERIMENTS:
        return EXPERIMENTS[name]
    near = difflib.get_close_matches(name, list(EXPERIMENTS), n=1, cutoff=0.5)
    raise ParameterError(f"no experiment {name!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
                         + "; `python -m kvlab run --list` lists them")


def load(exp: Experiment):
    return importlib.import_module(exp.module)


# --------------------------------------------------------------------------------------------- option types
class _StrictParser(argparse.ArgumentParser):
    """argparse without prefix matching (``--meth`` is not ``--methods``) whose errors raise ParameterError
    when the caller asks (a rerun reports them as the ledger's fault) and exit 2 otherwise."""

    raise_errors = False

    def error(self, message):
        if self.raise_errors:
            raise ParameterError(f"{self.prog}: {message}")
        super().error(message)


def experiment_parser(name: str, description: str, *, out_default: str | None = None) -> argparse.ArgumentParser:
    """The parser every experiment starts from: ``--out`` (default ``build/runs/NAME``), ``--device`` and
    ``--smoke``."""
    p = _StrictParser(prog=f"python -m kvlab run {name}", description=description, allow_abbrev=False,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=out_default or f"build/runs/{name}",
                   help="output folder (new, or one an earlier run of this experiment wrote; default %(default)s)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when there is one)")
    p.add_argument("--smoke", action="store_true", help="the same code at tiny size on the CPU, in seconds")
    return p


def names_list(choices, *, what: str = "name"):
    """An argparse ``type`` for a comma-separated list whose every item must be one of ``choices``: a misspelt
    name is refused with the nearest one, never dropped."""
    choices = list(choices)

    def parse(text: str) -> list[str]:
        items = [t.strip() for t in str(text).split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty list; give one or more of {choices}")
        bad = [t for t in items if t not in choices]
        if bad:
            hints = []
            for t in bad:
                near = difflib.get_close_matches(t, choices, n=1, cutoff=0.5)
                hints.append(f"{t!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(hints)}; the {what}s are {choices}")
        return items

    parse.__name__ = f"{what} list"
    return parse


def seed_range(text: str) -> list[int]:
    """``3``, ``0-9``, ``1,4,7`` or ``0-3,8``: the seeds, in the order named; a reversed or empty range is refused."""
    seeds: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise argparse.ArgumentTypeError(f"range {part!r} runs backwards; write {hi}-{lo}")
                seeds.extend(range(lo, hi + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a seed or a range such as 0-9") from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"{text!r} names no seed; give e.g. 0-9")
    if any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError("seeds are >= 0")
    return seeds


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


# --------------------------------------------------------------------------------------------- running
def config_argv(config: dict) -> list[str]:
    """A ledger row's configuration as options: ``{"methods": ["a", "b"], "n": 100, "heldout": true}`` is
    ``--methods a,b --n 100 --heldout``; a key ``_`` holds positional arguments (a sub-command)."""
    if not isinstance(config, dict):
        raise ParameterError(f"a configuration is a JSON object of options, got {type(config).__name__}")
    argv = [str(a) for a in config.get("_", [])]
    for key, value in config.items():
        if key == "_":
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            argv += [flag, ",".join(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def check_all(name: str, argv: list[str], *, raise_errors: bool = False):
    """Parse and check ``argv`` for experiment ``name`` (no model is loaded, nothing is written): the namespace."""
    exp = get(name)
    mod = load(exp)
    parser = mod.parser()
    parser.raise_errors = raise_errors
    args = parser.parse_args(argv)
    args.command_line = shlex.join(["python", "-m", "kvlab", "run", name, *argv])  # what the records' header names
    if args.smoke:
        args.device = "cpu"
    if hasattr(mod, "check"):
        try:
            mod.check(args)
        except ParameterError as e:
            if raise_errors:
                raise
            parser.error(str(e))
    return mod, args


def run(name: str, argv: list[str], *, raise_errors: bool = False) -> list[Path]:
    """Run experiment ``name`` with options ``argv``: the files it wrote."""
    mod, args = check_all(name, argv, raise_errors=raise_errors)
    written = mod.run(args)
    return [Path(p) for p in (written or [])]


def list_text() -> str:
    rows = [("experiment", "paper", "needs", "model", "minutes", "what it measures")]
    rows += [(e.name, e.paper, e.needs, e.model, e.minutes, e.summary) for e in EXPERIMENTS.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:5], widths)) + "  " + r[5] for r in rows)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m kvlab run NAME [OPTIONS]   (python -m kvlab run NAME --help: its options)\n"
              "       python -m kvlab run --list           what each experiment needs\n")
        if not argv:
            print(list_text())
        return 0
    if argv[0] == "--list":
        print(list_text())
        return 0
    try:
        written = run(argv[0], argv[1:])
    except ParameterError as e:
        print(f"kvlab run: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


def describe(config_text: str) -> dict:
    """A ledger ``config`` cell as a dict (empty cell: no options)."""
    if not config_text.strip():
        return {}
    try:
        config = json.loads(config_text)
    except json.JSONDecodeError as e:
        raise ParameterError(f"config {config_text!r} is not JSON ({e.msg})") from None
    if not isinstance(config, dict):
        raise ParameterError(f"config {config_text!r} must be a JSON object of options")
    return config
