"""What a student meets around the assignments: the policy explorer widgets, the start page, opening the lab."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest
import torch

from kvlab import viz

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _headless(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")


def test_streaming_explorer_is_a_widget_and_keeps_sinks_and_window():
    import ipywidgets

    explorer = viz.interactive_streaming(steps=40)
    assert isinstance(explorer.widget, ipywidgets.VBox)
    assert set(explorer.sliders) == {"sink", "window"}
    kept, trace = explorer.update(sink=2, window=5)
    assert kept[0].nonzero().flatten().tolist() == [0, 1, 35, 36, 37, 38, 39]
    expected = [min(t + 1, 7) for t in range(40)]  # held after each step: everything until sink + window
    assert trace[:, 0].tolist() == expected
    explorer.sliders["window"].value = 10  # moving a slider replays too
    assert explorer.kept[0].nonzero().flatten().tolist() == [0, 1] + list(range(30, 40))


def test_sepllm_explorer_matches_the_four_block_cache():
    from kvlab.sepllm.streaming import FourBlockCache

    explorer = viz.interactive_sepllm(steps=60, sep_every=7)
    kept, trace = explorer.update(a=2, s=3, w=4, c=14)
    blocks = FourBlockCache(2, 3, 4, 14)
    sizes = []
    for t in range(60):
        blocks.push(t, t % 7 == 6)
        sizes.append(blocks.size)
    assert kept[0].nonzero().flatten().tolist() == sorted(blocks.positions())
    assert trace[:, 0].tolist() == sizes
    assert explorer.update(a=2, s=3, w=4, c=8) == (None, None)  # a + s + w < c violated
    assert "a + s + w < c" in explorer.message.value


def test_lacache_explorer_keeps_a_ladder_within_budget():
    explorer = viz.interactive_lacache(steps=120, num_layers=8)
    kept, trace = explorer.update(S=4, O=2, budget=40)
    assert kept.shape == (8, 120) and int(trace.max()) == 40
    assert (kept.sum(dim=1) == 40).all()  # every layer holds the same number of entries
    assert kept[:, :4].all() and kept[:, -8:].all()  # sinks and the recent entries (L = 8) in every layer
    assert not torch.equal(kept[0], kept[-1])  # but different layers keep different middles
    assert kept.any(dim=0).sum() > 40  # together they reach more positions than one layer holds


def test_replay_needs_a_policy_without_scores():
    from kvlab.policies import H2O

    with pytest.raises(ValueError, match="attention scores"):
        viz.replay_policy(H2O(budget=8), 20)


def test_start_page_links_every_notebook_and_no_master():
    """The start page links every notebook, names every assignment, and never links the masters in lessons/
    (solutions and hidden tests): students get the student versions from `lessons make`'s bundle."""
    text = (ROOT / "notebooks" / "START.md").read_text()
    links = set(re.findall(r"\]\(([^)]+)\)", text))
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert path.name in links, f"notebooks/START.md does not link {path.name}"
    for path in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb")):
        assert f"`{path.stem}`" in text, f"notebooks/START.md does not name the assignment {path.stem}"
    for link in links:
        assert "lessons/" not in link or "build/lessons/student" in link, f"START.md links a master: {link}"
        if not link.startswith(("http://", "https://", "../build/")):
            assert (ROOT / "notebooks" / link).resolve().exists(), f"START.md links a missing file {link}"


def test_lab_script_opens_the_start_page_and_handles_root(tmp_path):
    """Run scripts/lab.sh with the set-up and JupyterLab replaced by stand-ins that record their arguments."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "lab.sh", tmp_path / "scripts" / "lab.sh")
    (tmp_path / "scripts" / "setup.sh").write_text("true\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    jupyter = tmp_path / ".venv" / "bin" / "jupyter"
    jupyter.write_text('#!/usr/bin/env bash\necho "ARGS $*"\n')
    jupyter.chmod(0o755)
    done = subprocess.run(["bash", "scripts/lab.sh", "--no-browser"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    args = done.stdout.strip()
    assert args.startswith("ARGS lab --config=scripts/jupyter_lab_config.py --notebook-dir=.")
    assert args.endswith("--no-browser notebooks/START.md")
    if os.geteuid() == 0:
        assert "--allow-root" in args and "running as root" in done.stderr
    else:
        assert "--allow-root" not in args
    assert not (tmp_path / ".venv" / "share").exists(), "lab.sh wrote settings into the environment"


def test_lab_config_keeps_the_settings_in_the_project():
    """The config lab.sh passes points JupyterLab's app settings at scripts/lab_settings/ (Markdown opens rendered)."""
    import json

    class Config:
        def __init__(self):
            self.LabApp = type("LabApp", (), {})()

    config = Config()
    source = (ROOT / "scripts" / "jupyter_lab_config.py").read_text()
    exec(compile(source, "jupyter_lab_config.py", "exec"),
         {"get_config": lambda: config, "__file__": str(ROOT / "scripts" / "jupyter_lab_config.py")})
    folder = pathlib.Path(config.LabApp.app_settings_dir)
    assert folder == ROOT / "scripts" / "lab_settings"
    overrides = json.loads((folder / "overrides.json").read_text())
    assert overrides["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]["markdown"] == "Markdown Preview"
