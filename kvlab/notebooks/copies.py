"""Prepare notebooks for nbval, and record the numbers their checked cells must print.

    python -m kvlab notebooks prepare --out build/notebooks   # what scripts/test.sh runs
    python -m kvlab notebooks record notebooks/01_attention_sinks.ipynb
    python -m kvlab notebooks book 01 --out book/executed     # the book's executed copy (a GPU host: minutes)
    python -m kvlab notebooks stale                            # which book copies no longer match their source
    python -m kvlab notebooks markers [01 ...]                 # move nbval's first-line markers into cell tags

Notebooks are committed without outputs. ``prepare`` copies each ``notebooks/NN_name.ipynb`` to ``--out``
with the small parameters of ``notebooks/params/NN_name.ci.yaml`` injected (papermill, no execution) and, for
every cell marked ``# NBVAL_CHECK_OUTPUT``, the output recorded in ``notebooks/params/NN_name.checks.json``;
nbval then executes the copy and compares those cells. ``record`` executes a notebook with its CI parameters
and writes the checks file from what the marked cells printed (review the diff before committing it). The
full-size parameter sets, ``notebooks/params/NN_name.full.yaml``, are for papermill by hand (see each notebook).

``book`` executes a notebook with its book set, ``notebooks/params/NN_name.book.yaml`` (large enough to show what
the prose describes), into ``--out`` (the committed copies live in ``book/executed/``) and stamps the copy's
metadata (``metadata.kvlab.book``) with a hash of the source's code cells (the parameters cell left out) and a hash
of the book set, so ``stale`` (and ``tests/test_book.py``) can tell a copy made from an older source or an older
set. Pictures are kept as PNG only and widget state is dropped, so the copies stay small.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import pathlib
import re
import sys
import time

import nbformat
import papermill
import yaml

from kvlab.core.checks import check_notebook_parameters, declared_parameters
from kvlab.outputs import MANIFEST, OutputFolder, OutputRefused

ROOT = pathlib.Path(__file__).resolve().parents[2]

NOTEBOOKS = ROOT / "notebooks"
PARAMS_DIR = "params"  # beside the notebooks: NN_name.ci.yaml, NN_name.full.yaml, NN_name.checks.json
MARK = "# NBVAL_CHECK_OUTPUT"


def _sidecar(nb: pathlib.Path, suffix: str) -> pathlib.Path:
    """``notebooks/NN_name.ipynb`` -> ``notebooks/params/NN_name<suffix>`` (parameter sets and recorded checks)."""
    return nb.parent / PARAMS_DIR / (nb.stem + suffix)


def _parameters(nb: pathlib.Path) -> dict:
    return read_set(_sidecar(nb, ".ci.yaml"), missing_ok=True)


def read_set(path: pathlib.Path, missing_ok: bool = False) -> dict:
    """A parameter set (YAML mapping); an error naming the file where it is not one."""
    if not path.exists() and missing_ok:
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{_shown(path)} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{_shown(path)}: a parameter set is a YAML mapping (name: value), got "
                         f"{type(data).__name__}")
    return data


#: nbval's comment markers and the cell tags nbval reads the same way: a marker can live in a cell's metadata (where a
#: reader of the notebook never sees it) instead of its first line (``markers --to-tags``)
MARKER_TAGS = {"# NBVAL_CHECK_OUTPUT": "nbval-check-output", "# NBVAL_IGNORE_OUTPUT": "nbval-ignore-output",
               "# NBVAL_SKIP": "nbval-skip"}


def checked(cell) -> bool:
    """A code cell whose output nbval compares: marked ``# NBVAL_CHECK_OUTPUT`` on its first line or tagged
    ``nbval-check-output``."""
    return cell.cell_type == "code" and (cell.source.lstrip().startswith(MARK)
                                         or MARKER_TAGS[MARK] in cell.metadata.get("tags", []))


def _checked(nb) -> list:
    return [c for c in nb.cells if checked(c)]


def leading_markers(source: str) -> tuple[list[str], str]:
    """The nbval markers on the first lines of a cell's source, and the source without them."""
    lines = source.split("\n")
    found = []
    while lines and lines[0].strip() in MARKER_TAGS:
        found.append(lines.pop(0).strip())
    return found, "\n".join(lines)


def markers_to_tags(nb) -> int:
    """Move every code cell's leading nbval markers into its tags (in place); how many moved."""
    moved = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        found, rest = leading_markers(cell.source)
        if found:
            tags = cell.metadata.setdefault("tags", [])
            tags += [MARKER_TAGS[m] for m in found if MARKER_TAGS[m] not in tags]
            cell.source = rest
            moved += len(found)
    return moved


