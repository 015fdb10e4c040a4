"""The cross-paper quality runs and the headline model choice, each behind ``python -m kvlab run NAME``: the Dask
sweep of full-size jobs (:mod:`.runs`) and its tables (:mod:`.report`), the conversion of older results into
per-example records (:mod:`.claims_examples`), the accuracy floor of the headline candidates (:mod:`.model_choice`)
and the ledger rows of the headline run (:mod:`.headline_rows`)."""
