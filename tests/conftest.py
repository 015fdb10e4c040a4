"""Shared fixtures: tiny random models of the three supported architectures (fast, no download)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

# Triton reads TRITON_INTERPRET when it is imported. scripts/test.sh exports it before pytest; for a plain
# `pytest` run without a GPU this sets it before any test module can import triton.
_INTERPRET_IN_TIME = True
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    _INTERPRET_IN_TIME = "triton" not in sys.modules
    os.environ["TRITON_INTERPRET"] = "1"
TRITON_READY = importlib.util.find_spec("triton") is not None and _INTERPRET_IN_TIME


def import_script(rel: str):
    """Import a script of the repository (``benchmarks/x.py``) by its file name; its folder goes on sys.path,
    which spawned workers inherit."""
    import importlib
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / rel
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    return importlib.import_module(path.stem)


# The long tests: each runs with --full (`bash scripts/test.sh --full`, and the GPU suite), never in the README's
# fast command. The value says what the fast suite still checks of the same property, so that nothing a long test
# asserts goes unchecked between full runs.
FULL_ONLY = {
    "tests/test_claims.py::test_every_exact_row_records_what_pytest_gives":
        "that every exact row names a test that exists (test_validate_fails_on_an_exact_row_whose_test_does_not_exist)",
    "tests/test_notebook_checks.py::test_checked_cells_hold_with_one_thread":
        "the tolerance cases (test_numbers_within_tolerance_agree, test_real_differences_still_fail); the notebooks "
        "stage runs every checked cell at the default threads",
    "tests/test_lessons_readme.py::test_instructor_commands_run_verbatim":
        "test_lessons.py's shared build: every lesson made, a wrong submission graded, feedback and written answers; "
        "the papermill example's cheap commands run verbatim",
    "tests/test_dhsa_protocol.py::test_authors_protocol_answers_the_needle_where_app_a_fails":
        "the authors' configuration and selection rule (test_authors_pattern_is_the_authors_configuration, "
        "test_authors_rule_keeps_the_authors_keys_on_real_tensors)",
    "tests/test_reform_claims.py::test_seeds_alone_repeat_targets_and_repo_targets_does_not":
        "the target sets (test_repo_targets_refuses_more_than_the_package_has, "
        "test_committed_code_set_has_distinct_targets)",
    "tests/test_fast_decode.py::test_real_smollm2_static_equals_hooks":
        "the static engine equals the hooks on tiny models of the three architectures (test_fast_decode.py)",
    "tests/test_fast_decode.py::test_compiled_layers_equal_eager_on_cpu":
        "eager static layers equal the hooks path (test_fast_decode.py); the GPU suite compiles them",
    "tests/test_notebook_times.py::test_run_counts_the_kernels_cpu_pins_one_core_and_ends_a_stuck_kernel":
        "test_notebook_times.py's stated-time, rounding and plan cases (the measured run itself only here)",
    "tests/test_interrupts.py::test_ctrl_c_during_grading_stops_every_child_and_writes_no_grade_file":
        "test_interrupts.py's sweep, experiment and leaderboard cases: Ctrl-C stops every child, nothing half-written",
    "tests/test_grading_judge.py::test_a_class_of_8_with_a_killer_and_a_hanger_grades_the_other_6_within_2x_and_a_"
    "sleeper_is_held_to_its_idle_budget":
        "test_grading_attacks.py: each attack scored and flagged, the honest class scored as alone, a sleeper "
        "stopped on its budget",
    "tests/test_grading_judge.py::test_the_seed_changes_the_hidden_inputs_not_the_verdicts":
        "the verdicts at the default seed (test_lessons.py: masters full, students zero, wrong ones partial)",
    "tests/test_orthorank.py::test_triton_topk_is_algorithm_1":
        "the reference Algorithm 1 top-k (order, smallest, ties) and the Triton router equal to the torch router",
    "tests/test_notebook_checks.py::test_nbval_uses_the_tolerance":
        "the plugin's comparison cases and nbval saving the executed notebook; the notebooks stage runs nbval with "
        "the plugin on every notebook",
    "tests/test_dhsa_chunking.py::test_nms_property_many_random_cases":
        "test_nms_matches_greedy_on_random_scores_with_ties_and_sure_positions and the edge cases",
    "tests/test_sweep_gpus.py::test_scheduler_and_worker_processes_started_apart":
        "workers pinned to their devices (test_worker_i_sees_only_device_i) and leaderboard cells on them",
    "tests/test_sep_attention.py::test_tma_default_tiles_fit_in_hopper_shared_memory":
        "nothing on the CPU (it compiles every default tile set for sm_90, 29-330 s); the GPU suite runs it with "
        "--full and launches the default tiles on an H200",
    "tests/test_ragged_decode.py::test_triton_chunking_does_not_change_the_result":
        "test_triton_matches_oracle on every case at the default chunking",
}
# test_static_triton.py's engine cases: one (StreamingLLM by insertion, logical order) stays in the fast suite
FULL_ONLY_PREFIXES = {
    "tests/test_static_triton.py::test_triton_engine_same_greedy_tokens_and_entries[":
        "the StreamingLLM (insertion positions, logical order) engine case, the kernel against its float64 oracle in "
        "both orders, and the indexed layout bit-identical to the compact one for every policy",
}
FAST_KEPT = ("tests/test_static_triton.py::test_triton_engine_same_greedy_tokens_and_entries[StreamingLLM(positions="
             "'insertion', sink=2, window=6)-logical]",)


def full_only(nodeid: str) -> str | None:
    """What the fast suite still checks where ``nodeid`` runs only with --full; None for a test of both."""
    if nodeid in FULL_ONLY:
        return FULL_ONLY[nodeid]
    if nodeid.startswith(FAST_KEPT):
        return None
    return next((why for prefix, why in FULL_ONLY_PREFIXES.items() if nodeid.startswith(prefix)), None)


def pytest_addoption(parser):
    parser.addoption("--max-test-seconds", type=float, default=None, metavar="S",
                     help="fail the run when one test's call takes more than S seconds (a shared fixture's build "
                          "is reported, not counted); the README's test command sets it (scripts/test.sh)")
    parser.addoption("--full", action="store_true", default=False,
                     help="also run the long tests (tests/conftest.py FULL_ONLY); `bash scripts/test.sh --full`")


def pytest_configure(config):
    config.addinivalue_line("markers", "triton: runs Triton kernels (on CUDA, or in the interpreter on CPU)")


_CALL: dict[str, float] = {}  # test id -> seconds of its call
_SETUP: dict[str, float] = {}  # test id -> seconds of its setup and teardown (a shared fixture's build lands here)


def pytest_runtest_logreport(report):
    """Each test's phases (with pytest-xdist the controller receives every worker's reports)."""
    into = _CALL if report.when == "call" else _SETUP
    into[report.nodeid] = into.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    """The time guard: every test whose call took over --max-test-seconds is named, and the run fails. Setups over
    the limit are named too (a module's shared build, such as the lessons', is paid once for its file)."""
    limit = session.config.getoption("--max-test-seconds")
    if limit is None or hasattr(session.config, "workerinput"):
        return
    write = session.config.get_terminal_writer().line
    over = sorted(((s, n) for n, s in _CALL.items() if s > limit and not full_only(n)), reverse=True)
    builds = sorted(((s, n) for n, s in _SETUP.items() if s > limit), reverse=True)
    if builds:
        write(f"kvlab: setups over {limit:g} s (shared builds, not counted):\n"
              + "\n".join(f"  {s:7.1f} s  {n}" for s, n in builds))
    if over:
        lines = "\n".join(f"  {s:7.1f} s  {n}" for s, n in over)
        write(f"kvlab: {len(over)} test(s) took more than {limit:g} s; make them faster with a smaller fixture on "
              f"the same code path, or move them to the --full run (tests/conftest.py FULL_ONLY) and say what the "
              f"fast suite still checks:\n{lines}", red=True)
        if session.exitstatus == 0:
            session.exitstatus = 1


def pytest_collection_modifyitems(config, items):
    full = config.getoption("--full")
    interpret = pytest.mark.skip(reason="needs triton, and CUDA or TRITON_INTERPRET=1 set before triton is imported")
    for item in items:
        if not TRITON_READY and "triton" in item.keywords:
            item.add_marker(interpret)
        why = None if full else full_only(item.nodeid)
        if why:
            item.add_marker(pytest.mark.skip(reason=f"long: runs with --full; the fast suite checks {why}"))


def _tiny(arch: str):
    from transformers import (Gemma3TextConfig, Gemma3ForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    from kvlab.core import attach

    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "gemma3":
        cfg = Gemma3TextConfig(**common, head_dim=16, sliding_window=8,
                               layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                            "sliding_attention"])
        model = Gemma3ForCausalLM(cfg)
    else:  # pragma: no cover
        raise ValueError(arch)
    model.eval()
    return attach(model)


@pytest.fixture(scope="session", params=["llama", "qwen2", "gemma3"])
def tiny_model(request):
    return _tiny(request.param)


@pytest.fixture(scope="session")
def tiny_llama():
    return _tiny("llama")


@pytest.fixture(scope="session")
def tiny_gemma():
    return _tiny("gemma3")


class IdTokenizer:
    """Stands in for a tokenizer when the text already is token ids."""

    eos_token_id = None


@pytest.fixture
def ids():
    torch.manual_seed(1)
    return torch.randint(0, 96, (1, 48))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors gain nothing from threads, and a busy machine makes extra threads very slow.
    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty kvlab cache for the test (``KVLAB_CACHE``)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("KVLAB_CACHE", str(root))
    return root


@pytest.fixture
def asset_shelf(tmp_path, monkeypatch):
    """Archives served from a local folder instead of the network: ``(folder, calls)``, where ``calls`` records
    each download asked for; an archive missing from the folder fails as a network error would."""
    from pathlib import Path

    from kvlab.assets import fetcher

    folder = tmp_path / "shelf"
    folder.mkdir()
    calls: list[str] = []

    def download(source, dest_dir, *, progress):
        calls.append(source.filename)
        if not (folder / source.filename).exists():
            raise OSError(f"{source.filename}: no network in this test")
        target = Path(dest_dir) / source.filename
        target.write_bytes((folder / source.filename).read_bytes())
        return target

    monkeypatch.setattr(fetcher, "_download_archive", download)
    return folder, calls
