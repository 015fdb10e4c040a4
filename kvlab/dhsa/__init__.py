"""DHSA (https://arxiv.org/abs/2510.24606): dynamic chunks, chunk-level similarity, token-level TopK.

Public names: :func:`dhsa_attention` (prefill attention, backends ``"torch" | "flex" | "triton"``;
:func:`dhsa_selection` builds its kept set apart, to share it across layers),
:func:`dhsa_decode` (one decode step, App. A; :class:`DHSADecode` keeps the full cache and
:func:`decode_attention` runs App. A for every new token, :mod:`.policy`), :class:`DHSAPattern` (DHSA in
a model's global layers, chunks fixed / oracle / predicted; :func:`block_sparse_pattern` and
:func:`sliding_window_pattern` are the baselines; :func:`authors_pattern` is the protocol of the authors'
code: dense question tail, dense decode, shared boundaries, initial + recent keys), :class:`BoundaryPredictor`
(Eq. 1-3; :func:`predict_boundaries` runs it once per call, batched, with a vectorised NMS). The
specification of the attention, with the chunkings, Eq. 4 and the selection, is :mod:`.reference`; the labels
(Eq. 5-8), the predictor (Eq. 1-3), the focal loss (Eq. 9), NMS and the recall of a kept set are
:mod:`.boundary_predictor`; predictor training (App. B) is :mod:`.training` (``python -m kvlab.dhsa.training --help``;
:func:`.training.shipped_predictor` loads the trained SmolLM2 predictor kvlab ships); the Eq. 4 bias and
attention recall are :mod:`.theory`. The experiments of notebooks 07-08 live in :mod:`kvlab.experiments.dhsa`, the
GPU benchmarks in ``python -m kvlab bench dhsa``.
"""
from kvlab.core.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    submodules=["api", "boundary_predictor", "chunking", "flex", "pattern", "policy", "reference", "theory",
                "training", "triton"],
    names={
        "api": ["BACKENDS", "Selection", "dhsa_attention", "dhsa_decode", "dhsa_selection", "predict_boundaries",
                "resolve_chunks"],
        "pattern": ["AUTHORS_THRESHOLD", "CHUNKINGS", "DECODES", "DHSAChunking", "DHSAPattern", "DHSAProtocol",
                    "authors_pattern", "block_sparse_pattern", "dhsa_layers", "sliding_window_pattern"],
        "policy": ["DHSADecode", "decode_attention", "decode_memory"],
        "reference": ["chunk_representation", "dhsa_mask", "fixed_boundaries", "local_starts"],
        "boundary_predictor": ["BoundaryPredictor", "attention_recall", "best_recall", "nms_boundaries",
                               "oracle_boundaries"],
    },
)
