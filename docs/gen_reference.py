"""Write docs/cli.md, the command-line and plan reference, from af1's registry and its typer app.

    python docs/gen_reference.py            # rewrite docs/cli.md
    python docs/gen_reference.py --stdout   # print it instead (what tests/test_docs.py compares)

Flags come from the click command typer builds (exactly what a user types); an experiment's types, defaults and
descriptions come from its pydantic `Options` (the only place they live); plan keys from `af1.study.plan`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import typer.main
import yaml
from pydantic import BaseModel

from af1.cli import TASK_FIELDS, app
from af1.experiments import REGISTRY
from af1.study.plan import ModelEntry, StudyPlan
from af1.tasks.spec import TaskSpec

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "docs" / "cli.md"
EXAMPLE_PLAN = "examples/smollm2_study.yaml"
REGENERATE = "python docs/gen_reference.py"

MODEL_KEYS = {"model": "spec", "dtype": "dtype", "attn": "attn", "device_map": "device_map"}
OTHER_KEYS = {
    "means": "none (a study computes its own means)",
    "upstream": "the named experiment's own entry under `experiments:`",
    "as_json": "none (a study writes JSON to its store)",
    "out_dir": "`af1 study PLAN --out DIR`",
}
TASK_NOTES = {  # TaskSpec fields that are not command-line options (so have no description)
    "n_max": "like n, but takes all problems when there are fewer",
    "file_sha256": "filled in from the task file: a changed file is another task",
}
MODEL_NOTES = {
    "dtype": "the weights' dtype, as `--dtype`",
    "attn": "attention kernel, as `--attn` (default: the family's best)",
    "trust_remote_code": "let a hub model run its own code (off: af1 reads only safetensors and GGUF weights)",
}
SCOPES = {
    "task": "one unit per model and task",
    "model": "one unit per model (the model alone: no task options)",
    "models": "one unit per task, reading every model's results",
}


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def type_text(annotation: Any) -> str:
    """How a value is written: the annotation of an option or a plan key in words."""
    origin = get_origin(annotation)
    args = [a for a in get_args(annotation) if a is not type(None)]
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in get_args(annotation))
    if origin is list:
        return f"{type_text(args[0])}, repeatable" if args else "list"
    if args and origin is not None:  # X | None
        return type_text(args[0]) if len(args) == 1 else " or ".join(type_text(a) for a in args)
    names = {bool: "flag", int: "integer", float: "number", str: "text", Path: "path"}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def plan_type_text(annotation: Any) -> str:
    """The same for a plan key, where a list is a YAML list and a bool true or false."""
    text = type_text(annotation).replace(", repeatable", " list")
    return text.replace("flag", "true or false")


def value_text(value: Any, flag: bool = False) -> str:
    if value is None or value == []:
        return "—"
    if flag:
        return "on" if value else "off"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list) and all(isinstance(v, BaseModel) for v in value):
        return "`[{}]`" if len(value) == 1 else f"{len(value)} entries"  # entries at their defaults
    if isinstance(value, list):
        return "`" + ", ".join(map(str, value)) + "`"
    return f"`{value}`"


def flags_text(param: Any) -> str:
    if param.param_type_name == "argument":
        return f"`{param.name.upper()}` (argument)"
    return " / ".join(f"`{f}`" for f in [*param.opts, *param.secondary_opts])


GROUPS = {
    "model": ("Model options", ("model", "dtype", "attn", "device_map")),
    "task": ("Task options", (*TASK_FIELDS, "means")),
    "output": ("Output options", ("upstream", "as_json", "out_dir")),
}


def plan_key(name: str, param: Any) -> str:
    """Where a flag's setting goes in a plan."""
    if param.name in REGISTRY[name].Options.model_fields:
        return f"`experiments.{name}.{param.name}`"
    if param.name in TASK_FIELDS:
        return f"`tasks[].{param.name}`"
    if param.name in MODEL_KEYS:
        return f"`models[].{MODEL_KEYS[param.name]}`"
    return OTHER_KEYS.get(param.name, "—")


