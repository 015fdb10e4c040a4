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
doors it uses), ``triton.py`` / ``flex.py`` (fast paths), ``bench.py`` (``python -m kvlab bench PAPER WHAT``);
its policies are re-exported from :mod:`kvlab.policies` so that the policy contract test covers them.
"""

from kvlab.core.attention import SUPPORTED_ARCHITECTURES, attach, capture_attention, eager_base
from kvlab.core.cache import KVCache, KVLayer, LayerView, rerotate
from kvlab.core.checks import check_choice, check_float, check_int, check_tensor, check_token_ids
from kvlab.core.pattern import AttentionCall, AttentionPattern, MaskPattern, attend, causal_mask, kv_ratio, use_pattern
from kvlab.core.policy import POSITION_MODES, Policy, indices_from_mask
from kvlab.core.router import LayerRouter, RouteCall, use_router
from kvlab.core.static import StaticKVCache, StaticView, static_support
from kvlab.core.state import model_state

__all__ = [
    "SUPPORTED_ARCHITECTURES", "attach", "capture_attention", "eager_base", "model_state",
    "KVCache", "KVLayer", "LayerView", "rerotate", "StaticKVCache", "StaticView", "static_support",
    "Policy", "POSITION_MODES", "indices_from_mask",
    "AttentionCall", "AttentionPattern", "MaskPattern", "attend", "causal_mask", "kv_ratio", "use_pattern",
    "LayerRouter", "RouteCall", "use_router",
    "check_int", "check_float", "check_choice", "check_tensor", "check_token_ids",
]
