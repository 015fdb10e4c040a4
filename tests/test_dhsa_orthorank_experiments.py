"""The DHSA, OrthoRank and package experiments behind ``python -m kvlab run``: every option is checked before a model
loads or a file is written (a misspelt name is refused with the nearest one, an empty selection is refused), and a
second run into the same ``--out`` resumes (the needle grid) or is refused, never replacing an earlier run's records."""
from __future__ import annotations

import pytest
import torch

from kvlab.experiments import records, registry
from kvlab.experiments.registry import ParameterError
from kvlab.outputs import OutputRefused

NB11 = "benchmarks/results/orthorank/notebook11_default_smollm2_cpu.json"


def refused(name: str, argv: list[str], tmp_path, *match: str) -> str:
    with pytest.raises(ParameterError) as e:
        registry.check_all(name, argv + ["--out", str(tmp_path / "out")], raise_errors=True)
    for m in match:
        assert m in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir()), "a refused run wrote files"
    return str(e.value)


@pytest.mark.parametrize("name, argv, hint", [
    ("dhsa-needle", ["--protocols", "autors"], "did you mean 'authors'"),
    ("dhsa-needle", ["--baselines", "dense,blocksparse"], "did you mean 'block-sparse'"),
    ("dhsa-qa", ["--tasks", "single-doc,multidoc"], "did you mean 'multi-doc'"),
    ("dhsa-table2", ["--timing-backends", "torch,tritn"], "did you mean 'triton'"),
    ("dhsa-prefill-e2e", ["--shapes", "gema3-270m"], "did you mean 'gemma3-270m'"),
    ("dhsa-prefill-e2e", ["--methods", "sdpa,dhsa-prd"], "did you mean 'dhsa-pred'"),
    ("dhsa-predictor-time", ["--shapes", "gemma2-2B"], "did you mean 'gemma2-2b'"),
    ("orthorank-table1", ["--plans", "SLEB 10%,OrthoRnk 20%"], "did you mean 'OrthoRank 20%'"),
    ("orthorank-zeroshot", ["--tasks", "piqa,hellaswg"], "did you mean 'hellaswag'"),
    ("orthorank-alignment", ["--model", "smolm2-135m"], "did you mean 'smollm2-135m'"),
    ("dhsa-needle", ["--model", "gemma3-207m"], "did you mean 'gemma3-270m'"),
])
def test_a_misspelt_name_is_refused_with_the_nearest_one(name, argv, hint, tmp_path):
    refused(name, argv, tmp_path, hint)


@pytest.mark.parametrize("name, argv, words", [
    ("dhsa-needle", ["--trials", "5", "--first-trial", "5"], ("nothing would run",)),
    ("dhsa-needle", ["--trials", "20", "--first-trial", "4", "--last-trial", "4"], ("nothing would run",)),
    ("dhsa-needle", ["--budgets", ","], ("empty list",)),
    ("dhsa-boundaries", ["--depths", "0.5,1.5"], ("outside",)),
    ("dhsa-needle", ["--baselines", "none,dense"], ("'none' stands alone",)),
    ("dhsa-needle", ["--budgets", "128,512", "--protocols", "authors"], ("--budgets 128", "--authors-local")),
    ("dhsa-qa", ["--budgets", "4", "--protocols", "app_a"], ("exceed --initial",)),
    ("dhsa-needle", ["--max-seconds", "0"], ("--max-seconds",)),
    ("dhsa-needle", ["--predictor", "no/such/predictor.pt"], ("--predictor",)),
    ("dhsa-boundaries", ["--predictor", "shipped:smollm2-135m-l9"], ("kvlab ships", "smollm2-135m-l0")),
    ("dhsa-table2", ["--needle-file", "no/such.examples.jsonl"], ("--needle-file",)),
    ("dhsa-app-d-costs", ["prefill", "--shape", "gemma3-1b"], ("--shape goes with decode",)),
    ("dhsa-app-d-costs", ["decode", "--contexts", "512,4x"], ("not a context",)),
    ("dhsa-needle-separating", ["summary"], ("--records",)),
    ("dhsa-needle-separating", [], ("--records",)),
    ("dhsa-needle-separating", ["summary", "--records", "missing.examples.jsonl.gz"], ("no such records file",)),
    ("dhsa-predictor-position", ["--files", "no-such-predictor.pt"], ("no predictor file",)),
    ("dhsa-predictor-position", ["--corpus", "botchn"], ("not a kvlab corpus",)),
    ("dhsa-prefill-e2e", ["--combos", "packed:2"], ("kernel:share",)),
    ("dhsa-prefill-e2e", ["--share-heads", "2"], ("outside",)),
    ("orthorank-table1", ["--documents", "1"], ("at least 2 documents",)),
    ("orthorank-table1", ["--plans", "T3 1 random"], ("add --table3",)),
    ("orthorank-fig4", ["--layers", "no/such/notebook11.json"], ("--layers",)),
    ("orthorank-table4docs", ["--calib", "8x"], ("N x LEN",)),
    ("orthorank-zeroshot", ["--token-ratio", "1.5"], ("strictly between 0 and 1",)),
    ("orthorank-zeroshot-records", [], ("--layers", "--table4")),
    ("orthorank-zeroshot-records", ["--layers", NB11, "--table4", NB11], ("one of",)),
    ("package-threads", ["--configs", "1,two"], ("thread settings",)),
    ("package-streaming-cuda", ["--tokens", "64", "--smoke"], ("at least 130",)),
])
def test_every_option_is_checked_before_any_work(name, argv, words, tmp_path):
    refused(name, argv, tmp_path, *words)