def _canonical(cell) -> str:
    """A code cell's source with its marker tags written back as first lines: the form the stamps hash, so moving
    the markers into tags leaves every book copy current."""
    written, _ = leading_markers(cell.source)
    marker = {tag: m for m, tag in MARKER_TAGS.items()}
    extra = [marker[t] for t in cell.metadata.get("tags", []) if t in marker and marker[t] not in written]
    return "\n".join(extra + [cell.source]) if extra else cell.source


#: the matplotlib settings of the runs that make the book's pages (figures drawn for the page's width)
BOOK_MPLRC = ROOT / "book" / "matplotlibrc"
CONFTEST = f"""# Written by python -m kvlab notebooks prepare: checked cells compare their numbers with a stated tolerance.
import os

from kvlab.notebooks.tolerant_checks import pytest_configure  # noqa: F401

# the kernels nbval starts draw their figures for the book's pages (book/matplotlibrc)
os.environ.setdefault("MATPLOTLIBRC", {str(BOOK_MPLRC)!r})
"""


def checked_parameters(nb: pathlib.Path, base: dict, where: str, overrides: dict | None = None) -> dict:
    """``base`` (a parameter set read from ``where``) then ``overrides`` (``-p NAME VALUE``), checked against the
    notebook's parameters cell before any work: names (a misspelt one suggests the declared name), types with
    element types, finiteness and ranges. An override of a parameter that says only where and how a notebook runs
    (``device``, ``num_threads``...) is left out, with a note, where the notebook does not declare it."""
    check_notebook_parameters(nb, base, where)
    declared = declared_parameters(nb)
    overrides = dict(overrides or {})
    dropped = sorted(k for k in overrides if k in NEUTRAL and k not in declared)
    if dropped:
        print(f"{nb.name}: declares no {dropped}: those -p overrides are left out for it", file=sys.stderr)
    overrides = {k: v for k, v in overrides.items() if k not in dropped}
    check_notebook_parameters(nb, overrides, "-p")
    return {**base, **overrides}


PREPARE = "python -m kvlab notebooks prepare"
BOOK = "python -m kvlab notebooks book"
#: the names these commands wrote in a folder's manifest before they moved into the package
FORMER_NAMES = {PREPARE: "scripts/notebooks.py prepare", BOOK: "scripts/notebooks.py book"}
WRITER = re.compile(r"# files written by kvlab \((?P<command>.*)\);")


def manifest_writer(out: pathlib.Path) -> str | None:
    """The kvlab command that last wrote ``out``'s manifest (its first line names it), or None."""
    try:
        first = (out / MANIFEST).read_text(encoding="utf-8").split("\n", 1)[0]
    except OSError:
        return None
    found = WRITER.match(first)
    return found["command"] if found else None


def open_output(out: pathlib.Path, command: str, recognise) -> OutputFolder:
    """``out`` under the output rule, for ``command`` alone: a folder another kvlab command wrote (a sweep's executed
    notebooks, the leaderboard's cells) holds kvlab's files, but not this command's, so it is refused whole before
    anything changes; this command replaces only what it wrote itself."""
    writer = manifest_writer(pathlib.Path(out))
    if writer is not None and writer not in (command, FORMER_NAMES.get(command)):
        raise OutputRefused(f"{command}: {out} holds the outputs of `{writer}` (its manifest {MANIFEST} says so); "
                            f"{command} replaces only files it wrote itself, so nothing was changed: give it a "
                            "folder of its own with --out")
    return OutputFolder(out, command, recognise=recognise)


def _prepared(path: pathlib.Path) -> bool:
    """A file an earlier ``prepare`` wrote (before its folder kept a manifest): its conftest, or a copy of a notebook
    with papermill's injected parameters that was never executed (only its checked cells hold their recorded
    output, with execution count 1; a sweep's executed notebook counts on past 1)."""
    if path.name == "conftest.py":
        first = path.read_text(errors="replace").split("\n", 1)[0]
        return first in (CONFTEST.splitlines()[0],
                         "# Written by scripts/notebooks.py prepare: checked cells compare their numbers with a "
                         "stated tolerance.")
    if path.suffix == ".ipynb" and (NOTEBOOKS / path.name).exists():
        try:
            nb = nbformat.read(path, as_version=4)
        except (OSError, ValueError):
            return False
        injected = any("injected-parameters" in c.metadata.get("tags", []) for c in nb.cells)
        code = [c for c in nb.cells if c.cell_type == "code"]
        untouched = all(c.get("execution_count") in (None, 1) and (checked(c) or not c.get("outputs")) for c in code)
        return injected and untouched
    return path.parent.name == "__pycache__" and path.name.startswith("conftest.")


