"""Base accuracy and the CLI's eval, models and tasks commands."""

from __future__ import annotations

import json

import pytest
import torch

from af1.evaluation import Scores, evaluate, solved
from af1.tasks import TaskSpec, build_task

from cli_helpers import run_cli
from conftest import tiny_model


def test_evaluate_matches_a_manual_forward(tokenizer):
    model = tiny_model("llama")
    task = build_task(TaskSpec(operation="a+b", shots=1), tokenizer)
    scores = evaluate(model, task, batch_size=7)
    logits = model(task.input_ids_PT, use_cache=False).logits[:, -1]
    assert torch.equal(scores.predicted_P, logits.argmax(-1))
    assert torch.allclose(scores.p_correct_P, logits.softmax(-1).gather(1, task.answer_ids_P[:, None])[:, 0])


def test_solved_keeps_the_correct_problems(tokenizer):
    task = build_task(TaskSpec(operation="a+b", n=4), tokenizer)
    scores = Scores(task.answer_ids_P.clone(), torch.ones(4), torch.tensor([True, False, True, False]))
    kept = solved(task, scores)
    assert kept.problems == [task.problems[0], task.problems[2]]


def test_smollm2_solves_spaced_addition(smollm2):
    task = build_task(TaskSpec(operation="a+b", style="calculate", shots=3), smollm2.tokenizer)
    assert evaluate(smollm2.model, task).accuracy > 0.85


def test_cli_eval_json(capsys, cli_on_smollm2):
    code, out, _ = run_cli(capsys, "eval", "--task", "a+b", "--shots", "3", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["n"] == 52 and 0 <= result["base_accuracy"] <= 1
    assert result["n_solved"] == sum(p["solved"] for p in result["problems"])
    assert result["provenance"]["model"]["sha256"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "--task", "a/b"], "unknown task"),
        (["eval", "--style", "poem"], "unknown style"),
        (["eval", "--shots", "-1"], "--shots"),
        (["eval", "--model", "/no/such/model"], "unknown model path"),
        (["eval", "--model", "nothing.gguf"], "no such GGUF file"),
        (["eval", "--no-such-flag"], "No such option"),
    ],
)
def test_cli_bad_input_is_one_line(capsys, args, message):
    code, out, err = run_cli(capsys, *args)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert out == ""


def test_cli_lists_models_and_tasks(capsys):
    code, out, _ = run_cli(capsys, "models")
    assert code == 0 and "gpt_neox" in out and "gemma3_text" in out
    code, out, _ = run_cli(capsys, "tasks")
    assert code == 0 and "John has 3 cookies" in out and "a*b" in out
