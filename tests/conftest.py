"""Shared fixtures: the real SmolLM2 once per session, tiny random models of every family."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

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

    common: dict[str, Any] = dict(
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
def tokenizer():
    """SmolLM2's tokenizer alone (its weights stay unread): tiny models share its vocabulary."""
    from af1.models.loading import load_tokenizer

    return load_tokenizer("smollm2")


REAL_MODEL_FIXTURES = {"smollm2", "cli_on_smollm2"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that reads a real model's weights is marked real_model, so `make test-fast` can leave it out."""
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real_model)


@pytest.fixture
def cli_on_smollm2(smollm2, monkeypatch):
    """The CLI's model loading answers with the session's SmolLM2 (no reload per command)."""
    import af1.api

    monkeypatch.setattr(af1.api, "load_model", lambda *a, **k: smollm2)
    return smollm2


def only_heads_write(model, heads: list[tuple[int, int]]) -> None:
    """Zeroes every attention head's columns of a llama-like model's output projection except those of `heads`
    ((layer, head) pairs): no other head writes to the residual stream."""
    d = model.config.head_dim
    with torch.no_grad():
        for index, layer in enumerate(model.model.layers):
            o_DK = layer.self_attn.o_proj.weight
            kept = {h: o_DK[:, h * d : (h + 1) * d].clone() for layer_, h in heads if layer_ == index}
            o_DK.zero_()
            for h, columns in kept.items():
                o_DK[:, h * d : (h + 1) * d] = columns


def fitted_tiny_model(
    family: str,
    specs: list,
    tokenizer,
    n_layers: int = 3,
    seed: int = 0,
    plant: Callable[[Any, list[int]], None] | None = None,
    min_hidden: int = 64,
    fit_under: tuple[tuple[int, int, Callable[[Any], bool] | None], ...] = ((0, 1, None),),
):
    """A tiny random model whose unembedding is fitted by least squares to answer the given tasks' problems.

    Its features are random but it solves every fitted problem, every answer token (each scoring step's
    last state is fitted to that step's target), both plainly and under AF1(wait 0, transfer 1) with the
    means of the task distribution; so a study has an AF1 subgraph to find, and other interventions move the
    features, so faithfulness is not trivially 1. `plant(model, token_ids)` edits the random weights before the
    fit (token_ids: every token the tasks' prompts hold); `min_hidden` is the least hidden size.
    """
    from transformers import AutoModelForCausalLM

    from af1.executors.reference import reference_logits
    from af1.interventions.af1 import AF1Config
    from af1.interventions.means import compute_means
    from af1.models import ModelAdapter
    from af1.tasks.means_sample import distribution_task
    from af1.tasks.task import build_task

    config = tiny_config(family)
    config.num_hidden_layers = n_layers
    if layer_types := getattr(config, "layer_types", None):
        config.layer_types = layer_types[:1] * n_layers
    pairs = []  # (problems of a step, the distribution's same step)
    for spec in specs:
        task = build_task(spec, tokenizer)
        dist = {part.part_key: part for part in distribution_task(spec, tokenizer, task).steps()}
        pairs += [(part, dist[part.part_key]) for part in task.steps()]
    rows = (1 + len(fit_under)) * sum(len(s) for s, _ in pairs)  # at most
    config.hidden_size = max(config.hidden_size, min_hidden, 64 * -(-rows // 64))  # room for an exact fit
    config.intermediate_size = 2 * config.hidden_size
    torch.manual_seed(seed)
    config.tie_word_embeddings = False  # the fit rewrites the unembedding, never the embedding
    attn = "eager" if family in ("gptj", "gemma2") else "sdpa"  # the only kernel these families offer
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    model.eval().requires_grad_(False)
    assert not config.tie_word_embeddings, "the fit rewrites the unembedding"
    if plant is not None:
        plant(
            model, sorted({int(t) for s, d in pairs for ids in (s.input_ids_PT, d.input_ids_PT) for t in ids.view(-1)})
        )
    adapter = ModelAdapter(model)
    means = [compute_means(adapter, dist) for _, dist in pairs]
    captured: list[torch.Tensor] = []
    hook = adapter.final_norm.register_forward_hook(lambda _m, _a, out: captured.append(out[:, -1]))
    answers: list[torch.Tensor] = []
    try:
        for (step, _), step_means in zip(pairs, means, strict=True):
            model(input_ids=step.input_ids_PT)
            answers.append(step.answer_ids_P)
            for wait, transfer, which in fit_under:
                on = step if which is None else step.subset([i for i, p in enumerate(step.problems) if which(p)])
                if len(on):
                    reference_logits(adapter, on, AF1Config(wait=wait, transfer=transfer), step_means)
                    answers.append(on.answer_ids_P)
    finally:
        hook.remove()
    hidden = torch.cat(captured)  # [rows, D], after the final norm
    answers_P = torch.cat(answers)
    assert hidden.shape[0] <= hidden.shape[1], "more rows than features: the fit would not be exact"
    classes = sorted(set(answers_P.tolist()))
    target = 10.0 * (answers_P[:, None] == torch.tensor(classes)[None]).float()  # [rows, C]
    weight = model.lm_head.weight
    weight.zero_()
    weight[classes] = (torch.linalg.pinv(hidden.double()) @ target.double()).T.float()
    return model
