"""SepLLM's experiments (Chen et al., ICML 2025), each behind ``python -m kvlab run NAME``: the headline accuracy
claims (:mod:`.headline`), the GSM8K ablations and needle figures (:mod:`.ablations`), GSM8K at matched r.KV
(:mod:`.gsm8k_matched`), MMLU under a prefill mask (:mod:`.mmlu`), the streaming tables 6, 8 and 11
(:mod:`.separator_cache`, :mod:`.position_shift`, :mod:`.architectures` over :mod:`.streaming`), Table 3's FLOPs
(:mod:`.flops_ratio`), Fig. 2's separator attention (:mod:`.separator_attention`), Table 2's H row
(:mod:`.training_h`) and the separator data of the kernel benchmarks (:mod:`.prepare_separators`)."""
