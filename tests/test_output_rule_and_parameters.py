"""Hostile-user cases, one test each (each failed before its fix), by class:

- data loss: kvlab deleted or overwrote a file it did not write;
- silent wrong results: a run finished and reported something wrong;
- crashes: a bare Python error instead of a message;
- unclear errors: a message that does not name the input, the rule and the fix.

Beside the cases, the two rules that make their classes impossible: the output rule (:mod:`kvlab.outputs`,
checked against every command that writes a folder) and the parameter check at every door (every committed
parameter set against its notebook's parameters cell).

A row of the ledger whose named test exists only in this docstring is refused: test_only_named_in_a_docstring.
"""
from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys
import zipfile

import pytest
import torch
import yaml

from kvlab.experiments import claims, ledger_cli
from kvlab.core.checks import check_notebook_parameters, check_parameters, declared_parameters
from kvlab.outputs import MANIFEST, OutputFolder, OutputRefused

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = sys.executable
NB01 = ROOT / "notebooks" / "01_attention_sinks.ipynb"


def _run(*args, timeout=300):
    return subprocess.run([PY, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


def _notebooks_tool():
    from kvlab.notebooks import copies

    return copies


def _user_file(folder: pathlib.Path, rel: str = "my_notes.txt") -> pathlib.Path:
    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("the user's own words\n")
    return path


# =========================================================================== the output rule
def test_output_folder_keeps_a_manifest_and_refuses_what_kvlab_did_not_write(tmp_path):
    out = tmp_path / "out"
    folder = OutputFolder(out, "test")
    folder.claim("a.txt").write_text("1")
    folder.claim("sub/b.txt").parent.mkdir()
    (out / "sub" / "b.txt").write_text("2")
    assert {"a.txt", "sub/b.txt"} <= set((out / MANIFEST).read_text().split())
    again = OutputFolder(out, "test")  # a second run: everything there is kvlab's
    again.remove("a.txt")
    again.remove_tree("sub")
    assert not (out / "a.txt").exists() and not (out / "sub").exists()
    mine = _user_file(out)
    with pytest.raises(OutputRefused, match="my_notes.txt was not written by kvlab"):
        OutputFolder(out, "test")
    with pytest.raises(OutputRefused, match="not written by kvlab"):
        OutputFolder(tmp_path / "out2", "test").claim(mine)  # outside the folder: refused too
    assert mine.read_text() == "the user's own words\n"


def test_output_folder_never_deletes_a_committed_file(tmp_path):
    repo = tmp_path / "repo"
    (repo / "out").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "out" / "kept.txt").write_text("committed")
    (repo / "out" / MANIFEST).write_text("kept.txt\n")  # even a file kvlab once wrote, once committed
    subprocess.run(["git", "-C", str(repo), "add", "out/kept.txt"], check=True)
    folder = OutputFolder(repo / "out", "test")
    with pytest.raises(OutputRefused, match="committed to git"):
        folder.remove("kept.txt")
    assert (repo / "out" / "kept.txt").read_text() == "committed"


def _lesson_assignment(tmp_path):
    from kvlab.classroom.lessons import Assignment

    built = tmp_path / "built" / "01_streaming_llm"
    return Assignment("01_streaming_llm", built / "student" / "x.ipynb", built / "autograder" / "x.ipynb",
                      built / "autograder" / "x.zip")


def _submissions(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir(exist_ok=True)
    (subs / "alice.ipynb").write_text("{}")
    return subs


def _writers(tmp_path):
    """Every command that writes a folder, as a function of the folder (each must refuse before any work)."""
    from kvlab.classroom import lessons
    from kvlab.experiments.leaderboard import run_leaderboard
    from kvlab.experiments.sweep import Task, run_sweep

    from kvlab.notebooks import plain_run, times

    nbtool = _notebooks_tool()
    from conftest import import_script

    book = import_script("book/build.py")
    return {
        "notebooks prepare": lambda out: nbtool.prepare(out, ["00"]),
        "notebooks book": lambda out: nbtool.execute_book(nbtool._selected(["01"])[0], out),
        "lessons make": lambda out: lessons.make(["01"], out),
        "lessons grade": lambda out: lessons.grade(_lesson_assignment(tmp_path), _submissions(tmp_path), out),
        "sweep": lambda out: run_sweep([Task("c1", "kvlab.sepllm.theory:sliding_window_layers",
                                             {"distance": 10, "neighbors": 3})], out, workers=1, progress=False),
        "leaderboard": lambda out: run_leaderboard("tiny", out, run=False, progress=False),
        "book build": lambda out: book.build(tmp_path / "executed", tmp_path / "lessons", out),
        "notebooks run": lambda out: plain_run.open_output(NB01, out),
        "notebooks times": lambda out: times.open_output(out, "t"),
    }


@pytest.mark.parametrize("command", ["notebooks prepare", "notebooks book", "lessons make", "lessons grade", "sweep",
                                     "leaderboard", "book build", "notebooks run", "notebooks times"])
def test_every_command_that_writes_a_folder_refuses_one_holding_a_users_file(tmp_path, command):
    out = tmp_path / "out"
    mine = _user_file(out)
    with pytest.raises(Exception, match="my_notes.txt was not written by kvlab") as info:
        _writers(tmp_path)[command](out)
    assert isinstance(info.value, (OutputRefused, ValueError)) or type(info.value).__name__ == "BookError"
    assert mine.read_text() == "the user's own words\n"
    assert sorted(p.name for p in out.iterdir()) == ["my_notes.txt"]  # nothing written, nothing removed


# =========================================================================== data loss
def _executed_notebook(path: pathlib.Path, cells: int = 3) -> bytes:
    """What a sweep (papermill) leaves for a notebook: injected parameters, every cell executed, outputs."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["injected-parameters"]}, execution_count=1)]
    nb.cells += [nbformat.v4.new_code_cell(f"print({i})", execution_count=i + 2,
                                           outputs=[nbformat.v4.new_output("stream", name="stdout", text=f"{i}\n")])
                 for i in range(cells - 1)]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path.read_bytes()


def test_prepare_into_a_sweeps_folder_keeps_its_executed_notebooks(tmp_path):
    """`notebooks prepare --out SWEEP_OUT` deleted the sweep's executed notebooks: they are kvlab's (the sweep's
    manifest lists them), but not prepare's; it replaces only what it wrote itself."""
    nbtool = _notebooks_tool()
    sweep = tmp_path / "sweep"
    OutputFolder(sweep, "kvlab sweep").claim("00_tour.ipynb", "c1.ipynb", "c1.json")
    before = {name: _executed_notebook(sweep / name) for name in ("00_tour.ipynb", "c1.ipynb")}
    with pytest.raises(OutputRefused, match=r"holds the outputs of `kvlab sweep`.*only files it wrote itself"):
        nbtool.prepare(sweep, ["00"])
    assert {name: (sweep / name).read_bytes() for name in before} == before
    # an older sweep's folder (no manifest yet): an executed notebook is not taken for a prepared copy
    old = tmp_path / "old_sweep"
    kept = _executed_notebook(old / "00_tour.ipynb")
    with pytest.raises(OutputRefused, match="00_tour.ipynb was not written by kvlab"):
        nbtool.prepare(old, ["00"])
    assert (old / "00_tour.ipynb").read_bytes() == kept and not (old / MANIFEST).exists()
    # prepare's own folder: its earlier copies are replaced, as before
    mine = tmp_path / "prepared"
    nbtool.prepare(mine, ["00"])
    nbtool.prepare(mine, ["00"])
    assert (mine / "00_tour.ipynb").is_file()


def _plain_notebook(folder: pathlib.Path) -> pathlib.Path:
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["parameters"]}, "outputs": [], "execution_count": None,
                     "source": ["n: int = 2  # how many\n", "word: str = 'a'  # what to print\n"]},
                    {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": ["print(word * n)\n"]}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "demo.ipynb"
    path.write_text(json.dumps(nb))
    return path


def test_plain_run_into_the_notebooks_own_folder_is_refused(tmp_path, capsys):
    """`notebooks run NB --out <its folder>` overwrote the source notebook and the user's log."""
    from kvlab.notebooks import plain_run

    nb = _plain_notebook(tmp_path / "work")
    log = _user_file(tmp_path / "work", "demo.log")
    source = nb.read_bytes()
    assert plain_run.main([str(nb), "--out", str(nb.parent)]) == 2
    assert "would replace the source notebook" in capsys.readouterr().err
    assert nb.read_bytes() == source and log.read_text() == "the user's own words\n"
    other = tmp_path / "other"  # a folder holding the user's log of the same name: refused too
    _user_file(other, "demo.log")
    assert plain_run.main([str(nb), "--out", str(other)]) == 2
    assert "demo.log was not written by kvlab" in capsys.readouterr().err
    assert (other / "demo.log").read_text() == "the user's own words\n"


def test_plain_run_refuses_a_parameter_the_notebook_does_not_declare(tmp_path, capsys):
    """`notebooks run -p xx 5` ran with the defaults: a name the parameters cell does not declare is refused,
    naming the declared ones, before any cell runs or any file is written."""
    from kvlab.notebooks import plain_run

    nb = _plain_notebook(tmp_path / "src")
    out = tmp_path / "out"
    assert plain_run.main([str(nb), "-p", "xx", "5", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "xx: not a parameter of this notebook" in err and "['n', 'word']" in err
    assert plain_run.main([str(nb), "-p", "n", "'three'", "--out", str(out)]) == 2  # a wrong type too
    assert "n: expected int" in capsys.readouterr().err
    assert not out.exists()


def test_book_build_claims_only_the_files_it_wrote(tmp_path):
    """`book/build.py --out` took any file under html/, src/ or doctrees/ for its own."""
    from conftest import import_script

    book = import_script("book/build.py")
    for rel in ("html/my_notes.txt", "src/my_notes.txt", "doctrees/my_notes.txt"):
        out = tmp_path / rel.replace("/", "_")
        mine = _user_file(out, rel)
        with pytest.raises(book.BookError, match="my_notes.txt was not written by kvlab"):
            book._output_folder(out)
        assert mine.read_text() == "the user's own words\n" and not (out / MANIFEST).exists()
    # a build folder from before the manifest: Sphinx's marked folders and the staged pages it listed are the book's
    out = tmp_path / "old_build"
    (out / "html").mkdir(parents=True)
    (out / "html" / ".buildinfo").write_text("# Sphinx build info version 1\n")
    (out / "html" / "index.html").write_text("<html></html>")
    (out / "src").mkdir()
    (out / "src" / "index.md").write_text("# kvlab\n")
    (out / "src" / book.BOOK_FILES).write_text("index.md\n")
    book._output_folder(out)
    (out / "src" / "my_page.md").write_text("mine\n")  # a page the build never staged
    with pytest.raises(book.BookError, match="my_page.md was not written by kvlab"):
        book._output_folder(out)


def test_prepare_into_the_notebooks_folder_deletes_nothing():
    before = {p.name: p.read_bytes() for p in (ROOT / "notebooks").glob("*.ipynb")}
    done = _run("-m", "kvlab", "notebooks", "prepare", "--out", "notebooks", "00")
    assert done.returncode != 0
    assert "was not written by kvlab" in done.stderr and "notebooks/" in done.stderr
    assert {p.name: p.read_bytes() for p in (ROOT / "notebooks").glob("*.ipynb")} == before
    assert not (ROOT / "notebooks" / MANIFEST).exists()


def test_grade_keeps_the_instructors_notes_in_the_feedback_folder(tmp_path):
    from kvlab.classroom import lessons

    out = tmp_path / "fb_out"
    notes = _user_file(out, "feedback/my_notes_on_alice.md")
    with pytest.raises(OutputRefused, match="my_notes_on_alice.md was not written by kvlab"):
        lessons.grade(_lesson_assignment(tmp_path), _submissions(tmp_path), out)
    assert notes.exists()


def test_make_keeps_the_users_files_in_student_and_their_student_zip(tmp_path):
    from kvlab.classroom import lessons

    out = tmp_path / "dir"
    mine = _user_file(out, "student/my_solutions.ipynb")
    with pytest.raises(OutputRefused, match="my_solutions.ipynb was not written by kvlab"):
        lessons.make(["01"], out)
    assert mine.exists()
    mine.unlink()
    (out / "student").rmdir()
    with zipfile.ZipFile(out / "student.zip", "w") as z:  # the user's own zip of that name
        z.writestr("homework/answers.txt", "mine")
    with pytest.raises(OutputRefused, match="student.zip was not written by kvlab"):
        lessons.make(["01"], out)
    assert zipfile.ZipFile(out / "student.zip").namelist() == ["homework/answers.txt"]


def test_bundle_rewrites_only_what_it_wrote(tmp_path):
    import nbformat

    from kvlab.classroom import lessons

    out = tmp_path / "built"
    (out / "01_streaming_llm" / "student").mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(), out / "01_streaming_llm" / "student" / "01_streaming_llm.ipynb")
    lessons.bundle(out)
    lessons.bundle(out)  # again: its own files are replaced
    assert sorted(p.name for p in (out / "student").iterdir()) == ["01_streaming_llm.ipynb", "README.md"]
    mine = _user_file(out, "student/extra.md")
    with pytest.raises(OutputRefused, match="extra.md"):
        lessons.bundle(out)
    assert mine.exists()


@pytest.mark.parametrize("content", ["plain text, not a result", "[1, 2, 3]", '{"mine": true}'])
def test_sweep_never_overwrites_a_users_file_at_a_result_path(tmp_path, content):
    from kvlab.experiments.sweep import Task, run_sweep

    (tmp_path / "c1.json").write_text(content)
    task = Task("c1", "kvlab.sepllm.theory:sliding_window_layers", {"distance": 10, "neighbors": 3})
    with pytest.raises(ValueError, match="c1.json was not written by kvlab"):  # a JSON list: no AttributeError
        run_sweep([task], tmp_path, workers=1, progress=False)
    assert (tmp_path / "c1.json").read_text() == content


# =========================================================================== silent wrong results
def test_pooled_records_refuse_a_duplicate_standing_in_for_a_missing_method_and_mixed_metrics():
    from kvlab.experiments.orthorank.studies import pooled_records

    dup = [{"example": "w0", "method": "A", "metric": "nll", "value": 1.0},
           {"example": "w0", "method": "A", "metric": "nll", "value": 5.0}]
    with pytest.raises(ValueError, match="duplicate records"):
        pooled_records(dup, ["A", "B"], "pooled")
    mixed = [{"example": "w0", "method": "A", "metric": "nll", "value": 1.0},
             {"example": "w0", "method": "B", "metric": "acc", "value": 0.0}]
    with pytest.raises(ValueError, match="several metrics"):
        pooled_records(mixed, ["A", "B"], "pooled")
    good = [{"example": "w0", "method": m, "metric": "nll", "value": v} for m, v in (("A", 1.0), ("B", 3.0))]
    assert pooled_records(good, ["A", "B"], "p")[0]["value"] == 2.0


def _row(**kw):
    base = {k: "" for k in claims.FIELDS}
    base.update(id="t-1", paper="SepLLM", item="Table 1", claim="c", kind="statistical", paper_value="1",
                model="m", differs="none", where="w", role="check", metric="score", method_a="A", method_b="B",
                direction="a>b", command="cmd", verdict="inconclusive",
                results_file="benchmarks/results/fidelity/fullsize_runs.examples.jsonl.gz")
    base.update(kw)
    return base


def test_validate_refuses_a_comparison_of_a_method_with_itself():
    with pytest.raises(ValueError, match="method_a and method_b are both 'A'"):
        claims.validate([_row(method_b="A")])


def test_validate_refuses_a_verdict_outside_the_vocabulary():
    row = _row(kind="exact", verdict="Agrees", test="tests/test_output_rule_and_parameters.py::"
                                                    "test_validate_refuses_a_verdict_outside_the_vocabulary")
    with pytest.raises(ValueError, match="verdict 'Agrees' is not one of"):
        claims.validate([row])
    row["verdict"] = "agrees"
    claims.validate([row])


def test_validate_refuses_an_exact_row_whose_test_is_only_named_in_a_docstring():
    row = _row(kind="exact", verdict="agrees", test="tests/test_output_rule_and_parameters.py::test_only_named_in_a_docstring")
    with pytest.raises(ValueError, match="defines no test function 'test_only_named_in_a_docstring'"):
        claims.validate([row])


def test_teacher_forced_metrics_match_case_insensitively(tmp_path):
    assert all(claims.teacher_forced(m) for m in ("nll", "NLL", "answer_nll", "window_nll", "Window_NLL", "ppl"))
    assert not any(claims.teacher_forced(m) for m in ("score", "f1", "nll_gap_sign", "answer"))
    path = tmp_path / "r.examples.jsonl"
    path.write_text("".join(json.dumps({"example": f"e{i}", "method": m, "metric": "NLL", "value": 1.0 + i,
                                        "config": {"device": "cpu"}, "output": ""}) + "\n"
                            for i in range(30) for m in ("A", "B")))
    *_, suspect = claims._paired(_row(metric="NLL", results_file=str(path)))
    assert suspect == 0  # the gold answer's NLL is scored whatever the model generated: no "harness bug"


def test_derive_verdict_refuses_true_as_a_bias_bound():
    with pytest.raises(ValueError, match="systematic must be a finite number"):
        claims.derive_verdict(0.1, 0.2, "a>b", 50, systematic=True)


def test_book_refuses_an_override_the_notebook_does_not_declare(tmp_path):
    done = _run("-m", "kvlab", "notebooks", "book", "01", "--out", str(tmp_path / "copies"), "-p", "xx", "5")
    assert done.returncode != 0 and "xx: not a parameter of this notebook" in done.stderr
    assert not (tmp_path / "copies").exists()  # refused before any work
    nbtool = _notebooks_tool()
    # a parameter that says only where it runs, absent from the notebook, is left out with a note, not an error
    assert "num_threads" not in nbtool.checked_parameters(NB01, {}, "set", {"num_threads": 2})


def test_prepare_refuses_a_misspelt_override_and_suggests_the_name(tmp_path):
    done = _run("-m", "kvlab", "notebooks", "prepare", "--out", str(tmp_path / "p"), "-p", "max_tokenz", "5", "01")
    assert done.returncode != 0 and "did you mean 'max_tokens'?" in done.stderr
    assert not (tmp_path / "p").exists()


def test_a_parameter_set_naming_an_undeclared_parameter_is_refused():
    with pytest.raises(ValueError, match=r"max_tokenz: not a parameter.*did you mean 'max_tokens'"):
        check_notebook_parameters(NB01, {"max_tokenz": 5}, "notebooks/params/01_attention_sinks.ci.yaml")


def _namespace(**values):
    ns = {"__annotations__": {"names": list[str], "rate": float, "count": int, "max_tokens": int},
          "names": ["a"], "rate": 0.5, "count": 3, "max_tokens": 10,
          "In": ["", "names: list[str] = ['a']\nrate: float = 0.5\ncount: int = 3\nmax_tokens: int = 10"]}
    ns.update(values)
    return ns


def test_check_parameters_checks_element_types_finiteness_and_names():
    with pytest.raises(TypeError, match=r"names: expected list\[str\], got list \[1, 2\]"):
        check_parameters(_namespace(names=[1, 2]))
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="rate must be finite"):
            check_parameters(_namespace(rate=bad))
    ns = _namespace(max_tokenz=5)
    ns["In"].append("# Parameters\nmax_tokenz = 5\n")  # what papermill injects for -p max_tokenz 5
    with pytest.raises(ValueError, match="max_tokenz: not a parameter of this notebook .did you mean 'max_tokens'"):
        check_parameters(ns)
    check_parameters(_namespace(rate=1))  # an int where a float is declared is fine


def test_sweep_refuses_a_parameter_both_fixed_and_in_the_grid():
    from kvlab.experiments.sweep import grid_tasks

    with pytest.raises(ValueError, match=r"\['x'\] given both in fixed and in grid"):
        grid_tasks("m:f", {"x": [1, 2]}, fixed={"x": 5})


def test_held_trace_refuses_a_bad_chunk_or_empty_ids():
    from kvlab.experiments.leaderboard import held_trace
    from kvlab.policies import StreamingLLM

    policy = StreamingLLM(sink=4, cache_size=16)
    ids = torch.arange(40)[None]
    with pytest.raises(ValueError, match="chunk must be >= 1, got -4"):
        held_trace(policy, 2, ids, -4)
    with pytest.raises(ValueError, match="chunk must be >= 1, got 0"):  # was: range() arg 3 must not be zero
        held_trace(policy, 2, ids, 0)
    with pytest.raises(ValueError, match=r"ids must be token ids of shape \(1, T\) with T >= 1"):
        held_trace(policy, 2, ids[:, :0], 4)
    assert math.isfinite(float(held_trace(policy, 2, ids, 4).mean()))


def test_layerwise_plans_refuse_a_repeated_layer():
    from kvlab.experiments.orthorank.studies import layerwise_plans

    with pytest.raises(ValueError, match=r"layers must be distinct.*\[3\] repeated"):
        layerwise_plans([3, 3])


class _CharTokenizer:
    bos_token_id = None

    def __call__(self, text, add_special_tokens=False):
        return type("Enc", (), {"input_ids": [ord(c) % 90 for c in text]})()


def test_document_windows_count_two_identical_documents_once():
    from kvlab.experiments.orthorank.studies import document_windows

    docs = {"a": "the same text " * 4, "b": "the same text " * 4, "c": "another text! " * 4}
    ids, names = document_windows(_CharTokenizer(), docs, 20)
    assert names == ["a", "c"] and ids.shape == (2, 20)
    with pytest.raises(ValueError, match="repeated"):
        document_windows(_CharTokenizer(), {"a": docs["a"], "b": docs["b"]}, 20)


def test_repo_task_refuses_true_as_a_use_index():
    from kvlab.eval.tasks import repo_task

    with pytest.raises(TypeError, match="use must be an int, got bool True"):
        repo_task(None, 512, use=True)


# =========================================================================== crashes
def test_decode_static_takes_int32_ids(tiny_llama):
    from kvlab.eval.fast import decode_static
    from kvlab.policies import StreamingLLM

    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(0))
    a = decode_static(tiny_llama, ids.int(), StreamingLLM(sink=2, cache_size=8))["nll"]
    b = decode_static(tiny_llama, ids, StreamingLLM(sink=2, cache_size=8))["nll"]
    torch.testing.assert_close(a, b)


