"""Model loading and the family adapters: parts found, layer loop equal to the plain model."""

from __future__ import annotations

import pytest
import torch

from af1 import Af1Error, ModelAdapter, load_model
from af1.models.adapter import weight_of

from conftest import TINY_FAMILIES, tiny_model

IDS = torch.tensor([[1, 17, 30, 42, 216, 35, 9], [1, 18, 31, 42, 216, 36, 9]])


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_layer_loop_equals_plain_logits(family, attn):
    model = tiny_model(family, attn)
    adapter = ModelAdapter(model)
    assert adapter.family.name == family
    assert adapter.n_layers == 3
    plain = model(IDS, use_cache=False).logits  # a cache changes memory layouts, hence last bits (GPT-J)
    assert torch.equal(adapter.forward(IDS), plain)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_adapter_finds_parts(family):
    model = tiny_model(family)
    a = ModelAdapter(model)
    for layer in range(a.n_layers):
        assert isinstance(a.o_proj(layer), torch.nn.Module)
        assert isinstance(a.mlp(layer), torch.nn.Module)
        assert getattr(a.attention(layer), "layer_idx", layer) == layer
    o_weight = weight_of(a.o_proj(0))
    assert a.n_heads * a.head_dim == (o_weight.shape[0] if a.family.conv1d else o_weight.shape[1])
    assert a.n_heads % a.n_kv_heads == 0
    assert a.parallel_residual == (family in ("gpt_neox", "gptj"))


def test_every_family_row_has_a_tiny_model():
    from af1.models.families import FAMILIES

    assert sorted(f.name for f in FAMILIES) == sorted(TINY_FAMILIES)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_family_columns_describe_the_model(family):
    """Each quirk column of the family table is what the family's real modules show."""
    a = ModelAdapter(tiny_model(family))
    attention, layer = a.attention(0), a.layers[0]
    assert a.family.conv1d == (type(a.o_proj(0)).__name__ == "Conv1D")
    assert a.family.fused_qkv == (not hasattr(attention, "q_proj") and not hasattr(attention, "k_proj"))
    assert a.family.post_norms == hasattr(layer, "post_feedforward_layernorm")
    base = getattr(a.model, a.model.base_model_prefix)
    has_rotary = hasattr(base, "rotary_emb") or hasattr(attention, "rotary_emb") or family == "gptj"
    assert a.family.rope == has_rotary
    partial = a.config.rope_parameters.get("partial_rotary_factor", 1.0) if has_rotary and family != "gptj" else 1.0
    assert (a.family.rotary == "partial") == (partial < 1.0)


def test_layer_loop_runs_a_range():
    model = tiny_model("llama")
    a = ModelAdapter(model)
    inputs = a.layer_inputs(IDS)
    hidden = model(IDS, output_hidden_states=True).hidden_states
    assert torch.equal(a.run_layers(hidden[1], inputs, start=1, stop=2), hidden[2])


def test_unsupported_architecture_is_refused(tmp_path):
    from transformers import AutoModelForCausalLM, OPTConfig

    model = AutoModelForCausalLM.from_config(
        OPTConfig(
            vocab_size=64,
            hidden_size=16,
            num_hidden_layers=1,
            ffn_dim=32,
            num_attention_heads=2,
            word_embed_proj_dim=16,
        )
    )
    with pytest.raises(Af1Error, match=r"unsupported architecture 'opt'.*llama"):
        ModelAdapter(model)
    model.save_pretrained(tmp_path)
    with pytest.raises(Af1Error, match="unsupported architecture"):
        load_model(str(tmp_path))


def test_load_local_directory_roundtrip(tmp_path, tokenizer):
    model = tiny_model("qwen2")
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path))
    assert lm.info["source"] == "directory" and lm.info["model_type"] == "qwen2"
    assert torch.equal(lm.model(IDS).logits, model(IDS).logits)


@pytest.mark.parametrize("spec", ["/no/such/dir", "./missing", "missing.gguf"])
def test_unknown_model_path(spec):
    with pytest.raises(Af1Error):
        load_model(spec)


def test_directory_without_config(tmp_path):
    with pytest.raises(Af1Error, match=r"config\.json"):
        load_model(str(tmp_path))


