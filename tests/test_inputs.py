"""Every result lists its exact inputs: one problem of each experiment reruns from its JSON file alone and gets the
recorded prediction; and every number beside a search's confirmation number is measured on the same problems."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import af1.api
from af1.experiments import REGISTRY
from af1.tasks.evaluation import inputs_sha256
from af1.tasks.spec import TaskSpec

from conftest import fitted_tiny_model

SPEC = TaskSpec(operation="a+b", shots=1, n=30)
SEARCH = {"search": {"threshold": 0.5}}
# every experiment that lists its problems as `inputs` (styles: each row's), with the small options it declares; the
# search runs first for all of them
RUNS: dict[str, dict[str, Any]] = {
    name: experiment.small
    for name, experiment in REGISTRY.items()
    if {"inputs", "rows"} & set(experiment.Result.model_fields) and name != "search"
}


@pytest.fixture(scope="module")
def written(tmp_path_factory, tokenizer) -> tuple[Any, Path]:
    """A tiny model that solves the task, every experiment run on it through the API, each JSON file written."""
    root = tmp_path_factory.mktemp("inputs")
    fitted_tiny_model("llama", [SPEC], tokenizer).save_pretrained(root / "m")
    tokenizer.save_pretrained(root / "m")
    held = af1.api.session(af1.api.load_model(str(root / "m")))
    for name, options in RUNS.items():
        af1.api.run(name, held, SPEC, out_dir=root / "out", upstream={"eval": {}, **SEARCH}, **options)
    af1.api.run("run", held, SPEC, out_dir=root / "out", upstream=SEARCH)  # the search's config
    af1.api.run("sweep", held, SPEC, out_dir=root / "out", upstream=SEARCH)  # the grid beside it
    return held.lm().model, root / "out"


def read(out: Path, name: str) -> dict[str, Any]:
    return json.loads((out / f"{name}.json").read_text())


@torch.no_grad()
def rerun(model: Any, row: dict[str, Any]) -> list[int]:
    """The model's greedy token at each scored answer step, the earlier answer tokens fed (teacher forcing), from
    the row's `input_ids` alone."""
    ids, answer = row["input_ids"], row["answer_tokens"]
    steps = len(row.get("predicted_tokens") or answer)
    return [int(model(input_ids=torch.tensor([ids + answer[:k]])).logits[0, -1].argmax()) for k in range(steps)]


def check_row(model: Any, row: dict[str, Any]) -> None:
    """The rerun's tokens are the recorded ones, and right exactly when the answer and its end token are."""
    predicted = rerun(model, row)
    assert predicted == row["predicted_tokens"]
    targets = row["answer_tokens"] + ([row["stop_token"]] if row.get("stop_token") is not None else [])
    assert row["solved"] == (predicted == targets[: len(predicted)])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_one_problem_of_each_experiment_reruns_from_its_json_alone(written, name):
    model, out = written
    data = read(out, name)
    listed = [r["inputs"] for r in data["rows"] if "inputs" in r] if name == "styles" else [data["inputs"]]
    assert listed, "no row lists its problems"
    for inputs in listed:
        problems, sets = inputs["problems"], inputs["sets"]
        assert inputs["sha256"] == inputs_sha256(problems)
        measured = sets.get("confirmation") or sets.get("evaluation") or sets["solved"]
        check_row(model, problems[measured[0]])
        check_row(model, problems[measured[-1]])
        assert all(0 <= i < len(problems) for part in sets.values() for i in part)
    inputs = listed[0]
    if name == "finetune":  # three disjoint sets, as large as the result says
        parts = [set(inputs["sets"][s]) for s in ("train", "validation", "evaluation")]
        assert [len(p) for p in parts] == [data["n_train"], data["n_val"], data["n_eval"]]
        assert len(set().union(*parts)) == sum(map(len, parts))
        return
    # the task's own problems: the same inputs as the eval unit's, tied by the fingerprint
    assert inputs["sha256"] == inputs_sha256(read(out, "eval")["problems"])
    solved = inputs["sets"]["solved"]
    assert solved == [i for i, p in enumerate(inputs["problems"]) if p["solved"]]
    search = read(out, "search")
    if name == "prune":  # the selection half pruning ranked on, the confirmation half it is checked on
        sel, conf = inputs["sets"]["selection"], inputs["sets"]["confirmation"]
        assert (len(sel), len(conf)) == (data["n_selection"], data["n_confirmation"])
        assert sorted(sel + conf) == solved and not set(sel) & set(conf)
    elif name in ("alternatives", "transfer", "heads", "styles") or (
        name in ("necessity", "probes") and search["chosen"]
    ):
        assert len(inputs["sets"]["confirmation"]) == search["n_confirmation"]  # measured on the search's other half
        assert set(inputs["sets"]["confirmation"]) <= set(solved)


@pytest.mark.slow
def test_eval_run_and_sweep_list_every_problem_too(written):
    model, out = written
    run, alternatives = read(out, "run"), read(out, "alternatives")
    # a result measured on a split describes the split: its n_solved is the n its rates are over
    assert run["n_solved"] == run["faithfulness"]["n"]
    assert alternatives["n_solved"] == alternatives["configured"]["faithfulness"]["n"]
    check_row(model, read(out, "eval")["problems"][0])
    check_row(model, read(out, "run")["problems"][-1])
    kept = read(out, "sweep")["kept_problems"][0]  # solved: the greedy answer is the answer
    assert rerun(model, kept) == kept["answer_tokens"]


@pytest.mark.slow
def test_styles_own_row_is_on_the_searchs_confirmation_problems(written):
    """At the search's config the task's own style is measured on the search's confirmation half, beside the
    search's confirmation number (the same problems, the same number); other styles and operations on their solved
    problems whose operands did not choose the config."""
    _, out = written
    search, styles = read(out, "search"), read(out, "styles")
    own = next(r for r in styles["rows"] if r["style"] == SPEC.style and r["operation"] == SPEC.operation)
    judged = search["judged"]
    assert search["chosen"] and (styles["config"]["wait"], styles["config"]["transfer"]) == (
        judged["wait"],
        judged["transfer"],
    )
    assert own["faithfulness"]["n"] == search["n_confirmation"] < own["n_solved"]
    assert own["measured_on"] == "the search's confirmation split"
    assert own["faithfulness"]["value"] == pytest.approx(judged["confirmation"]["value"])
    assert own["faithfulness"]["ci"] == pytest.approx(judged["confirmation"]["ci"])

    def operands(rows: list[dict[str, Any]], at: list[int]) -> set[tuple[str, ...]]:
        return {tuple(re.findall(r"\d", rows[i]["prompt"])) for i in at}

    sets = own["inputs"]["sets"]  # the search's setup: its solved problems, the confirmation half among them
    chose = operands(own["inputs"]["problems"], sorted(set(sets["solved"]) - set(sets["confirmation"])))
    assert chose
    for row in styles["rows"]:
        if row is not own and "n_solved" in row:
            assert row["measured_on"] == "the solved problems whose operands did not choose the config"
            measured = row["inputs"]["sets"]["confirmation"]
            assert len(measured) == row["faithfulness"]["n"] < row["n_solved"]
            assert not operands(row["inputs"]["problems"], measured) & chose
