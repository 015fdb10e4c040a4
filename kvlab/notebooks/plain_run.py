"""Run a notebook's code cells in this Python process, with a parameter set, where Jupyter is not installed.

    python -m kvlab notebooks run notebooks/04_sepllm_training.ipynb \
        -f notebooks/params/04_sepllm_training.full.yaml -p steps 1000 --out build/plain/04

For machines that have torch but not papermill/Jupyter (a rented GPU box): the parameters cell runs
first, then the YAML values and ``-p NAME VALUE`` pairs are assigned (papermill's order), then every
other code cell. What each cell prints goes to the terminal and to ``OUT/<notebook>.log``; every
figure shown is saved as ``OUT/fig_<cell>_<n>.png``; the executed notebook, with stream outputs, is
written to ``OUT/<notebook>.ipynb`` after each cell, so a run cut short keeps what it did. IPython
magics are not supported (kvlab's notebooks use none). Use papermill wherever it is installed.

Everything is checked before the first cell runs: every parameter of the sets and of ``-p`` against the notebook's
parameters cell (a name it does not declare is refused, naming the declared ones, never run with the defaults), and
``--out`` under the output rule (:mod:`kvlab.outputs`): new, or holding only what an earlier run wrote, so the
notebook's own folder (the source notebook, a log of the user's) is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pathlib
import sys
import time

import yaml


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self):
        for s in self.streams:
            s.flush()


COMMAND = "python -m kvlab notebooks run"


def parameters(notebook: pathlib.Path, files: list[pathlib.Path], pairs: list[tuple[str, str]]) -> dict:
    """The values of the YAML ``files`` then the ``-p NAME VALUE`` ``pairs``, checked against the notebook's
    parameters cell (names, types, ranges): ValueError/TypeError naming the file or ``-p`` and the parameter."""
    from kvlab.core.checks import check_notebook_parameters

    params = {}
    for f in files:
        values = yaml.safe_load(f.read_text()) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{f}: a parameter set is a YAML mapping (name: value), got {type(values).__name__}")
        check_notebook_parameters(notebook, values, str(f))
        params.update(values)
    overrides = {}
    for name, value in pairs:
        try:
            overrides[name] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ValueError(f"-p {name} {value!r}: not a YAML value ({str(exc).splitlines()[0]})") from None
    check_notebook_parameters(notebook, overrides, "-p")
    return {**params, **overrides}


def open_output(notebook: pathlib.Path, out: pathlib.Path):
    """``out`` under the output rule; the notebook's own folder (``--out`` where the source lives) is refused."""
    from kvlab.outputs import OutputFolder, OutputRefused

    if (out / notebook.name).resolve() == notebook.resolve():
        raise OutputRefused(f"{COMMAND}: --out {out} is the folder of {notebook.name}: the executed copy would "
                            "replace the source notebook; give another folder, e.g. --out build/plain")
    folder = OutputFolder(out, COMMAND)
    folder.claim(notebook.name, f"{notebook.stem}.log", "fig_*.png")
    return folder


def main(argv=None) -> int:
    from kvlab.outputs import OutputRefused

    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("notebook", type=pathlib.Path)
    ap.add_argument("-f", "--parameters-file", type=pathlib.Path, action="append", default=[])
    ap.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="VALUE is read as YAML (numbers, lists, strings)")
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--cwd", type=pathlib.Path, default=None,
                    help="the cells' working directory (default: the notebook's folder, as Jupyter runs it)")
    args = ap.parse_args(argv)
    if not args.notebook.is_file():
        ap.error(f"no notebook {args.notebook}")
    try:
        params = parameters(args.notebook, args.parameters_file, args.parameter)
        open_output(args.notebook, args.out)
    except (ValueError, TypeError, OutputRefused) as err:  # OutputRefused is a ValueError
        print(f"{COMMAND}: {err}", file=sys.stderr)
        return 2

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nb = json.loads(args.notebook.read_text())
    log = open(args.out / f"{args.notebook.stem}.log", "w")
    namespace = {"__name__": "__main__"}
    figures = {"cell": 0, "n": 0}

    def show(*_, **__):
        for num in plt.get_fignums():
            figures["n"] += 1
            plt.figure(num).savefig(args.out / f"fig_{figures['cell']:02d}_{figures['n']}.png", dpi=80,
                                    bbox_inches="tight")
        plt.close("all")

    plt.close("all")  # figures left open by whoever imported pyplot before are not this notebook's
    shown, here = plt.show, os.getcwd()
    plt.show = show
    os.chdir(args.cwd or args.notebook.resolve().parent)  # notebooks run with their folder as working directory
    try:
        return _run(nb, args, params, namespace, figures, show, log)
    finally:
        plt.show = shown
        os.chdir(here)
        log.close()


def _run(nb, args, params, namespace, figures, show, log):
    code_cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    first = next((c for c in code_cells if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    for i, cell in enumerate(code_cells):
        figures["cell"], figures["n"] = i, 0
        source = "".join(cell["source"])
        buffer = io.StringIO()
        begin = time.time()
        print(f"# --- cell {i} ---", file=log, flush=True)
        with contextlib.redirect_stdout(_Tee(sys.stdout, buffer, log)):
            exec(compile(source, f"<cell {i}>", "exec"), namespace)
            if cell is first:
                namespace.update(params)
                print(f"# parameters: {params}")
            show()
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": buffer.getvalue()}]
        cell["execution_count"] = i + 1
        print(f"# cell {i}: {time.time() - begin:.1f} s", file=log, flush=True)
        (args.out / args.notebook.name).write_text(json.dumps(nb, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
