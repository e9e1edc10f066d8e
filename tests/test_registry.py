"""The registry: every experiment is a command, a plan entry, a report section and an API call, derived from
its one module; a new experiment becomes all of them by being registered."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import af1.api
from af1 import cli
from af1.experiments import REGISTRY, base, costs
from af1.report.markup import Tab
from af1.study import plan as plan_module
from af1.study.plan import StudyPlan, expand
from af1.tasks.spec import TaskSpec

from conftest import tiny_model


def test_every_experiment_is_a_command_and_a_plan_entry_with_its_own_options():
    runner = CliRunner()
    listing = runner.invoke(cli.app, ["--help"], terminal_width=400).output
    for name, experiment in REGISTRY.items():
        assert f" {name} " in listing and experiment.help[:30] in listing  # its help: its module's docstring
        assert (
            plan_module.Experiments.model_fields[name].default is None
        )  # optional in a plan, with the experiment's options
        help_text = runner.invoke(cli.app, [name, "--help"], terminal_width=200).output
        for field, info in experiment.Options.model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            assert str(extra.get("flag") or "--" + field.replace("_", "-")) in help_text, (name, field)
        assert ("--task" in help_text) == (experiment.scope != "model")
        plan = StudyPlan.model_validate({"models": [{"spec": "x"}], "experiments": {name: {}}})
        assert name in {u.experiment for u in expand(plan)}  # with what it needs before it


def test_af1_help_lists_every_command_without_importing_torch():
    """The command list comes from each experiment's source, so a first `af1 --help` answers at once."""
    script = (
        "import sys\n"
        "from af1.cli import app\n"
        "try:\n    app(['--help'], standalone_mode=False)\n"
        "except SystemExit:\n    pass\n"
        "print(sorted({'torch', 'transformers', 'scipy', 'af1.experiments.base'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    *listing, imported = done.stdout.strip().splitlines()
    assert imported == "[]"
    assert all(any(f" {name} " in line for line in listing) for name in [*REGISTRY, "study", "demo"])


def test_an_experiments_help_imports_no_transformers():
    """`af1 run --help` builds the command from the registry (torch comes with it) but loads no model machinery:
    transformers is imported when a model is loaded or a plan first runs."""
    script = (
        "import sys\n"
        "from af1.cli import app\n"
        "try:\n    app(['run', '--help'], standalone_mode=False)\n"
        "except SystemExit:\n    pass\n"
        "print(sorted({'transformers', 'af1.experiments.base'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    *help_text, imported = done.stdout.strip().splitlines()
    assert imported == "['af1.experiments.base']" and any("--wait" in line for line in help_text)


def test_the_registry_lists_what_an_experiment_reads_before_it():
    """Plans run a model's units in registry order, so what an experiment needs or uses comes earlier."""
    order = list(REGISTRY)
    for name, experiment in REGISTRY.items():
        reads = {*experiment.needs(experiment.Options()), *experiment.uses()}
        gated = experiment.Options.model_fields.get("require_found")
        if gated is not None:
            reads |= set(experiment.needs(experiment.Options.model_validate({"require_found": True})))
        assert all(order.index(r) < order.index(name) for r in reads), (name, reads)


def test_with_passes_options_to_the_experiments_run_first(capsys):
    from cli_helpers import run_cli

    assert cli.parse_upstream(["sweep.max_transfer=2", "search.threshold=0.8"]) == {
        "sweep": {"max_transfer": "2"},
        "search": {"threshold": "0.8"},
    }
    for args, message in [
        (["--with", "sweep"], "NAME.OPTION=VALUE"),
        (["--with", "nope.x=1"], "unknown experiment 'nope'"),
        (["--with", "sweep.max_transfer=lots"], "max_transfer"),
    ]:
        code, out, err = run_cli(capsys, "search", *args)
        assert code == 2 and message in err and out == "" and len(err.strip().splitlines()) == 1


def test_a_cross_model_experiment_declares_the_sources_a_study_ran_it_without():
    """A study runs a per-task experiment across models with the sources that finished and records the others in
    its result (`missing_sources`): each such experiment's Result declares that field, or its result is refused."""
    across = [e for e in REGISTRY.values() if e.scope == "models"]
    assert across and all("missing_sources" in e.Result.model_fields for e in across)


def test_the_options_model_is_the_only_place_defaults_live():
    """The command line passes only what the user gave; what is not given takes the options' default."""
    options = REGISTRY["search"].Options.model_validate({})
    assert options.model_dump() == {
        "threshold": 0.9,
        "selection": 0.5,
        "split_seed": 0,
        "frontier": False,
        "ablation": "cama",
        "abp": "af1",
        "reference": False,
    }
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        REGISTRY["search"].Options.model_validate({"threshold": 2})


class ToyOptions(base.Options):
    scale: float = 1.0


class ToyResult(base.Result):
    value: float
    n: int


class Toy(base.Experiment):
    """An experiment a user adds: base accuracy times a scale, its section a heading."""

    name = "toy"
    help = "A toy experiment."
    Options = ToyOptions
    Result = ToyResult
    cost = costs.Cost(slowdown=2.0, memory_factor=1.5)  # its cost, declared where it is: the estimate reads it

    def needs(self, options: ToyOptions) -> tuple[str, ...]:
        return ("eval",)

    def work(self, options: ToyOptions, s: costs.Shapes) -> costs.Work:
        return s.on.n * s.model.layers, s.on.n, 0.0  # one pass of each problem's last token, one unembedding

    def run(self, inputs: base.Inputs, options: ToyOptions) -> ToyResult:
        from af1.experiments.eval import Result as Evaluated

        evaluated = inputs.one(Evaluated)
        assert evaluated is not None
        return ToyResult(value=options.scale * evaluated.base_accuracy["value"], n=evaluated.n)

    def tables(self, result: ToyResult) -> list[Tab]:
        return [Tab(["toy value", "n"], [[result.value, result.n]])]  # the report and the terminal both show it

    def section(self, result: ToyResult) -> list[str]:
        return ["<h2>Toy section</h2>", *super().section(result)]


@pytest.fixture
def toy():
    from af1.experiments import register, unregister

    register(Toy())
    yield
    unregister("toy")


def test_a_new_experiment_is_one_module_and_one_registry_line(toy, tmp_path, tokenizer):
    model = tiny_model("llama")
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    spec = TaskSpec(operation="a+b", shots=1, n=12)

    # the Python API, with what it needs run first
    lm = af1.api.load_model(str(tmp_path / "m"))
    result = af1.api.run("toy", lm, spec, out_dir=tmp_path / "api", scale=2.0)
    base_accuracy = json.loads((tmp_path / "api" / "eval.json").read_text())["base_accuracy"]["value"]
    assert result.value == 2.0 * base_accuracy and result.n == 12
    typed = af1.api.run(ToyResult, lm, spec, scale=2.0)  # named by its Result: the type checker knows `.value`
    assert isinstance(typed, ToyResult) and typed.value == result.value
    assert json.loads((tmp_path / "api" / "toy.json").read_text())["provenance"]["model"]["source"] == "directory"

    # the report section
    from af1.study.report import build_report

    page = build_report(tmp_path / "api").read_text()
    assert "Toy section" in page and f"<td>{result.value:.3f}</td>" in page

    # the command line, registered after `af1.cli` was imported
    assert " toy " in CliRunner().invoke(cli.app, ["--help"]).output
    args = ["toy", "--model", str(tmp_path / "m"), "--shots", "1", "--n", "12", "--scale", "3", "--json"]
    out = CliRunner().invoke(cli.app, args)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["value"] == 3.0 * base_accuracy
    shown = CliRunner().invoke(cli.app, args[:-1])  # the terminal renders the same table
    assert shown.exit_code == 0 and "toy value" in shown.stdout and f"{3.0 * base_accuracy:.3f}" in shown.stdout

    # plan files
    plan = StudyPlan.model_validate({"models": [{"spec": "x"}], "experiments": {"toy": {"scale": 2}}})
    assert plan.experiments.toy.scale == 2
    assert [u.experiment for u in expand(plan)] == ["eval", "toy"]

    # the cost estimate, from the experiment's own declaration
    from af1.study import cost

    unit = expand(plan)[1]
    shapes = (cost.model_shape(tmp_path / "m", "float32"), costs.TaskShape(12, 5.0, 1.0, 1.0, 1))
    assert cost.unit_work(unit, *shapes, costs.Found(12, 1, 1, True), []) == (12 * shapes[0].layers, 12, 0.0)
    assert cost.slowdown("toy") == 2.0 and cost.peak_gb(unit, shapes[0]) == cost.RUNTIME_GB + 1.5 * shapes[0].weight_gb
    with pytest.raises(ValueError, match="scale"):
        StudyPlan.model_validate({"models": [{"spec": "x"}], "experiments": {"toy": {"scale": "big"}}})


def test_after_unregistering_a_plan_refuses_it():
    with pytest.raises(ValueError, match="toy"):
        StudyPlan.model_validate({"models": [{"spec": "x"}], "experiments": {"toy": {}}})


def test_other_experiments_run_at_a_search_result_s_chosen_cell_else_its_best_eligible_one():
    """The config others run at is the search's chosen cell, else its best eligible one, else none."""
    from af1.experiments import search
    from af1.interventions.af1 import AF1Config
    from af1.methods.allforone.search import Judged
    from af1.stats import rate

    judged = Judged(
        wait=3, transfer=1, eligible=True, selection=rate([True] * 9, list("0123456789")[:9]), confirmation=rate([], [])
    )
    found = search.Result.model_construct(
        chosen=True, found=False, threshold=0.9, config=AF1Config(seed=3), judged=judged
    )
    assert search.searched_config(found) == AF1Config(wait=3, transfer=1, seed=3)
    found.chosen = False  # no cell reached the threshold on the selection split: the judged cell is the best one
    assert search.searched_config(found) == AF1Config(wait=3, transfer=1, seed=3)
    found.judged = {**judged, "eligible": False}  # no cell is eligible: nothing to run at
    assert search.searched_config(found) is None


def test_every_result_is_fully_defined_when_its_module_is_imported():
    """A part whose field names a type declared later in its module leaves the Result incomplete, and it fails only
    when a result is first built or read back: every Result is complete at import."""
    assert [name for name, e in REGISTRY.items() if not e.Result.__pydantic_complete__] == []


def test_no_result_field_is_declared_twice():
    """Each field of every Result is declared in one class: the Result itself, the method's part it extends, the
    setup's description or `Part` (the warnings), never re-declared along the way."""
    import inspect

    from pydantic import BaseModel

    declared_twice = {}
    for name, experiment in REGISTRY.items():
        where: dict[str, list[str]] = {}
        for cls in experiment.Result.__mro__:
            if isinstance(cls, type) and issubclass(cls, BaseModel) and cls is not BaseModel:
                for field in inspect.get_annotations(cls):
                    where.setdefault(field, []).append(f"{cls.__module__}.{cls.__qualname__}")
        declared_twice |= {f"{name}.{field}": classes for field, classes in where.items() if len(classes) > 1}
    assert declared_twice == {}


def test_every_experiment_declares_a_small_run_its_options_accept():
    """The small run each experiment declares (what the tests run it with on a tiny model) is valid options."""
    for name, experiment in REGISTRY.items():
        assert experiment.Options.model_validate(experiment.small).model_dump() is not None, name
    assert REGISTRY["heads"].small and REGISTRY["neurons"].small and REGISTRY["prune"].small