def test_ledger_example_ids_mixing_int_and_str_are_an_error_naming_them(tmp_path):
    path = tmp_path / "r.examples.jsonl"
    path.write_text("".join(json.dumps({"example": e, "method": m, "metric": "score", "value": 1.0,
                                        "config": {"device": "cpu"}}) + "\n" for e in (1, "2") for m in ("A", "B")))
    # the record schema (kvlab.experiments.records) refuses the int id where it is read, naming file and line
    with pytest.raises(ValueError, match=r"r.examples.jsonl:1: 'example' must be a non-empty string, got 1"):
        claims._paired(_row(results_file=str(path)))


def test_validate_refuses_non_string_ledger_values():
    with pytest.raises(ValueError, match=r"columns \['id'\] must be strings"):
        claims.validate([_row(id=3)])


def test_window_nll_near_a_thousand_nats_is_shown_not_an_overflow():
    assert claims._our_value("window_nll", 1000.0, 999.0, "") == "ppl e^1000 vs e^999"
    assert claims._our_value("window_nll", 2.0, None, "x") == f"ppl {math.exp(2):.2f} vs x"


def test_orthorank_ids_beyond_the_vocabulary_are_an_error(tiny_llama):
    from kvlab.orthorank.api import sink_profile
    from kvlab.experiments.orthorank.studies import window_nll

    with pytest.raises(ValueError, match=r"in \[0, 96\) \(the model's vocabulary\)"):
        sink_profile(tiny_llama, torch.tensor([[1, 2, 500]]), attention=False)
    with pytest.raises(ValueError, match=r"in \[0, 96\)"):
        window_nll(tiny_llama, torch.tensor([[1, 2, 500]]))


