"""Make the student version of each lesson: solution blocks become a clear "your code here" error.

    python scripts/lessons.py --out build/lessons

A master notebook in ``lessons/`` marks solutions with ``# BEGIN SOLUTION`` / ``# END SOLUTION`` lines; the
student copy keeps everything else (the checks included) and raises ``NotImplementedError`` in their place.
"""

from __future__ import annotations

import argparse
import pathlib
import re

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION\n.*?^[ \t]*# END SOLUTION[ \t]*$", re.S | re.M)


def strip_solutions(source: str) -> str:
    return BLOCK.sub(lambda m: f'{m["indent"]}raise NotImplementedError("write your solution here")', source)


def make_students(out: pathlib.Path) -> list[pathlib.Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted((ROOT / "lessons").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.source = strip_solutions(cell.source)
        target = out / path.name
        nbformat.write(nb, target)
        written.append(target)
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "lessons")
    for p in make_students(parser.parse_args().out):
        print("wrote", p.relative_to(ROOT))
