"""Greedy tokens through the bfloat16 screen equal the argmax of the float32 logits (tested whether or not the
screen pays on this CPU: `greedy_tokens` uses it only where it does)."""

from __future__ import annotations

import pytest
import torch

from af1 import ModelAdapter
from af1.executors.greedy import bf16_pays, greedy_tokens, screened_tokens, usable
from af1.interventions.sites import record, residual
from af1.models.adapter import weight_of
from af1.models.forward import forward_last
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task

from conftest import TINY_FAMILIES, tiny_model


def plain_argmax(adapter: ModelAdapter, h_BD: torch.Tensor) -> torch.Tensor:
    return adapter.logits(h_BD[:, None])[:, -1].float().argmax(-1)


@pytest.mark.parametrize("family", TINY_FAMILIES)  # gptj's unembedding has a bias, gemma2 soft-caps its logits
def test_screened_tokens_equal_the_argmax_on_every_family(family):
    adapter = ModelAdapter(tiny_model(family))
    assert usable(adapter) == bf16_pays()
    torch.manual_seed(0)
    h = torch.randn(200, adapter.hidden_size) * torch.logspace(-1, 1, 200)[:, None]  # small to large states
    expected = plain_argmax(adapter, h)
    assert torch.equal(screened_tokens(adapter, h), expected) and torch.equal(greedy_tokens(adapter, h), expected)


def test_exact_ties_go_to_the_lowest_token_as_argmax():
    adapter = ModelAdapter(tiny_model("llama"))
    with torch.no_grad():
        W = weight_of(adapter.lm_head)
        W[3] *= 50  # a token that wins where a state points its way
        W[7] = W[3]  # and a second with the same unembedding: every state ties them exactly
    h = torch.randn(5, adapter.hidden_size)
    h = h * torch.sign(adapter.final_norm(h) @ W[3])[:, None]
    expected = plain_argmax(adapter, h)
    assert expected.tolist() == [3] * 5
    assert torch.equal(screened_tokens(adapter, h), expected)


def test_a_changed_unembedding_is_screened_anew():
    adapter = ModelAdapter(tiny_model("qwen2", seed=3))
    h = torch.randn(50, adapter.hidden_size)
    before = screened_tokens(adapter, h)
    with torch.no_grad():
        weight_of(adapter.lm_head).mul_(-1)  # in place, as fine-tuning does
    after = screened_tokens(adapter, h)
    assert torch.equal(after, plain_argmax(adapter, h)) and not torch.equal(before, after)


def test_screened_tokens_on_smollm2_states_of_every_layer(smollm2):
    """Intermediate layers read as final states: flat, near-tied logits, the screen's hardest case (4 problems:
    a CPU without bf16 dot products takes seconds per hundred rows of a 49k vocabulary)."""
    adapter = smollm2.adapter
    task = build_task(TaskSpec(style="calculate", shots=3, n=4), smollm2.tokenizer)
    with record(adapter, [residual(layer) for layer in range(adapter.n_layers)], last_only=True) as cache:
        forward_last(adapter.model, task.input_ids_PT, task.context_len)
    h = torch.cat([cache[residual(layer)] for layer in range(adapter.n_layers)])
    assert torch.equal(screened_tokens(adapter, h), plain_argmax(adapter, h))
