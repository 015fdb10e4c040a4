"""A class of honest submissions of one lesson, to time grading: N copies of the master's answers, each with a
comment of its own in every answer cell (so no two students share a run, as in a real class)::

    python scripts/make_class_submissions.py BUILT/01_streaming_llm 8 class/   # class/student0.ipynb ...
    /usr/bin/time -v python -m kvlab lessons grade 01 class/ --built BUILT --jobs 2

``BUILT`` is the folder ``python -m kvlab lessons make`` wrote (``build/lessons`` by default).
"""

from __future__ import annotations

import pathlib
import sys

import nbformat

TAGS = {"otter_answer_cell", "otter_assign_solution_cell"}


def _answer_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and TAGS & set(c.metadata.get("tags", []))]


def write_class(assignment_folder: pathlib.Path, n: int, out: pathlib.Path) -> list[pathlib.Path]:
    from kvlab.classroom import lessons as classroom

    assignment = classroom.Assignment.at(pathlib.Path(assignment_folder))
    reference = [c.source for c in _answer_cells(nbformat.read(assignment.solutions, as_version=4))]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for k in range(n):
        nb = nbformat.read(assignment.student, as_version=4)
        for i, cell in enumerate(_answer_cells(nb)):
            cell.source = f"# student {k}\n" + reference[i]
        path = out / f"student{k}.ipynb"
        nbformat.write(nb, path)
        written.append(path)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__)
        sys.exit(2)
    for p in write_class(pathlib.Path(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3])):
        print(p)
