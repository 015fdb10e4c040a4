"""kvlab.core.eager_base: the fallback attention is eager inside the block and restored after it."""

import pytest
import torch

from kvlab.core import eager_base, model_state


def test_eager_base_switches_and_restores(tiny_model):
    model = tiny_model
    state = model_state(model)
    name, base = model.config._attn_implementation, state.base_implementation
    ids = torch.randint(0, model.config.vocab_size, (1, 12))
    plain = model(ids).logits
    with eager_base(model):
        assert state.base_implementation == "eager"
        out = model(ids, output_attentions=True)
        assert out.attentions is not None and out.attentions[0].shape[-1] == 12  # eager returns its weights
        torch.testing.assert_close(out.logits, plain, rtol=1e-4, atol=1e-5)
    assert (model.config._attn_implementation, state.base_implementation) == (name, base)
    with pytest.raises(RuntimeError, match="inside"):
        with eager_base(model):
            raise RuntimeError("inside")
    assert (model.config._attn_implementation, state.base_implementation) == (name, base)
