"""An evaluation read back from its recorded problem rows instead of run again, and only when it is the same input."""

from __future__ import annotations

import copy

import pytest
import torch

from af1.tasks.evaluation import Scores, all_step_logits, evaluate, evaluated, last_logits, problem_rows, recorded
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task

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
    no_end = [{k: v for k, v in r.items() if k != "stop_token"} for r in rows]  # scored before the end was checked
    for stale in (other_answer, no_p, no_end, rows[:-1], []):
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
        # each batch scored as it comes (memory flat in n) = the same batches' logits stacked, then scored
        for batch_size in (7, 64):
            stacked = Scores.combine(
                task,
                [
                    Scores.from_logits(logits, step.answer_ids_P)
                    for step, logits in zip(steps, all_step_logits(model, steps, batch_size), strict=True)
                ],
            )
            scored = evaluate(model, task, batch_size)
            assert scored.predicted_PA == stacked.predicted_PA
            assert torch.equal(scored.correct_P, stacked.correct_P)
            assert torch.equal(scored.p_correct_P, stacked.p_correct_P)
            # float64 sums over the vocabulary: their order (so the last bits) may follow the batch's shape
            assert scored.log_p_correct_P is not None and stacked.log_p_correct_P is not None
            assert (scored.log_p_correct_P - stacked.log_p_correct_P).abs().max() < 1e-12


def test_an_answer_that_does_not_stop_is_wrong_under_full_scoring(tokenizer):
    """A model that says "14" for "1" (right first digit, then no newline) is wrong once the end is checked, and
    was right before; first-token scoring is unchanged."""
    spec = TaskSpec(operation="a+b", shots=1, n=30, seed=4)
    V, four = len(tokenizer), tokenizer("4").input_ids[0]

    def says(task, go_on: bool) -> Scores:
        """Logits of a model that predicts every scored token, except "4" instead of the end after a 1-digit answer."""
        logits = []
        for step in task.steps():
            target_P = step.answer_ids_P.clone()
            if go_on and step.step == 1:  # the end of one-digit answers is due at step 1
                short = torch.tensor([len(a) == 1 for a in step.answer_tokens])
                target_P[short] = four
            logits.append(torch.nn.functional.one_hot(target_P, V).float() * 10)
        return Scores.from_steps(task, logits)

    task = build_task(spec, tokenizer)
    short_P = torch.tensor([len(a) == 1 for a in task.answer_tokens])
    assert 0 < int(short_P.sum()) < len(task)
    assert says(task, go_on=False).correct_P.all()
    going_on = says(task, go_on=True)
    assert torch.equal(going_on.correct_P, ~short_P)  # "14" for "1": wrong; two-digit answers unaffected
    assert all(going_on.predicted_PA[i][-1] == four for i in short_P.nonzero().flatten().tolist())
    unchecked = build_task(spec.model_copy(update={"check_end": False}), tokenizer)
    assert says(unchecked, go_on=True).correct_P.all()  # the old scoring: nothing after "1" was read
    first = build_task(spec.model_copy(update={"scoring": "first"}), tokenizer)
    assert len(first.steps()) == 1 and first.end is not None and first.end["checked"] is False
