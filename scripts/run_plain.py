"""Run a notebook's code cells in this Python process, with a parameter set, where Jupyter is not installed.

    python scripts/run_plain.py notebooks/04_sepllm_training.ipynb -f notebooks/params/04_sepllm_training.full.yaml \
        -p steps 1000 --out build/plain/04

For machines that have torch but not papermill/Jupyter (a rented GPU box): the parameters cell runs
first, then the YAML values and ``-p NAME VALUE`` pairs are assigned (papermill's order), then every
other code cell. What each cell prints goes to the terminal and to ``OUT/<notebook>.log``; every
figure shown is saved as ``OUT/fig_<cell>_<n>.png``; the executed notebook, with stream outputs, is
written to ``OUT/<notebook>.ipynb`` after each cell, so a run cut short keeps what it did. IPython
magics are not supported (kvlab's notebooks use none). Use papermill wherever it is installed.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebook", type=pathlib.Path)
    ap.add_argument("-f", "--parameters-file", type=pathlib.Path, action="append", default=[])
    ap.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="VALUE is read as YAML (numbers, lists, strings)")
    ap.add_argument("--out", type=pathlib.Path, required=True)
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nb = json.loads(args.notebook.read_text())
    params = {}
    for f in args.parameters_file:
        params.update(yaml.safe_load(f.read_text()) or {})
    for name, value in args.parameter:
        params[name] = yaml.safe_load(value)
    args.out.mkdir(parents=True, exist_ok=True)
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
    os.chdir(args.notebook.resolve().parent)  # notebooks run with their folder as working directory
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
