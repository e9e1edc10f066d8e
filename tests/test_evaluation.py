"""An evaluation read back from its recorded problem rows instead of run again, and only when it is the same input."""

from __future__ import annotations

import copy

import pytest
import torch

from af1.evaluation import Scores, all_step_logits, evaluate, evaluated, last_logits, problem_rows, recorded
from af1.tasks import TaskSpec, build_task

from conftest import tiny_model


def test_a_recorded_evaluation_is_reused_only_for_the_same_inputs(tokenizer):
    model = tiny_model("llama")
    spec = TaskSpec(operation="a+b", shots=1, n=12, seed=2)
    done = evaluated(model, tokenizer, spec)
    rows = problem_rows(done.task, done.base)
    again = recorded(model, tokenizer, spec, rows)
    assert again is not None and again.check(model, spec) is again
    assert again.base.predicted_PA == done.base.predicted_PA and torch.equal(again.base.correct_P, done.base.correct_P)
    assert torch.allclose(again.base.p_correct_P, done.base.p_correct_P)
    other_answer = copy.deepcopy(rows)
    other_answer[3]["answer_tokens"] = [*other_answer[3]["answer_tokens"], 5]  # another tokenization of the answer
    no_p = [{k: v for k, v in r.items() if k != "p_correct"} for r in rows]  # rows of an older version
    for stale in (other_answer, no_p, rows[:-1], []):
        assert recorded(model, tokenizer, spec, stale) is None
    assert recorded(model, tokenizer, spec.model_copy(update={"seed": 3}), rows) is None  # other problems


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2"])
def test_every_answer_step_from_one_forward_equals_each_step_alone(tokenizer, family):
    """Evaluation runs each problem once, at its deepest answer step: the logits at every earlier step's last
    position equal that step's own forward (a causal position never reads later tokens)."""
    model = tiny_model(family)
    for spec in (TaskSpec(operation="a+b", shots=1, n=40, seed=3), TaskSpec(operation="a+b", digits=2, n=30, seed=1)):
        task = build_task(spec, tokenizer)
        steps = task.steps()
        assert len(steps) >= 2
        together = all_step_logits(model, steps, batch_size=7)
        for step, logits in zip(steps, together, strict=True):
            alone = last_logits(model, step.input_ids_PT, 5, context_len=step.context_len)
            assert (logits - alone).abs().max() < 1e-4
        scores = evaluate(model, task)
        per_step = Scores.from_steps(
            task, [last_logits(model, s.input_ids_PT, 5, context_len=s.context_len) for s in steps]
        )
        assert scores.predicted_PA == per_step.predicted_PA and torch.equal(scores.correct_P, per_step.correct_P)
