"""Recording sites: the one way to read activations, its clean-up, its reduction; reuse of an evaluation."""

from __future__ import annotations

import pytest
import torch

from af1 import Af1Error, ModelAdapter
from af1.interventions.heads import head_sums
from af1.interventions.sites import FINAL, head_inputs, mlp_output, record, residual
from af1.tasks.evaluation import evaluated
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task

from conftest import tiny_model


def hook_count(adapter: ModelAdapter) -> int:
    modules = [*adapter.layers, adapter.final_norm, *(adapter.o_proj(i) for i in range(adapter.n_layers))]
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in modules)


def test_record_reads_every_site_and_leaves_no_hook(tokenizer):
    adapter = ModelAdapter(tiny_model("llama"))
    ids = build_task(TaskSpec(operation="a+b", n=4), tokenizer).input_ids_PT
    sites = [residual(0), head_inputs(1), mlp_output(2), FINAL]
    with record(adapter, sites) as full, torch.no_grad():
        out = adapter.model(ids, output_hidden_states=True, use_cache=False)
    assert torch.equal(full[residual(0)], out.hidden_states[1])  # h[0] is the output of block 0
    assert full[head_inputs(1)].shape == (4, ids.shape[1], adapter.n_heads * adapter.head_dim)
    own = hook_count(adapter)  # transformers keeps hooks of its own once hidden states were asked for
    with record(adapter, sites, last_only=True) as last, torch.no_grad():
        adapter.model(ids, use_cache=False)
    assert torch.equal(last[FINAL], full[FINAL][:, -1]) and hook_count(adapter) == own


def test_a_bad_site_registers_nothing(tokenizer):
    adapter = ModelAdapter(tiny_model("llama"))
    own = hook_count(adapter)
    with pytest.raises(Af1Error), record(adapter, [residual(0), residual(adapter.n_layers)]):
        pass
    assert hook_count(adapter) == own


def test_head_sums_reduce_over_batches_to_the_plain_mean(tokenizer):
    adapter = ModelAdapter(tiny_model("qwen2"))
    task = build_task(TaskSpec(operation="a+b", n=10), tokenizer)
    sums = head_sums(adapter, task, batch_size=3)  # four batches, one running sum
    with record(adapter, [head_inputs(2)]) as cache, torch.no_grad():
        adapter.model(task.input_ids_PT, use_cache=False)
    assert torch.allclose(sums.mean(2), cache[head_inputs(2)].float().mean(0), atol=1e-6)


def test_an_evaluation_is_reused_only_for_its_own_model_and_spec(tokenizer):
    model = tiny_model("llama")
    spec = TaskSpec(operation="a+b", n=6)
    done = evaluated(model, tokenizer, spec)
    assert evaluated(model, tokenizer, spec, done) is done
    with pytest.raises(ValueError, match="another model or task"):
        evaluated(model, tokenizer, spec.model_copy(update={"n": 5}), done)
    with pytest.raises(ValueError, match="another model or task"):
        evaluated(tiny_model("llama"), tokenizer, spec, done)
