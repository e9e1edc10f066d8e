"""The cost estimate: its work follows the plan (the executor's grid, the problems, the options), it reads what
finished units measured, and a study says it before it runs (`af1 study --estimate` runs nothing)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from af1.executors.fast import grid
from af1.experiments import costs
from af1.models.loading import load_tokenizer
from af1.study import cost
from af1.study.plan import StudyPlan, expand
from af1.tasks.task import build_task

from cli_helpers import run_cli
from conftest import tiny_model


@pytest.mark.parametrize("layers", [1, 5, 24, 30])
@pytest.mark.parametrize("max_transfer", [None, 0, 3])
def test_the_estimates_grid_is_the_executors_grid(layers, max_transfer):
    passes, cells = costs.sweep_passes(layers, max_transfer)
    assert cells == len(grid(layers, max_transfer))
    # last-token passes: each cell runs from its wait to the top once, its transfer layers once more
    assert passes == sum(t + sum(layers - 1 - w - j for j in range(t + 1)) for w, t in _tops(layers, max_transfer))


def _tops(layers: int, max_transfer: int | None) -> list[tuple[int, int]]:
    tops: dict[int, int] = {}
    for wait, transfer in grid(layers, max_transfer):
        tops[wait] = max(tops.get(wait, 0), transfer)
    return list(tops.items())


def test_uncapped_grids_of_the_bundled_depths():
    assert costs.sweep_passes(30, None) == (5425, 496)  # SmolLM2: L(L+1)/2 + L(L+1)(L+2)/6 passes
    assert costs.sweep_passes(24, None) == (2900, 325)  # Qwen2.5-0.5B


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer) -> Path:
    root = tmp_path_factory.mktemp("cost") / "m"
    tiny_model("llama").save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def plan_of(directory: Path, n: int, experiments: dict) -> StudyPlan:
    return StudyPlan.model_validate(
        {
            "name": "cost",
            "models": [{"spec": str(directory), "name": "tiny"}],
            "tasks": [{"operation": "a+b", "shots": 1, "n": n}],
            "experiments": experiments,
        }
    )


def work_of(plan: StudyPlan, records=lambda _uid: None) -> dict[str, tuple[float, ...]]:
    units = expand(plan)
    shape = cost.model_shape(Path(units[0].model.spec), "float32")
    out = {}
    for unit in units:
        assert unit.task is not None
        task = cost.task_shape(build_task(unit.task, load_tokenizer(unit.model.spec)))
        found = cost.found_from(unit, records, task.n, shape.layers)
        work = cost.unit_work(unit, shape, task, found, [])
        assert work is not None, unit.experiment  # every registered experiment has a cost model
        out[unit.experiment] = work
    return out


def test_work_follows_the_problems_the_grid_and_the_options(tiny_dir):
    small = work_of(plan_of(tiny_dir, 20, {"eval": {}, "sweep": {}, "search": {}, "heads": {"draws": 2}}))
    large = work_of(plan_of(tiny_dir, 40, {"eval": {}, "sweep": {}, "search": {}, "heads": {"draws": 2}}))
    for experiment in ("eval", "sweep", "search", "heads"):
        assert large[experiment][0] == pytest.approx(2 * small[experiment][0], rel=0.05)  # twice the problems
    capped = work_of(plan_of(tiny_dir, 20, {"sweep": {"max_transfer": 0}, "search": {}, "heads": {"draws": 8}}))
    assert capped["sweep"][0] < small["sweep"][0] and capped["sweep"][1] < small["sweep"][1]
    assert capped["heads"][0] > small["heads"][0]  # more random draws knocked out
    assert 0 < small["search"][1] < small["sweep"][1]  # a share of the grid's cells and problems
    narrow = work_of(plan_of(tiny_dir, 20, {"search": {"selection": 0.2}}))
    assert narrow["search"][1] < small["search"][1]  # fewer problems to choose on: fewer measured


def test_finished_units_replace_what_is_assumed(tiny_dir):
    plan = plan_of(tiny_dir, 20, {"search": {}, "necessity": {}})
    unit = next(u for u in expand(plan) if u.experiment == "necessity")
    assumed = cost.found_from(unit, lambda _uid: None, 20, 3)
    assert (assumed.solved, assumed.measured) == (20, False)
    results = {
        "tiny/a+b.original.1d.1shot.n20/eval": {"n_solved": 7},
        "tiny/a+b.original.1d.1shot.n20/search": {"chosen": True, "judged": {"wait": 2, "transfer": 0}},
    }
    known = cost.found_from(unit, results.get, 20, 3)
    assert (known.solved, known.wait, known.transfer, known.measured) == (7, 2, 0, True)
    fewer = cost.unit_work(unit, cost.model_shape(tiny_dir, "float32"), _shape(20), known, [])
    more = cost.unit_work(unit, cost.model_shape(tiny_dir, "float32"), _shape(20), assumed, [])
    assert fewer is not None and more is not None and fewer[0] < more[0]  # 7 solved cost less than 20 assumed


def test_an_experiment_with_no_cost_model_is_said_not_guessed(tiny_dir):
    unit = dataclasses.replace(expand(plan_of(tiny_dir, 20, {"eval": {}}))[0], experiment="plugin")
    assert (
        cost.unit_work(unit, cost.model_shape(tiny_dir, "float32"), _shape(20), cost.Found(20, 1, 1, True), []) is None
    )
    line = cost.summary_line(
        [cost.Estimate(unit.id, 0.0, 1.0, "unknown"), cost.Estimate("m/t/eval", 5.0, 1.0, "measured")]
    )
    assert "about 5 s for 2 units on this machine, 1 with no cost model not counted" in line


def _shape(n: int) -> cost.TaskShape:
    return cost.TaskShape(n=n, suffix=6.0, steps=2.0, answer_steps=1.0, max_steps=2)


def test_study_estimate_prints_every_unit_and_runs_nothing(tiny_dir, tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"name: cost\nmodels:\n  - {{spec: {tiny_dir}, name: tiny}}\ntasks:\n  - {{operation: a+b, shots: 1, n: 20}}\n"
        "experiments:\n  eval: {}\n  search: {}\n"
    )
    code, out, _ = run_cli(capsys, "study", str(plan), "--out", str(tmp_path / "out"), "--estimate")
    assert code == 0
    assert all(name in out for name in ("eval", "search")) and "estimate: about" in out
    assert "GB" in out and "assumed" in out  # before the eval, what it solves is assumed
    assert not (tmp_path / "out" / "units").exists()  # nothing ran, nothing was written


def test_peak_memory_grows_with_the_weights_and_says_whether_it_fits(tiny_dir):
    unit = expand(plan_of(tiny_dir, 20, {"eval": {}}))[0]
    shape = cost.model_shape(tiny_dir, "float32")
    half = cost.model_shape(tiny_dir, "bfloat16")
    assert half.weight_gb == pytest.approx(shape.weight_gb / 2)
    assert cost.peak_gb(unit, shape) > cost.RUNTIME_GB + shape.weight_gb
    huge = cost.Estimate("m/t/eval", 1.0, 1e6, "assumed")
    assert "WILL NOT FIT" in cost.summary_line([huge]) or cost.available_gb() is None


def test_every_registered_experiment_has_a_cost_model(tiny_dir):
    from af1.experiments import REGISTRY

    units = expand(plan_of(tiny_dir, 20, {name: {} for name in REGISTRY}))
    assert {u.experiment for u in units} == set(REGISTRY)
    shape, task = cost.model_shape(tiny_dir, "float32"), _shape(20)
    for unit in units:
        work = cost.unit_work(unit, shape, task if unit.task is not None else None, cost.Found(20, 1, 1, True), [])
        assert work is not None and all(w >= 0 for w in work), unit.experiment
        assert sum(work) > 0, unit.experiment


def test_a_resumed_study_estimates_only_what_is_left_and_its_model_load(tiny_dir, tmp_path):
    """Units done in the store cost nothing; the first unit left pays the model's load, as its worker loads it."""
    from af1.study import run_study
    from af1.study.store import Store

    units = expand(plan_of(tiny_dir, 20, {"eval": {}, "search": {}}))
    fresh = cost.estimate_store(Store(tmp_path), units)
    run_study(plan_of(tiny_dir, 20, {"eval": {}}), tmp_path)  # the same eval unit, done in the store
    resumed = cost.estimate_store(Store(tmp_path), units)
    assert [e.basis for e in resumed][:1] == ["done"] and resumed[0].seconds == 0
    search_fresh, search_resumed = fresh[1], resumed[1]
    load = cost.LOAD_S + cost.model_shape(tiny_dir, "float32").weight_gb / cost.LOAD_GB_PER_S
    assert search_resumed.seconds >= load  # the load moved to the first unit left
    assert search_resumed.basis == "measured" and search_fresh.basis == "assumed"  # the problems solved, read