def prepare(out: pathlib.Path, names: list[str], overrides: dict | None = None) -> None:
    """Copy notebooks to ``out`` with their CI parameters (then ``overrides``) and their recorded checks.

    Everything is checked before anything in ``out`` changes: the names, every parameter set, and the folder
    itself (:class:`kvlab.outputs.OutputFolder`: new, or holding only what an earlier ``prepare`` wrote)."""
    selected = _selected(names)
    sets = {path: checked_parameters(path, _parameters(path), _shown(_sidecar(path, ".ci.yaml")), overrides)
            for path in selected}
    folder = open_output(out, PREPARE, _prepared)
    out = out.resolve()
    for old in sorted(out.glob("*.ipynb")):  # the copies an earlier prepare wrote (open_output: nobody else's)
        folder.remove(old.name)
    folder.claim("__pycache__/")  # pytest's, beside the conftest
    folder.claim("conftest.py").write_text(CONFTEST)
    for path in selected:
        target = folder.claim(path.name).resolve()
        parameters = sets[path]
        papermill.execute_notebook(str(path), str(target), parameters=parameters, prepare_only=True,
                                   kernel_name="python3", cwd=str(NOTEBOOKS), progress_bar=False)
        nb = nbformat.read(target, as_version=4)
        checks_path = _sidecar(path, ".checks.json")
        expected = json.loads(checks_path.read_text()) if checks_path.exists() else []
        cells = _checked(nb)
        if len(expected) != len(cells):
            sys.exit(f"{path.name}: {len(cells)} cells marked {MARK} but {len(expected)} recorded outputs in "
                     f"{checks_path.relative_to(path.parent)}; run `python -m kvlab notebooks record {path}`")
        for cell, text in zip(cells, expected):
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
            cell.execution_count = 1  # nbval only compares cells that look executed
        nbformat.write(nb, target)
        print(f"prepared {target} ({len(cells)} checked cells)")


def record(names: list[str]) -> None:
    for path in _selected(names):
        executed = ROOT / "build" / "recorded" / path.name
        executed.parent.mkdir(parents=True, exist_ok=True)
        papermill.execute_notebook(str(path), str(executed), parameters=_parameters(path), kernel_name="python3",
                                   cwd=str(NOTEBOOKS))
        nb = nbformat.read(executed, as_version=4)
        texts = []
        for cell in _checked(nb):
            texts.append("".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream"))
        _sidecar(path, ".checks.json").write_text(json.dumps(texts, indent=1) + "\n")
        print(f"recorded {len(texts)} checked outputs of {path.name}")


def _overrides(pairs) -> dict:
    """``-p NAME YAML`` pairs as values; a value YAML cannot read is an error naming it."""
    out = {}
    for name, text in pairs:
        try:
            out[name] = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"-p {name} {text!r}: not a YAML value ({str(exc).splitlines()[0]}); quote a string, "
                             "write a list as [1, 2]") from None
    return out


def _selected(names: list[str]) -> list[pathlib.Path]:
    if not names:
        return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    out = []
    for n in names:
        path = pathlib.Path(n)
        if not path.exists():  # a number or a stem: "03", "03_sepllm_streaming"
            found = sorted(NOTEBOOKS.glob(f"{n}*.ipynb"))
            if len(found) != 1:
                sys.exit(f"notebook {n!r}: give a path or a unique prefix of a notebook in {NOTEBOOKS} "
                         f"(found {[f.name for f in found]})")
            path = found[0]
        out.append(path.resolve())
    return out


# --- the book's executed copies ----------------------------------------------------------------------------------
BOOK_COPIES = ROOT / "book" / "executed"
SKIPPED_TAGS = {"parameters", "injected-parameters"}
# parameters that say where and how a notebook runs, not what it computes: a book set need not fix them
NEUTRAL = {"device", "num_threads", "out", "results_path", "examples_out"}


def book_set_path(nb: pathlib.Path) -> pathlib.Path:
    return _sidecar(nb, ".book.yaml")


def book_parameters(nb: pathlib.Path) -> dict:
    """The book set of ``nb`` (``notebooks/params/NN_name.book.yaml``); an error naming the file where missing."""
    path = book_set_path(nb)
    if not path.exists():
        raise FileNotFoundError(f"{nb.name}: no book parameter set {_shown(path)}; write one (every "
                                f"parameter of the notebook's parameters cell, at the size the book shows)")
    return read_set(path)


