"""The shared context: forwards that run only each problem's suffix equal the full forwards on every family."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from af1 import ModelAdapter
from af1.executors.fast import capture_problem_kv
from af1.interventions.heads import head_sums
from af1.interventions.means import compute_means
from af1.interventions.sites import head_inputs, record
from af1.methods.heads.knockouts import head_sums_by_step, knockouts
from af1.models.forward import context_of, forward_last, suffix_start
from af1.tasks.evaluation import evaluate, last_logits
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task

from conftest import TINY_FAMILIES, tiny_model

TOL = 1e-4


@pytest.fixture(scope="module")
def task(tokenizer):
    task = build_task(TaskSpec(operation="a+b", shots=2, n=10, seed=1), tokenizer)
    assert task.context_len > 5
    return task


def full(task):
    """The same task said to share nothing: every forward runs every position."""
    return dataclasses.replace(task, context_len=0)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_suffix_forwards_equal_full_forwards(family, task):
    model = tiny_model(family)
    assert suffix_start(model, task.input_ids_PT, task.context_len) == task.context_len
    shared = last_logits(model, task.input_ids_PT, batch_size=4, context_len=task.context_len)
    plain = last_logits(model, task.input_ids_PT, batch_size=4)
    assert (shared - plain).abs().max() < TOL
    assert torch.equal(shared.argmax(-1), plain.argmax(-1))
    assert torch.equal(last_logits(model, task.input_ids_PT, 4, context_len=task.context_len), shared)  # cached


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox"])
def test_means_and_captured_keys_equal_those_of_full_forwards(family, task):
    adapter = ModelAdapter(tiny_model(family))
    a, b = compute_means(adapter, task), compute_means(adapter, full(task))
    assert (a.cond_LTSD - b.cond_LTSD).abs().max() < TOL and (a.mean_LTD - b.mean_LTD).abs().max() < TOL
    assert torch.equal(a.counts_TS, b.counts_TS)
    ha, hb = head_sums(adapter, task), head_sums(adapter, full(task))
    for layer in ha.sums:
        assert ha.mean(layer).shape == hb.mean(layer).shape and (ha.mean(layer) - hb.mean(layer)).abs().max() < TOL
    ka = capture_problem_kv(adapter, task.input_ids_PT, task.context_len, with_states=True)
    kb = capture_problem_kv(adapter, task.input_ids_PT, 0, with_states=True)
    assert all((ka.keys[layer] - kb.keys[layer]).abs().max() < TOL for layer in ka.keys)
    c = task.context_len
    assert all((ka.states[layer][:, -1] - kb.states[layer][:, -1]).abs().max() < TOL for layer in ka.states)
    assert ka.states[0].shape[1] == task.n_positions - c  # only the suffix was computed


def test_knockout_and_evaluation_on_the_shared_context_match_full_forwards(tokenizer):
    adapter = ModelAdapter(tiny_model("qwen2"))
    task = build_task(TaskSpec(operation="a+b", shots=2, n=10, seed=1, scoring="full", answer_digits="any"), tokenizer)
    assert task.n_steps() == 3  # two answer digits, then the end of the answer (the worked examples' newline)
    heads = [(0, 1), (2, 3)]
    (shared,) = knockouts(adapter, task, [heads], head_sums_by_step(adapter, task))
    (plain,) = knockouts(adapter, full(task), [heads], head_sums_by_step(adapter, full(task)))
    assert shared.predicted_PA == plain.predicted_PA
    assert (shared.p_correct_P - plain.p_correct_P).abs().max() < TOL
    assert evaluate(adapter.model, task).predicted_PA == evaluate(adapter.model, full(task)).predicted_PA


def test_hooks_do_not_see_the_context_being_computed(task):
    """The first hooked forward computes the context unhooked: a recording sees the suffix rows only."""
    model = tiny_model("llama", seed=5)  # a model whose context is not cached yet
    adapter = ModelAdapter(model)
    with record(adapter, [head_inputs(1)]) as cache:
        forward_last(model, task.input_ids_PT[:3], task.context_len)
    assert cache[head_inputs(1)].shape[:2] == (3, task.n_positions - task.context_len)


def test_a_context_is_recomputed_after_the_weights_change(task):
    model = tiny_model("llama", seed=6)
    before = forward_last(model, task.input_ids_PT, task.context_len)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(1.5)  # in place, as a fine-tuning step
    after = forward_last(model, task.input_ids_PT, task.context_len)
    plain = forward_last(model, task.input_ids_PT)
    assert not torch.allclose(before, after) and (after - plain).abs().max() < TOL
    model.to(torch.bfloat16)  # a cast swaps every weight's storage, not its version
    half = forward_last(model, task.input_ids_PT, task.context_len)
    assert (half - forward_last(model, task.input_ids_PT)).abs().max() < 0.1


def test_rows_that_differ_inside_the_context_are_refused(task):
    model = tiny_model("llama")
    ids = task.input_ids_PT[:2].clone()
    ids[1, 0] = (ids[1, 0] + 1) % 1000
    with pytest.raises(ValueError, match="differ inside the context"):
        forward_last(model, ids, task.context_len)


def test_the_context_has_the_same_bits_whatever_the_thread_count(tokenizer):
    """A study's workers (one thread each on Ray, all cores here) must agree: the context runs on one thread (a
    6-token context is one that CPU kernels split differently on 1 and 2 threads)."""
    task = build_task(TaskSpec(operation="a+b", shots=1, n=10, seed=1), tokenizer)
    assert task.context_len == 6
    threads = torch.get_num_threads()
    out = []
    try:
        for n in (1, 2):
            model = tiny_model("qwen2", seed=8)
            torch.set_num_threads(n)
            context_of(model, task.input_ids_PT[0, : task.context_len])  # the context computed on n threads
            torch.set_num_threads(2)  # the suffixes on the same threads in both runs
            out.append(forward_last(model, task.input_ids_PT, task.context_len))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(out[0], out[1])


def test_a_sliding_window_shorter_than_the_prompt_runs_whole_prompts(task):
    """A window would drop context the full forward reads: no shared context, no fast or shared-context executor."""
    from af1.executors.fast import supports
    from af1.executors.shared_context import supports_shared
    from af1.interventions.af1 import AF1Config

    model = tiny_model("mistral")
    adapter = ModelAdapter(model)
    assert suffix_start(model, task.input_ids_PT, task.context_len) == task.context_len
    model.config.sliding_window = task.n_positions - 1
    try:
        reason = f"prompts of {task.n_positions} tokens exceed the sliding window {task.n_positions - 1}"
        assert suffix_start(model, task.input_ids_PT, task.context_len) == 0
        assert supports(adapter, task, AF1Config()) == reason == supports_shared(adapter, task)
    finally:
        model.config.sliding_window = None