def option_row(name: str, param: Any) -> str:
    """A flag's row: an experiment's own option from its Options field, a shared one from the command."""
    fields = REGISTRY[name].Options.model_fields
    if param.name in fields:
        info = fields[param.name]
        annotation, description = info.annotation, info.description or ""
        default = info.get_default(call_default_factory=True)
    elif param.name in TASK_FIELDS:
        info = TaskSpec.model_fields[param.name]
        annotation, description = info.annotation, info.description or ""
        default = REGISTRY[name].task_defaults.get(param.name, info.default)
    else:
        annotation = getattr(getattr(param, "type_descriptor", None), "annotation", str)
        default, description = param.default, param.help or ""
    kind = type_text(annotation)
    return (
        f"| {flags_text(param)} | {cell(kind)} | {value_text(default, kind == 'flag')} | {cell(description)} "
        f"| {plan_key(name, param)} |"
    )


HEADER = ["| flag | type | default | description | in a plan |", "|---|---|---|---|---|"]


def shared_section(commands: dict[str, Any]) -> list[str]:
    """The options every experiment's command shares, taken from `af1 eval` (every experiment has them)."""
    params = {p.name: p for p in commands["eval"].params}
    lines = [
        "## Options every experiment takes",
        "",
        "Each experiment's command takes these, then its own (listed in its section). `positional` studies the "
        "model alone and takes no task options. A command whose task defaults differ says so in its section.",
        "",
    ]
    for title, names in GROUPS.values():
        lines += [f"### {title}", "", *HEADER, *(option_row("eval", params[n]) for n in names), ""]
    return lines


def experiment_rows(name: str, command: Any) -> list[str]:
    """The experiment's own flags, one row each, with where the same setting goes in a plan."""
    fields = REGISTRY[name].Options.model_fields
    return [option_row(name, p) for p in command.params if p.name in fields]


def differing_defaults(name: str, command: Any) -> list[str]:
    """Task flags whose default on this command is not TaskSpec's (the experiment's `task_defaults`)."""
    changed = REGISTRY[name].task_defaults
    return [f"`{p.opts[0]} {changed[p.name]}`" for p in command.params if p.name in changed]


def plain_rows(command: Any) -> list[str]:
    rows = []
    for param in command.params:
        annotation = getattr(getattr(param, "type_descriptor", None), "annotation", str)
        kind = type_text(annotation)
        if getattr(param, "metavar", None) and param.param_type_name != "argument":
            kind = f"{kind} (`{param.metavar}`)"
        rows.append(
            f"| {flags_text(param)} | {cell(kind)} | {value_text(param.default, kind == 'flag')} "
            f"| {cell(param.help or '')} |"
        )
    return rows


def model_table(model: type[BaseModel], notes: dict[str, str]) -> list[str]:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, info in model.model_fields.items():
        required = info.is_required()
        default = "required" if required else value_text(info.get_default(call_default_factory=True))
        description = info.description or notes.get(key, "")
        rows.append(f"| `{key}` | {cell(plan_type_text(info.annotation))} | {default} | {cell(description)} |")
    return rows


def plan_section(commands: dict[str, Any]) -> list[str]:
    example = (ROOT / EXAMPLE_PLAN).read_text(encoding="utf-8").rstrip("\n")
    top_notes = {
        "name": "the study's name",
        "models": "one entry per model (below); at least one",
        "tasks": "one entry per task (below); default: one task with every key at its default",
        "experiments": "one entry per experiment to run, with its options (each command below says which)",
    }
    lines = [
        "## Plan files",
        "",
        "A plan (YAML or TOML, given to `af1 study PLAN --out DIR`) names models, tasks and experiments; it is "
        "expanded into units of one model x one task x one experiment. Unknown keys are errors. An experiment's "
        "options are written under its name with the same names as its flags, `_` for `-` "
        "(`--split-seed 1` is `split_seed: 1`); an experiment that another one needs runs with its default options "
        "unless the plan names it. The example `" + EXAMPLE_PLAN + "`:",
        "",
        "```yaml",
        example,
        "```",
        "",
        "### Top level",
        "",
        *model_table(StudyPlan, top_notes),
        "",
        "### `models:` entries",
        "",
        *model_table(ModelEntry, MODEL_NOTES),
        "",
        "### `tasks:` entries",
        "",
        "A task entry takes every field of `TaskSpec`; `file:` names a task file, found beside the plan.",
        "",
        *model_table(TaskSpec, TASK_NOTES),
        "",
    ]
    return lines


