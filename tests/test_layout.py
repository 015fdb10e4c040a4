"""The layout rule: a paper folder holds its mechanism; experiments, the ledger and the classroom import it, never
the reverse; importing a paper's reference loads no experiment, benchmark, classroom or transformers code."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PAPERS = ("sepllm", "lacache", "dhsa", "reform", "orthorank")
ROOT = Path(__file__).resolve().parents[1]
# what a paper folder may import besides itself: the core, the shared kernels, evaluation, and the foundation
# modules every method needs (models, corpora, baselines, shapes)
FOUNDATION = ("core", "kernels", "eval", "baselines", "models", "datasets", "assets", "memory")


@pytest.mark.parametrize("paper", PAPERS)
def test_importing_a_reference_loads_only_the_core(paper):
    code = (f"import kvlab.{paper}.reference, sys, json; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('kvlab', 'transformers')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    loaded = set(ast.literal_eval(out.stdout.strip()))
    allowed = {"kvlab", "kvlab.core", f"kvlab.{paper}", f"kvlab.{paper}.reference"}
    stray = sorted(m for m in loaded if m not in allowed and not m.startswith("kvlab.core."))
    assert not stray, f"import kvlab.{paper}.reference also loads {stray}"


def _kvlab_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.split(".")[0] == "kvlab"}


@pytest.mark.parametrize("paper", PAPERS)
def test_a_paper_folder_imports_only_the_foundation(paper):
    bad = []
    for path in sorted((ROOT / "kvlab" / paper).glob("*.py")):
        for module in _kvlab_imports(path):
            parts = module.split(".")
            if len(parts) == 1 or parts[1] in (paper, *FOUNDATION):
                continue
            bad.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not bad, "\n".join(bad)


def test_no_experiment_or_benchmark_file_in_a_paper_folder():
    names = {"experiments.py", "bench.py", "compare.py", "gsm8k.py", "mmlu.py", "tasks.py"}
    found = [str(p.relative_to(ROOT)) for paper in PAPERS for p in (ROOT / "kvlab" / paper).glob("*.py")
             if p.name in names]
    assert not found, f"experiment code inside a paper folder: {found} (it belongs in kvlab/experiments/)"


def test_the_core_and_kernels_import_no_paper_experiment_or_classroom():
    bad = []
    for folder in ("core", "kernels", "eval", "baselines"):
        for path in sorted((ROOT / "kvlab" / folder).rglob("*.py")):
            for module in _kvlab_imports(path):
                parts = module.split(".")
                if len(parts) > 1 and parts[1] in (*PAPERS, "experiments", "classroom"):
                    bad.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not bad, "\n".join(bad)
