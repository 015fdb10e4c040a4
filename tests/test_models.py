"""kvlab.models.load_model: the default model (fetched by the default set), ids, paths, errors."""

from __future__ import annotations

import json

import pytest
import torch

from kvlab import assets, models


@pytest.fixture(scope="module")
def smollm2():
    return models.load_model("smollm2-135m")


@pytest.mark.slow
def test_default_model_shape_and_mode(smollm2):
    model, tokenizer = smollm2
    config = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (30, 9, 3)
    assert (config.hidden_size, config.head_dim, config.max_position_embeddings) == (576, 64, 8192)
    assert not model.training
    expected_device = "cuda" if torch.cuda.is_available() else "cpu"
    assert next(model.parameters()).device.type == expected_device
    assert next(model.parameters()).dtype == (torch.bfloat16 if expected_device == "cuda" else torch.float32)
    assert config._attn_implementation == "kvlab"  # attach() ran
    assert len(tokenizer) == 49152


@pytest.mark.slow
def test_default_model_continues_text_sensibly(smollm2):
    model, tokenizer = smollm2
    device = next(model.parameters()).device
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids.to(device)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    continuation = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in continuation
    # and the loss on ordinary English is that of a language model, not of random weights (ln 49152 = 10.8)
    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife."
    ids = tokenizer(text, return_tensors="pt").input_ids.to(device)
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss
    assert float(loss) < 4.0


@pytest.mark.slow
def test_reload_reads_the_safetensors_copy(smollm2, monkeypatch):
    folder = models.converted_path("smollm2-135m")
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    record = json.loads((folder / "kvlab-source.json").read_text())
    assert record["gguf_sha256"] == assets.ASSETS["smollm2-135m"].sha256 and record["dtype"] == "bfloat16"
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config

    def no_gguf(*args, **kwargs):
        raise AssertionError("the GGUF was fetched again")

    monkeypatch.setattr(assets, "fetch", no_gguf)
    model, _ = models._load_raw("smollm2-135m", device="cpu")
    assert model.name_or_path == str(folder)
    # the copy holds the GGUF's weights, dequantized and rounded to bfloat16
    from gguf import GGUFReader
    from gguf.quants import dequantize

    gguf = assets.asset_path("smollm2-135m")
    tensor = next(t for t in GGUFReader(gguf).tensors if t.name == "blk.0.ffn_down.weight")
    expected = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type)).to(torch.bfloat16).float()
    assert torch.equal(model.model.layers[0].mlp.down_proj.weight.detach(), expected)


@pytest.mark.slow
def test_local_directory_and_dtype(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2))
    tiny.save_pretrained(tmp_path)
    models.load_tokenizer("smollm2-135m").save_pretrained(tmp_path)
    model, tokenizer = models.load_model(str(tmp_path), dtype="bfloat16", device="cpu")
    assert model.config.num_hidden_layers == 2 and model.dtype == torch.bfloat16
    assert model.config._attn_implementation == "kvlab" and not model.training
    assert tokenizer("hello")["input_ids"]


def test_unknown_model_lists_the_ids():
    with pytest.raises(ValueError) as err:
        models.load_model("not-a-model")
    for model_id in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert model_id in str(err.value)
    with pytest.raises(KeyError, match="smollm2-135m"):
        models.converted_path("wikitext")
    with pytest.raises(ValueError, match="dtype"):
        models._resolve_dtype("float33", torch.device("cpu"))


def test_defaults_follow_the_device():
    cpu = torch.device("cpu")
    assert models._resolve_dtype(None, cpu) == torch.float32
    assert models._resolve_dtype(None, torch.device("cuda")) == torch.bfloat16
    assert models._resolve_dtype("torch.float16", cpu) == torch.float16
    assert models._default_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert models.MODEL_IDS[0] == "smollm2-135m" and set(models.MODEL_IDS) == set(assets.list_assets("model"))


class _CharTokenizer:
    """What transformers 5.17 makes of Gemma3's GGUF tokenizer: one token a character, from a vocabulary of
    ``size`` entries."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self):
        return self.size

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}


def test_a_tokenizer_without_its_merges_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"splits plain English into \d+ tokens for 18 words.*constraints.txt"):
        models.check_tokenizer(_CharTokenizer(262_143), "gemma3-270m")


def test_a_byte_level_tokenizer_of_a_test_model_is_left_alone():
    models.check_tokenizer(_CharTokenizer(259), "tiny-llama")  # nothing to lose: no merges in a 259-entry vocabulary


def test_the_default_tokenizer_passes_the_check():
    tokenizer = models.load_tokenizer()  # checked on load
    models.check_tokenizer(tokenizer, "smollm2-135m")
    n = len(tokenizer(models._PROBE, add_special_tokens=False)["input_ids"])
    assert n <= 1.5 * len(models._PROBE.split())
