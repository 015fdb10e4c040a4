"""A class of honest submissions of one lesson, to time grading: N copies of the master's answers, each with a
comment of its own in every answer cell (so no two students share a run, as in a real class)::

    python -m kvlab lessons class BUILT/01_streaming_llm 8 class/   # class/student0.ipynb ...
    /usr/bin/time -v python -m kvlab lessons grade 01 class/ --built BUILT --jobs 2

``BUILT`` is the folder ``python -m kvlab lessons make`` wrote (``build/lessons`` by default). The class folder
follows kvlab's output rule (:class:`kvlab.outputs.OutputFolder`): a new folder, or one this command wrote; a
notebook it did not write (a real student's ``student0.ipynb``) is never replaced: the command refuses first.
"""

from __future__ import annotations

import pathlib

TAGS = {"otter_answer_cell", "otter_assign_solution_cell"}
COMMAND = "python -m kvlab lessons class"


def _answer_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and TAGS & set(c.metadata.get("tags", []))]


def write_class(assignment_folder: pathlib.Path, n: int, out: pathlib.Path) -> list[pathlib.Path]:
    """``n`` honest students ``out/student{k}.ipynb`` from the assignment ``make`` wrote into
    ``assignment_folder``; refuses (:class:`kvlab.outputs.OutputRefused`) before writing when ``out`` holds a
    file kvlab did not write there."""
    import nbformat

    from kvlab.classroom import lessons as classroom
    from kvlab.outputs import OutputFolder

    if n < 1:
        raise ValueError(f"a class of {n} students: give N >= 1")
    assignment = classroom.Assignment.at(pathlib.Path(assignment_folder))
    folder = OutputFolder(out, COMMAND)  # refuses a folder holding someone's notebooks before anything is read
    reference = [c.source for c in _answer_cells(nbformat.read(assignment.solutions, as_version=4))]
    written = []
    for k in range(n):
        nb = nbformat.read(assignment.student, as_version=4)
        for i, cell in enumerate(_answer_cells(nb)):
            cell.source = f"# student {k}\n" + reference[i]
        path = folder.claim(f"student{k}.ipynb")
        nbformat.write(nb, path)
        written.append(path)
    return written