def test_a_study_runs_on_where_its_estimate_fails(tiny_dir, tmp_path, monkeypatch, capsys):
    from af1.study import run_study

    monkeypatch.delenv("AF1_NO_PROGRESS", raising=False)

    def broken(*_args, **_kwargs):
        raise ValueError("no shapes")

    monkeypatch.setattr(cost, "estimate_store", broken)
    (tmp_path / "estimate.json").write_text("not json")  # nor does a damaged earlier estimate stop it
    summary = run_study(plan_of(tiny_dir, 20, {"eval": {}}), tmp_path)
    assert summary.failed == [] and len(summary.ran) == 1
    assert "estimate: not available (ValueError: no shapes)" in capsys.readouterr().err


def test_units_asked_only_where_a_cell_is_chosen_are_counted_apart(tiny_dir, tmp_path):
    """Before the search has run, a unit gated on its choice (require_found) is estimated but kept out of the total:
    the line says what it would add."""
    from af1.study.store import Store

    units = expand(plan_of(tiny_dir, 20, {"eval": {}, "search": {}, "necessity": {"require_found": True}}))
    estimates = cost.estimate_store(Store(tmp_path), units)
    gated = [e for e in estimates if e.basis == "gated"]
    assert [e.unit.rsplit("/", 1)[1] for e in gated] == ["necessity"] and gated[0].seconds > 0
    line = cost.summary_line(estimates)
    total = sum(e.seconds for e in estimates if e.basis != "gated")
    assert line.startswith(f"estimate: about {total:.0f} s for {len(estimates) - 1} units on this machine; up to ")
    assert f"{gated[0].seconds:.0f} s more for 1 units asked only where a search chooses a cell" in line


@pytest.mark.parametrize("pays", [True, False])
def test_the_slowdown_follows_whether_bfloat16_products_pay_on_this_cpu(monkeypatch, pays):
    from af1.executors import greedy
    from af1.experiments import REGISTRY

    monkeypatch.setattr(greedy, "bf16_pays", lambda: pays)
    for name, experiment in REGISTRY.items():
        fit = experiment.cost
        expected = fit.slowdown if pays or fit.slowdown_without_bf16 is None else fit.slowdown_without_bf16
        assert cost.slowdown(name) == expected
    assert (cost.slowdown("eval") == REGISTRY["eval"].cost.slowdown) is pays  # the evaluation's two fits differ
