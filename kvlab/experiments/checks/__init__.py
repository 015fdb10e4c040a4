"""Experiments of the package as a whole rather than of one driver: the ledger's rows that a test suite, a notebook
or the kvpress peer check stands behind (``python -m kvlab run tests|notebook|peers``)."""