def test_oracle_boundaries_refuse_a_four_dimensional_map():
    from kvlab.dhsa.boundary_predictor import oracle_boundaries

    with pytest.raises(ValueError, match=r"\(n, n\) or \(heads, n, n\).*pass one row, attn\[b\]"):
        oracle_boundaries(torch.rand(1, 2, 16, 16), max_chunks=4)


def test_a_yaml_date_in_a_parameter_set_is_a_type_error_naming_it():
    value = yaml.safe_load("corpus: 2024-01-01")
    with pytest.raises(TypeError, match="corpus: expected str, got date"):
        check_notebook_parameters(NB01, value, "set.yaml")


def test_sized_grid_without_models_and_match_cache_of_full_say_why():
    from kvlab.experiments.leaderboard import GRIDS, match_cache, sized_grid

    grid = dict(GRIDS["tiny"])
    grid.pop("models")
    with pytest.raises(ValueError, match=r"missing \['models'\]"):
        sized_grid(grid)
    with pytest.raises(ValueError, match="Full keeps every entry, it has no cap to match"):
        match_cache("Full", 40, torch.arange(100)[None], 8, 2, None)


# =========================================================================== unclear errors
def test_match_cache_names_a_bad_chunk_and_a_nan_budget():
    from kvlab.experiments.leaderboard import match_cache

    ids = torch.arange(100)[None]
    with pytest.raises(ValueError, match="chunk must be >= 1, got -8"):
        match_cache("StreamingLLM", 40, ids, -8, 2, None)
    with pytest.raises(ValueError, match=r"budget \(mean KV entries\) must be finite, got nan"):
        match_cache("StreamingLLM", float("nan"), ids, 8, 2, None)


