"""kvlab's core: the step protocol every method plugs into. Paper folders build on it, never on each other.

Three doors into a transformers model, all opened by :func:`attach` (``kvlab.load_model`` calls it):

* **KV policy** — what each layer's cache *keeps* after every step: :class:`Policy` (``keep(view) ->
  indices``) run by :class:`KVCache`, a transformers ``Cache`` that physically holds only the kept entries.
  :class:`StaticKVCache` keeps the same entries in fixed-capacity buffers (the policy's
  ``static_keep(view) -> (B, C) mask``), so a decode step can be captured in a CUDA graph
  (``kvlab.eval.FastDecoder``, the default engine of ``streaming_perplexity``).
* **Attention pattern** — what the queries of a layer *see* during prefill or training:
  :class:`AttentionPattern` / :class:`MaskPattern` under ``with use_pattern(model, pattern, layers)``.
* **Layer router** — which tokens a decoder layer *computes* (or whether it runs at all):
  :class:`LayerRouter` under ``with use_router(model, router, layers)``.

Glossary (one vocabulary for all methods; each paper's own symbols are kept in its docstrings):

* **entry** — one token's key and value in one layer's cache. A layer "holds" ``n`` entries.
* **initial tokens** (= attention **sinks**) — the first tokens of the stream, always kept. Argument name:
  ``sink`` for the baselines and LaCache; SepLLM's paper symbol is ``a`` (argument ``init``).
* **window** — the newest entries kept, **not counting the query**: after a step with ``window=w`` a layer
  holds the ``w`` newest entries and the next query attends to them plus itself (StreamingLLM, H2O's
  ``recent``, SepLLM's ``local`` = ``w``).
* **neighbours** — SepLLM's ``n``: the nearest tokens a query sees **counting itself** (``q - k < n``), so
  ``neighbors = window + 1``. The different name marks the different count.
* **budget** — the most entries a layer holds after a step: a **maximum, per layer** (``Policy.budget``).
  A compute budget (DHSA's ``N_b`` keys per query, OrthoRank's token ratio, REFORM's recompute budget) is
  named for what it counts. What a run actually held is reported as the **mean runtime KV** (the papers'
  "r.KV": entries held per layer, averaged over steps and layers: ``StreamingResult.mean_kv``).
* **cache capacity** — SepLLM's ``c``: the total that triggers compression (argument ``cache``, an int).
* **positions** — ``"original"`` (every token keeps its stream position), ``"cache"`` (positions within
  the cache: kept keys re-rotated, StreamingLLM's shift) or ``"insertion"`` (new token at the cache length,
  cached keys never re-rotated: the official code on transformers 4.33).

Where a sixth paper goes: ``kvlab/<paper>/`` with the fixed slots ``reference.py`` (the spec, equation
numbers), ``api.py`` (checks + backend choice), ``policy.py`` / ``pattern.py`` / ``router.py`` (whichever
doors it uses), ``triton.py`` / ``flex.py`` (fast paths);
its policies are re-exported from :mod:`kvlab.policies` so that the policy contract test covers them. Its experiments
and benchmarks go to :mod:`kvlab.experiments`, never into the paper's folder.
"""

from kvlab.core.lazy import attach as _lazy_namespace

# Names load on first use: a paper's reference imports its checks from here without loading transformers' Cache.
__getattr__, __dir__, __all__ = _lazy_namespace(
    __name__,
    submodules=["attention", "cache", "checks", "lazy", "pattern", "policy", "rope", "router", "state", "static",
                "static_triton", "views"],
    names={
        "attention": ["SUPPORTED_ARCHITECTURES", "attach", "capture_attention", "eager_base"],
        "cache": ["KVCache", "KVLayer", "LayerView"],
        "rope": ["rerotate"],
        "checks": ["check_choice", "check_float", "check_int", "check_tensor", "check_token_ids"],
        "pattern": ["AttentionCall", "AttentionPattern", "MaskPattern", "attend", "causal_mask", "kv_ratio",
                    "use_pattern"],
        "policy": ["POSITION_MODES", "Policy", "indices_from_mask"],
        "router": ["LayerRouter", "RouteCall", "use_router"],
        "static": ["StaticKVCache", "StaticView", "static_support"],
        "state": ["model_state"],
    },
)
