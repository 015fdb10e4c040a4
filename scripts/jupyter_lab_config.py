"""JupyterLab settings of kvlab's lab: `scripts/lab.sh` starts `jupyter lab --config=scripts/jupyter_lab_config.py`.

The settings live in the project (scripts/lab_settings/overrides.json: Markdown files such as the start page
notebooks/START.md open rendered), never inside the Python environment, so lab.sh writes nothing into a .venv.
"""

import pathlib

c = get_config()  # noqa: F821 - defined by Jupyter when it loads this file

c.LabApp.app_settings_dir = str(pathlib.Path(__file__).resolve().parent / "lab_settings")
