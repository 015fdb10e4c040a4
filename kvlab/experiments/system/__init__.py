"""Experiments about kvlab itself rather than a paper: the streaming evaluation on CUDA and CPU threads under
load, and the option helpers the paper experiments share (:mod:`.options`)."""
