"""Sphinx configuration of the kvlab book (built by ``scripts/book.sh``, see ``book/build.py``).

Why Sphinx + myst-nb (the engine under Jupyter Book 1) and not Jupyter Book 2 / mystmd: it is pure Python from
PyPI, pinned in ``constraints.txt`` with the rest of kvlab (mystmd needs Node.js and fetches its site theme from
the network at build time; CI has neither promise); myst-nb renders the outputs already stored in a notebook
(``nb_execution_mode = "off"``), so the notebooks nbval executed are rendered, not run again; and Sphinx's
``-W --keep-going -n`` turns every broken cross-reference, missing image and unknown document into an error.
"""

project = "kvlab"
author = "kvlab contributors"
copyright = "kvlab contributors, Apache-2.0"
html_title = "kvlab: the KV-cache course"

extensions = ["myst_nb"]
nb_execution_mode = "off"  # render what nbval executed (build/executed), never execute here
nb_output_stderr = "show"
nb_merge_streams = True
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