def test_unreadable_gguf(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(Af1Error, match="not a readable GGUF file"):
        load_model(str(bad))


def test_a_gguf_cut_short_is_refused_in_one_line_before_any_work(tmp_path, capsys):
    import gguf
    import numpy as np

    from af1.models.loading import check_gguf

    from cli_helpers import run_cli

    whole = tmp_path / "whole.gguf"
    writer = gguf.GGUFWriter(str(whole), "llama")
    writer.add_tensor("w", np.ones((64, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    check_gguf(whole)  # a whole file passes
    data = whole.read_bytes()
    for cut in (len(data) // 2, 100, len(data) - 10):  # in the tensor data, in the header, at the very end
        short = tmp_path / f"cut{cut}.gguf"
        short.write_bytes(data[:cut])
        with pytest.raises(Af1Error, match=r"damaged or cut short|is cut short"):
            check_gguf(short)
    code, out, err = run_cli(capsys, "eval", "--model", str(tmp_path / f"cut{len(data) // 2}.gguf"))
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and "cut short" in lines[0], err


def _saved(tmp_path, tokenizer, name: str = "m"):
    directory = tmp_path / name
    tiny_model("llama").save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _one_line_refusal(capsys, spec: str) -> str:
    from cli_helpers import run_cli

    code, out, err = run_cli(capsys, "eval", "--model", spec)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    return lines[0]


def test_damaged_safetensors_are_refused_in_one_line_before_loading(tmp_path, tokenizer, capsys):
    import json

    whole = _saved(tmp_path, tokenizer)
    load_model(str(whole))  # a whole directory loads
    data = (whole / "model.safetensors").read_bytes()
    for name, damage, why in (
        ("cut-in-data", data[: len(data) // 2], "is cut short"),
        ("cut-in-header", data[:40], "damaged or cut short"),
        ("bad-header", data[:8] + b"{garbage" + data[16:], "header is damaged"),
    ):
        broken = _saved(tmp_path, tokenizer, name)
        (broken / "model.safetensors").write_bytes(damage)
        line = _one_line_refusal(capsys, str(broken))
        assert why in line and str(broken / "model.safetensors") in line, line

    no_weights = _saved(tmp_path, tokenizer, "no-weights")
    (no_weights / "model.safetensors").unlink()
    assert "has config.json but no weights" in _one_line_refusal(capsys, str(no_weights))
    (no_weights / "pytorch_model.bin").write_bytes(b"pickle")
    assert "never unpickles" in _one_line_refusal(capsys, str(no_weights))

    other_shape = _saved(tmp_path, tokenizer, "other-shape")
    config = json.loads((other_shape / "config.json").read_text())
    config["intermediate_size"] += 8
    (other_shape / "config.json").write_text(json.dumps(config))
    line = _one_line_refusal(capsys, str(other_shape))
    assert "does not fit" in line and "mlp" in line and "config.json" in line, line


def test_a_model_name_typo_is_refused_offline_with_the_closest_bundled_name(capsys):
    line = _one_line_refusal(capsys, "smolm2")
    assert "unknown model 'smolm2': did you mean smollm2?" in line, line
    assert "did you mean" not in _one_line_refusal(capsys, "zzzz")


def test_a_hub_id_without_the_hub_fails_in_one_line_within_seconds(capsys, monkeypatch, tmp_path):
    import time

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))  # nothing cached
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = _one_line_refusal(capsys, "some-org/some-model")
    assert "'some-org/some-model' is not in the Hugging Face cache" in line and "HF_HUB_OFFLINE" in line, line
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    t0 = time.perf_counter()
    line = _one_line_refusal(capsys, "some-org/some-model")
    assert time.perf_counter() - t0 < 10 and "the hub http://127.0.0.1:9 is not reachable" in line, line


def test_bundled_model(smollm2):
    assert smollm2.adapter.n_layers == 30
    assert (smollm2.adapter.n_heads, smollm2.adapter.n_kv_heads, smollm2.adapter.head_dim) == (9, 3, 64)
    assert smollm2.info["sha256"] and smollm2.info["source"] == "bundled"
    ids = smollm2.tokenizer(["Calculate: 3 + 4 = "], return_tensors="pt").input_ids
    assert smollm2.tokenizer.decode(smollm2.model(ids).logits[0, -1].argmax()) == "7"
    assert torch.equal(smollm2.adapter.forward(ids), smollm2.model(ids).logits)
