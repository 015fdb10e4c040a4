"""DHSA's experiments (arXiv:2510.24606), each behind ``python -m kvlab run dhsa-*``.

:mod:`.measures` holds what they measure (needle records, boundary quality, prefill and decode costs, the QA
stand-in), shared with notebooks 07-08 and ``python -m kvlab bench dhsa``; :mod:`.grid` runs the needle grid, the
boundary study, the QA stand-in and Table 2; :mod:`.app_d_costs` App. D's latency and memory rounds;
:mod:`.needle_separating` picks and judges the grid that separates chunkings; :mod:`.predictor_position`,
:mod:`.predictor_time` and :mod:`.prefill_e2e` the boundary predictor's behaviour and cost and the end-to-end
prefill.
"""
