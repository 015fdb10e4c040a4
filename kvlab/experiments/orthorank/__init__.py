"""OrthoRank's experiments (Shin, Oh and Oh, ICML 2025), each behind ``python -m kvlab run orthorank-*``.

:mod:`.studies` holds what they measure (plans, searches, per-window NLL, sink alignment, paired differences),
shared with notebooks 11-12; :mod:`.commands` runs each study from its options; :mod:`.zeroshot_records` Table 2
and Table 4 with one record per question.
"""