def test_sweep_names_the_line_of_a_broken_grid_file(tmp_path):
    from kvlab.experiments import sweep

    bad = tmp_path / "bad.yaml"
    bad.write_text("target: m:f\ngrid: {x: [1, 2}\n")
    with pytest.raises(ValueError, match=r"bad.yaml is not valid YAML at line 2"):
        sweep.load_grid(bad)
    assert sweep.main([str(bad)]) == 2


def test_lessons_cli_errors_are_one_sentence(tmp_path, capsys):
    from kvlab.classroom import cli, lessons

    assert cli.main(["grade", "99", str(tmp_path)]) == 2
    assert "lesson '99' matches 0 of" in capsys.readouterr().err
    assert cli.main(["grade", "01", str(tmp_path), "--built", str(tmp_path / "nothing")]) == 2
    assert "run `python -m kvlab lessons make 01_streaming_llm` first" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="the submissions folder .*missing_dir does not exist"):
        lessons.grade(_lesson_assignment(tmp_path), tmp_path / "missing_dir", tmp_path / "out")


def test_claims_table_of_an_unknown_paper_is_a_message(capsys):
    assert ledger_cli.main(["--table", "Nope"]) == 2
    assert "--table 'Nope' is not a paper of the ledger" in capsys.readouterr().err
    assert ledger_cli.main(["--table", "lacach"]) == 2
    assert "did you mean 'LaCache'?" in capsys.readouterr().err


