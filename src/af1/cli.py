"""The `af1` command: parse, call the API, print, write. Errors are one line and exit code 2."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from af1.errors import Af1Error

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Where and when a language model does mental arithmetic."
)
out = Console()

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="smollm2, a model directory, a .gguf file or a hub id")
]
TaskOpt = Annotated[str, typer.Option("--task", "-t", help="a+b, a-b, a+b+c, a+b-c, a-b+c, a-b-c, a*b")]
StyleOpt = Annotated[str, typer.Option(help="original, calculate, verbal, question, instruction, word, code")]
ShotsOpt = Annotated[int, typer.Option(help="worked examples in the constant prefix")]
DigitsOpt = Annotated[int, typer.Option(help="digits per operand")]
NOpt = Annotated[int | None, typer.Option("--n", help="problems to sample (default: all distinct)")]
SeedOpt = Annotated[int, typer.Option(help="sampling seed")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object")]
DtypeOpt = Annotated[str, typer.Option(help="float32, bfloat16 or float16")]
AttnOpt = Annotated[
    str | None, typer.Option("--attn", help="attention kernel: sdpa or eager (default: the family's best)")
]
LayoutOpt = Annotated[
    bool, typer.Option("--largest-layout", help="keep the largest group of same-layout prompts")
]


def task_spec(
    task: str, style: str, digits: int, shots: int, n: int | None, seed: int, largest: bool = False
):
    from af1.tasks import TaskSpec

    if shots < 0:
        raise Af1Error(f"--shots must be >= 0, got {shots}")
    return TaskSpec(
        operation=task, style=style, digits=digits, shots=shots, n=n, seed=seed, largest_layout=largest
    )


def emit(data: dict[str, Any], as_json: bool, table: Table | None = None) -> None:
    from af1.results import to_json

    if as_json:
        sys.stdout.write(to_json(data) + "\n")
    elif table is not None:
        out.print(table)


@app.command()
def models() -> None:
    """List the supported architecture families."""
    from af1.models import FAMILIES

    table = Table("family", "model_type", "layers", "attention", "o_proj", "mlp", "positions")
    for f in FAMILIES:
        table.add_row(
            f.name,
            ", ".join(f.model_types),
            f.layers,
            f.attention,
            f.o_proj,
            f.mlp,
            "rotary" if f.rope else "learned",
        )
    out.print(table)


@app.command()
def tasks() -> None:
    """List tasks and input styles with an example prompt each."""
    from af1.tasks import OPERATIONS, STYLES, example_prompt

    table = Table("task", "style", "example prompt")
    for op in OPERATIONS:
        for style in STYLES:
            prompt = example_prompt(op, style)
            if prompt is not None:
                table.add_row(op, style, repr(prompt))
    out.print(table)


@app.command("eval")
def eval_cmd(
    model: ModelOpt = "smollm2",
    task: TaskOpt = "a+b",
    style: StyleOpt = "original",
    shots: ShotsOpt = 0,
    digits: DigitsOpt = 1,
    n: NOpt = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
    dtype: DtypeOpt = "float32",
    attn: AttnOpt = None,
    largest_layout: LayoutOpt = False,
    out_file: Annotated[Path | None, typer.Option("--out", help="also write the JSON result here")] = None,
) -> None:
    """Base accuracy of a model on a task: greedy next token vs the answer's first token."""
    from af1 import api

    spec = task_spec(task, style, digits, shots, n, seed, largest_layout)
    result = api.base_accuracy(model, spec, dtype=dtype, attn_implementation=attn)
    if out_file:
        from af1.results import write_json

        write_json(out_file, result)
    table = Table("task", "style", "shots", "n", "base accuracy", "solved")
    table.add_row(
        task, style, str(shots), str(result["n"]), f"{result['base_accuracy']:.3f}", str(result["n_solved"])
    )
    emit(result, as_json, table)


@app.command()
def demo(
    model: ModelOpt = "smollm2",
    out_dir: Annotated[Path, typer.Option("--out", help="where to write results")] = Path("results/demo"),
    shots: ShotsOpt = 3,
    style: StyleOpt = "calculate",
    n: Annotated[int, typer.Option("--n", help="problems per task (at most)")] = 100,
) -> None:
    """The main job on the bundled model: base accuracy of every task, as a table and JSON."""
    from af1 import api
    from af1.results import write_json
    from af1.tasks import OPERATIONS

    lm = api.as_loaded(model)
    table = Table("task", "style", "shots", "n", "base accuracy", "solved")
    rows = []
    for op in OPERATIONS:
        result = api.base_accuracy(
            lm, task_spec(op, style, 1, shots, None, 0).model_copy(update={"n_max": n})
        )
        rows.append({k: result[k] for k in ("task", "style", "shots", "n", "n_solved", "base_accuracy")})
        table.add_row(
            op, style, str(shots), str(result["n"]), f"{result['base_accuracy']:.3f}", str(result["n_solved"])
        )
    out.print(table)
    path = write_json(out_dir / "base_accuracy.json", {"rows": rows, "provenance": api.provenance(lm.info)})
    out.print(f"wrote {path}")


def main() -> None:
    """Entry point: every user-facing failure becomes one line on stderr and exit code 2."""
    try:
        app(standalone_mode=False)
    except Af1Error as exc:
        print(f"af1: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except ValidationError as exc:
        first = exc.errors()[0]
        print(f"af1: error: {first['msg'].removeprefix('Value error, ')}", file=sys.stderr)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        print("af1: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):  # click's usage errors
            exc.show()
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
