"""LaCache's experiments behind ``python -m kvlab run lacache-...``: the perplexity windows and decode throughput a CPU
decides (:mod:`.cpu_claims`), Fig. 3 as a held-out test (:mod:`.pareto`), the RULER / passkey re-runs
(:mod:`.reruns`), the word needle at one more length (:mod:`.niah_cells`) and the very long streams
(:mod:`.longstream`)."""