def test_position_shift_checks_its_flags_before_loading_a_model(capsys, monkeypatch):
    import kvlab
    from kvlab.experiments import registry

    monkeypatch.setattr(kvlab, "load_model", lambda *a, **k: pytest.fail("loaded the model before the flags"))
    with pytest.raises(SystemExit) as info:
        registry.run("sepllm-position-shift", ["--tokens", "100", "--out", "x"])
    assert info.value.code == 2
    assert "--tokens must exceed --skip + 1 = 325" in capsys.readouterr().err


# =========================================================================== parameters at every door
@pytest.mark.parametrize("path", sorted((ROOT / "notebooks" / "params").glob("*.yaml")), ids=lambda p: p.name)
def test_every_committed_parameter_set_fits_its_notebook(path):
    notebook = ROOT / "notebooks" / (path.name.split(".")[0] + ".ipynb")
    check_notebook_parameters(notebook, yaml.safe_load(path.read_text()) or {}, path.name)


def test_declared_parameters_read_the_parameters_cell():
    declared = declared_parameters(ROOT / "notebooks" / "03_sepllm_streaming.ipynb")
    assert declared["max_tokens"] == (int, 192)
    assert declared["sep_sizes"] == (list[int], [8, 16])


def test_sweep_checks_notebook_parameters_before_starting(tmp_path):
    from kvlab.experiments.sweep import Task, run_sweep

    task = Task("t", str(NB01), {"max_tokens": [1, 2]})
    with pytest.raises(ValueError, match=r"max_tokens: expected int, got list"):
        run_sweep([task], tmp_path / "out", workers=1, progress=False)
    assert not (tmp_path / "out").exists()


def test_papermill_run_with_a_misspelt_parameter_fails_in_the_check_cell(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    papermill = pytest.importorskip("papermill")
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("max_tokens: int = 4096  # tokens to stream\nnames: list[str] = ['a']  # x")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("import kvlab\nkvlab.check_parameters(globals())"),
                nbformat.v4.new_code_cell("print('work that should not run')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src, out = tmp_path / "nb.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, src)
    with pytest.raises(papermill.PapermillExecutionError, match="max_tokenz: not a parameter.*did you mean"):
        papermill.execute_notebook(str(src), str(out), parameters={"max_tokenz": 5}, progress_bar=False,
                                   kernel_name="python3")
    with pytest.raises(papermill.PapermillExecutionError, match=r"names: expected list\[str\]"):
        papermill.execute_notebook(str(src), str(out), parameters={"names": [1, 2]}, progress_bar=False,
                                   kernel_name="python3")