def test_a_cuda_experiment_is_refused_on_a_machine_without_one(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    refused("package-streaming-cuda", [], tmp_path, "CUDA")
    refused("dhsa-needle", ["--device", "cuda"], tmp_path, "no CUDA device")


@pytest.mark.parametrize("name, argv, existing", [
    ("orthorank-alignment", [], "alignment.json"),
    ("orthorank-table1", ["--name", "table1_docs256_search"], "table1_docs256_search.examples.jsonl.gz"),
    ("orthorank-zeroshot-records", ["--layers", NB11], "zeroshot.examples.jsonl.gz"),
    ("dhsa-app-d-costs", ["decode"], "decode.examples.jsonl.gz"),
    ("dhsa-prefill-e2e", ["--rounds", "20"], "dhsa_prefill_rounds.examples.jsonl.gz"),
    ("dhsa-table2", [], "dhsa_table2.json"),
    ("dhsa-predictor-time", [], "dhsa_predictor_time.examples.jsonl.gz"),
    ("dhsa-predictor-position", [], "position.json"),
    ("dhsa-needle-separating", ["summary", "--smoke"], "dhsa_needle_separating.summary.json"),
    ("package-threads", [], "threads.examples.jsonl.gz"),
])
def test_a_second_run_into_the_same_folder_is_refused_before_any_work(name, argv, existing, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / existing).write_bytes(b"an earlier run's results")
    with pytest.raises(ParameterError, match="is there already"):
        registry.check_all(name, argv + ["--out", str(out)], raise_errors=True)
    assert (out / existing).read_bytes() == b"an earlier run's results"


def test_a_users_file_in_the_output_folder_is_left_untouched(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputRefused, match="notes.txt"):
        registry.run("dhsa-needle-separating", ["summary", "--smoke", "--out", str(out)], raise_errors=True)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"


def test_the_separating_judge_writes_records_and_its_summary(tmp_path):
    written = registry.run("dhsa-needle-separating", ["summary", "--smoke", "--out", str(tmp_path / "o")],
                           raise_errors=True)
    recs = records.read(written[0])
    assert written[0].name == "dhsa_needle_separating.summary.examples.jsonl.gz" and recs
    assert {r["metric"] for r in recs} == {"needle_recall_diff", "answer_nll_diff"}


def test_the_needle_grid_resumes_into_its_folder_without_running_a_prompt_twice(tmp_path, capsys):
    out = str(tmp_path / "grid")
    argv = ["--smoke", "--budgets", "64", "--protocols", "app_a", "--name", "recall", "--out", out]
    first = registry.run("dhsa-boundaries", argv, raise_errors=True)
    before = records.read(first[0])
    second = registry.run("dhsa-boundaries", argv, raise_errors=True)
    assert "resuming: 1 examples" in capsys.readouterr().out
    assert records.read(second[0]) == before  # kept, not replaced, not duplicated


def test_the_qa_task_names_are_kvlab_eval_qas():
    from kvlab.eval.qa import QA_TASKS
    from kvlab.experiments.dhsa.grid import QA_TASK_NAMES

    assert tuple(QA_TASK_NAMES) == tuple(QA_TASKS)


def test_the_table1_plan_names_are_the_studies_own():
    from kvlab.experiments.orthorank import studies
    from kvlab.experiments.orthorank.commands import PLAN_NAMES

    t3 = set(studies.table3_plans((1,), 0.33))
    assert t3 <= set(PLAN_NAMES)
    assert {a for pair in studies.TABLE1_PAIRS for a in pair} <= set(PLAN_NAMES)


def test_a_shipped_predictor_is_picked_by_name():
    """``--predictor shipped:NAME`` loads that shipped file (sha-checked): what a ledger row names when its run
    used the predictor kvlab shipped before another one replaced it as the default."""
    from kvlab.dhsa.training import shipped_predictor
    from kvlab.experiments import registry
    from kvlab.experiments.dhsa.grid import _predictor

    _, args = registry.check_all("dhsa-boundaries", ["--predictor", "shipped:smollm2-135m-l0"], raise_errors=True)
    picked = _predictor(args, "cpu")
    expected, info = shipped_predictor("smollm2-135m", "cpu", file="smollm2-135m-l0")
    assert info["file"] == "smollm2-135m-l0.pt"
    for a, b in zip(picked.state_dict().values(), expected.state_dict().values()):
        assert torch.equal(a, b)
    default, _ = shipped_predictor("smollm2-135m", "cpu")
    assert any(x.shape != y.shape or not torch.equal(x, y)
               for x, y in zip(picked.state_dict().values(), default.state_dict().values()))
