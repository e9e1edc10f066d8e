"""The built-in mental-math tasks: operations, input styles and their prompt templates."""

from __future__ import annotations

from dataclasses import dataclass

from af1.errors import Af1Error


@dataclass(frozen=True)
class Operation:
    name: str
    operators: tuple[str, ...]

    @property
    def n_operands(self) -> int:
        return len(self.operators) + 1

    def apply(self, operands: tuple[int, ...]) -> int:
        value = operands[0]
        for op, x in zip(self.operators, operands[1:], strict=True):
            value = value + x if op == "+" else value - x if op == "-" else value * x
        return value


OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        Operation("a+b", ("+",)),
        Operation("a-b", ("-",)),
        Operation("a+b+c", ("+", "+")),
        Operation("a+b-c", ("+", "-")),
        Operation("a-b+c", ("-", "+")),
        Operation("a-b-c", ("-", "-")),
        Operation("a*b", ("*",)),
    )
}

# Input styles of the paper's Table 4 (two-operand + and - only), plus `calculate`, the
# spaced form small models answer best. `{A}`, `{B}` are operands; `{expr}` is the spaced expression.
TWO_OPERAND_STYLES: dict[str, dict[str, str]] = {
    "verbal": {"+": "The sum of {A} and {B} is ", "-": "The difference of {A} and {B} is "},
    "question": {
        "+": "What is the sum of {A} and {B}? Answer: ",
        "-": "What is the difference of {A} and {B}? Answer: ",
    },
    "instruction": {
        "+": "If you add {A} to {B}, you will get ",
        "-": "If you subtract {B} from {A}, you will get ",
    },
    "word": {
        "+": "John has {A} cookies. Jane has {B} cookies. Together they have ",
        "-": "John has {A} cookies. He gave Jane {B} cookies. John now has ",
    },
    "code": {
        "+": "a = {A}; b = {B}; print(a + b) # should print ",
        "-": "a = {A}; b = {B}; print(a - b) # should print ",
    },
}
STYLES: tuple[str, ...] = ("original", "calculate", *TWO_OPERAND_STYLES)
FILE_STYLE = "task file"  # the style results give a task file's problems (its template is its own)
NAMES = "ABCDEFG"


def prompt_template(operation: Operation, style: str) -> str:
    """The prompt template with `{A}`, `{B}`, ... placeholders."""
    fields = [f"{{{NAMES[i]}}}" for i in range(operation.n_operands)]
    if style == "original":
        return "".join(f + op for f, op in zip(fields, operation.operators, strict=False)) + fields[-1] + "="
    if style == "calculate":
        body = " ".join(f"{f} {op}" for f, op in zip(fields, operation.operators, strict=False))
        return f"Calculate: {body} {fields[-1]} = "
    if style not in TWO_OPERAND_STYLES:
        raise Af1Error(f"unknown style '{style}'; choose one of {', '.join(STYLES)}")
    if operation.operators not in (("+",), ("-",)):
        raise Af1Error(f"style '{style}' exists only for a+b and a-b; use original or calculate for {operation.name}")
    return TWO_OPERAND_STYLES[style][operation.operators[0]]


SEPARATOR = "\n"  # what follows each worked example's answer in a built-in task's few-shot prefix


def format_prompt(operation: Operation, style: str, operands: tuple[int, ...]) -> str:
    return prompt_template(operation, style).format(**{NAMES[i]: x for i, x in enumerate(operands)})


def example_prompt(operation: str, style: str) -> str | None:
    """One example prompt of an operation in a style, or None if the style does not apply."""
    op = OPERATIONS[operation]
    try:
        return format_prompt(op, style, tuple(range(3, 3 + op.n_operands)))
    except Af1Error:
        return None