def code_hash(nb) -> str:
    """sha256 of the code cells' sources in order, the parameters cell and papermill's injected cell left out; a
    marker kept as a tag counts as the same marker on the cell's first line (:func:`_canonical`)."""
    sources = [_canonical(c) for c in nb.cells
               if c.cell_type == "code" and not SKIPPED_TAGS & set(c.metadata.get("tags", []))]
    return hashlib.sha256(json.dumps(sources).encode()).hexdigest()


def params_hash(parameters: dict) -> str:
    """The sha256 of a parameter set as JSON. A value JSON cannot hold (YAML reads an unquoted 2024-05-01 as a
    date, papermill would pass the notebook a date object) is refused by name: quote it in the file."""
    try:
        text = json.dumps(parameters, sort_keys=True)
    except TypeError:
        bad = [f"{k} = {v!r} ({type(v).__name__})" for k, v in sorted(parameters.items(), key=lambda kv: str(kv[0]))
               if not _json_value(v)]
        raise ValueError(f"parameters that are not numbers, text, true/false, null or lists and maps of them: "
                         f"{', '.join(bad) or repr(parameters)}; quote them in the YAML file (e.g. '2024-05-01'), so the "
                         "notebook gets text") from None
    return hashlib.sha256(text.encode()).hexdigest()


def _json_value(value) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


