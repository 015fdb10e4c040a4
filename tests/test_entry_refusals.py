"""The package's own entry points refuse what they cannot compute: each case that gave a silent result, a
traceback deep in torch or transformers, or a message naming the wrong thing is now one clear error naming the
input, the constraint and the fix (statistics, perplexity lengths, the two attention APIs, a used cache in
``generate``, notebook text parameters, the LaCache Pareto driver's files and flags, the repository task, the
hidden seed, DHSA's shipped predictors and chunk representation, the book's parameter hash). One test per case,
each showing the good input beside the bad one still works.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest
import torch

from kvlab.core import KVCache
from kvlab.policies import Full, StreamingLLM

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


# ================================================================================ statistics and perplexity
def test_sign_test_refuses_no_pairs():
    from kvlab.eval.stats import mcnemar_exact, sign_test

    with pytest.raises(ValueError, match=r"sign_test needs at least one pair .*got none"):
        sign_test([], [])
    with pytest.raises(ValueError, match="at least one pair"):
        mcnemar_exact([], [])
    assert sign_test([1.0, 2.0], [1.0, 2.0]).p == 1.0  # pairs, all tied: p = 1 is a measurement
    assert sign_test([1.0], [0.0]).wins == 1


class _Run:
    def __init__(self, n: int):
        self.nll = torch.linspace(1.0, 2.0, n)


@pytest.mark.parametrize("lengths, bad", [([0, -1, 64], "0"), ([64, -1], "-1"), ([1], "1"), ([2.5], "2.5"),
                                          ([True], "True")])
def test_ppl_at_lengths_refuses_lengths_below_two_by_value(lengths, bad):
    from kvlab.eval import ppl_at_lengths

    with pytest.raises(ValueError, match=rf"lengths must be integers >= 2 .*got {bad} in"):
        ppl_at_lengths(_Run(100), lengths)
    with pytest.raises(ValueError, match="lengths must be a list of token counts"):
        ppl_at_lengths(_Run(100), 64)
    out = ppl_at_lengths(_Run(100), [2, 64, 1000])  # beyond the run: still left out, as documented
    assert sorted(out) == [2, 64]


# ================================================================================ the attention APIs
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_sep_and_dhsa_attention_refuse_integer_inputs(dtype):
    from kvlab.dhsa import dhsa_attention, dhsa_selection
    from kvlab.sepllm import sep_attention

    q = torch.randint(0, 2, (1, 2, 8, 4)).to(dtype)
    is_sep = torch.zeros(1, 8, dtype=torch.bool)
    msg = rf"q, k, v must be floating point .*got {dtype}.*cast them, e\.g\. q\.float\(\)"
    with pytest.raises(ValueError, match=msg):
        sep_attention(q, q, q, is_sep, init=1, neighbors=2)
    with pytest.raises(ValueError, match=msg):
        dhsa_attention(q, q, q, chunks=4, budget=4)
    with pytest.raises(ValueError, match=msg):
        dhsa_selection(q, q, chunks=4, budget=4)
    x = q.float()
    assert sep_attention(x, x, x, is_sep, init=1, neighbors=2).shape == x.shape
    assert dhsa_attention(x, x, x, chunks=4, budget=4).shape == x.shape


# ================================================================================ a used cache in generate
GREEDY = dict(max_new_tokens=3, do_sample=False)


def _used_cache(model, policy, prompt):
    """A KVCache after one greedy generate of ``prompt``: ``(cache, output, tokens it holds)``."""
    cache = KVCache(model, policy)
    out = model.generate(prompt, past_key_values=cache, **GREEDY)
    return cache, out, cache.seen


@torch.no_grad()
def test_generate_with_a_used_cache_asks_for_a_new_one(tiny_llama):
    torch.manual_seed(0)
    first, second = torch.randint(0, 96, (1, 12)), torch.randint(0, 96, (1, 7))
    cache, _, seen = _used_cache(tiny_llama, StreamingLLM(2, 8), first)
    with pytest.raises(ValueError, match=rf"already holds a stream of {seen} tokens.*make a new KVCache for each "
                                         r"prompt .*cache\.reset\(\)"):
        tiny_llama.generate(second, past_key_values=cache, **GREEDY)
    assert cache.seen == seen  # the refused step left nothing behind
    cache.reset()
    again = tiny_llama.generate(second, past_key_values=cache, **GREEDY)
    fresh = tiny_llama.generate(second, past_key_values=KVCache(tiny_llama, StreamingLLM(2, 8)), **GREEDY)
    assert torch.equal(again, fresh)


@torch.no_grad()
def test_generate_with_a_used_cache_and_a_longer_new_prompt_refuses_to_continue_the_old_stream(tiny_llama):
    torch.manual_seed(1)
    first, other = torch.randint(0, 96, (1, 6)), torch.randint(0, 96, (1, 20))
    cache, out, seen = _used_cache(tiny_llama, Full(), first)
    if torch.equal(other[:, :seen], out[:, :seen]):
        other[0, 0] = (other[0, 0] + 1) % 96
    with pytest.raises(ValueError, match=rf"already holds a stream of {seen} tokens.*does not start with them.*"
                                         r"Make a new KVCache for each prompt .*cache\.reset\(\)"):
        tiny_llama.generate(other, past_key_values=cache, **GREEDY)
    assert cache.seen == seen  # nothing of the refused prompt entered the cache
    # the same stream continued (prompt, generated tokens, new text) is what a used cache is for: with a Full
    # cache it gives the tokens of one generate over the whole text
    more = torch.cat([out, torch.randint(0, 96, (1, 4))], dim=-1)
    continued = tiny_llama.generate(more, past_key_values=cache, **GREEDY)
    whole = tiny_llama.generate(more, past_key_values=KVCache(tiny_llama, Full()), **GREEDY)
    assert torch.equal(continued, whole)


# ================================================================================ notebook text parameters
def _parameters_source(notebook: Path) -> str:
    cell = next(c for c in json.loads(notebook.read_text())["cells"] if "parameters" in c["metadata"].get("tags", []))
    return "".join(cell["source"])


def test_notebook_00_refuses_an_empty_prompt_in_its_check_cell():
    from kvlab.core.checks import check_notebook_parameters, check_parameters

    nb = ROOT / "notebooks" / "00_tour.ipynb"
    with pytest.raises(ValueError, match=r"prompt must not be empty .*got ''; pass a non-empty value"):
        check_notebook_parameters(nb, {"prompt": ""}, "-p")
    # inside the kernel, as papermill runs it: the parameters cell, then the injected cell, then the check cell
    source = _parameters_source(nb)
    ns: dict = {}
    exec(source, ns)  # noqa: S102 - the notebook's own parameters cell: plain annotated assignments
    ns["prompt"] = "   "
    ns["In"] = ["", source, "# Parameters\nprompt = '   '\n"]
    with pytest.raises(ValueError, match="prompt must not be empty"):
        check_parameters(ns)
    ns["prompt"], ns["In"][2] = "Hello", "# Parameters\nprompt = 'Hello'\n"
    check_parameters(ns)


def test_a_text_parameter_whose_comment_names_the_empty_string_may_be_empty():
    from kvlab.core.checks import blank_parameters, check_notebook_parameters

    nb = ROOT / "notebooks" / "02_sepllm_separators.ipynb"
    assert "other_tokenizer" in blank_parameters(_parameters_source(nb))
    check_notebook_parameters(nb, {"other_tokenizer": ""}, "-p")  # "" lists no other tokenizer
    with pytest.raises(ValueError, match="corpus must not be empty"):
        check_notebook_parameters(nb, {"corpus": ""}, "-p")
    assert blank_parameters("a: str = 'x'  # a name\nb: str = 'y'  # a path ('' for none)\nc = '#\"\"'\n") == {"b"}


# ================================================================================ the LaCache Pareto driver
def _pareto_args(out: Path, *extra: str):
    from kvlab.experiments.lacache import pareto

    args = pareto.parser().parse_args(["--smoke", "--out", str(out), *extra])
    pareto.check(args)
    return pareto, args


def test_pareto_refuses_a_plan_json_that_is_not_json(tmp_path):
    from kvlab.experiments.registry import ParameterError
    from kvlab.outputs import OutputFolder

    out = tmp_path / "pareto"
    OutputFolder(out, "test").claim("plan.json").write_text('{"sizes": [64')  # a file kvlab wrote, cut short
    pareto, args = _pareto_args(out)
    never = lambda *a: pytest.fail("loaded the model before reading the plan")  # noqa: E731
    with pytest.raises(ParameterError, match=r"plan\.json is not the JSON plan an earlier run wrote .*give a new "
                                             r"--out, or empty this one"):
        pareto.run(args, load=never)
    (out / "plan.json").write_text(json.dumps(args.plan))  # the same plan: reused, the load is reached
    with pytest.raises(RuntimeError, match="load reached"):
        pareto.run(args, load=lambda *a: (_ for _ in ()).throw(RuntimeError("load reached")))


@pytest.mark.parametrize("argv, message", [
    (["run", "lacache-pareto", "--sizes", "64,abc"], "argument --sizes: 'abc' is not an integer"),
    (["run", "reform-reruns", "--seeds", "1,x"], "argument --seeds: 'x' is not a seed"),
    (["leaderboard", "--seeds", "0,one"], "--seeds must be comma-separated whole numbers such as 0,1,2, got '0,one'"),
])
def test_driver_flags_that_are_not_numbers_are_named(argv, message, tmp_path, capsys, monkeypatch):
    import kvlab
    from kvlab.__main__ import main

    monkeypatch.setattr(kvlab, "load_model", lambda *a, **k: pytest.fail("loaded a model before the flags"))
    argv = [*argv, "--out", str(tmp_path / "out")] if argv[0] == "leaderboard" else argv
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(argv))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# ================================================================================ the repository task
@pytest.mark.parametrize("count", [0, -1])
def test_repo_targets_names_the_count_and_the_fix(count):
    from kvlab.eval.tasks import repo_targets

    with pytest.raises(ValueError, match=rf"count must be >= 1 .*got {count}: ask for at least one example"):
        repo_targets(None, 4096, count)  # refused before the tokenizer is asked anything
    with pytest.raises(TypeError, match="count must be an int"):
        repo_targets(None, 4096, 2.0)


# ================================================================================ the classroom's hidden seed
@pytest.mark.parametrize("text", ["abc\n", "12.5\n", "", "\xff"])
def test_a_hidden_seed_that_is_not_a_whole_number_names_its_file(tmp_path, text):
    from kvlab.classroom.lessons import Assignment, read_seed_file

    folder = tmp_path / "private" / "autograder"
    folder.mkdir(parents=True)
    seed = folder / "hidden_seed"  # where make --seed keeps it, beside the autograder zip
    seed.write_bytes(text.encode("latin-1"))
    os.chmod(seed, 0o600)
    for read in (lambda: read_seed_file(seed), lambda: Assignment("x", folder, folder, folder / "x.zip").seed()):
        with pytest.raises(ValueError, match=rf"{seed} does not hold a whole number .*--seed") as info:
            read()
        assert text.strip() == "" or text.strip() not in str(info.value)  # the secret's text is never shown
    seed.write_text("1234\n")
    assert read_seed_file(seed) == 1234


# ================================================================================ DHSA
@pytest.mark.parametrize("name", ["*", "[", "smollm2*", "?"])
def test_shipped_predictor_takes_a_name_not_a_pattern(name):
    from kvlab.dhsa.training import shipped_predictor

    with pytest.raises(ValueError, match=r"no shipped DHSA predictor for .*\(kvlab ships: \['smollm2-135m'"):
        shipped_predictor(name)
    with pytest.raises(ValueError, match="model_name must be a model's name"):
        shipped_predictor(None)


@pytest.mark.parametrize("shape", [(2, 8, 4), (8, 4), (1, 1, 2, 8, 4)])
def test_chunk_representation_names_the_expected_shape(shape):
    from kvlab.dhsa.reference import chunk_representation, fixed_boundaries

    b = fixed_boundaries(8, 4)
    with pytest.raises(ValueError, match=r"x must be queries or keys of shape \(batch, heads, seq, dim\), got "
                                         rf"\({', '.join(map(str, shape))}\)"):
        chunk_representation(torch.randn(shape), b)
    assert chunk_representation(torch.randn(1, 2, 8, 4), b).shape == (1, 2, 2, 4)


# ================================================================================ the book's parameter hash
def test_params_hash_refuses_a_date_by_name():
    import yaml

    from kvlab.notebooks.copies import params_hash

    params = yaml.safe_load("max_tokens: 64\nday: 2024-05-01\n")
    assert isinstance(params["day"], datetime.date)
    with pytest.raises(ValueError, match=r"day = datetime\.date\(2024, 5, 1\) \(date\); quote them in the YAML"):
        params_hash(params)
    quoted = yaml.safe_load("max_tokens: 64\nday: '2024-05-01'\n")
    assert params_hash(quoted) == params_hash(dict(quoted)) and len(params_hash(quoted)) == 64
