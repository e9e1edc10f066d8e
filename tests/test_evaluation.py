"""An evaluation read back from its recorded problem rows instead of run again, and only when it is the same input."""

from __future__ import annotations

import copy

import torch

from af1.evaluation import evaluated, problem_rows, recorded
from af1.tasks import TaskSpec

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