def experiment_section(name: str, command: Any, shared: dict[str, Any]) -> list[str]:
    experiment = REGISTRY[name]
    defaults = experiment.Options()
    needs = experiment.needs(defaults)
    uses = experiment.uses()
    lines = [f"## af1 {name}", "", cell(experiment.help), ""]
    facts = [f"Scope: {SCOPES[experiment.scope]}."]
    if needs:
        facts.append("Runs first, with default options: " + ", ".join(f"`{n}`" for n in needs) + ".")
    if uses:
        facts.append("Reads, when there is one: " + ", ".join(f"`{n}`" for n in uses) + ".")
    if experiment.config_from_search:
        facts.append("Runs at the search's AF1 config unless `--wait` is given.")
    names = {p.name for p in command.params}
    groups = [title.lower() for title, keys in GROUPS.values() if set(keys) <= names]
    takes = "Takes the " + " and the ".join([", the ".join(groups[:-1]), groups[-1]] if len(groups) > 2 else groups)
    takes += " (above)"
    changed = differing_defaults(name, command)
    takes += f", with task defaults {', '.join(changed)}." if changed else "."
    lines += [" ".join(facts), "", takes, ""]
    own = experiment_rows(name, command)
    lines += [*HEADER, *own, ""] if own else ["No options of its own.", ""]
    entry = {k: v for k, v in defaults.model_dump().items() if v is not None}
    dumped = yaml.safe_dump({"experiments": {name: entry}}, sort_keys=False, default_flow_style=None).rstrip("\n")
    lines += [
        "In a plan, every option at its default (options whose default is unset are left out):",
        "",
        "```yaml",
        dumped,
        "```",
        "",
    ]
    return lines


def plain_section(name: str, command: Any) -> list[str]:
    lines = [f"## af1 {name}", "", cell(command.help or ""), ""]
    if not command.params:
        return [*lines, "No options.", ""]
    return [*lines, "| flag | type | default | description |", "|---|---|---|---|", *plain_rows(command), ""]


def render() -> str:
    group: Any = typer.main.get_command(app)
    commands: dict[str, Any] = {name: group.get_command(None, name) for name in group.list_commands(None)}
    commands |= {name: group.experiment(name) for name in REGISTRY}
    overview = ["| command | what it does |", "|---|---|"]
    for name, command in commands.items():
        overview.append(f"| [`af1 {name}`](#af1-{name}) | {cell(command.help or '')} |")
    lines = [
        "# Command line and plan reference",
        "",
        f"<!-- Generated by docs/gen_reference.py from af1's registry; do not edit. Regenerate: {REGENERATE} -->",
        "",
        "Generated from af1's registry (`src/af1/experiments/`) and its command line (`src/af1/cli.py`): the "
        "flags are the ones `af1 <command> --help` lists, and every experiment's defaults are its `Options`'. "
        f"Regenerate with `{REGENERATE}`; `tests/test_docs.py` fails when this page and the code differ.",
        "",
        "Every experiment is a command and a plan entry. An experiment's command takes the model options, the task "
        "options (not `positional`, which studies the model alone), `--means`, `--with NAME.OPTION=VALUE` (an "
        "option of an experiment run first), `--json`, `--out` and its own options. Bad input is one line on stderr "
        "and exit code 2.",
        "",
        *overview,
        "",
        *plan_section(commands),
        *shared_section(commands),
    ]
    shared = {p.name: p for p in commands["eval"].params}
    for name, command in commands.items():
        lines += experiment_section(name, command, shared) if name in REGISTRY else plain_section(name, command)
    return "\n".join(lines).rstrip("\n") + "\n"


def emit(text: str, target: Path, argv: list[str]) -> int:
    """A generated page: printed with --stdout (what tests/test_docs.py compares), else written to `target`."""
    if "--stdout" in argv:
        sys.stdout.write(text)
        return 0
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(emit(render(), TARGET, sys.argv[1:]))
