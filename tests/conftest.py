"""Shared fixtures: tiny random models of the three supported architectures (fast, no download)."""

from __future__ import annotations

import pytest
import torch


def _tiny(arch: str):
    from transformers import (Gemma3TextConfig, Gemma3ForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    from kvlab.integration import attach

    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "gemma3":
        cfg = Gemma3TextConfig(**common, head_dim=16, sliding_window=8,
                               layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                            "sliding_attention"])
        model = Gemma3ForCausalLM(cfg)
    else:  # pragma: no cover
        raise ValueError(arch)
    model.eval()
    return attach(model)


@pytest.fixture(scope="session", params=["llama", "qwen2", "gemma3"])
def tiny_model(request):
    return _tiny(request.param)


@pytest.fixture(scope="session")
def tiny_llama():
    return _tiny("llama")


@pytest.fixture(scope="session")
def tiny_gemma():
    return _tiny("gemma3")


class IdTokenizer:
    """Stands in for a tokenizer when the text already is token ids."""

    eos_token_id = None


@pytest.fixture
def ids():
    torch.manual_seed(1)
    return torch.randint(0, 96, (1, 48))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors gain nothing from threads, and a busy machine makes extra threads very slow.
    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
