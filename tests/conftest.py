"""Shared fixtures: the real SmolLM2 once per session, tiny random models of every family."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("AF1_NO_PROGRESS", "1")
VOCAB = 49152  # SmolLM2's tokenizer, shared by every tiny model so tasks tokenize the same way


def tiny_config(family: str):
    """A three-layer random-weight config of a family, small enough for unit tests."""
    from transformers import (
        Gemma2Config,
        Gemma3TextConfig,
        GPT2Config,
        GPTJConfig,
        GPTNeoXConfig,
        LlamaConfig,
        MistralConfig,
        Qwen2Config,
        Qwen3Config,
    )

    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    if family == "llama":
        return LlamaConfig(**common)
    if family == "mistral":
        return MistralConfig(**common, sliding_window=None)
    if family == "qwen2":
        return Qwen2Config(**common)
    if family == "qwen3":
        return Qwen3Config(**common, head_dim=16)
    if family == "gemma2":
        return Gemma2Config(**common, head_dim=16, sliding_window=128, query_pre_attn_scalar=16)
    if family == "gemma3":
        return Gemma3TextConfig(
            **common,
            head_dim=16,
            sliding_window=128,
            query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        )
    if family == "gpt2":
        return GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=256)
    if family == "gpt_neox":
        return GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=128,
            rotary_pct=0.25,
            use_parallel_residual=True,
            max_position_embeddings=256,
        )
    if family == "gptj":
        return GPTJConfig(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, rotary_dim=8, n_positions=256)
    raise KeyError(family)


TINY_FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gpt2", "gpt_neox", "gptj"]


def tiny_model(family: str, attn: str = "sdpa", seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    if family in ("gptj", "gemma2"):
        attn = "eager"  # the only kernel these families offer
    model = AutoModelForCausalLM.from_config(tiny_config(family), attn_implementation=attn, dtype=torch.float32)
    model.eval().requires_grad_(False)
    return model


@pytest.fixture(scope="session")
def smollm2():
    from af1 import load_model

    return load_model("smollm2")


@pytest.fixture(scope="session")
def tokenizer(smollm2):
    return smollm2.tokenizer


@pytest.fixture
def cli_on_smollm2(smollm2, monkeypatch):
    """The CLI's model loading answers with the session's SmolLM2 (no reload per command)."""
    import af1.api

    monkeypatch.setattr(af1.api, "load_model", lambda *a, **k: smollm2)
    return smollm2


def fitted_tiny_model(family: str, specs: list, tokenizer, n_layers: int = 3, seed: int = 0):
    """A tiny random model whose unembedding is fitted by least squares to answer the given tasks' problems.

    Its features are random but it solves every fitted problem, so AF1 and the heads study have
    something to measure; interventions move the features, so faithfulness is not trivially 1.
    """
    from af1.tasks import build_task

    config = tiny_config(family)
    config.num_hidden_layers = n_layers
    if hasattr(config, "layer_types"):
        config.layer_types = config.layer_types[:1] * n_layers
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.eval().requires_grad_(False)
    assert not config.tie_word_embeddings, "the fit rewrites the unembedding"
    tasks = [build_task(spec, tokenizer) for spec in specs]
    answers = torch.cat([t.answer_ids_P for t in tasks])
    hidden = torch.cat([model.model(input_ids=t.input_ids_PT).last_hidden_state[:, -1] for t in tasks])  # [P, D]
    assert hidden.shape[0] <= hidden.shape[1], "more problems than features: the fit would not be exact"
    classes = sorted(set(answers.tolist()))
    target = 10.0 * (answers[:, None] == torch.tensor(classes)[None]).float()  # [P, C]
    weight = model.lm_head.weight
    weight.zero_()
    weight[classes] = (torch.linalg.pinv(hidden.double()) @ target.double()).T.float()
    return model
