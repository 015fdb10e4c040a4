"""The contract every KV policy of kvlab keeps (in the spirit of kvpress's test_presses).

Every class exported by :mod:`kvlab.policies` must appear in ``EXAMPLES`` below (a new policy that is
exported but not listed fails ``test_every_policy_is_covered``), and then gets checked for: its budget
respected after every step, the same kept entries whether a text is prefilled at once or decoded token by
token (where the policy defines it), invalid arguments refused with ValueError/TypeError, running on the
three tiny architectures, and the documented batch behaviour.
"""

from __future__ import annotations

import pytest
import torch

import kvlab.policies as policies
from kvlab.core import KVCache, Policy
from kvlab.eval import decode_stepwise

pytestmark = pytest.mark.usefixtures("one_thread")

SEPS = [5, 17, 33, 60]  # separator ids for the tiny models' 96-token vocabulary


def _examples():
    P = policies
    return {  # class -> (valid instances, [(bad kwargs, error type)], same kept set after prefill and decode)
        P.Full: ([P.Full(), P.Full(positions="cache")], [(dict(positions="absolute"), ValueError)], True),
        P.StreamingLLM: ([P.StreamingLLM(2, 6), P.StreamingLLM(0, 5, positions="original")],
                         [(dict(sink=-1, window=4), ValueError), (dict(sink=2, window=2.5), TypeError),
                          (dict(sink=2), ValueError)], True),
        P.H2O: ([P.H2O(8), P.H2O(8, recent=3, positions="original")],
                [(dict(budget=0), ValueError), (dict(budget=4, recent=5), ValueError),
                 (dict(budget=4.0), TypeError)], False),
        P.TOVA: ([P.TOVA(8)], [(dict(budget=0), ValueError), (dict(budget="8"), TypeError)], False),
        P.LaCache: ([P.LaCache(24, span=2, overlap=1, sink=2, recent=4)],
                    [(dict(budget=0), ValueError), (dict(budget=24, span=2, overlap=2), ValueError),
                     (dict(budget=24, layout="zigzag"), ValueError)], False),
        P.SepLLM: ([P.SepLLM(2, 6, separators=SEPS)],
                   [(dict(init=2.7, separators=SEPS), TypeError), (dict(neighbors=0, separators=SEPS), ValueError),
                    (dict(separators=".,"), TypeError), (dict(separators=None), ValueError),
                    (dict(separators=[-3]), ValueError)], True),
        P.FixLLM: ([P.FixLLM(2, 6, 4)], [(dict(interval=0), ValueError), (dict(init=-1), ValueError)], True),
        P.SepLLMStreaming: ([P.SepLLMStreaming(2, 4, 8, 20, separators=SEPS)],
                            [(dict(init=2, sep=4, local=8, cache=14, separators=SEPS), ValueError),
                             (dict(init=2, sep=4, local=8.0, cache=20, separators=SEPS), TypeError)], False),
    }


EXAMPLES = _examples()
INSTANCES = [(cls, p) for cls, (made, _, _) in EXAMPLES.items() for p in made]


def test_every_policy_is_covered():
    exported = {getattr(policies, n) for n in policies.__all__} - {Policy}
    assert exported == set(EXAMPLES), f"add {exported - set(EXAMPLES)} to EXAMPLES"


@pytest.mark.parametrize("cls, bad, error", [(c, b, e) for c, (_, bads, _) in EXAMPLES.items() for b, e in bads],
                         ids=lambda x: getattr(x, "__name__", None) or str(x))
def test_invalid_arguments_are_refused(cls, bad, error):
    with pytest.raises(error) as info:
        cls(**bad)
    assert len(str(info.value)) > 15  # a sentence, not a bare value


@pytest.mark.parametrize("cls, policy", INSTANCES, ids=lambda x: repr(x) if isinstance(x, Policy) else x.__name__)
def test_budget_respected_and_finite_on_three_architectures(tiny_model, ids, cls, policy):
    logits, cache = decode_stepwise(tiny_model, ids[:, :40], policy)
    assert torch.isfinite(logits).all()
    budget = policy.budget
    for step, held in enumerate(cache.trace.per_layer):
        if budget is not None:
            assert max(held) <= budget, f"step {step}: layers hold {held} > budget {budget}"
        assert max(held) <= step + 1


@pytest.mark.parametrize("cls, policy", [(c, p) for c, p in INSTANCES if EXAMPLES[c][2]],
                         ids=lambda x: repr(x) if isinstance(x, Policy) else x.__name__)
def test_prefill_then_compact_keeps_what_decoding_keeps(tiny_llama, ids, cls, policy):
    """For policies whose rule depends only on positions and tokens, compaction after a one-step prefill
    keeps exactly the entries token-by-token decoding keeps."""
    _, stepwise = decode_stepwise(tiny_llama, ids[:, :30], policy)
    cache = KVCache(tiny_llama, policy)
    with torch.no_grad():
        tiny_llama(input_ids=ids[:, :30], past_key_values=cache, use_cache=True)
    for a, b in zip(stepwise.layers, cache.layers):
        assert a.positions.tolist() == b.positions.tolist()


@pytest.mark.parametrize("cls, policy", INSTANCES, ids=lambda x: repr(x) if isinstance(x, Policy) else x.__name__)
def test_batch_behaviour_as_documented(tiny_llama, cls, policy):
    torch.manual_seed(3)
    ids = torch.randint(0, 96, (2, 24))
    if policy.batch_rows == "one":
        with pytest.raises(NotImplementedError, match="batch size 1"):
            decode_stepwise(tiny_llama, ids, policy)
        return
    assert policy.batch_rows == "equal"
    both, _ = decode_stepwise(tiny_llama, ids, policy)
    for row in range(2):
        one, _ = decode_stepwise(tiny_llama, ids[row:row + 1], policy)
        torch.testing.assert_close(both[row], one[0], rtol=1e-4, atol=1e-4)
