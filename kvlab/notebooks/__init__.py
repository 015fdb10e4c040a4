"""The numbered notebooks as kvlab runs them: ``python -m kvlab notebooks COMMAND``.

- :mod:`kvlab.notebooks.copies`: the copies nbval executes (``prepare``, with the CI parameters and the recorded
  checks), the checks' recording (``record``), the book's executed copies and their staleness (``book``, ``stale``),
  and nbval's markers moved into cell tags (``markers``);
- :mod:`kvlab.notebooks.tolerant_checks`: the pytest plugin that compares a checked cell's printed numbers with a
  stated tolerance and saves what nbval executed for the book;
- :mod:`kvlab.notebooks.times`: the notebooks timed as a student runs them (``times run|table|stamp|merge``);
- :mod:`kvlab.notebooks.plain_run`: a notebook's code cells run in one Python process where Jupyter is not
  installed (``run``);
- :mod:`kvlab.notebooks.cli`: the command line.
"""