def _shown(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def book_stamp(nb_path: pathlib.Path) -> dict:
    """What a book copy of ``nb_path`` must carry to be current: the two hashes and the set's file."""
    nb = nbformat.read(nb_path, as_version=4)
    return {"code_sha256": code_hash(nb), "params_sha256": params_hash(book_parameters(nb_path)),
            "params_file": _shown(book_set_path(nb_path))}


def stale(nb_path: pathlib.Path, copies: pathlib.Path = BOOK_COPIES) -> list[str]:
    """Why the book copy of ``nb_path`` in ``copies`` cannot stand for it (empty: it is current)."""
    copy = copies / nb_path.name
    if not copy.exists():
        return [f"{nb_path.name}: no executed copy in {copies}"]
    meta = nbformat.read(copy, as_version=4).metadata.get("kvlab", {}).get("book")
    if not meta:
        return [f"{copy}: no metadata.kvlab.book stamp (make it with `python -m kvlab notebooks book "
                f"{nb_path.stem[:2]}`)"]
    problems = []
    if meta.get("set") != "book":
        problems.append(f"{copy.name}: executed with the {meta.get('set')!r} set, not the book set")
    want = book_stamp(nb_path)
    if meta.get("code_sha256") != want["code_sha256"]:
        problems.append(f"{copy.name}: executed from other code cells than notebooks/{nb_path.name} has now "
                        f"(stale: execute it again with `benchmarks/gpu/book_notebooks.sh`)")
    if meta.get("params_sha256") != want["params_sha256"]:
        problems.append(f"{copy.name}: executed with other parameters than {want['params_file']} holds now "
                        f"(stale: execute it again)")
    errors = [o for c in nbformat.read(copy, as_version=4).cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    if errors:
        problems.append(f"{copy.name}: holds an error output ({errors[0].get('ename')}: {errors[0].get('evalue')})")
    return problems


def slim(nb) -> None:
    """Keep the copy small: PNG only where a picture has several forms, no widget state or widget views."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/png" in data:
                for key in [k for k in data if k.startswith("image/") and k != "image/png"] + ["application/pdf"]:
                    data.pop(key, None)
            data.pop("application/vnd.jupyter.widget-view+json", None)


def execute_book(nb_path: pathlib.Path, out: pathlib.Path, which: str = "book",
                 overrides: dict | None = None) -> dict:
    """Execute ``nb_path`` with its book set (``which="ci"``: its CI set, for a quick check of this machinery;
    ``stale`` refuses such a copy) plus ``overrides`` (kept where the notebook declares them) into ``out``."""
    if which == "book":
        base = book_parameters(nb_path)
    elif which == "ci":
        base = _parameters(nb_path)
    else:
        raise ValueError(f"which must be 'book' or 'ci', got {which!r}")
    parameters = checked_parameters(nb_path, base, _shown(_sidecar(nb_path, f".{which}.yaml")), overrides)
    folder = open_output(out, BOOK, _book_copy)
    target = folder.claim(nb_path.name)
    partial = folder.claim(target.with_suffix(".partial.ipynb").name)
    t0 = time.monotonic()
    os.environ.setdefault("MATPLOTLIBRC", str(BOOK_MPLRC))  # the kernel draws figures for the page's width
    papermill.execute_notebook(str(nb_path), str(partial), parameters=parameters, kernel_name="python3",
                               cwd=str(NOTEBOOKS), progress_bar=False)
    seconds = time.monotonic() - t0
    nb = nbformat.read(partial, as_version=4)
    slim(nb)
    device = "cpu"
    try:
        import torch

        if torch.cuda.is_available() and parameters.get("device", "auto") != "cpu":
            device = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    stamp = book_stamp(nb_path) if which == "book" else {
        "code_sha256": code_hash(nbformat.read(nb_path, as_version=4)), "params_sha256": params_hash(base),
        "params_file": _shown(_sidecar(nb_path, ".ci.yaml"))}
    meta = {**stamp, "set": which, "parameters": parameters, "seconds": round(seconds, 1), "device": device,
            "executed": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}
    nb.metadata.setdefault("kvlab", {})["book"] = meta
    nb.metadata.pop("papermill", None)
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
    nbformat.write(nb, target)
    partial.unlink()
    print(f"executed {nb_path.name} with {meta['params_file']} in {seconds:.0f} s on {device}: {target} "
          f"({target.stat().st_size / 1e6:.2f} MB)", flush=True)
    return meta


def _book_copy(path: pathlib.Path) -> bool:
    """A copy ``book`` wrote (stamped in its metadata), or the partial copy of a run that was stopped."""
    if path.name.endswith(".partial.ipynb") and (NOTEBOOKS / path.name.replace(".partial", "")).exists():
        return True
    try:
        return path.suffix == ".ipynb" and "book" in json.loads(path.read_text()).get("metadata", {}).get("kvlab", {})
    except (OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvlab notebooks", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "notebooks")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "YAML"),
                   help="override a CI parameter, e.g. -p num_threads 1")
    p.add_argument("names", nargs="*")
    r = sub.add_parser("record")
    r.add_argument("names", nargs="*")
    b = sub.add_parser("book", help="execute notebooks with their book set into the book's executed copies")
    b.add_argument("--out", type=pathlib.Path, default=BOOK_COPIES)
    b.add_argument("--set", choices=["book", "ci"], default="book",
                   help="book (default) or ci: the CI set, to check this machinery quickly (not a book copy)")
    b.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "YAML"),
                   help="override where the notebook declares it, e.g. -p device cuda -p num_threads 2")
    b.add_argument("names", nargs="+", help="notebooks: paths or prefixes such as 01")
    m = sub.add_parser("markers", help="move nbval's first-line markers into cell tags (nbval reads both), so "
                       "that a reader of the notebook in the lab never sees them; the book copies stay current")
    m.add_argument("names", nargs="*", help="default: every numbered notebook")
    s = sub.add_parser("stale", help="list the book copies that no longer match their notebook or book set")
    s.add_argument("--copies", type=pathlib.Path, default=BOOK_COPIES)
    s.add_argument("names", nargs="*", help="default: every notebook that has a book set")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        try:
            prepare(args.out, args.names, _overrides(args.parameter))
        except (ValueError, TypeError, FileNotFoundError) as err:  # OutputRefused is a ValueError
            sys.exit(str(err))
    elif args.command == "book":
        try:
            overrides = _overrides(args.parameter)
            selected = _selected(args.names)
            for nb in selected:  # every set checked before the first notebook runs
                checked_parameters(nb, book_parameters(nb) if args.set == "book" else _parameters(nb),
                                   _shown(_sidecar(nb, f".{args.set}.yaml")), overrides)
            for nb in selected:
                execute_book(nb, args.out.resolve(), args.set, overrides)
        except (ValueError, TypeError, FileNotFoundError) as err:
            sys.exit(str(err))
    elif args.command == "markers":
        for path in _selected(args.names):
            nb = nbformat.read(path, as_version=4)
            moved = markers_to_tags(nb)
            if moved:
                nbformat.write(nb, path)
            print(f"{path.name}: {moved} markers moved into cell tags")
    elif args.command == "stale":
        names = args.names or [str(p) for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
                               if book_set_path(p).exists()]
        problems = [x for nb in _selected(names) for x in stale(nb, args.copies.resolve())]
        print("\n".join(problems) or "every book copy is current")
        sys.exit(1 if problems else 0)
    else:
        record(args.names)


if __name__ == "__main__":
    main()
