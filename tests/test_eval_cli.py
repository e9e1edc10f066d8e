"""Base accuracy and the CLI's eval, models and tasks commands."""

from __future__ import annotations

import json

import pytest
import torch

from af1.experiments import REGISTRY
from af1.tasks.evaluation import Scores, evaluate, solved
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task

from cli_helpers import run_cli
from conftest import tiny_model


def test_evaluate_matches_a_manual_forward(tokenizer):
    """Full scoring = greedy exact match under teacher forcing: every answer token and the end-of-answer token (the
    few-shot separator), from one manual forward each."""
    model = tiny_model("llama")
    task = build_task(TaskSpec(operation="a+b", shots=1), tokenizer)
    scores = evaluate(model, task, batch_size=7)
    assert (
        task.end is not None
        and task.end["checked"]
        and all(s[-1] == task.stop_tokens[i] for i, s in enumerate(task.scored_tokens))
    )
    for i in range(len(task)):
        targets = list(task.scored_tokens[i])
        ids = task.input_ids_PT[i].tolist() + targets
        logits = model(torch.tensor([ids]), use_cache=False).logits[0]  # teacher-forced, all steps at once
        n, k = task.n_positions, len(targets)
        steps = logits[n - 1 : n - 1 + k]
        assert scores.predicted_PA[i] == steps.argmax(-1).tolist()
        assert bool(scores.correct_P[i]) == (steps.argmax(-1).tolist() == targets)
        p = steps.softmax(-1).gather(1, torch.tensor(targets)[:, None]).prod()
        assert torch.allclose(scores.p_correct_P[i], p, rtol=1e-4)


def test_solved_keeps_the_correct_problems(tokenizer):
    task = build_task(TaskSpec(operation="a+b", n=4), tokenizer)
    scores = Scores([[0]] * 4, torch.ones(4), torch.tensor([True, False, True, False]))
    kept = solved(task, scores)
    assert kept.problems == [task.problems[0], task.problems[2]]


def test_smollm2_solves_spaced_addition(smollm2):
    first = build_task(TaskSpec(operation="a+b", style="calculate", shots=3, scoring="first"), smollm2.tokenizer)
    assert evaluate(smollm2.model, first).accuracy > 0.85  # one-digit answers, first token
    full = build_task(TaskSpec(operation="a+b", style="calculate", shots=3), smollm2.tokenizer)
    assert 0.6 < evaluate(smollm2.model, full).accuracy < 0.8  # every answer, every digit: harder


def test_cli_eval_json(capsys, cli_on_smollm2):
    code, out, _ = run_cli(capsys, "eval", "--task", "a+b", "--shots", "3", "--json")
    assert code == 0
    result = json.loads(out)
    base = result["base_accuracy"]
    assert result["n"] == 97 and result["scoring"] == "full" and 0 <= base["value"] <= 1 and base["n"] == 97
    assert result["n_solved"] == sum(p["solved"] for p in result["problems"])
    low, high = base["ci"]
    assert low < base["value"] < high
    answers = [p["answer"] for p in result["problems"]]
    assert base["baseline"] == max(answers.count(a) for a in set(answers)) / len(answers)
    row = result["problems"][0]
    assert row["input"].endswith(row["prompt"]) and row["input_ids"] and row["answer_tokens"]
    assert row["predicted_text"] == cli_on_smollm2.tokenizer.decode(row["predicted_tokens"])  # ids read as text
    assert result["provenance"]["model"]["sha256"]
    code, out, err = run_cli(
        capsys, "eval", "--task", "a+b", "--digits", "2", "--n", "30", "--scoring", "first", "--json"
    )
    first = json.loads(out)
    assert code == 0 and first["n"] == 30 and first["base_accuracy"]["baseline"] == 1.0  # every first token is "1"
    assert "near constant" in err and first["warnings"]


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


@pytest.mark.parametrize("command", [*REGISTRY, "demo"])
def test_cli_out_naming_a_file_is_one_line(capsys, tmp_path, command):
    """--out that names an existing file fails at parse time, before a model is loaded, and leaves it alone."""
    existing = tmp_path / "taken.txt"
    existing.write_text("mine")
    code, out, err = run_cli(capsys, command, "--out", str(existing))
    assert code == 2 and f"--out {existing} is a file, not a directory" in err
    assert "Traceback" not in err and out == "" and existing.read_text() == "mine"


def test_cli_eval_out_is_a_directory_like_every_command(capsys, cli_on_smollm2, tmp_path):
    code, out, _ = run_cli(capsys, "eval", "--shots", "3", "--n", "20", "--out", str(tmp_path / "o"))
    assert code == 0 and "wrote" in out
    written = json.loads((tmp_path / "o" / "eval.json").read_text())
    assert written["n"] == 20 and written["provenance"]["model"]["sha256"] and len(written["problems"]) == 20


def test_cli_study_out_naming_a_file_is_one_line(capsys, tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("models: [smollm2]\n")
    existing = tmp_path / "store"
    existing.write_text("")
    code, _, err = run_cli(capsys, "study", str(plan), "--out", str(existing))
    assert code == 2 and "is a file, not a directory" in err
