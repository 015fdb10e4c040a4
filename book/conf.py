"""Sphinx configuration of the kvlab book (built by ``scripts/book.sh``, see ``book/build.py``).

Why Sphinx + myst-nb (the engine under Jupyter Book 1) and not Jupyter Book 2 / mystmd: it is pure Python from
PyPI, pinned in ``constraints.txt`` with the rest of kvlab (mystmd needs Node.js and fetches its site theme from
the network at build time; CI has neither promise); myst-nb renders the outputs already stored in a notebook
(``nb_execution_mode = "off"``), so the notebooks nbval executed are rendered, not run again; and Sphinx's
``-W --keep-going -n`` turns every broken cross-reference, missing image and unknown document into an error.
"""

import importlib.util
import pathlib

project = "kvlab"
author = "kvlab contributors"
copyright = "kvlab contributors, Apache-2.0"
html_title = "kvlab: the KV-cache course"

extensions = ["myst_nb"]
nb_execution_mode = "off"  # render what nbval executed (build/executed), never execute here
nb_output_stderr = "show"
nb_merge_streams = True
# Markdown that a cell displays (the claims ledger's tables, the leaderboard) is GitHub-flavoured: with myst-nb's
# default ("commonmark") a table prints as one paragraph of "| ... |---|" text.
nb_render_markdown_format = "gfm"
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
nitpicky = True
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]

html_theme = "sphinx_book_theme"
html_static_path = ["_static"]
html_css_files = ["kvlab.css"]
html_theme_options = {
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "use_download_button": True,
    "use_fullscreen_button": False,
}
html_last_updated_fmt = None
html_show_sourcelink = False


# --- math, offline ----------------------------------------------------------------------------------------------
# Sphinx's MathJax extension loads MathJax from a CDN; a book read without network then shows raw "\(...\)". The
# book serves MathJax 3 itself, from the files of the pinned PyPI package sphinx-mathjax-offline (constraints.txt),
# copied into _static/mathjax at the end of the build. Not loaded as that package's own extension: it does not
# declare itself safe for Sphinx's parallel build (-j), which -W turns into an error.
mathjax_path = "mathjax/tex-chtml.js"


def _mathjax_files() -> pathlib.Path:
    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    if spec is None or spec.origin is None:
        raise RuntimeError("kvlab book: the MathJax files come from the package sphinx-mathjax-offline, which is not "
                           "installed: run `bash scripts/setup.sh` (it installs kvlab[dev] under constraints.txt)")
    return pathlib.Path(spec.origin).parent / "static" / "mathjax"


def _copy_mathjax(app, exc):
    from sphinx.util.fileutil import copy_asset

    if exc is None and app.builder.format == "html":
        copy_asset(str(_mathjax_files()), str(pathlib.Path(app.outdir) / "_static" / "mathjax"))


def setup(app):
    _mathjax_files()  # fail before the build, not after it
    app.connect("build-finished", _copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
