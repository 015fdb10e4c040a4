"""The guide's instructor and papermill commands (docs/guide/classroom.md, docs/guide/papermill.md; the README links
both), run verbatim (the instructor block) or checked and partly run (papermill: a full notebook run is not a unit
test; the folder every output goes to is created first, and the cheap commands run verbatim)."""

from __future__ import annotations

import csv
import os
import pathlib
import re
import shlex
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
CLASSROOM = (ROOT / "docs" / "guide" / "classroom.md").read_text()
PAPERMILL = (ROOT / "docs" / "guide" / "papermill.md").read_text()


def _block(page: str, heading: str) -> str:
    """The first ```bash block after ``heading`` in ``page``."""
    after = page.split(heading, 1)[1]
    return re.search(r"```bash\n(.*?)```", after, re.S).group(1)


def test_instructor_commands_run_verbatim(tmp_path):
    """make -> hand-out bundle; a folder of submissions (a zip and a notebook) -> grades, feedback, answers."""
    block = _block(CLASSROOM, "### For instructors: hand out, collect, grade")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    # what students hand in, placed where the block says to collect it (the block itself creates the folder)
    script = block.replace("mkdir -p submissions", "mkdir -p submissions && cp \"$WRONG\" submissions/bob.ipynb")
    assert script != block, "the classroom guide's block no longer creates submissions/"
    env = {**os.environ, "WRONG": str(ROOT / "tests" / "fixtures" / "lessons" / "01_streaming_llm_wrong.ipynb")}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "build" / "lessons" / "student").glob("*.ipynb")) == \
        sorted(p.name for p in (ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))
    assert (tmp_path / "build" / "lessons" / "student.zip").exists()
    out = tmp_path / "build" / "grades" / "01_streaming_llm"
    with open(out / "final_grades.csv") as f:
        rows = {r["file"]: r for r in csv.DictReader(f)}
    assert float(rows["bob.ipynb"]["total_points_earned"]) == 5 and rows["bob.ipynb"]["review"] == ""
    assert (out / "feedback" / "bob.ipynb.md").exists() and (out / "written_answers.csv").exists()
    # the paths the guide's prose names exist
    prose = CLASSROOM.split("### For instructors: hand out, collect, grade", 1)[1].split("\n## ", 1)[0]
    for name in ("final_grades.csv", "feedback.csv", "written_answers.csv"):
        assert f"`{name}`" in prose and (out / name).exists()


def test_papermill_example_creates_its_output_folders_and_its_cheap_commands_run(tmp_path):
    block = _block(PAPERMILL, "## Running an experiment with papermill")
    commands = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip() and
                not line.strip().startswith("#")]
    made = set()
    for command in commands:
        words = shlex.split(command)
        if words[:2] == ["mkdir", "-p"]:
            made.update(words[2:])
        elif words[0].endswith("papermill") and "--help-notebook" not in words:
            output = pathlib.PurePosixPath(words[2])
            assert str(output.parent) in made | {"."}, f"{command}: nothing in the block creates {output.parent}/"
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    for command in commands:  # the cheap ones, verbatim
        if command.startswith("mkdir") or "--help-notebook" in command:
            done = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, (command, done.stderr[-2000:])
            if "--help-notebook" in command:
                assert "max_tokens" in done.stdout
    assert all((tmp_path / folder).is_dir() for folder in made)
