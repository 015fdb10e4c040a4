"""REFORM's experiments: the tables' harness (:mod:`.compare`: every method on one task; :mod:`.tables`: the
tables and their records), the ledger's re-runs (:mod:`.reruns`, ``python -m kvlab run reform-reruns``) and the
heads / needle / long-document QA runs (:mod:`.heads_needle_qa`)."""
