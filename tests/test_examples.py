"""The examples under examples/ run as shipped: the API quick start on the session's SmolLM2, plans parse."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_quickstart_runs_and_its_numbers_hold_together(smollm2):
    out = load_example("api_quickstart").quickstart(smollm2, n=30)
    value, (low, high) = out["base_accuracy"]
    assert out["n"] == 30 and 0 < out["n_solved"] <= 30 and low <= value <= high
    assert out["n_solved"] == round(value * out["n"])
    faith, (f_low, f_high) = out["faithfulness"]
    assert f_low <= faith <= f_high and 0 <= out["faithfulness_baseline"] <= 1
    assert out["stages"]["transfer"] == [16, 17] and out["executor"] == "fast"
    assert out["first_problem_input"].startswith("Calculate: ")  # the few-shot prefix is part of the input
    search = out["search"]
    conf = search["confirmation"]
    assert search["cell"] is not None and conf["ci"][0] <= conf["value"] <= conf["ci"][1]
    assert out["claim"]["outcome"] != "confirmed" or search["chosen"]  # a best cell is never confirmed
    measured, grid = search["problem_cells"]
    assert 0 < measured < grid  # the search stops cells once decided: never the whole grid


@pytest.mark.parametrize("plan", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_example_plans_parse(plan):
    from af1.study import expand, load_plan

    assert expand(load_plan(EXAMPLES / plan))
